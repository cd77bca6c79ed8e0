set -o pipefail
export PYTHONUNBUFFERED=1 KVATTN_CACHE_DIR=/tmp/kvcache
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
T=build/release/tests/kvattn_tests
mkdir -p $OUT/r
start=$(date +%s)
el() { echo "$(( $(date +%s) - start )) s"; }
(CMAKE_BUILD_PARALLEL_LEVEL=10 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site -Ccmake.define.KVATTN_DLPACK_INCLUDE=$PWD/.devcall/inc . > $OUT/r/build.log 2>&1; echo "pkg rc=$?" >> $OUT/r/build.log) &
timeout 170 stdbuf -oL $T --gtest_filter='GpuPrefill.EmptyRequestsAndBatches:GpuUserVariant.*:GpuPrefill.HopperTierAgainstTheReference:GpuPrefill.SplitSchedulesMatch' > $OUT/r/cpp.log 2>&1
echo "cpp rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|FAILED  \]" $OUT/r/cpp.log | head -20; grep -B2 -A10 "Failure" $OUT/r/cpp.log | head -50
wait; tail -3 $OUT/r/build.log; echo "pkg $(el)"
python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__)"; python3 -m pip list 2>/dev/null | grep -iE "xdist|timeout|numpy|ml.dtypes|scipy"
# A batch of pytest stopped with SIGINT at its limit, so that pytest still writes its report.
run_batch() { local limit=$1 log=$2; shift 2
  setsid "$@" > $log 2>&1 & local pid=$!
  ( sleep $limit; kill -INT -- -$pid 2>/dev/null; sleep 15; kill -KILL -- -$pid 2>/dev/null ) & local killer=$!
  wait $pid; local rc=$?; kill $killer 2>/dev/null; return $rc; }
run_batch 130 $OUT/r/py.log env PYTHONPATH=/tmp/site python3 -m pytest -q -p no:cacheprovider -n 8 python/tests/test_cuda_wrappers.py python/tests/test_torch.py python/tests/test_rope.py
echo "py rc=$? $(el)"; tail -3 $OUT/r/py.log; grep -E "^(FAILED|ERROR) " $OUT/r/py.log | head -20
A="test_batch_decode_kernels.py test_batch_prefill_kernels.py test_single_prefill.py test_tensor_cores_decode.py test_non_contiguous_decode.py test_non_contiguous_prefill.py test_decode_prefill_lse.py"
B="test_block_sparse.py test_shared_prefix_kernels.py test_page.py test_rope.py test_alibi.py test_logits_cap.py test_sliding_window.py test_quantization.py"
left=$(( 575 - ($(date +%s) - start) )); la=$(( left * 55 / 100 - 20 )); lb=$(( left - la - 40 ))
echo "flashinfer batches: $la s, $lb s"
OUT=$OUT/r/fiA run_batch $la $OUT/r/fiA.log env PYTHONPATH=/tmp/site python3 scripts/flashinfer-tests --sample 60 .devcall/tests $A -- -n 14 --timeout 90
echo "fi A rc=$? $(el)"; sed -n '/^| file/,$p' $OUT/r/fiA.log | head -40
OUT=$OUT/r/fiB run_batch $lb $OUT/r/fiB.log env PYTHONPATH=/tmp/site python3 scripts/flashinfer-tests --sample 60 .devcall/tests $B -- -n 14 --timeout 90
echo "fi B rc=$? $(el)"; sed -n '/^| file/,$p' $OUT/r/fiB.log | head -40
cd $OUT && tar czf r.tgz r && rm -rf r
