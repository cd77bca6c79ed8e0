set -o pipefail
export PYTHONUNBUFFERED=1 KVATTN_CACHE_DIR=/tmp/kvcache
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
T=build/release/tests/kvattn_tests; K=build/release/apps/kvattn
t0=$(date +%s)
(CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site -Ccmake.define.KVATTN_DLPACK_INCLUDE=$PWD/.devcall/inc . > $OUT/build.log 2>&1; echo "pkg rc=$?" >> $OUT/build.log) &
timeout 80 stdbuf -oL $T --gtest_filter='GpuUserVariant.EveryExampleOnThePrefillKernels' > $OUT/cpp_user.log 2>&1
echo "cpp user rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]" $OUT/cpp_user.log | head; grep -A8 "Failure" $OUT/cpp_user.log | head -30
wait; tail -1 $OUT/build.log
t1=$(date +%s)
PYTHONPATH=/tmp/site timeout 30 python3 -m pytest -q -p no:cacheprovider python/tests/test_cuda_wrappers.py -k "user_variant_decode_cuda_graph" > $OUT/py.log 2>&1
echo "py rc=$? $(( $(date +%s) - t1 )) s"; tail -2 $OUT/py.log; grep -E "^E " $OUT/py.log | head -8
t2=$(date +%s)
for v in softcap user-softcap; do
  timeout 12 $K bench decode --cases b64_l4096_h32-8 --variant $v --json --iters 20 > $OUT/dec_$v.json 2> $OUT/dec_$v.err
done
for v in softcap user-softcap plain user-docmask; do
  timeout 12 $K bench prefill --cases hd128_causal_1x16384 --variant $v --json --iters 10 > $OUT/pre_$v.json 2> $OUT/pre_$v.err
done
echo "bench $(( $(date +%s) - t2 )) s"
touch $OUT/jit_t5.log
python3 - <<'PY'
import json, glob, os, re
out = os.environ["OUT"]
for op, key in (("dec", "GBps"), ("pre", "TFLOPs")):
    for f in sorted(glob.glob(f"{out}/{op}_*.json")):
        try:
            r = json.load(open(f))[0]
            print(f"{os.path.basename(f):24s} {r['ms']*1e3:9.1f} us  {key} {r[key]:7.1f}  {r['kernel']}")
        except Exception as e:
            print(f, "no row:", open(f.replace('.json', '.err')).read()[-200:])
ts = sorted(float(m.group(1)) for line in open(out + "/jit_t5.log") for m in [re.search(r"\] \d+/\d+ +([0-9.]+) ms +compiled", line)] if m)
if ts: print(f"t5_bias cold compiles (16 parallel): {len(ts)}, median {ts[len(ts)//2]:.0f} ms, p95 {ts[int(len(ts)*0.95)]:.0f} ms, max {ts[-1]:.0f} ms")
PY
cd $OUT && tar czf logs.tgz *.log *.json *.err && rm -f *.log *.json *.err
