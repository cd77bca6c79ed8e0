#!/usr/bin/env bash
# Call A: fp8 decode stages/workers/route probes, bf16 MQA probes, decode GPU tests.
set -uo pipefail
B=build/release/apps/kvattn; T=build/release/tests/kvattn_tests
export KVATTN_CACHE_DIR=/tmp/kc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 120 $B jit precompile --arch sm_90a --preset default --cache-dir $KVATTN_CACHE_DIR -j 16 > $OUT/precompile.log 2>&1; echo "precompile rc $? $(( $(date +%s)-t0 ))s"
timeout 150 $T --gtest_filter='GpuDecode.*:GpuGraph.*:GpuPageTable.*:DecodeConfig.*' --gtest_brief=1 > $OUT/tests.log 2>&1; echo "tests rc $? $(( $(date +%s)-t0 ))s"; tail -5 $OUT/tests.log
ALL=b1_l32768_h32-8,b16_l4096_h32-8,b64_l4096_h32-8,b64_l32768_h32-8,b256_l4096_h32-8,b64_l4096_h32-32,zipf64_h32-8,b64_l4096_p1_h32-8,b64_l4096_h32-1,b64_l4096_h64-1,b64_l4096_h64-8
P=b64_l4096_h32-8,b64_l32768_h32-8,b16_l4096_h32-8,b1_l32768_h32-8,zipf64_h32-8,b64_l4096_h32-32
M=b64_l4096_h32-1,b64_l4096_h64-1
bench() { local tag=$1; shift; timeout 60 env "$@" --json > $OUT/$tag.json 2> $OUT/$tag.err || echo "$tag failed: $(tail -2 $OUT/$tag.err)"; }
bench bf16 $B bench decode --cases $ALL --iters 50
bench e4m3 $B bench decode --kv-dtype e4m3 --cases $ALL --iters 50
bench e4m3_prefill KVATTN_DECODE_KERNEL=prefill $B bench decode --kv-dtype e4m3 --cases $ALL --iters 50
echo "base benches $(( $(date +%s)-t0 ))s"
for s in 4 5 6; do for w in 0 264 396; do
  wa=(); [[ $w != 0 ]] && wa=(--workers $w)
  bench e4m3_s${s}_w$w KVATTN_DECODE_BULK_STAGES=$s $B bench decode --kv-dtype e4m3 --cases $P --iters 50 "${wa[@]}"
done; done
echo "fp8 probes $(( $(date +%s)-t0 ))s"
for w in 264 396 528; do
  bench bf16_mqa_w$w $B bench decode --cases $M --iters 50 --workers $w
  bench bf16_mqa_s4_w$w KVATTN_DECODE_BULK_STAGES=4 $B bench decode --cases $M --iters 50 --workers $w
  bench e4m3_mqa_s5_w$w KVATTN_DECODE_BULK_STAGES=5 $B bench decode --kv-dtype e4m3 --cases $M --iters 50 --workers $w
done
echo "mqa probes $(( $(date +%s)-t0 ))s"
python3 - <<'PY'
import json,glob,os
for f in sorted(glob.glob(os.environ['OUT']+'/*.json')):
  try: rows=json.load(open(f))
  except Exception as e: print(f, 'bad', e); continue
  print('##', os.path.basename(f))
  for r in rows: print(f"  {r['id']:22} {r['GBps']:7.0f} GB/s {r['ms']*1000:8.1f} us items {r['items']:5} w {r['workers']:4} {r['kernel']}")
PY
