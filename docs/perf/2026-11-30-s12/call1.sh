#!/usr/bin/env bash
# Session 12 call 1 (e479553): A/B of tuning bits 32 (P V by dim), 64 / 128 (poly 2^x, all / half)
# and the paged row pairs (new t31 vs a073d20's t31), generated values; then the prefill suites
# with every bit (255) and memcheck.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s12; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_old jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
for t in 31 63 159 5 69 77 93 133 21 85 149; do KVATTN_PREFILL_TUNING=$t $D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
echo "precompiled t=$((SECONDS - t0)) s"
H=hd128_causal_1x16384,hd128_full_1x16384,hd128_causal_1x16384_p16,hd128_causal_1x16384_p1
S=hd128_causal_1x16384_softcap
L=hd64_causal_1x16384,hd64_full_16x1024
for r in 1 2; do
  echo "== old default r$r"; $D/kvattn_old bench prefill --cases $H 2>&1 | tail -n +2
  for t in 31 63 159; do echo "== new $t r$r"; KVATTN_PREFILL_TUNING=$t $D/kvattn_new bench prefill --cases $H 2>&1 | tail -n +2; done
  for t in 5 69 77 93 133; do echo "== softcap $t r$r"; KVATTN_PREFILL_TUNING=$t $D/kvattn_new bench prefill --cases $S 2>&1 | tail -n +2; done
  for t in 21 85 149; do echo "== hd64 $t r$r"; KVATTN_PREFILL_TUNING=$t $D/kvattn_new bench prefill --cases $L 2>&1 | tail -n +2; done
  echo "t=$((SECONDS - t0)) s"
done > "$out/ab.txt" 2>&1
sed -E "s/ +/ /g" "$out/ab.txt" | cut -c1-64 | head -120
echo "ab done t=$((SECONDS - t0)) s"
KVATTN_PREFILL_TUNING=255 $D/kvattn_new jit precompile --preset default -j 16 2>&1 | tail -1
left=$((540 - (SECONDS - t0)))
KVATTN_PREFILL_TUNING=255 timeout $left $D/tests_new --gtest_filter='GpuPrefill.*:GpuBlockSparse.*:GpuDecode.OnThePrefillKernels:GpuPageTable.PrefillKernelsReadDeviceIdsInPlace' > "$out/tests-t255.log" 2>&1
echo "tests t255 exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests-t255.log" | tail -12
