#!/usr/bin/env bash
# Call B: decode GPU tests with the fp8 defaults, the fp8/large-group tests on every decode kernel,
# compute-sanitizer over them, then bench decode bf16/e4m3/e5m2 (and page-1 fp8 probes).
set -uo pipefail
B=build/release/apps/kvattn; T=build/release/tests/kvattn_tests
export KVATTN_CACHE_DIR=/tmp/kc
L=$OUT/logs; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s)-t0 ))s]"; }
timeout 120 $B jit precompile --arch sm_90a --preset default --cache-dir $KVATTN_CACHE_DIR -j 16 > $L/precompile.log 2>&1; echo "precompile rc $? $(el)"
timeout 200 $T --gtest_filter='GpuDecode.*:GpuGraph.*:GpuPageTable.*:GpuCascade.*:DecodeConfig.*' --gtest_brief=1 > $L/tests.log 2>&1; echo "tests rc $? $(el)"; grep -E "FAILED|PASSED|tests from" $L/tests.log | head -20
F='GpuDecode.Fp8OnTensorCores:GpuDecode.LargeGroupsOnTwoMTiles:GpuDecode.EveryDtypeCombination:GpuDecode.Variants'
for k in KVATTN_DECODE_KERNEL=bulk KVATTN_DECODE_TMA_BOXES=0 KVATTN_DECODE_KERNEL=mma KVATTN_DECODE_MERGE=fold KVATTN_DECODE_GRID=workers KVATTN_DECODE_BULK_STAGES=3; do
  timeout 60 env $k $T --gtest_filter="$F" --gtest_brief=1 > $L/alt-$k.log 2>&1; echo "$k rc $? $(el) $(grep -E 'PASSED|FAILED' $L/alt-$k.log | tr '\n' ' ')"
done
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $T --gtest_filter='GpuDecode.Fp8OnTensorCores:GpuDecode.LargeGroupsOnTwoMTiles' --gtest_brief=1 > $L/memcheck.log 2>&1; echo "memcheck rc $? $(el)"; tail -3 $L/memcheck.log
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 3 $T --gtest_filter='GpuDecode.Fp8OnTensorCores:GpuDecode.LargeGroupsOnTwoMTiles' --gtest_brief=1 > $L/racecheck.log 2>&1; echo "racecheck rc $? $(el)"; tail -3 $L/racecheck.log
ALL=b1_l32768_h32-8,b16_l4096_h32-8,b64_l4096_h32-8,b64_l32768_h32-8,b256_l4096_h32-8,b64_l4096_h32-32,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8,b64_l4096_p1_h32-8,b64_l4096_h32-1,b64_l4096_h64-1,b64_l4096_h64-8
bench() { local tag=$1; shift; timeout 60 env "$@" --json > $OUT/$tag.json 2> $L/$tag.err || echo "$tag failed: $(tail -2 $L/$tag.err)"; }
bench bf16 $B bench decode --cases $ALL
bench e4m3 $B bench decode --kv-dtype e4m3 --cases $ALL
bench e5m2 $B bench decode --kv-dtype e5m2 --cases $ALL
P1=b64_l4096_p1_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8
bench e4m3_p1_mma KVATTN_DECODE_KERNEL=mma $B bench decode --kv-dtype e4m3 --cases $P1 --iters 50
bench e4m3_p1_s3 KVATTN_DECODE_BULK_STAGES=3 $B bench decode --kv-dtype e4m3 --cases $P1 --iters 50
bench e4m3_p1_s6 KVATTN_DECODE_BULK_STAGES=6 $B bench decode --kv-dtype e4m3 --cases $P1 --iters 50
echo "benches $(el)"
(cd $OUT && tar czf logs.tgz logs && rm -rf logs)
python3 - <<'PY'
import json,glob,os
for f in sorted(glob.glob(os.environ['OUT']+'/*.json')):
  try: rows=json.load(open(f))
  except Exception as e: print(f, 'bad', e); continue
  print('##', os.path.basename(f))
  for r in rows: print(f"  {r['id']:22} {r['GBps']:6.0f} {r['ms']*1000:7.1f}us it {r['items']:4} w {r['workers']:3} p {r['plan_us']:5.1f} {r['kernel'][:60]}")
PY
