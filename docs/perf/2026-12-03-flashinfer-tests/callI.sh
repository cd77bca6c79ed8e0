set -o pipefail
export PYTHONUNBUFFERED=1 KVATTN_CACHE_DIR=/tmp/kvcache
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
T=build/release/tests/kvattn_tests
mkdir -p $OUT/r
start=$(date +%s)
el() { echo "$(( $(date +%s) - start )) s"; }
(CMAKE_BUILD_PARALLEL_LEVEL=12 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site -Ccmake.define.KVATTN_DLPACK_INCLUDE=$PWD/.devcall/inc . > $OUT/r/build.log 2>&1; echo "pkg rc=$?" >> $OUT/r/build.log) &
timeout 230 stdbuf -oL $T --gtest_filter='GpuPrefill.SmallWorkspaceGetsTheUnsplitPlan:GpuPrefill.FailedPlanLeavesTheLastGoodSchedule:GpuUserVariant.*' > $OUT/r/cpp.log 2>&1
echo "cpp rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|FAILED  \]" $OUT/r/cpp.log | head -20; grep -B2 -A10 "Failure" $OUT/r/cpp.log | head -50
wait; tail -3 $OUT/r/build.log; echo "pkg $(el)"
run_batch() { local limit=$1 log=$2; shift 2
  setsid "$@" > $log 2>&1 & local pid=$!
  ( sleep $limit; kill -INT -- -$pid 2>/dev/null; sleep 15; kill -KILL -- -$pid 2>/dev/null ) & local killer=$!
  wait $pid; local rc=$?; kill $killer 2>/dev/null; return $rc; }
left=$(( 560 - ($(date +%s) - start) ))
OUT=$OUT/r/fiS run_batch $(( left / 2 )) $OUT/r/fiS.log env PYTHONPATH=/tmp/site python3 scripts/flashinfer-tests --sample 200 .devcall/tests test_shared_prefix_kernels.py test_batch_decode_kernels.py -- -n 14 --timeout 90
echo "fi S rc=$? $(el)"; sed -n '/^| file/,$p' $OUT/r/fiS.log | head -30
left=$(( 575 - ($(date +%s) - start) ))
OUT=$OUT/r/fiP run_batch $left $OUT/r/fiP.log env PYTHONPATH=/tmp/site python3 scripts/flashinfer-tests --sample 60 .devcall/tests test_batch_prefill_kernels.py test_single_prefill.py test_block_sparse.py test_alibi.py -- -n 14 --timeout 90
echo "fi P rc=$? $(el)"; sed -n '/^| file/,$p' $OUT/r/fiP.log | head -30
cd $OUT && tar czf r.tgz r && rm -rf r
