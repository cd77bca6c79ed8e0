#!/usr/bin/env bash
# Session 11 call 3 (89c2e8b): final prefill figures (generated values), the hd128 tuning against session 10's,
# prefill peers in the same call, then the prefill suites and memcheck on the final kernels.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s11; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_final jit precompile --preset default -j 16 2>&1 | tail -1
$D/kvattn_final jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
for t in 7 1; do KVATTN_PREFILL_TUNING=$t $D/kvattn_final jit precompile --preset bench-prefill -j 16 > /dev/null 2>&1; done
echo "== bench prefill (final)"; $D/kvattn_final bench prefill 2>&1 | tee "$out/bench-prefill.txt"
A=hd128_causal_1x16384,hd128_full_1x16384,hd128_append_16x512_on_4k_p16
for r in 1 2; do for t in default 7 1; do
  echo "== $A tuning $t r$r"; if [[ $t == default ]]; then $D/kvattn_final bench prefill --cases $A 2>&1 | tail -n +2; else KVATTN_PREFILL_TUNING=$t $D/kvattn_final bench prefill --cases $A 2>&1 | tail -n +2; fi
done; done
echo "t=$((SECONDS - t0)) s"
KVATTN_BIN=$D/kvattn_final KVATTN_COMMIT=89c2e8b OUT="$out" timeout 240 bench/run-peers --fi-cache-in .fi-cache --no-decode --no-cascade --budget 190 > "$out/run-peers-stdout.log" 2>&1
echo "run-peers exit $? at $((SECONDS - t0)) s"; grep -E "^\| (1|4|16|append)" "$out/run-peers-stdout.log" | head -30
left=$((520 - (SECONDS - t0)))
timeout $left $D/tests_final --gtest_filter='GpuPrefill.*:GpuBlockSparse.*:GpuDecode.OnThePrefillKernels:GpuPageTable.PrefillKernelsReadDeviceIdsInPlace' > "$out/tests.log" 2>&1
echo "tests exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -10
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 $D/tests_final --gtest_filter='GpuPrefill.RequestLengths:GpuPrefill.Variants*:GpuBlockSparse.BlockShapes' --gtest_brief=1 > "$out/memcheck.log" 2>&1
echo "memcheck exit $? at $((SECONDS - t0)) s"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | head -3
