#!/usr/bin/env bash
# Session 14 call 2: dynamic grid v2 (static first wave, late claims): its test, then items vs
# dynamic on the issue-4 rows (3 alternations) and split sizes for 1 x 32k.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s14; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn_new2 jit precompile --preset default -j 16 2>&1 | tail -1
KVATTN_DECODE_GRID=dynamic $D/kvattn_new2 jit precompile --preset default -j 16 2>&1 | tail -1
timeout 120 $D/tests_new2 --gtest_filter='GpuDecode.DynamicGrid*' > "$out/t-dyn.log" 2>&1
echo "dyn test exit $? t=$((SECONDS - t0)) s"; grep -E "Failure|FAILED|PASSED|rror" "$out/t-dyn.log" | head -20
C=b1_l32768_h32-8,b64_l4096_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8,b16_l4096_h32-8,b1_l4096_h32-8,b64_l512_h32-8,b256_l4096_h32-8
for r in 1 2 3; do
  timeout 60 $D/kvattn_new2 bench decode --cases $C > "$out/r$r-items.txt" 2>&1
  KVATTN_DECODE_GRID=dynamic timeout 60 $D/kvattn_new2 bench decode --cases $C > "$out/r$r-dyn.txt" 2>&1
done
echo "bench t=$((SECONDS - t0)) s"
paste -d'|' <(cut -c1-62 "$out/r1-items.txt") <(cut -c44-62 "$out/r1-dyn.txt") <(cut -c44-62 "$out/r2-items.txt") <(cut -c44-62 "$out/r2-dyn.txt") <(cut -c44-62 "$out/r3-items.txt") <(cut -c44-62 "$out/r3-dyn.txt")
for s in 1024 512 256; do
  for g in items dynamic; do
    echo "== 1 x 32k split $s $g: $(KVATTN_DECODE_GRID=$g timeout 30 $D/kvattn_new2 bench decode --cases b1_l32768_h32-8 --split-size $s 2>&1 | tail -1 | cut -c30-75)"
  done
done
echo "== 1 x 32k + 63 x 512 split 512 dynamic: $(KVATTN_DECODE_GRID=dynamic timeout 30 $D/kvattn_new2 bench decode --cases long32k_63x512_h32-8 --split-size 512 2>&1 | tail -1 | cut -c30-75)"
echo "t=$((SECONDS - t0)) s"
