#!/usr/bin/env bash
# Session 14 call 14: the prefill lazy rescale's threshold (KVATTN_PREFILL_LAZY_LOG2, default 8)
# at 2 and 4: speed on the hd 128 / hd 64 rows whose accuracy it sets (scripts/lazy-rescale-error).
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s14; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
for t in 8 2 4; do KVATTN_PREFILL_LAZY_LOG2=$t $D/kvattn_fin jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
C=hd128_causal_1x16384,hd128_full_4x4096,hd64_full_16x1024,hd128_append_16x512_on_4k_p16,hd128_causal_1x16384_p16
for r in 1 2; do
  for t in 8 2 4; do
    KVATTN_PREFILL_LAZY_LOG2=$t timeout 60 $D/kvattn_fin bench prefill --cases $C > "$out/r$r-t$t.txt" 2>&1
    echo "== r$r threshold $t"; cut -c1-90 "$out/r$r-t$t.txt"
  done
done
echo "t=$((SECONDS - t0)) s"
