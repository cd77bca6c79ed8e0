#!/usr/bin/env bash
# Session 16 call 5: soft-cap at head dims 64, 128 (MHA and 32/8) and 256 (cap 50) beside their
# plain twins, over the tunings: 5 (the old default, no shift), 261 (shift), 287 (five bits +
# shift), 863 (+ whole-tile transform + halves), 1887 (+ quarters), and tanh.approx at 285, 1887.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s16; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
SC=hd64_causal_1x16384_softcap,hd128_causal_1x16384_softcap,hd128_causal_1x16384_gqa_softcap,hd256_causal_1x16384_softcap
PL=hd64_causal_1x16384,hd128_causal_1x16384,hd128_causal_1x16384_gqa,hd256_causal_1x16384
$D/kvattn5 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
for t in 5 287 863 1887; do KVATTN_PREFILL_TUNING=$t $D/kvattn5 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
for t in 285 1887; do KVATTN_PREFILL_TANH=approx KVATTN_PREFILL_TUNING=$t $D/kvattn5 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
echo "precompiled t=$((SECONDS - t0)) s"
for r in 1 2; do
  { echo "== round $r plain"; timeout 60 $D/kvattn5 bench prefill --cases $PL 2>&1 | tail -4
    echo "== round $r default (261)"; timeout 60 $D/kvattn5 bench prefill --cases $SC 2>&1 | tail -4
    for t in 5 287 863 1887; do
      echo "== round $r t$t"; KVATTN_PREFILL_TUNING=$t timeout 60 $D/kvattn5 bench prefill --cases $SC 2>&1 | tail -4
    done
    for t in 285 1887; do
      echo "== round $r approx t$t"; KVATTN_PREFILL_TANH=approx KVATTN_PREFILL_TUNING=$t timeout 60 $D/kvattn5 bench prefill --cases $SC 2>&1 | tail -4
    done; } >> "$out/rows.txt"
done
cut -c1-110 "$out/rows.txt"
echo "bench t=$((SECONDS - t0)) s"
