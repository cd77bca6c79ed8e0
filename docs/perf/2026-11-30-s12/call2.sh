#!/usr/bin/env bash
# Session 12 call 2 (see commit): soft-cap in cap units (exact and tanh.approx) against a073d20
# (kvattn_old), tuning bits for soft-cap; paged row pairs again; soft-cap tests exact and approx.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s12; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_old jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
KVATTN_PREFILL_TANH=approx $D/kvattn_old jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
$D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
for t in 13 29 31; do KVATTN_PREFILL_TUNING=$t $D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
  KVATTN_PREFILL_TANH=approx KVATTN_PREFILL_TUNING=$t $D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
echo "precompiled t=$((SECONDS - t0)) s"
S=hd128_causal_1x16384_softcap,hd128_causal_1x16384
P=hd128_causal_1x16384,hd128_causal_1x16384_p16,hd128_causal_1x16384_p1,hd128_append_16x512_on_4k_p16
for r in 1 2; do
  echo "== old exact r$r"; $D/kvattn_old bench prefill --cases $S 2>&1 | tail -n +2
  echo "== old approx r$r"; KVATTN_PREFILL_TANH=approx $D/kvattn_old bench prefill --cases $S 2>&1 | tail -n +2
  echo "== new exact t5 r$r"; $D/kvattn_new bench prefill --cases $S 2>&1 | tail -n +2
  for t in 13 29 31; do echo "== new exact t$t r$r"; KVATTN_PREFILL_TUNING=$t $D/kvattn_new bench prefill --cases $S 2>&1 | tail -n +2
    echo "== new approx t$t r$r"; KVATTN_PREFILL_TANH=approx KVATTN_PREFILL_TUNING=$t $D/kvattn_new bench prefill --cases $S 2>&1 | tail -n +2; done
  echo "== paged old r$r"; $D/kvattn_old bench prefill --cases $P 2>&1 | tail -n +2
  echo "== paged new r$r"; $D/kvattn_new bench prefill --cases $P 2>&1 | tail -n +2
  echo "t=$((SECONDS - t0)) s"
done > "$out/ab.txt" 2>&1
sed -E "s/ +/ /g" "$out/ab.txt" | cut -c1-60 | head -120
echo "ab done t=$((SECONDS - t0)) s"
T='GpuPrefill.SoftCap*:GpuPrefill.Variants:GpuPrefill.HeadDims:GpuPrefill.SplitSchedulesMatch'
timeout 150 $D/tests_new --gtest_filter="$T" > "$out/tests-exact.log" 2>&1
echo "tests exact exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  PASSED)|Failure|max" "$out/tests-exact.log" | head -12
KVATTN_PREFILL_TANH=approx timeout 120 $D/tests_new --gtest_filter='GpuPrefill.SoftCap*:GpuPrefill.Variants' > "$out/tests-approx.log" 2>&1
echo "tests approx exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  PASSED)|Failure" "$out/tests-approx.log" | head -12
grep -E -A6 "Failure" "$out/tests-approx.log" | head -40
