#!/usr/bin/env bash
# Session 10 call 2: prefill experiment bits on main's exact codegen (EXP=0 == main's cubins).
D=.scratch/s10; export KVATTN_CACHE_DIR=/tmp/jit; t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
P=hd128_causal_1x16384,hd128_full_1x16384,hd128_causal_1x16384_p16,hd128_causal_1x16384_softcap,hd64_full_1x16384,hd256_full_4x4096
for e in 1 2 4 5 8 9 12 13 6 15; do KVATTN_PREFILL_EXP=$e $D/kvattn_exp jit precompile --preset bench-prefill -j 16 > /dev/null 2>&1; done
echo "precompiled t=$(( $(date +%s) - t0 )) s"
for r in 1 2; do
  for e in 0 1 4 5 8 9 12 13 2 6; do
    echo "== prefill exp$e r$r"; KVATTN_PREFILL_EXP=$e $D/kvattn_exp bench prefill --cases $P 2>&1 | tail -n +2
  done
  echo "t=$(( $(date +%s) - t0 )) s"
done
S=hd128_causal_1x16384_softcap
for e in 0 4 5; do
  echo "== softcap tanh approx exp$e"; KVATTN_PREFILL_TANH=approx KVATTN_PREFILL_EXP=$e $D/kvattn_exp bench prefill --cases $S 2>&1 | tail -n +2
  echo "== softcap m2k64 exp$e"; KVATTN_PREFILL_VARIANT=m2k64 KVATTN_PREFILL_EXP=$e $D/kvattn_exp bench prefill --cases $S 2>&1 | tail -n +2
done
echo "t=$(( $(date +%s) - t0 )) s"
KVATTN_PREFILL_EXP=15 $D/kvattn_exp jit precompile --preset default -j 16 2>&1 | tail -1
KVATTN_PREFILL_EXP=15 timeout 220 $D/tests_exp --gtest_filter='GpuPrefill.*:GpuBlockSparse.*' --gtest_brief=1 > $OUT/tests-exp15.log 2>&1; echo "tests exp15 rc=$? t=$(( $(date +%s) - t0 )) s"
grep -E "PASSED|FAILED|SKIPPED" $OUT/tests-exp15.log | head -20
