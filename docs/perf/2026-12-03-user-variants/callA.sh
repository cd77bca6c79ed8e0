set -o pipefail
export PYTHONUNBUFFERED=1 KVATTN_CACHE_DIR=/tmp/kvcache
nvidia-smi -L; uname -r; date
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
T=build/release/tests/kvattn_tests
t0=$(date +%s)
(CMAKE_BUILD_PARALLEL_LEVEL=12 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site -Ccmake.define.KVATTN_DLPACK_INCLUDE=$PWD/.devcall/inc . > $OUT/build.log 2>&1; echo "pkg rc=$? $(( $(date +%s) - t0 )) s" >> $OUT/build.log) &
timeout 240 stdbuf -oL $T --gtest_filter='GpuUserVariant.*' > $OUT/cpp_user.log 2>&1
echo "cpp user rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]" $OUT/cpp_user.log | head -20
grep -B3 -A14 "Failure" $OUT/cpp_user.log | head -80
t1=$(date +%s)
timeout 120 stdbuf -oL $T --gtest_filter='GpuDecode.*:GpuGraph.*:GpuBlockSparse.*' > $OUT/cpp_reg.log 2>&1
echo "cpp regress rc=$? $(( $(date +%s) - t1 )) s"; grep -E "^\[  (FAILED|PASSED) |tests ran" $OUT/cpp_reg.log | head -20
wait
tail -3 $OUT/build.log
export PYTHONPATH=/tmp/site
t2=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 --timeout 140 python/tests/test_cuda_wrappers.py python/tests/test_torch.py python/tests/test_rope.py > $OUT/py.log 2>&1
echo "py rc=$? $(( $(date +%s) - t2 )) s"; tail -3 $OUT/py.log; grep -E "^(FAILED|ERROR)" $OUT/py.log | head -20
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
