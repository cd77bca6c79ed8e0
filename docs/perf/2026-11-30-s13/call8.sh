#!/usr/bin/env bash
# Session 13 call 8 (10cb283, final): decode, ops, page-table, graph, staging and prefill suites;
# bench decode's issue-4 rows with plan() timed the new way (median / p90 of 200, each plan
# followed by its run).
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s13; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_fin jit precompile --preset default -j 16 2>&1 | tail -1
C=b64_l4096_h32-8,b1_l32768_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8,b64_l4096_p1_h32-8,b256_l4096_h32-8,b16_l4096_h32-8
$D/kvattn_fin bench decode --cases $C > "$out/decode.txt" 2>&1; sed -E "s/ +/ /g" "$out/decode.txt" | cut -c1-100
$D/kvattn_fin bench decode --json --cases $C > "$out/decode.json" 2>&1
echo "bench t=$((SECONDS - t0)) s"
timeout $((370 - (SECONDS - t0))) $D/tests_fin --gtest_filter='GpuDecode.*:GpuOps.*:GpuPageTable.*:GpuGraph.*:GpuPlanStaging.*:GpuPrefill.RequestLengths:GpuPrefill.GroupSizesPageSizesLayouts:GpuPrefill.HeadDims' > "$out/tests.log" 2>&1
echo "tests exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -10
