#!/usr/bin/env bash
# Session 16 call 2: soft-cap's half tiles (tuning bit 512, with the fixed shift 256): a tile's
# two halves of keys, Q K^T of both first, then each half's softmax and P V. hd 128 causal 1 x 16k
# over the tuning bits (two rounds); the soft-cap GPU tests on two half-tile tunings.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s16; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
TUNINGS="261 287 768 773 776 781 799 832 837 863"
$D/kvattn2 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
for t in $TUNINGS; do KVATTN_PREFILL_TUNING=$t $D/kvattn2 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
echo "precompiled t=$((SECONDS - t0)) s"
for r in 1 2; do
  { echo "== round $r default"; timeout 60 $D/kvattn2 bench prefill --cases hd128_causal_1x16384,hd128_causal_1x16384_softcap 2>&1 | tail -2
    for t in $TUNINGS; do
      echo "== round $r t$t"; KVATTN_PREFILL_TUNING=$t timeout 60 $D/kvattn2 bench prefill --cases hd128_causal_1x16384_softcap 2>&1 | tail -1
    done; } >> "$out/rows.txt"
done
cut -c1-110 "$out/rows.txt"
echo "bench t=$((SECONDS - t0)) s"
for t in 799 773; do
  KVATTN_PREFILL_TUNING=$t timeout 100 $D/tests2 --gtest_filter='GpuPrefill.SoftCap*' > "$out/tests-t$t.log" 2>&1
  echo "tests t$t exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  PASSED)" "$out/tests-t$t.log" | tail -3
done
