#!/usr/bin/env bash
# Session 12 call 7 (36c4757): tuning bit 64 (a mask-free tile's transform in one block) for
# soft-cap (exact and tanh.approx) and ALiBi against the same kernels without it; then the prefill
# suites and memcheck with the new defaults.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s12; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_new jit precompile --preset default -j 16 2>&1 | tail -1
K=hd128_causal_1x16384,hd128_causal_1x16384_softcap,hd128_causal_1x16384_gqa_alibi
run() { echo "== $*"; env "$@" $D/kvattn_new bench prefill --cases $K 2>&1 | tail -n +2; }
for r in 1 2; do
  run KVATTN_PREFILL_X=default
  run KVATTN_PREFILL_TUNING=5
  run KVATTN_PREFILL_TANH=approx
  run KVATTN_PREFILL_TANH=approx KVATTN_PREFILL_TUNING=29
done > "$out/ab.txt" 2>&1
sed -E "s/ +/ /g" "$out/ab.txt" | cut -c1-62
echo "ab t=$((SECONDS - t0)) s"
timeout $((480 - (SECONDS - t0))) $D/tests_new --gtest_filter='GpuPrefill.*:GpuBlockSparse.*:GpuDecode.OnThePrefillKernels:GpuPageTable.PrefillKernelsReadDeviceIdsInPlace' > "$out/tests.log" 2>&1
echo "tests exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -10
timeout $((540 - (SECONDS - t0))) compute-sanitizer --tool memcheck --error-exitcode 3 $D/tests_new --gtest_filter='GpuPrefill.Variants*:GpuPrefill.SoftCap*' --gtest_brief=1 > "$out/memcheck.log" 2>&1
echo "memcheck exit $? at $((SECONDS - t0)) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | head -3
