set -o pipefail
export PYTHONUNBUFFERED=1 KVATTN_CACHE_DIR=/tmp/kvcache
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
T=build/release/tests/kvattn_tests
mkdir -p $OUT/r
start=$(date +%s)
el() { echo "$(( $(date +%s) - start )) s"; }
(CMAKE_BUILD_PARALLEL_LEVEL=6 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site -Ccmake.define.KVATTN_DLPACK_INCLUDE=$PWD/.devcall/inc . > $OUT/r/build.log 2>&1; echo "pkg rc=$?" >> $OUT/r/build.log) &
timeout 330 stdbuf -oL $T --gtest_filter='GpuUserVariant.*:-GpuUserVariant.EveryExampleOnEveryDecodeKernelFamily' > $OUT/r/cpp.log 2>&1
echo "cpp rc=$? $(el)"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|FAILED  \]" $OUT/r/cpp.log | head -20; grep -B2 -A10 "Failure" $OUT/r/cpp.log | head -50
wait; tail -1 $OUT/r/build.log
K='test_batch_decode_with_tuple_paged_kv_cache[True-kv_dtype1-q_dtype0-True-0.0-NONE-NHD-256-32-4-8-16384-128] or test_cuda_graph_batch_decode_with_paged_kv_cache[True-kv_dtype0-q_dtype0-NONE-NHD-128-32-4-1-16384-128] or test_batch_decode_with_tuple_paged_kv_cache[True-kv_dtype0-q_dtype0-True-0.0-NONE-NHD-256-32-4-1-16384-128] or test_cuda_graph_batch_decode_with_paged_kv_cache[True-kv_dtype0-q_dtype0-ROPE_LLAMA-NHD-256-32-4-16-16384-128]'
left=$(( 570 - ($(date +%s) - start) ))
OUT=$OUT/r/fiO timeout $left env PYTHONPATH=/tmp/site python3 scripts/flashinfer-tests .devcall/tests test_batch_decode_kernels.py -- -k "$K" > $OUT/r/fiO.log 2>&1
echo "fi O rc=$? $(el)"; sed -n '/^| file/,$p' $OUT/r/fiO.log | head; tail -3 $OUT/r/fiO.log
cd $OUT && tar czf r.tgz r && rm -rf r
