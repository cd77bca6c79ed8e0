set -o pipefail
export PYTHONUNBUFFERED=1
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
T=build/release/tests/kvattn_tests; K=build/release/apps/kvattn
mkdir -p $OUT/r
date
# 1. Correctness of the new paths first.
t0=$(date +%s)
KVATTN_CACHE_DIR=/tmp/kvcache timeout 150 stdbuf -oL $T --gtest_filter='GpuUserVariant.*' > $OUT/r/cpp_user.log 2>&1
echo "cpp user rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]" $OUT/r/cpp_user.log | head; grep -A8 "Failure" $OUT/r/cpp_user.log | head -40
# 2. Benches, each user variant in a cold cache (first_plan_ms: its first plan compiles), then warm.
t0=$(date +%s)
bench() { local op=$1 case=$2 v=$3 tag=$4
  KVATTN_CACHE_DIR=/tmp/c_$v timeout 20 $K bench $op --cases $case --variant $v --json --iters 10 > $OUT/r/${tag}_$v.json 2> $OUT/r/${tag}_$v.err; }
for v in plain softcap user-softcap alibi user-alibi sigmoid user-sigmoid user-sink user-t5 user-streaming user-prefixlm; do bench decode b64_l4096_h32-8 $v dec; done
for v in plain softcap user-softcap alibi user-alibi sigmoid user-sigmoid user-sink user-docmask user-t5 user-streaming; do bench prefill hd128_causal_1x16384 $v pre; done
bench prefill hd128_causal_16x1024 plain pre16
bench prefill hd128_full_1x16384 plain full; bench prefill hd128_full_1x16384 user-prefixlm full
for v in user-softcap user-alibi user-sigmoid user-sink user-t5 user-streaming user-prefixlm; do  # warm: a new process, the disk cache
  KVATTN_CACHE_DIR=/tmp/c_$v timeout 20 $K bench decode --cases b64_l4096_h32-8 --variant $v --json --iters 2 > $OUT/r/warm_$v.json 2>/dev/null; done
echo "bench $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, glob, os
out = os.environ["OUT"] + "/r"
for f in sorted(glob.glob(f"{out}/*.json")):
    try:
        r = json.load(open(f))[0]
        key = "GBps" if r.get("op") == "decode" else "TFLOPs"
        print(f"{os.path.basename(f):26s} {r['ms']*1e3:9.1f} us  {key} {r.get(key, 0):7.1f}  first plan {r.get('first_plan_ms', -1):8.1f} ms  {r['kernel']}")
    except Exception as e:
        print(f, "no row:", open(f.replace('.json', '.err')).read()[-300:] if os.path.exists(f.replace('.json', '.err')) else e)
PY
# 3. Built-in prefill regressions (the mask code moved into RowMask).
t0=$(date +%s)
KVATTN_CACHE_DIR=/tmp/kvcache timeout 150 stdbuf -oL $T --gtest_filter='GpuPrefill.Variants:GpuPrefill.HopperTierAgainstTheReference:GpuPrefill.DecodeShapes:GpuPrefill.SplitSchedulesMatch:GpuPrefill.GroupSizesPageSizesLayouts' > $OUT/r/cpp_reg.log 2>&1
echo "cpp regress rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^\[  (FAILED|PASSED) |OK \]|FAILED  \]" $OUT/r/cpp_reg.log | head -30; grep -A8 "Failure" $OUT/r/cpp_reg.log | head -30
# 4. memcheck over the narrowed item range and the full-range path.
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
KVATTN_CACHE_DIR=/tmp/c_user-docmask timeout 40 $CS --tool memcheck --leak-check no $K bench prefill --cases hd128_causal_4x4096 --variant user-docmask --iters 1 > $OUT/r/cs_pre.log 2>&1; echo "cs docmask rc=$?"; tail -2 $OUT/r/cs_pre.log
KVATTN_CACHE_DIR=/tmp/c_user-prefixlm timeout 40 $CS --tool memcheck --leak-check no $K bench prefill --cases hd128_full_4x4096 --variant user-prefixlm --iters 1 > $OUT/r/cs_pre2.log 2>&1; echo "cs prefixlm rc=$?"; tail -2 $OUT/r/cs_pre2.log
cd $OUT && tar czf r.tgz r && rm -rf r
