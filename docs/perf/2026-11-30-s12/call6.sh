#!/usr/bin/env bash
# Session 12 call 6 (370aabc + experimental shapes m1k32b3/m1k32b4/m1k64b2): 4 warps x 16 rows,
# 3 CTAs per SM (12 warps; 168 registers) against the default m2k64 (8 warps; 255 registers),
# for plain, paged and soft-cap (exact and tanh.approx) hd128 rows.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s12; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
K=hd128_causal_1x16384,hd128_full_1x16384,hd128_causal_1x16384_p16,hd128_causal_1x16384_softcap,hd64_causal_1x16384
run() { echo "== $*"; env "$@" $D/kvattn_new bench prefill --cases $K 2>&1 | tail -n +2; }
for r in 1 2; do
  run KVATTN_PREFILL_X=default
  run KVATTN_PREFILL_TANH=approx
  for t in 13 29 31; do run KVATTN_PREFILL_VARIANT=m1k32b3 KVATTN_PREFILL_TUNING=$t; done
  run KVATTN_PREFILL_VARIANT=m1k32b3 KVATTN_PREFILL_TANH=approx
  run KVATTN_PREFILL_VARIANT=m1k64b2 KVATTN_PREFILL_TUNING=13
  echo "t=$((SECONDS - t0)) s"
done > "$out/ab.txt" 2>&1
sed -E "s/ +/ /g" "$out/ab.txt" | cut -c1-58
