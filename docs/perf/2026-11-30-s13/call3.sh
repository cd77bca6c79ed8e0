#!/usr/bin/env bash
# Session 13 call 3: plan() A/B, each plan followed by its run and a sync (kvattn_old: c4f35d8's
# library; kvattn_new: copy + cuStreamWriteValue32 flag instead of the event wait, one-pass knobs),
# three rounds; plan phases; tests and memcheck of the staging.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s13; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for b in old new; do $D/kvattn_$b jit precompile --preset default -j 16 2>&1 | tail -1; done
echo "precompile t=$((SECONDS - t0)) s"
C=b256_l4096_h32-8,zipf64_h32-8,b64_l4096_h32-8,b1_l32768_h32-8,long32k_63x512_h32-8,b16_l4096_h32-8,b64_l4096_p1_h32-8
for r in 1 2 3; do for b in old new; do echo "== $b r$r"; $D/kvattn_$b bench decode --cases $C --iters 10 2>&1 | tail -n +2; done; done > "$out/plan-ab.txt" 2>&1
sed -E "s/ +/ /g" "$out/plan-ab.txt" | cut -c1-100
for b in old new; do for c in b256_l4096_h32-8 b1_l32768_h32-8; do KVATTN_PLAN_TRACE=1 $D/kvattn_$b bench decode --cases $c --iters 3 > "$out/trace-$b-$c.txt" 2>&1; echo "== trace $b $c"; grep "^\[plan\]" "$out/trace-$b-$c.txt" | tail -3; done; done
$D/kvattn_new bench decode --json --cases b256_l4096_h32-8,b1_l32768_h32-8 > "$out/new.json" 2>&1
$D/kvattn_new bench cascade --cases casc_b64_p4096_s512,casc_b32_p1024_s77 2>&1 | sed -E "s/ +/ /g"
echo "bench t=$((SECONDS - t0)) s"
timeout $((450 - (SECONDS - t0))) $D/tests_new --gtest_filter='GpuPlanStaging.*:GpuGraph.*:GpuDecode.*:GpuPageTable.*:GpuOps.*:GpuPrefill.RequestLengths:GpuPrefill.GroupSizesPageSizesLayouts:GpuBlockSparse.BlockShapes' > "$out/tests.log" 2>&1
echo "tests exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -10
timeout $((560 - (SECONDS - t0))) compute-sanitizer --tool memcheck --error-exitcode 3 $D/tests_new --gtest_filter='GpuPlanStaging.*:GpuGraph.*:GpuDecode.SkewedBatches' --gtest_brief=1 > "$out/memcheck.log" 2>&1
echo "memcheck exit $? at $((SECONDS - t0)) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | head -3
