#!/usr/bin/env bash
# Session 15 call 11: the default (uniform batches on 6 x 16 at 2 CTAs per SM) against
# KVATTN_PREFILL_DECODE_SHAPE=4x16s2b3 (every batch on 4 x 16 at 3), same machine, alternated.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s15; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn10 jit precompile --preset default -j 16 2>&1 | tail -1; $D/kvattn10 jit precompile --preset decode -j 16 2>&1 | tail -1
C=b64_l4096_h32-8,b64_l32768_h32-8,b256_l4096_h32-8,b64_l4096_p1_h32-8,zipf64_h32-8
for r in 1 2; do
  timeout 60 $D/kvattn10 bench decode --cases $C > "$out/r$r-default.txt" 2>&1
  KVATTN_PREFILL_DECODE_SHAPE=4x16s2b3 timeout 60 $D/kvattn10 bench decode --cases $C > "$out/r$r-4x16.txt" 2>&1
  echo "== round $r default"; cut -c1-30,46-58,67-77 "$out/r$r-default.txt" | tail -5
  echo "== round $r 4x16s2b3"; cut -c1-30,46-58,67-77 "$out/r$r-4x16.txt" | tail -5
done
echo "t=$((SECONDS - t0)) s"
