#!/usr/bin/env bash
# Session 15 call 4 (slice 0 staged on the prefill route): BatchDecode's batch-dependent route on sm_90 (long GQA batches on the prefill
# kernels' decode shape) against the decode kernels alone (KVATTN_DECODE_KERNEL=decode), two
# alternated rounds, 64 x 2048 and 64 x 3072 for the threshold; the GPU decode suites.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s15; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for p in default decode; do $D/kvattn4 jit precompile --preset $p -j 16 2>&1 | tail -1; done
C=b1_l4096_h32-8,b1_l32768_h32-8,b16_l4096_h32-8,b16_l32768_h32-8,b64_l512_h32-8,b64_l4096_h32-8,b64_l32768_h32-8,b256_l512_h32-8,b256_l4096_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8,b64_l4096_p1_h32-8
L2048=$(python3 -c "print(','.join(['2048']*64))"); L3072=$(python3 -c "print(','.join(['3072']*64))")
for r in 1 2; do
  for m in route decode; do
    e=X=1; [ $m = decode ] && e=KVATTN_DECODE_KERNEL=decode
    env $e timeout 120 $D/kvattn4 bench decode --cases $C > "$out/r$r-$m.txt" 2>&1
    for L in 2048 3072; do v=L$L; echo "64 x $L  $(env $e timeout 30 $D/kvattn4 bench decode --cases custom_h32-8 --kv-lens ${!v} 2>&1 | tail -1 | cut -c31-75)"; done >> "$out/r$r-$m.txt"
  done
done
python3 - "$out" <<'PY'
import re, sys, glob
out = sys.argv[1]
def rows(f):
    d = {}
    for line in open(f).read().splitlines():
        m = re.match(r"^(\S.*?)\s{2,}\S+\s+([\d.]+) us\s+(\d+)", line)
        if m: d[m.group(1).strip()] = int(m.group(3))
    return d
t = {k: rows(f"{out}/{k}.txt") for k in ["r1-route", "r2-route", "r1-decode", "r2-decode"]}
print(f"{'case':30s} {'route r1':>9s} {'r2':>6s} {'decode r1':>10s} {'r2':>6s}")
for name in t["r1-route"]:
    print(f"{name:30s} {t['r1-route'].get(name,0):9d} {t['r2-route'].get(name,0):6d} {t['r1-decode'].get(name,0):10d} {t['r2-decode'].get(name,0):6d}")
PY
echo "bench t=$((SECONDS - t0)) s"
grep -h "plan" "$out/r1-route.txt" | head -1; for f in r1-route r2-route r1-decode r2-decode; do echo "== $f plan medians"; cut -c1-30,70-90 "$out/$f.txt" | sed -n 2,14p; done
timeout 330 $D/tests4 --gtest_filter='GpuDecodeRoute.*:GpuDecode.*:GpuGraph.*:GpuPlanStaging.*:GpuPageTable.*:GpuPrefill.DecodeShapes:GpuPrefill.GroupSizesPageSizesLayouts' > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -8
timeout 100 compute-sanitizer --tool memcheck $D/tests4 --gtest_filter='GpuDecodeRoute.*:GpuDecode.OnThePrefillKernels' > "$out/memcheck.log" 2>&1
echo "memcheck exit $? t=$((SECONDS - t0)) s"; tail -2 "$out/memcheck.log"
