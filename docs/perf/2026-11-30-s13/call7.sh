#!/usr/bin/env bash
# Session 13 call 7 (final kernels: row sums by MMA for one-head hd 64 and paged hd 128): prefill,
# block-sparse, graph, staging and decode-on-prefill suites; every tuning bit together
# (KVATTN_PREFILL_TUNING=255) on the request-length, head-dim and variant cases; memcheck.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s13; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_fin jit precompile --preset default -j 16 2>&1 | tail -1
$D/kvattn_fin jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
timeout 330 $D/tests_fin --gtest_filter='GpuPrefill.*:GpuBlockSparse.*:GpuDecode.OnThePrefillKernels:GpuPageTable.*:GpuGraph.*:GpuPlanStaging.*' > "$out/tests.log" 2>&1
echo "tests exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -10
KVATTN_PREFILL_TUNING=255 timeout $((470 - (SECONDS - t0))) $D/tests_fin --gtest_filter='GpuPrefill.RequestLengths:GpuPrefill.HeadDims:GpuPrefill.Variants:GpuPrefill.GroupSizesPageSizesLayouts' > "$out/tests-t255.log" 2>&1
echo "t255 exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests-t255.log" | tail -6
timeout $((575 - (SECONDS - t0))) compute-sanitizer --tool memcheck --error-exitcode 3 $D/tests_fin --gtest_filter='GpuPrefill.RequestLengths:GpuPrefill.HeadDims' --gtest_brief=1 > "$out/memcheck.log" 2>&1
echo "memcheck exit $? at $((SECONDS - t0)) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | head -3
