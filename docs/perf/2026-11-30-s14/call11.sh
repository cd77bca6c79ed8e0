#!/usr/bin/env bash
# Session 14 call 11: the in-kernel fold rewritten (float4 per thread, slots online with 8 in
# flight; one fence per CTA): its tests, then KVATTN_DECODE_MERGE=fold against the merge kernel.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s14; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn_fold jit precompile --preset default -j 16 2>&1 | tail -1
KVATTN_DECODE_MERGE=fold timeout 200 $D/tests_fold --gtest_filter='GpuDecode.*:GpuGraph.*:GpuPlanStaging.*' > "$out/t-fold.log" 2>&1
echo "fold suites exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  PASSED)|Failure" "$out/t-fold.log" | head -8
C=b1_l512_h32-8,b1_l4096_h32-8,b1_l32768_h32-8,b16_l512_h32-8,b16_l4096_h32-8,b64_l512_h32-8,b64_l4096_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8,b1_l4096_h32-32,b1_l32768_h32-32,b16_l4096_h32-32
for r in 1 2 3; do
  KVATTN_DECODE_MERGE=kernel timeout 90 $D/kvattn_fold bench decode --cases $C > "$out/r$r-kernel.txt" 2>&1
  KVATTN_DECODE_MERGE=fold timeout 90 $D/kvattn_fold bench decode --cases $C > "$out/r$r-fold.txt" 2>&1
done
paste -d'|' <(cut -c1-62 "$out/r1-kernel.txt") <(cut -c44-62 "$out/r1-fold.txt") <(cut -c44-62 "$out/r2-kernel.txt") <(cut -c44-62 "$out/r2-fold.txt") <(cut -c44-62 "$out/r3-kernel.txt") <(cut -c44-62 "$out/r3-fold.txt")
for L in 1024 2048 8192 16384; do
  for m in kernel fold; do echo "1 x $L $m: $(KVATTN_DECODE_MERGE=$m timeout 30 $D/kvattn_fold bench decode --kv-lens $L --cases custom_h32-8 2>&1 | tail -1 | cut -c30-75)"; done
done
echo "t=$((SECONDS - t0)) s"
