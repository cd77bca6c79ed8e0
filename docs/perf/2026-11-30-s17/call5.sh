#!/usr/bin/env bash
# Session 17 call 5 (hd 64 tanh.approx soft-cap on two stages in halves): bench prefill's soft-cap
# cases (default and exact) with their plain twins, two rounds; the prefill and block-sparse GPU
# suites against float64.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s17; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for p in default bench-prefill; do $D/kvattn5 jit precompile --preset $p -j 16 2>&1 | tail -1; done
SC=hd128_causal_1x16384_softcap,hd64_causal_1x16384_softcap,hd256_causal_1x16384_softcap,hd128_causal_1x16384_gqa_softcap
PL=hd128_causal_1x16384,hd64_causal_1x16384,hd256_causal_1x16384,hd128_causal_1x16384_gqa
for r in 1 2; do
  { echo "== round $r plain"; timeout 60 $D/kvattn5 bench prefill --cases $PL 2>&1 | tail -4
    echo "== round $r soft-cap default (tanh.approx on the long shape)"; timeout 60 $D/kvattn5 bench prefill --cases $SC 2>&1 | tail -4
    echo "== round $r soft-cap KVATTN_PREFILL_TANH=exact"; KVATTN_PREFILL_TANH=exact timeout 60 $D/kvattn5 bench prefill --cases $SC 2>&1 | tail -4
  } >> "$out/rows.txt"
done
cut -c1-110 "$out/rows.txt"; echo "bench t=$((SECONDS - t0)) s"
timeout $((585 - (SECONDS - t0))) $D/tests5 --gtest_filter='GpuPrefill.*:GpuBlockSparse.*' > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED|==========)" "$out/tests.log" | tail -12
