#!/usr/bin/env bash
# Session 10 call 5: bench prefill on generated values (kvattn_rand) against the constant fill
# (kvattn_const, same kernels); the tuning bits re-measured on generated values.
D=.scratch/s10; export KVATTN_CACHE_DIR=/tmp/jit; t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for t in 1 4 5 7; do KVATTN_PREFILL_TUNING=$t $D/kvattn_rand jit precompile --preset bench-prefill -j 16 > /dev/null 2>&1; done
$D/kvattn_rand jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
K=hd128_causal_1x16384,hd128_full_1x16384,hd128_causal_1x16384_p16,hd128_causal_1x16384_softcap,hd128_causal_1x16384_gqa,hd64_causal_1x16384,hd256_causal_1x16384
echo "== const fill, default tuning"; $D/kvattn_const bench prefill --cases $K 2>&1 | tail -n +2
for r in 1 2; do
  echo "== generated values, default tuning r$r"; $D/kvattn_rand bench prefill --cases $K 2>&1 | tail -n +2
  for t in 1 4 5 7; do
    echo "== generated values, tuning $t r$r"; KVATTN_PREFILL_TUNING=$t $D/kvattn_rand bench prefill --cases $K 2>&1 | tail -n +2
  done
  echo "t=$(( $(date +%s) - t0 )) s"
done
