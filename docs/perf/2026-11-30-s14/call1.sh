#!/usr/bin/env bash
# Session 14 call 1: the dynamic decode grid (KVATTN_DECODE_GRID=dynamic) - its test first, then
# A/B of old (31d0459) / new items grid / new dynamic grid on the issue-4 rows, split sizes for
# 1 x 32k, then the decode/graph/staging suites under the dynamic grid and by default.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s14; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_old jit precompile --preset default -j 16 2>&1 | tail -1
$D/kvattn_new jit precompile --preset default -j 16 2>&1 | tail -1
KVATTN_DECODE_GRID=dynamic $D/kvattn_new jit precompile --preset default -j 16 2>&1 | tail -1
echo "jit t=$((SECONDS - t0)) s"
timeout 120 $D/tests_new --gtest_filter='GpuDecode.DynamicGrid*' > "$out/t-dyn.log" 2>&1
echo "dyn test exit $? t=$((SECONDS - t0)) s"; grep -E "Failure|FAILED|PASSED|rror" "$out/t-dyn.log" | head -20
C=b1_l32768_h32-8,b64_l4096_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8,b16_l4096_h32-8,b1_l4096_h32-8,b64_l512_h32-8
for r in 1 2; do
  timeout 60 $D/kvattn_old bench decode --cases $C > "$out/r$r-old.txt" 2>&1
  timeout 60 $D/kvattn_new bench decode --cases $C > "$out/r$r-new.txt" 2>&1
  KVATTN_DECODE_GRID=dynamic timeout 60 $D/kvattn_new bench decode --cases $C > "$out/r$r-dyn.txt" 2>&1
  echo "round $r t=$((SECONDS - t0)) s"
done
for f in r1-old r1-new r1-dyn r2-old r2-new r2-dyn; do echo "== $f"; cut -c1-75 "$out/$f.txt"; done
for s in 2048 1024 512 256 128; do
  for g in items dynamic; do
    echo "== 1 x 32k split $s $g: $(KVATTN_DECODE_GRID=$g timeout 30 $D/kvattn_new bench decode --cases b1_l32768_h32-8 --split-size $s 2>&1 | tail -1 | cut -c1-75)"
  done
done
for w in 264 396; do
  echo "== 1 x 32k workers $w dynamic: $(KVATTN_DECODE_GRID=dynamic timeout 30 $D/kvattn_new bench decode --cases b1_l32768_h32-8 --workers $w 2>&1 | tail -1 | cut -c1-75)"
done
echo "bench t=$((SECONDS - t0)) s"
KVATTN_DECODE_GRID=dynamic timeout 150 $D/tests_new --gtest_filter='GpuDecode.*:GpuGraph.*:GpuPlanStaging.*' > "$out/t-dyn-suites.log" 2>&1
echo "dyn suites exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  PASSED)|tests ran" "$out/t-dyn-suites.log" | tail -8
timeout 120 $D/tests_new --gtest_filter='GpuDecode.*:GpuGraph.*:GpuPlanStaging.*' > "$out/t-default.log" 2>&1
echo "default suites exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  PASSED)|tests ran" "$out/t-default.log" | tail -8
timeout 100 compute-sanitizer --tool memcheck $D/tests_new --gtest_filter='GpuDecode.DynamicGrid*' > "$out/memcheck.log" 2>&1
echo "memcheck exit $? t=$((SECONDS - t0)) s"; tail -3 "$out/memcheck.log"
