#!/usr/bin/env bash
# Session 15 call 9: decode shapes with more KV warps per CTA and fewer CTAs per SM (6 x 16 tokens
# at 2 CTAs per SM, 8 x 16 at 1), so that the sm_90 route plans fewer workers (264, 128) and
# uniform batches need no split; against the default 4x16s2b3. Route and --via-prefill, GB/s and
# plan() medians; the decode-on-prefill tests under 6x16s2b2.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s15; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn9 jit precompile --preset default -j 16 2>&1 | tail -1
S="4x16s2b3 6x16s2b2 8x16s2 6x16s3b1"
for s in $S; do KVATTN_PREFILL_DECODE_SHAPE=$s $D/kvattn9 jit precompile --preset decode -j 16 2>&1 | tail -1; done
C=b16_l4096_h32-8,b16_l32768_h32-8,b64_l4096_h32-8,b64_l32768_h32-8,b256_l4096_h32-8,zipf64_h32-8,b64_l4096_p1_h32-8
V=b64_l4096_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8,b64_l4096_p1_h32-8
for r in 1 2; do for s in $S; do
  KVATTN_PREFILL_DECODE_SHAPE=$s timeout 90 $D/kvattn9 bench decode --cases $C > "$out/r$r-route-$s.txt" 2>&1
  echo "== round $r route $s"; cut -c1-30,46-58,67-77 "$out/r$r-route-$s.txt" | tail -7
done; done
for s in $S; do
  KVATTN_PREFILL_DECODE_SHAPE=$s timeout 90 $D/kvattn9 bench decode --via-prefill --cases $V > "$out/via-$s.txt" 2>&1
  echo "== via-prefill $s"; cut -c1-30,46-58 "$out/via-$s.txt" | tail -5
done
echo "bench t=$((SECONDS - t0)) s"
KVATTN_PREFILL_DECODE_SHAPE=6x16s2b2 timeout 200 $D/tests9 --gtest_filter='GpuDecodeRoute.*:GpuDecode.OnThePrefillKernels' > "$out/tests-6x16.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  PASSED|       OK)" "$out/tests-6x16.log" | tail -4
