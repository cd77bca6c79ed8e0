set -o pipefail
export PYTHONUNBUFFERED=1 KVATTN_CACHE_DIR=/tmp/kvcache
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
T=build/release/tests/kvattn_tests; K=build/release/apps/kvattn
mkdir -p $OUT/r
t0=$(date +%s)
timeout 250 stdbuf -oL $T --gtest_filter='GpuUserVariant.EveryExampleOnThePrefillKernels' > $OUT/r/cpp_user.log 2>&1
echo "cpp user prefill rc=$? $(( $(date +%s) - t0 )) s"; grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]" $OUT/r/cpp_user.log | head; grep -A8 "Failure" $OUT/r/cpp_user.log | head -40
t0=$(date +%s)
for v in softcap user-softcap alibi user-alibi user-docmask; do timeout 20 $K bench prefill --cases hd128_causal_1x16384 --variant $v --iters 2 > /dev/null 2>&1; done  # compiles
for rep in 1 2 3; do
  for v in softcap user-softcap alibi user-alibi plain user-docmask; do
    timeout 20 $K bench prefill --cases hd128_causal_1x16384 --variant $v --json --iters 10 > $OUT/r/pre_${v}_$rep.json 2>&1
  done
  timeout 20 $K bench prefill --cases hd128_causal_16x1024 --variant plain --json --iters 10 > $OUT/r/pre16_plain_$rep.json 2>&1
done
echo "bench $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, glob, os, collections
out = os.environ["OUT"] + "/r"
rows = collections.defaultdict(list)
for f in sorted(glob.glob(f"{out}/*.json")):
    try:
        r = json.load(open(f))[0]; rows[os.path.basename(f).rsplit('_', 1)[0]].append((r['TFLOPs'], r['ms'] * 1e3, r['kernel']))
    except Exception as e: print(f, open(f).read()[-300:])
for k, v in rows.items(): print(f"{k:22s} TFLOP/s {' '.join(f'{x[0]:6.1f}' for x in v)}  us {' '.join(f'{x[1]:8.1f}' for x in v)}  {v[0][2]}")
PY
cd $OUT && tar czf r.tgz r && rm -rf r
