#!/usr/bin/env bash
# Session 15 call 1: the prefill kernels' decode shape (KV warps splitting each tile): GPU tests
# against float64, then bench decode --via-prefill by shape (two rounds), the decode kernels beside.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s15; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn1 jit precompile --preset default -j 16 2>&1 | tail -1
SHAPES="1x32s2:0 4x16s2b3:31 4x16s2b3:0 4x16s3:31 2x32s2b3:31 2x32s3:31 4x32s2:31 2x16s4:31"
for st in $SHAPES; do
  KVATTN_PREFILL_DECODE_SHAPE=${st%%:*} KVATTN_PREFILL_TUNING=${st##*:} $D/kvattn1 jit precompile --preset decode -j 16 2>&1 | tail -1
done
echo "precompiled t=$((SECONDS - t0)) s"
C=b64_l4096_h32-8,zipf64_h32-8,b64_l1016_h32-8,long32k_63x512_h32-8,b1_l32768_h32-8
for r in 1 2; do
  timeout 60 $D/kvattn1 bench decode --cases $C > "$out/r$r-decode.txt" 2>&1
  echo "== round $r decode kernels"; cut -c1-90 "$out/r$r-decode.txt" | tail -5
  for st in $SHAPES; do
    KVATTN_PREFILL_DECODE_SHAPE=${st%%:*} KVATTN_PREFILL_TUNING=${st##*:} timeout 60 $D/kvattn1 bench decode --via-prefill --cases $C > "$out/r$r-$st.txt" 2>&1
    echo "== round $r shape $st"; cut -c1-90 "$out/r$r-$st.txt" | tail -5
  done
done
echo "bench t=$((SECONDS - t0)) s"
timeout 240 $D/tests1 --gtest_filter='GpuPrefill.DecodeShapes:GpuDecode.OnThePrefillKernels*:GpuPrefill.QueryLengthsUpToKVLength:GpuPrefill.GroupSizesPageSizesLayouts' > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED|       OK)" "$out/tests.log" | tail -8
