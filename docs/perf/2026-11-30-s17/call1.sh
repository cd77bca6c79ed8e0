#!/usr/bin/env bash
# Session 17 call 1: soft-cap's tanh.approx on the long prefill shape by default. bench prefill's
# soft-cap cases (default = tanh.approx, and KVATTN_PREFILL_TANH=exact) with their plain twins, two
# rounds; then the GPU suites that run the prefill kernels and the graph-mode wrappers (the new
# re-plan check) against float64.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s17; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for p in default decode bench-prefill; do $D/kvattn1 jit precompile --preset $p -j 16 2>&1 | tail -1; done
echo "precompiled t=$((SECONDS - t0)) s"
SC=hd128_causal_1x16384_softcap,hd64_causal_1x16384_softcap,hd256_causal_1x16384_softcap,hd128_causal_1x16384_gqa_softcap
PL=hd128_causal_1x16384,hd64_causal_1x16384,hd256_causal_1x16384,hd128_causal_1x16384_gqa
for r in 1 2; do
  { echo "== round $r plain"; timeout 60 $D/kvattn1 bench prefill --cases $PL 2>&1 | tail -4
    echo "== round $r soft-cap default (tanh.approx on the long shape)"; timeout 60 $D/kvattn1 bench prefill --cases $SC 2>&1 | tail -4
    echo "== round $r soft-cap KVATTN_PREFILL_TANH=exact"; KVATTN_PREFILL_TANH=exact timeout 60 $D/kvattn1 bench prefill --cases $SC 2>&1 | tail -4
  } >> "$out/rows.txt"
done
cut -c1-110 "$out/rows.txt"; echo "bench t=$((SECONDS - t0)) s"
F='GpuPrefill.*:GpuBlockSparse.*:GpuDecode.OnThePrefillKernels*:GpuGraph.*:GpuDecodeRoute.*:GpuPlanStaging.*'
timeout $((585 - (SECONDS - t0))) $D/tests1 --gtest_filter="$F" > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED|==========)" "$out/tests.log" | tail -12
grep -E "Failure|Which is|allowed" "$out/tests.log" | head -20
