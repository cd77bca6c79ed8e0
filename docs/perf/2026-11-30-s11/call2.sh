#!/usr/bin/env bash
# Session 11 call 2: P packed right after the softmax (tuning bit 8, d still summed in f32)
# against the session 10 tuning, generated values; prefill suites with every bit on.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit2; D=.scratch/s11; out=${OUT:-gpu-out}; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for t in 1 5 7 9 13 15; do KVATTN_PREFILL_TUNING=$t $D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
KVATTN_PREFILL_TUNING=15 $D/kvattn_new jit precompile --preset default -j 16 2>&1 | tail -1
echo "precompiled t=$((SECONDS - t0)) s"
K=hd128_causal_1x16384,hd128_full_1x16384,hd128_causal_1x16384_p16,hd128_causal_1x16384_softcap,hd128_causal_1x16384_gqa,hd64_causal_1x16384,hd64_full_16x1024,hd256_causal_1x16384,hd128_append_16x512_on_4k_p16
for r in 1 2 3; do for t in 1 9 5 13 7 15; do
  echo "== tuning $t r$r"; KVATTN_PREFILL_TUNING=$t $D/kvattn_new bench prefill --cases $K 2>&1 | tail -n +2
done; echo "t=$((SECONDS - t0)) s"; done
left=$((570 - (SECONDS - t0)))
KVATTN_PREFILL_TUNING=15 timeout $left $D/tests_new --gtest_filter='GpuPrefill.*:GpuBlockSparse.*:GpuDecode.OnThePrefillKernels' > "$out/tests-t15.log" 2>&1
echo "tests t15 exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests-t15.log" | tail -10
