#!/usr/bin/env bash
# Session 11 call 1: prefill row sums on the tensor cores with P packed after the softmax
# (tuning bit 8) against the session 10 tuning, generated values; tests with the bit on.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit LD_LIBRARY_PATH=$PWD/.scratch:${LD_LIBRARY_PATH:-}; D=.scratch/s11; out=${OUT:-gpu-out}; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
for t in 1 5 7 9 13 15; do KVATTN_PREFILL_TUNING=$t $D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
echo "precompiled t=$((SECONDS - t0)) s"
K=hd128_causal_1x16384,hd128_full_1x16384,hd128_causal_1x16384_p16,hd128_causal_1x16384_softcap,hd128_causal_1x16384_gqa,hd64_causal_1x16384,hd64_full_16x1024,hd256_causal_1x16384,hd128_append_16x512_on_4k_p16
for r in 1 2; do for t in default 1 5 7 9 13 15; do
  echo "== tuning $t r$r"
  if [[ $t == default ]]; then $D/kvattn_new bench prefill --cases $K 2>&1 | tail -n +2; else KVATTN_PREFILL_TUNING=$t $D/kvattn_new bench prefill --cases $K 2>&1 | tail -n +2; fi
done; echo "t=$((SECONDS - t0)) s"; done
for t in 15 13; do
  KVATTN_PREFILL_TUNING=$t $D/kvattn_new jit precompile --preset default -j 16 2>&1 | tail -1
  left=$((560 - (SECONDS - t0))); [[ $left -lt 30 ]] && break
  KVATTN_PREFILL_TUNING=$t timeout $left $D/tests_new --gtest_filter='GpuPrefill.*:GpuBlockSparse.*:GpuDecode.OnThePrefillKernels' > "$out/tests-t$t.log" 2>&1
  echo "tests t$t exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests-t$t.log" | tail -10
done
