#!/usr/bin/env bash
# Session 13 call 4: plan() A/B in five rounds, each plan followed by its run and a sync:
# kvattn_old (c4f35d8's library), kvattn_new (stream-written flag), kvattn_new with
# KVATTN_PLAN_EVENTS=1 (the same binary's event path); plan phases incl. page 1; staging tests.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s13; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for b in old new; do $D/kvattn_$b jit precompile --preset decode -j 16 2>&1 | tail -1; done
C=b256_l4096_h32-8,zipf64_h32-8,b1_l32768_h32-8,b16_l4096_h32-8,b64_l4096_p1_h32-8
for r in 1 2 3 4 5; do for b in old new events; do echo "== $b r$r"
  if [[ $b == events ]]; then KVATTN_PLAN_EVENTS=1 $D/kvattn_new bench decode --cases $C --iters 5 2>&1 | tail -n +2
  else $D/kvattn_$b bench decode --cases $C --iters 5 2>&1 | tail -n +2; fi; done; done > "$out/plan-ab.txt" 2>&1
sed -E "s/ +/ /g" "$out/plan-ab.txt" | cut -c1-100
for v in old new events; do for c in b256_l4096_h32-8 b64_l4096_p1_h32-8; do
  b=$v; [[ $v == events ]] && b=new
  KVATTN_PLAN_EVENTS=$([[ $v == events ]] && echo 1 || echo 0) KVATTN_PLAN_TRACE=1 $D/kvattn_$b bench decode --cases $c --iters 3 > "$out/trace-$v-$c.txt" 2>&1
  echo "== trace $v $c"; grep "^\[plan\]" "$out/trace-$v-$c.txt" | tail -3; done; done
echo "bench t=$((SECONDS - t0)) s"
$D/tests_new --gtest_filter='GpuPlanStaging.*' > "$out/tests.log" 2>&1
echo "tests exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -4
compute-sanitizer --tool memcheck --error-exitcode 3 $D/tests_new --gtest_filter='GpuPlanStaging.*' --gtest_brief=1 > "$out/memcheck.log" 2>&1
echo "memcheck exit $? at $((SECONDS - t0)) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | head -3
