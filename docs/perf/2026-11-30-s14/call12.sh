#!/usr/bin/env bash
# Session 14 call 12 (d3f1f4a, final): the decode, graph, staging, ops and page-table suites by
# default and under KVATTN_DECODE_MERGE=fold; memcheck over the fold; the issue-4 rows; the
# single-kernel floor (0 and 1 token, TMA boxes on and off).
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s14; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_fin jit precompile --preset default -j 16 2>&1 | tail -1
b() { local e=$1; shift; echo "$e $* :: $(env $e timeout 30 $D/kvattn_fin bench decode --cases custom_h32-8 "$@" 2>&1 | tail -1 | cut -c30-75)"; }
for r in 1 2; do for L in 0 1 16; do b X=1 --kv-lens $L; b KVATTN_DECODE_TMA_BOXES=0 --kv-lens $L; done; done | tee "$out/floor.txt"
C=b64_l4096_h32-8,b1_l32768_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8,b64_l4096_p1_h32-8,b256_l4096_h32-8,b16_l4096_h32-8,b1_l4096_h32-8
timeout 120 $D/kvattn_fin bench decode --cases $C > "$out/decode.txt" 2>&1; cut -c1-100 "$out/decode.txt"
echo "bench t=$((SECONDS - t0)) s"
timeout 200 $D/tests_fin --gtest_filter='GpuDecode.*:GpuOps.*:GpuPageTable.*:GpuGraph.*:GpuPlanStaging.*' > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -6
KVATTN_DECODE_MERGE=fold timeout 150 $D/tests_fin --gtest_filter='GpuDecode.*:GpuGraph.*' > "$out/tests-fold.log" 2>&1
echo "fold tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  PASSED)" "$out/tests-fold.log" | tail -4
KVATTN_DECODE_MERGE=fold timeout 120 compute-sanitizer --tool memcheck $D/tests_fin --gtest_filter='GpuDecode.SplitRowsFoldOnEveryRun:GpuDecode.SkewedBatches' > "$out/memcheck-fold.log" 2>&1
echo "memcheck exit $? t=$((SECONDS - t0)) s"; tail -2 "$out/memcheck-fold.log"
