#!/usr/bin/env bash
# Session 16 call 6: soft-cap on other long tile shapes (KVATTN_PREFILL_VARIANT m1k64, m2k32, m2w8,
# m2k48) at tunings 863, 1887 and 799, against the default m2k64; hd 128 and hd 64 causal 1 x 16k.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s16; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
SC=hd128_causal_1x16384_softcap,hd64_causal_1x16384_softcap
$D/kvattn5 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
for v in m1k64 m2k32 m2w8 m2k48; do for t in 863 1887 799; do
  KVATTN_PREFILL_VARIANT=$v KVATTN_PREFILL_TUNING=$t $D/kvattn5 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
done; done
KVATTN_PREFILL_TUNING=863 $D/kvattn5 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
echo "precompiled t=$((SECONDS - t0)) s"
for r in 1 2; do
  { echo "== round $r plain + m2k64 863"; timeout 60 $D/kvattn5 bench prefill --cases hd128_causal_1x16384 2>&1 | tail -1
    KVATTN_PREFILL_TUNING=863 timeout 60 $D/kvattn5 bench prefill --cases $SC 2>&1 | tail -2
    for v in m1k64 m2k32 m2w8 m2k48; do for t in 863 1887 799; do
      echo "== round $r $v t$t"; KVATTN_PREFILL_VARIANT=$v KVATTN_PREFILL_TUNING=$t timeout 60 $D/kvattn5 bench prefill --cases $SC 2>&1 | tail -2
    done; done; } >> "$out/rows.txt"
done
cut -c1-110 "$out/rows.txt"
echo "bench t=$((SECONDS - t0)) s"
