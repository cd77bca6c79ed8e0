#!/usr/bin/env bash
# Call C: the Python package built on the device (CUDA backend) and its torch CUDA tests; fp8 probes
# (4 stages, three CTAs per SM); the C++ GPU decode suites with the fp8 defaults.
set -uo pipefail
B=build/release/apps/kvattn; T=build/release/tests/kvattn_tests
export KVATTN_CACHE_DIR=/tmp/kc
L=$OUT/logs; mkdir -p $L
t0=$(date +%s); el() { echo "[$(( $(date +%s)-t0 ))s]"; }
timeout 100 $B jit precompile --arch sm_90a --preset default --cache-dir $KVATTN_CACHE_DIR -j 16 > $L/precompile.log 2>&1; echo "precompile rc $? $(el)"
python3 -c 'import torch, nanobind, scikit_build_core; print(torch.__version__, nanobind.__version__, scikit_build_core.__version__)'
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 200 python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/site \
  -Ccmake.define.KVATTN_DLPACK_INCLUDE=$PWD/.devcall/inc . > $L/pip.log 2>&1; echo "pip rc $? $(el)"; tail -5 $L/pip.log
export PYTHONPATH=/tmp/site
python3 -c 'import kvattn; print(kvattn.__version__, kvattn.has_cuda_backend)'
PYTHONUNBUFFERED=1 timeout 200 python3 -m pytest -q -p no:cacheprovider -rfs python/tests/test_cuda_wrappers.py python/tests/test_torch.py python/tests/test_rope.py > $L/pytest.log 2>&1; echo "pytest rc $? $(el)"; tail -40 $L/pytest.log
ALL=b1_l32768_h32-8,b16_l4096_h32-8,b64_l4096_h32-8,b64_l32768_h32-8,b256_l4096_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8
bench() { local tag=$1; shift; timeout 40 env "$@" --json > $OUT/$tag.json 2> $L/$tag.err || echo "$tag failed: $(tail -2 $L/$tag.err)"; }
bench e4m3_s4_w396 KVATTN_DECODE_BULK_STAGES=4 $B bench decode --kv-dtype e4m3 --cases $ALL --workers 396 --iters 50
bench e4m3_s3_w396 KVATTN_DECODE_BULK_STAGES=3 $B bench decode --kv-dtype e4m3 --cases $ALL --workers 396 --iters 50
bench e4m3_now $B bench decode --kv-dtype e4m3 --cases $ALL --iters 50
echo "benches $(el)"
left=$(( 520 - ($(date +%s)-t0) ))
[[ $left -gt 30 ]] && { timeout $left stdbuf -oL $T --gtest_filter='GpuDecode.*:GpuGraph.*:GpuPageTable.*:GpuCascade.*:GpuSharedPrefix.*' > $L/tests.log 2>&1; echo "C++ GPU tests rc $? $(el)"; grep -E "^\[  (FAILED|PASSED|  OK) " $L/tests.log | sort | uniq -c | sort -rn | head -5; grep -E "FAILED|Failure" $L/tests.log | head; grep -c "       OK \]" $L/tests.log; tail -2 $L/tests.log; }
(cd $OUT && tar czf logs.tgz logs && rm -rf logs)
python3 - <<'PY'
import json,glob,os
for f in sorted(glob.glob(os.environ['OUT']+'/*.json')):
  try: rows=json.load(open(f))
  except Exception as e: print(f, 'bad', e); continue
  print('##', os.path.basename(f))
  for r in rows: print(f"  {r['id']:22} {r['GBps']:6.0f} {r['ms']*1000:7.1f}us it {r['items']:4} w {r['workers']:3} {r['kernel'][:50]}")
PY
