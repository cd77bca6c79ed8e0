#!/usr/bin/env bash
# Session 13 call 6: prefill with the row sums by MMA (kTuneRowSumMMA, kvattn_rs) against the
# same kernels without it (kvattn_new, eb2a147), two alternated rounds on generated values; then
# the prefill peers (run-peers, kvattn_rs) for the errors against float64.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s13; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for b in new rs; do $D/kvattn_$b jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; $D/kvattn_$b jit precompile --preset prefill -j 16 2>&1 | tail -1; done
S=hd128_causal_1x16384,hd128_full_4x4096,hd128_causal_1x16384_p16,hd128_causal_1x16384_p1,hd64_causal_1x16384,hd256_causal_1x16384,hd128_causal_1x16384_softcap,hd128_causal_1x16384_gqa,hd128_append_16x512_on_4k_p16,hd128_causal_zipf16
for r in 1 2; do for b in new rs; do echo "== $b r$r"; $D/kvattn_$b bench prefill --cases $S 2>&1 | tail -n +2; done; done > "$out/rowsum-ab.txt" 2>&1
sed -E "s/ +/ /g" "$out/rowsum-ab.txt" | cut -c1-80
echo "ab t=$((SECONDS - t0)) s"
KVATTN_BIN=$D/kvattn_rs KVATTN_COMMIT=rowsum OUT="$out" timeout $((570 - (SECONDS - t0))) bench/run-peers --fi-cache-in .fi-cache --no-decode --no-cascade --budget $((480 - (SECONDS - t0))) > "$out/run-peers-stdout.log" 2>&1
echo "run-peers exit $? at $((SECONDS - t0)) s"; grep -E "^\| (1|4|16|append|zipf)" "$out/run-peers-stdout.log" | head -30; grep -iE "err" "$out/run-peers-stdout.log" | head -30
