#!/usr/bin/env bash
# Session 16 call 7 (final kernels): bench prefill's soft-cap cases and their plain twins (exact
# default, tanh.approx beside); the GPU tests that run soft-cap through the prefill kernels and
# memcheck over the shift's edge cases; then the peers on hd 128 causal 1 x 16k, plain and
# soft-capped (run-peers, FlashInfer compiled in this call).
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s16; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for p in default bench-prefill; do $D/kvattn7 jit precompile --preset $p -j 16 2>&1 | tail -1; done
KVATTN_PREFILL_TANH=approx $D/kvattn7 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
SC=hd64_causal_1x16384_softcap,hd128_causal_1x16384_softcap,hd128_causal_1x16384_gqa_softcap,hd256_causal_1x16384_softcap
PL=hd64_causal_1x16384,hd128_causal_1x16384,hd128_causal_1x16384_gqa,hd256_causal_1x16384
for r in 1 2; do
  { echo "== round $r plain"; timeout 60 $D/kvattn7 bench prefill --cases $PL 2>&1 | tail -4
    echo "== round $r soft-cap (exact, default)"; timeout 60 $D/kvattn7 bench prefill --cases $SC 2>&1 | tail -4
    echo "== round $r soft-cap tanh.approx"; KVATTN_PREFILL_TANH=approx timeout 60 $D/kvattn7 bench prefill --cases $SC 2>&1 | tail -4
  } >> "$out/rows.txt"
done
cut -c1-110 "$out/rows.txt"; echo "bench t=$((SECONDS - t0)) s"
F='GpuPrefill.Variants:GpuPrefill.DecodeShapes:GpuPrefill.SoftCap*:GpuPrefill.SplitSchedulesMatch:GpuPrefill.GraphCaptureOnceReplanAndReplay:GpuBlockSparse.Variants:GpuDecode.OnThePrefillKernels*'
timeout 200 $D/tests7 --gtest_filter="$F" > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -8
timeout 100 compute-sanitizer --tool memcheck $D/tests7 --gtest_filter='GpuPrefill.SoftCapShiftAtTheEdgesOfItsRange' > "$out/memcheck.log" 2>&1
echo "memcheck exit $? t=$((SECONDS - t0)) s"; tail -1 "$out/memcheck.log"
left=$((540 - (SECONDS - t0)))
KVATTN_BIN=$D/kvattn7 KVATTN_COMMIT=${COMMIT:-s16-final} OUT="$out" timeout $left bench/run-peers --no-decode --no-cascade \
  --prefill-cases hd128_causal_1x16384,hd128_causal_1x16384_softcap --budget $((left - 40)) > "$out/run-peers-stdout.log" 2>&1
echo "run-peers exit $? at $((SECONDS - t0)) s"; grep -E "^\| 1 x 16384|flashinfer JIT" "$out/run-peers-stdout.log" | head
rm -f "$out"/*.png "$out/run-peers.log"
