#!/usr/bin/env bash
# Session 16 call 8 (final kernels: soft-cap's reference fixed per row at its first tile, for
# accuracy): bench prefill's soft-cap cases and their plain twins (exact default, tanh.approx
# beside; one round); the GPU tests that run soft-cap through the prefill kernels and memcheck
# over the edge cases; then the peers on hd 128 causal 1 x 16k, plain and soft-capped (run-peers,
# FlashInfer compiled in this call). Shortened to fit the session's device time.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s16; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for p in default bench-prefill; do $D/kvattn8 jit precompile --preset $p -j 16 2>&1 | tail -1; done
KVATTN_PREFILL_TANH=approx $D/kvattn8 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
SC=hd64_causal_1x16384_softcap,hd128_causal_1x16384_softcap,hd128_causal_1x16384_gqa_softcap,hd256_causal_1x16384_softcap
PL=hd64_causal_1x16384,hd128_causal_1x16384,hd128_causal_1x16384_gqa,hd256_causal_1x16384
for r in 1; do
  { echo "== round $r plain"; timeout 60 $D/kvattn8 bench prefill --cases $PL 2>&1 | tail -4
    echo "== round $r soft-cap (exact, default)"; timeout 60 $D/kvattn8 bench prefill --cases $SC 2>&1 | tail -4
    echo "== round $r soft-cap tanh.approx"; KVATTN_PREFILL_TANH=approx timeout 60 $D/kvattn8 bench prefill --cases $SC 2>&1 | tail -4
  } >> "$out/rows.txt"
done
cut -c1-110 "$out/rows.txt"; echo "bench t=$((SECONDS - t0)) s"
F='GpuPrefill.Variants:GpuPrefill.DecodeShapes:GpuPrefill.SoftCap*:GpuBlockSparse.Variants'
timeout 150 $D/tests8 --gtest_filter="$F" > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -8
timeout 60 compute-sanitizer --tool memcheck $D/tests8 --gtest_filter='GpuPrefill.SoftCapShiftAtTheEdgesOfItsRange' > "$out/memcheck.log" 2>&1
echo "memcheck exit $? t=$((SECONDS - t0)) s"; tail -1 "$out/memcheck.log"
left=$((330 - (SECONDS - t0)))
KVATTN_BIN=$D/kvattn8 KVATTN_COMMIT=${COMMIT:-s16-final} OUT="$out" timeout $left bench/run-peers --no-decode --no-cascade \
  --prefill-cases hd128_causal_1x16384,hd128_causal_1x16384_softcap --budget $((left - 30)) > "$out/run-peers-stdout.log" 2>&1
echo "run-peers exit $? at $((SECONDS - t0)) s"; grep -E "^\| 1 x 16384|flashinfer JIT" "$out/run-peers-stdout.log" | head
rm -f "$out"/*.png "$out/run-peers.log"
