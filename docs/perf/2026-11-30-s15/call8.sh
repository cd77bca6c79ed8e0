#!/usr/bin/env bash
# Session 15 call 8 (the final test code): the refactored many-plan tests (graph, staging, route)
# and the decode-on-prefill grids, on the GPU.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s15; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
for p in default decode; do $D/kvattn8 jit precompile --preset $p -j 16 2>&1 | tail -1; done
timeout 300 $D/tests8 --gtest_filter='GpuGraph.*:GpuPlanStaging.*:GpuDecodeRoute.*:GpuDecode.OnThePrefillKernels*:GpuDecode.SplitKVMatchesAcrossSchedules' > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED|       OK)" "$out/tests.log" | tail -10
