#!/usr/bin/env bash
# Session 14 call 6: GQA decode on the prefill kernels (bench decode --via-prefill), skewed batches
# against their uniform twins, by planner workers (default: SMs x resident CTAs).
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s14; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn_main jit precompile --preset default -j 16 2>&1 | tail -1
C=b64_l4096_h32-8,zipf64_h32-8,b64_l1016_h32-8,long32k_63x512_h32-8
for r in 1 2; do
  for w in 0 264 396 528 792 1584; do
    timeout 60 $D/kvattn_main bench decode --via-prefill --cases $C --workers $w > "$out/r$r-w$w.txt" 2>&1
    echo "== round $r workers $w"; cut -c1-75 "$out/r$r-w$w.txt" | tail -4
  done
done
echo "t=$((SECONDS - t0)) s"
