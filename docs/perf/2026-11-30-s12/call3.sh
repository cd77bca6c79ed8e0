#!/usr/bin/env bash
# Session 12 call 3 (370aabc): prefill suites, graphs and memcheck on the final kernels; GQA decode
# on the prefill kernels (KVATTN_DECODE_KERNEL=prefill) against the decode kernels.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s12; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_new jit precompile --preset default -j 16 2>&1 | tail -1
C=b64_l4096_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8
for r in 1 2; do for k in prefill default; do
  echo "== decode kernel $k r$r"
  if [[ $k == default ]]; then $D/kvattn_new bench decode --cases $C 2>&1 | tail -n +2; else KVATTN_DECODE_KERNEL=prefill $D/kvattn_new bench decode --cases $C 2>&1 | tail -n +2; fi
done; done > "$out/decode-on-prefill.txt" 2>&1
sed -E "s/ +/ /g" "$out/decode-on-prefill.txt" | cut -c1-90
echo "decode t=$((SECONDS - t0)) s"
timeout $((420 - (SECONDS - t0))) $D/tests_new --gtest_filter='GpuPrefill.*:GpuBlockSparse.*:GpuDecode.OnThePrefillKernels:GpuPageTable.PrefillKernelsReadDeviceIdsInPlace:GpuGraph.*' > "$out/tests.log" 2>&1
echo "tests exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -10
timeout $((540 - (SECONDS - t0))) compute-sanitizer --tool memcheck --error-exitcode 3 $D/tests_new --gtest_filter='GpuPrefill.RequestLengths:GpuPrefill.Variants*:GpuPrefill.GroupSizesPageSizesLayouts:GpuBlockSparse.BlockShapes' --gtest_brief=1 > "$out/memcheck.log" 2>&1
echo "memcheck exit $? at $((SECONDS - t0)) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | head -3
