#!/usr/bin/env bash
# Session 14 call 8: one request of L tokens (32/8, hd 128, page 16, bf16) for L = 2k .. 128k:
# time against KV bytes gives the steady streaming rate (slope) and the fixed cost (intercept)
# that limit 1 x 32k; the planner's default split, and fixed 1024 / 2048-token chunks.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s14; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn_main jit precompile --preset default -j 16 2>&1 | tail -1
for r in 1 2; do
  for s in 0 1024 2048; do
    for L in 2048 4096 8192 16384 24576 32768 49152 65536 98304 131072; do
      echo "r$r split $s L $L $(timeout 30 $D/kvattn_main bench decode --kv-lens $L --cases custom_h32-8 --split-size $s 2>&1 | tail -1 | cut -c30-75)"
    done
  done
done | tee "$out/len-sweep.txt"
echo "t=$((SECONDS - t0)) s"
