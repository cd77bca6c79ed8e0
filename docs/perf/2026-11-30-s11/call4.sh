#!/usr/bin/env bash
# Session 11 call 4 (b197431): ragged row pointers (tuning bit 16) against 89c2e8b (kvattn_final),
# the prefill suites and memcheck on the new kernels, then prefill peers with the new binary.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s11; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_new jit precompile --preset default -j 16 2>&1 | tail -1
$D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
$D/kvattn_final jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
K=hd128_causal_1x16384,hd128_full_1x16384,hd128_causal_1x16384_softcap,hd128_causal_1x16384_gqa,hd64_causal_1x16384,hd64_full_16x1024,hd256_causal_1x16384,hd128_causal_4x4096,hd128_causal_zipf16
for r in 1 2; do for b in final new; do
  echo "== $b r$r"; $D/kvattn_$b bench prefill --cases $K 2>&1 | tail -n +2
done; done
echo "t=$((SECONDS - t0)) s"
timeout $((300 - (SECONDS - t0))) $D/tests_new --gtest_filter='GpuPrefill.*:GpuBlockSparse.*:GpuDecode.OnThePrefillKernels:GpuPageTable.PrefillKernelsReadDeviceIdsInPlace' > "$out/tests.log" 2>&1
echo "tests exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -10
KVATTN_BIN=$D/kvattn_new KVATTN_COMMIT=b197431 OUT="$out" timeout $((470 - (SECONDS - t0))) bench/run-peers --fi-cache-in .fi-cache --no-decode --no-cascade --budget $((420 - (SECONDS - t0))) > "$out/run-peers-stdout.log" 2>&1
echo "run-peers exit $? at $((SECONDS - t0)) s"; grep -E "^\| (1|4|16|append)" "$out/run-peers-stdout.log" | head -30
left=$((520 - (SECONDS - t0)))
[[ $left -gt 20 ]] && timeout $left compute-sanitizer --tool memcheck --error-exitcode 3 $D/tests_new --gtest_filter='GpuPrefill.RequestLengths:GpuPrefill.Variants*:GpuBlockSparse.BlockShapes' --gtest_brief=1 > "$out/memcheck.log" 2>&1
echo "memcheck exit $? at $((SECONDS - t0)) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | head -3
