#!/usr/bin/env bash
# Session 14 call 13: 64 x 4096 (32/8) by split size and workers: does a finer split's shorter
# tail beat the merge it adds?
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s14; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn_fin jit precompile --preset default -j 16 2>&1 | tail -1
for r in 1 2 3; do
  for opt in "--split-size 0" "--split-size 2048" "--split-size 1024" "--workers 264" "--workers 396"; do
    echo "r$r $opt :: $(timeout 30 $D/kvattn_fin bench decode --cases b64_l4096_h32-8,b256_l4096_h32-8 $opt 2>&1 | tail -2 | cut -c1-20,30-62 | tr -s ' ' | tr '\n' '|')"
  done
done | tee "$out/split64.txt"
echo "t=$((SECONDS - t0)) s"
