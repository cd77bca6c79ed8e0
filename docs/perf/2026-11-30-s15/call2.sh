#!/usr/bin/env bash
# Session 15 call 2 (53a0a95 + default shape 4x16s2b3): the issue-4 grid on the decode kernels and
# on the prefill kernels' new decode shape (two rounds); planner settings for the prefill path's
# short batches; the GPU suites; memcheck over the decode shapes.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s15; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for p in default decode prefill; do $D/kvattn2 jit precompile --preset $p -j 16 2>&1 | tail -1; done
C=b1_l512_h32-8,b1_l4096_h32-8,b1_l32768_h32-8,b16_l512_h32-8,b16_l4096_h32-8,b16_l32768_h32-8,b64_l512_h32-8,b64_l4096_h32-8,b64_l32768_h32-8,b256_l512_h32-8,b256_l4096_h32-8,b256_l32768_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8,b64_l4096_p1_h32-8
for r in 1 2; do
  timeout 120 $D/kvattn2 bench decode --cases $C > "$out/grid-r$r-decode.txt" 2>&1
  timeout 120 $D/kvattn2 bench decode --via-prefill --cases $C > "$out/grid-r$r-prefill.txt" 2>&1
done
paste <(cut -c1-62 "$out/grid-r1-decode.txt") <(cut -c47-62 "$out/grid-r2-decode.txt") <(cut -c47-62 "$out/grid-r1-prefill.txt") <(cut -c47-62 "$out/grid-r2-prefill.txt") | tail -17
echo "grid t=$((SECONDS - t0)) s"
S=b16_l512_h32-8,b64_l512_h32-8,b64_l1016_h32-8,long32k_63x512_h32-8,b64_l4096_h32-8,zipf64_h32-8
for opt in "--workers 264" "--workers 528" "--workers 792" "--split-size 256" "--split-size 512" "--split-size 1024"; do
  echo "== via-prefill $opt"; timeout 60 $D/kvattn2 bench decode --via-prefill $opt --cases $S 2>&1 | cut -c1-62 | tail -6
done
echo "planner t=$((SECONDS - t0)) s"
timeout 300 $D/tests2 --gtest_filter='GpuPrefill.*:GpuDecode.*:GpuGraph.*:GpuBlockSparse.*:GpuPageTable.*' > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -8
timeout 150 compute-sanitizer --tool memcheck $D/tests2 --gtest_filter='GpuPrefill.DecodeShapes:GpuDecode.OnThePrefillKernels' > "$out/memcheck.log" 2>&1
echo "memcheck exit $? t=$((SECONDS - t0)) s"; tail -2 "$out/memcheck.log"
