#!/usr/bin/env bash
# Session 17 call 2: the peers in one call with kvattn (run-peers; FlashInfer compiled in this call)
# on the tensor-core prefill issue's rows: hd 128 causal 1 x 16k ragged, page 16, page 1 and soft-cap
# 30 (kvattn's default tanh.approx on the long shape); then memcheck over the soft-cap edge cases.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s17; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn1 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
KVATTN_PREFILL_TANH=exact timeout 60 $D/kvattn1 bench prefill --cases hd128_causal_1x16384,hd128_causal_1x16384_softcap > "$out/exact-rows.txt" 2>&1
cut -c1-110 "$out/exact-rows.txt" | tail -2
KVATTN_BIN=$D/kvattn1 KVATTN_COMMIT=${COMMIT:-s17} OUT="$out" timeout $((470 - (SECONDS - t0))) bench/run-peers --no-decode --no-cascade \
  --prefill-cases hd128_causal_1x16384,hd128_causal_1x16384_p16,hd128_causal_1x16384_p1,hd128_causal_1x16384_softcap \
  --budget $((430 - (SECONDS - t0))) > "$out/run-peers-stdout.log" 2>&1
echo "run-peers exit $? at $((SECONDS - t0)) s"; grep -E "^\| 1 x 16384|flashinfer_jit|left out" "$out/run-peers-stdout.log" | head
timeout $((585 - (SECONDS - t0))) compute-sanitizer --tool memcheck $D/tests1 --gtest_filter='GpuPrefill.SoftCapShiftAtTheEdgesOfItsRange' > "$out/memcheck.log" 2>&1
echo "memcheck exit $? t=$((SECONDS - t0)) s"; tail -2 "$out/memcheck.log"
rm -f "$out"/*.png "$out/run-peers.log"
