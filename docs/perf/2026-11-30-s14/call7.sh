#!/usr/bin/env bash
# Session 14 call 7: decode on the prefill kernels, skewed batches by fixed split size and workers.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s14; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn_main jit precompile --preset default -j 16 2>&1 | tail -1
for r in 1 2; do
  for s in 0 256 512 1024 2048; do
    for w in 0 1056; do
      echo "== r$r split $s workers $w: $(timeout 60 $D/kvattn_main bench decode --via-prefill --cases zipf64_h32-8,long32k_63x512_h32-8,b64_l4096_h32-8,b64_l1016_h32-8 --workers $w --split-size $s 2>&1 | tail -4 | cut -c1-20,44-62 | tr -s " " | tr "\n" "|")"
    done
  done
done
echo "t=$((SECONDS - t0)) s"
