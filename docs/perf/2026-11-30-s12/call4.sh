#!/usr/bin/env bash
# Session 12 call 4 (370aabc): bench prefill (final kernels, tanh.approx soft-cap rows too), then
# the prefill peers in the same call (run-peers).
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s12; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
KVATTN_PREFILL_TANH=approx $D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
echo "== bench prefill (final)"; $D/kvattn_new bench prefill > "$out/bench-prefill.txt" 2>&1
sed -E "s/ +/ /g" "$out/bench-prefill.txt" | cut -c1-64
S=hd128_causal_1x16384,hd128_causal_1x16384_softcap
for r in 1 2; do echo "== exact r$r"; $D/kvattn_new bench prefill --cases $S 2>&1 | tail -n +2
  echo "== approx r$r"; KVATTN_PREFILL_TANH=approx $D/kvattn_new bench prefill --cases $S 2>&1 | tail -n +2; done > "$out/softcap.txt" 2>&1
sed -E "s/ +/ /g" "$out/softcap.txt" | cut -c1-64
echo "t=$((SECONDS - t0)) s"
KVATTN_BIN=$D/kvattn_new KVATTN_COMMIT=370aabc OUT="$out" timeout $((560 - (SECONDS - t0))) bench/run-peers --fi-cache-in .fi-cache --no-decode --no-cascade --budget $((500 - (SECONDS - t0))) > "$out/run-peers-stdout.log" 2>&1
echo "run-peers exit $? at $((SECONDS - t0)) s"; grep -E "^\| (1|4|16|append|zipf)" "$out/run-peers-stdout.log" | head -30
