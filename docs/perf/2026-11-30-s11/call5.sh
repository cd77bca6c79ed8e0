#!/usr/bin/env bash
# Session 11 call 5 (see commit): lean paged copies (kvattn_new) against 89c2e8b (kvattn_final),
# paged-relevant prefill suites and memcheck on the new kernels. No peers (device budget).
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s11; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_new jit precompile --preset default -j 16 2>&1 | tail -1
$D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
$D/kvattn_final jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
K=hd128_causal_1x16384,hd128_causal_1x16384_p16,hd128_causal_1x16384_p1,hd128_append_16x512_on_4k_p16
for r in 1 2; do for b in final new; do
  echo "== $b r$r"; $D/kvattn_$b bench prefill --cases $K 2>&1 | tail -n +2
done; done
echo "t=$((SECONDS - t0)) s"
T='GpuPrefill.GroupSizesPageSizesLayouts:GpuPrefill.RequestLengths:GpuPrefill.QueryLengthsUpToKVLength:GpuPrefill.LongCache16k:GpuPrefill.HeadDims:GpuPrefill.DtypeCombinations:GpuPrefill.EmptyRequestsAndBatches:GpuPageTable.PrefillKernelsReadDeviceIdsInPlace:GpuBlockSparse.BlockShapes:GpuDecode.OnThePrefillKernels'
timeout $((170 - (SECONDS - t0))) $D/tests_new --gtest_filter="$T" > "$out/tests.log" 2>&1
echo "tests exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -10
timeout $((195 - (SECONDS - t0))) compute-sanitizer --tool memcheck --error-exitcode 3 $D/tests_new --gtest_filter='GpuPrefill.RequestLengths:GpuBlockSparse.BlockShapes' --gtest_brief=1 > "$out/memcheck.log" 2>&1
echo "memcheck exit $? at $((SECONDS - t0)) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | head -3
