#!/usr/bin/env bash
# Session 10 call 1: prefill main-loop experiments (KVATTN_PREFILL_EXP bits) and the decode prologue-ids branch.
D=.scratch/s10; export KVATTN_CACHE_DIR=/tmp/jit; t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
P=hd128_causal_1x16384,hd128_full_1x16384,hd128_causal_1x16384_p16,hd128_causal_1x16384_softcap,hd64_full_1x16384,hd256_full_4x4096
for r in 1 2; do
  echo "== prefill main r$r"; $D/kvattn_main bench prefill --cases $P 2>&1
  for e in 0 1 2 3 4 7; do
    echo "== prefill exp$e r$r"; KVATTN_PREFILL_EXP=$e $D/kvattn_exp bench prefill --cases $P 2>&1
  done
  echo "t=$(( $(date +%s) - t0 )) s"
done
C=b1_l32768_h32-8,b64_l4096_h32-8,b1_l4096_h32-8,zipf64_h32-8,b64_l512_h32-8
for r in 1 2; do
  echo "== decode main r$r"; $D/kvattn_main bench decode --cases $C 2>&1
  echo "== decode prologue r$r"; $D/kvattn_prologue bench decode --cases $C 2>&1
done
echo "t=$(( $(date +%s) - t0 )) s"
KVATTN_PREFILL_EXP=7 $D/kvattn_exp jit precompile --preset default -j 16 2>&1 | tail -1
KVATTN_PREFILL_EXP=7 timeout 200 $D/tests_exp --gtest_filter='GpuPrefill.*:GpuBlockSparse.*' --gtest_brief=1 > $OUT/tests-exp7.log 2>&1; echo "tests exp7 rc=$? t=$(( $(date +%s) - t0 )) s"
grep -E "PASSED|FAILED|SKIPPED" $OUT/tests-exp7.log | head -20
