#!/usr/bin/env bash
# Session 16 call 1: bf16 soft-cap with one fixed shift instead of a row maximum (tuning bit 256):
# hd 128 causal 1 x 16k, plain and soft-capped, over the tuning bits (two rounds); the soft-cap
# and prefill GPU tests against float64.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s16; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
TUNINGS="5 261 256 264 269 277 285 287 320 333"
$D/kvattn1 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
for t in $TUNINGS; do KVATTN_PREFILL_TUNING=$t $D/kvattn1 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
echo "precompiled t=$((SECONDS - t0)) s"
for r in 1 2; do
  timeout 60 $D/kvattn1 bench prefill --cases hd128_causal_1x16384,hd128_causal_1x16384_softcap > "$out/r$r-default.txt" 2>&1
  echo "== round $r default"; cut -c1-110 "$out/r$r-default.txt" | tail -2
  for t in $TUNINGS; do
    KVATTN_PREFILL_TUNING=$t timeout 60 $D/kvattn1 bench prefill --cases hd128_causal_1x16384_softcap > "$out/r$r-t$t.txt" 2>&1
    echo "== round $r t$t"; cut -c1-110 "$out/r$r-t$t.txt" | tail -1
  done
done
echo "bench t=$((SECONDS - t0)) s"
timeout 300 $D/tests1 --gtest_filter='GpuPrefill.*:GpuBlockSparse.*:GpuDecode.OnThePrefillKernels*' > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -8
grep -B3 -A12 "SoftCapShift" "$out/tests.log" | grep -E "Failure|error|FAILED" | head
