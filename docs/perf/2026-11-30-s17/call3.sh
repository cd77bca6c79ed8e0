#!/usr/bin/env bash
# Session 17 call 3: hd 64 soft-cap through tanh.approx (10.8% cost in call 1, the one soft-cap
# case over 10%): tile shapes (m2k64, m2k48, m2k32) and parts (halves 863, quarters 1887), two
# rounds, with the plain twin beside.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s17; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for v in m2k64 m2k48 m2k32; do for t in 863 1887; do
  KVATTN_PREFILL_VARIANT=$v KVATTN_PREFILL_TUNING=$t $D/kvattn1 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
  KVATTN_PREFILL_VARIANT=$v $D/kvattn1 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
echo "precompiled t=$((SECONDS - t0)) s"
for r in 1 2; do
  echo "== round $r plain default"; timeout 60 $D/kvattn1 bench prefill --cases hd64_causal_1x16384 2>&1 | tail -1
  echo "== round $r plain m2k48"; KVATTN_PREFILL_VARIANT=m2k48 timeout 60 $D/kvattn1 bench prefill --cases hd64_causal_1x16384 2>&1 | tail -1
  echo "== round $r soft-cap default"; timeout 60 $D/kvattn1 bench prefill --cases hd64_causal_1x16384_softcap 2>&1 | tail -1
  for v in m2k64 m2k48 m2k32; do for t in 863 1887; do
    echo "== round $r soft-cap $v t$t"
    KVATTN_PREFILL_VARIANT=$v KVATTN_PREFILL_TUNING=$t timeout 60 $D/kvattn1 bench prefill --cases hd64_causal_1x16384_softcap 2>&1 | tail -1
  done; done
done > "$out/rows.txt"
cut -c1-110 "$out/rows.txt"; echo "t=$((SECONDS - t0)) s"
