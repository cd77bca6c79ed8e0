#!/usr/bin/env bash
# Session 16 call 9 (the shift centred, max(0, c L - 64)): the soft-cap GPU tests (the edge test
# now with a window and the decode shape) and one round of the soft-cap rows with their plain twins.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s16; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn9 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
timeout 40 $D/kvattn9 bench prefill --cases hd128_causal_1x16384,hd128_causal_1x16384_softcap,hd256_causal_1x16384,hd256_causal_1x16384_softcap > "$out/rows.txt" 2>&1
cut -c1-110 "$out/rows.txt"; echo "bench t=$((SECONDS - t0)) s"
timeout 90 $D/tests9 --gtest_filter='GpuPrefill.SoftCap*' > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(       OK|  FAILED  |  PASSED)" "$out/tests.log" | tail -5
