#!/usr/bin/env bash
# Session 16 call 3: soft-cap's tile parts: halves (863 = the five bits + whole-tile transform +
# shift + halves), quarters (+1024), the whole Q K^T in one pass (+2048); tanh.approx beside as
# a bound. hd 128 causal 1 x 16k, two rounds.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s16; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
TUNINGS="863 1887 2911 3935 2847"
$D/kvattn3 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
for t in $TUNINGS; do KVATTN_PREFILL_TUNING=$t $D/kvattn3 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
for t in 863 1887; do KVATTN_PREFILL_TANH=approx KVATTN_PREFILL_TUNING=$t $D/kvattn3 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
echo "precompiled t=$((SECONDS - t0)) s"
for r in 1 2; do
  { echo "== round $r default"; timeout 60 $D/kvattn3 bench prefill --cases hd128_causal_1x16384,hd128_causal_1x16384_softcap 2>&1 | tail -2
    for t in $TUNINGS; do
      echo "== round $r t$t"; KVATTN_PREFILL_TUNING=$t timeout 60 $D/kvattn3 bench prefill --cases hd128_causal_1x16384_softcap 2>&1 | tail -1
    done
    for t in 863 1887; do
      echo "== round $r approx t$t"; KVATTN_PREFILL_TANH=approx KVATTN_PREFILL_TUNING=$t timeout 60 $D/kvattn3 bench prefill --cases hd128_causal_1x16384_softcap 2>&1 | tail -1
    done; } >> "$out/rows.txt"
done
cut -c1-110 "$out/rows.txt"
echo "bench t=$((SECONDS - t0)) s"
