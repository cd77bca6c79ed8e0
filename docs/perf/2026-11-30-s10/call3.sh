#!/usr/bin/env bash
# Session 10 call 3: the tuned prefill kernels (kvattn_new) against main, tests, memcheck.
D=.scratch/s10; export KVATTN_CACHE_DIR=/tmp/jit; t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_new jit precompile --preset default -j 16 2>&1 | tail -1
$D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
$D/kvattn_main jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
echo "== full main"; $D/kvattn_main bench prefill 2>&1
echo "== full new"; $D/kvattn_new bench prefill 2>&1
echo "t=$(( $(date +%s) - t0 )) s"
K=hd64_full_1x16384,hd64_causal_1x16384,hd128_causal_1x16384,hd128_causal_1x16384_softcap,hd256_causal_1x16384,hd256_full_4x4096
for r in 1 2; do
  echo "== key main r$r"; $D/kvattn_main bench prefill --cases $K 2>&1 | tail -n +2
  echo "== key new r$r"; $D/kvattn_new bench prefill --cases $K 2>&1 | tail -n +2
done
echo "== softcap tanh approx"; KVATTN_PREFILL_TANH=approx $D/kvattn_new bench prefill --cases hd128_causal_1x16384_softcap 2>&1 | tail -n +2
H=hd128_causal_1x16384,hd128_full_1x16384,hd128_causal_1x16384_p16
for t in 0 2 6; do
  echo "== m2k48s3 tuning $t"; KVATTN_PREFILL_VARIANT=m2k48s3 KVATTN_PREFILL_TUNING=$t $D/kvattn_new bench prefill --cases $H 2>&1 | tail -n +2
done
echo "t=$(( $(date +%s) - t0 )) s"
timeout 200 $D/tests_new --gtest_filter='GpuPrefill.*:GpuBlockSparse.*:GpuPageTable.*:GpuDecode.OnThePrefillKernels:PrefillConfig*:PrefillVariantEnv*' --gtest_brief=1 > $OUT/tests.log 2>&1; echo "tests rc=$? t=$(( $(date +%s) - t0 )) s"
grep -E "PASSED|FAILED|SKIPPED" $OUT/tests.log | head -20
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $D/tests_new --gtest_filter='GpuPrefill.RequestLengths:GpuPrefill.Variants*:GpuBlockSparse.BlockShapes' --gtest_brief=1 > $OUT/memcheck.log 2>&1; echo "memcheck rc=$? t=$(( $(date +%s) - t0 )) s"
grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -5
