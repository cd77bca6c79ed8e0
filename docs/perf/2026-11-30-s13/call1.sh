#!/usr/bin/env bash
# Session 13 call 1: plan() with the upload kernel (kvattn_new) against c4f35d8 (kvattn_old):
# bench decode A/B (two rounds), plan phases, the planner's CPU speed here, tests, memcheck.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s13; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
lscpu | grep -E "Model name|MHz" | head -3; env | wc -l
for b in old new; do $D/kvattn_$b jit precompile --preset decode -j 16 2>&1 | tail -1; done
$D/kvattn_new jit precompile --preset prefill -j 16 2>&1 | tail -1
echo "precompile t=$((SECONDS - t0)) s"
C=b256_l4096_h32-8,zipf64_h32-8,b64_l4096_h32-8,b1_l32768_h32-8,long32k_63x512_h32-8,b16_l4096_h32-8
for r in 1 2; do for b in old new; do echo "== $b r$r"; $D/kvattn_$b bench decode --cases $C --iters 10 2>&1 | tail -n +2; done; done > "$out/plan-ab.txt" 2>&1
sed -E "s/ +/ /g" "$out/plan-ab.txt" | cut -c1-90
for b in old new; do KVATTN_PLAN_TRACE=1 $D/kvattn_$b bench decode --cases b256_l4096_h32-8 --iters 3 > "$out/trace-$b.txt" 2>&1; echo "== trace $b"; grep "^\[plan\]" "$out/trace-$b.txt" | tail -3; done
LD_LIBRARY_PATH=$D $D/plan_bench --benchmark_filter='BM_PlanDecodeBench/' --benchmark_min_time=0.5 2>&1 | tail -9 > "$out/plan-bench.txt"; cat "$out/plan-bench.txt"
echo "bench t=$((SECONDS - t0)) s"
timeout $((480 - (SECONDS - t0))) $D/tests_new --gtest_filter='GpuPlanUpload.*:GpuGraph.*:GpuDecode.*:GpuPageTable.*:GpuOps.*:GpuPrefill.RequestLengths:GpuPrefill.GroupSizesPageSizesLayouts:GpuPrefill.Variants*:GpuBlockSparse.BlockShapes' > "$out/tests.log" 2>&1
echo "tests exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -10
timeout $((570 - (SECONDS - t0))) compute-sanitizer --tool memcheck --error-exitcode 3 $D/tests_new --gtest_filter='GpuPlanUpload.*:GpuGraph.*:GpuDecode.SkewedBatches' --gtest_brief=1 > "$out/memcheck.log" 2>&1
echo "memcheck exit $? at $((SECONDS - t0)) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | head -3
