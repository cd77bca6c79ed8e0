#!/usr/bin/env bash
# Session 15 call 6: the sm_90 route with the decode shape 4x16s3 (2 CTAs per SM: 264 workers, so
# uniform batches plan without splits) against the default 4x16s2b3 (3 per SM, 392 workers), two
# alternated rounds, GB/s and plan() medians.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s15; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn4 jit precompile --preset default -j 16 2>&1 | tail -1
for s in 4x16s2b3 4x16s3; do KVATTN_PREFILL_DECODE_SHAPE=$s $D/kvattn4 jit precompile --preset decode -j 16 2>&1 | tail -1; done
C=b16_l4096_h32-8,b16_l32768_h32-8,b64_l4096_h32-8,b64_l32768_h32-8,b256_l4096_h32-8,zipf64_h32-8,b64_l4096_p1_h32-8
for r in 1 2; do for s in 4x16s2b3 4x16s3; do
  KVATTN_PREFILL_DECODE_SHAPE=$s timeout 90 $D/kvattn4 bench decode --cases $C > "$out/r$r-$s.txt" 2>&1
  echo "== round $r shape $s"; cut -c1-100 "$out/r$r-$s.txt" | tail -7
done; done
echo "t=$((SECONDS - t0)) s"
