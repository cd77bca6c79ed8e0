#!/usr/bin/env bash
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export KVATTN_CACHE_DIR=$PWD/.jit-cache
bin=build/release
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
for p in default prefill bench-prefill; do timeout 60 $bin/apps/kvattn jit precompile --arch sm_90a -j 16 --preset $p 2>&1 | tail -1; done
KVATTN_PREFILL_TIER=mma_sync timeout 60 $bin/apps/kvattn jit precompile --arch sm_90a -j 16 --preset bench-prefill --with-overrides 2>&1 | tail -1
echo "== Hopper tier test"
timeout 120 $bin/tests/kvattn_tests --gtest_filter='GpuPrefill.HopperTier*' > "$out/tests-hopper.log" 2>&1; echo "rc=$?"
grep -E "^\[ +(OK|FAILED) +\]|Failure|exception" "$out/tests-hopper.log" | head -20
echo "== bench prefill, both tiers (same call)"
timeout 100 $bin/apps/kvattn bench prefill --json > "$out/bench-wgmma.json" 2> "$out/bench-wgmma.err"; echo rc=$?
KVATTN_PREFILL_TIER=mma_sync timeout 60 $bin/apps/kvattn bench prefill --cases hd64_causal_1x16384,hd128_causal_1x16384,hd128_full_1x16384,hd256_causal_1x16384,hd128_causal_4x4096,hd128_append_16x512_on_4k_p16 --json > "$out/bench-mma.json" 2> "$out/bench-mma.err"; echo rc=$?
python3 - "$out/bench-wgmma.json" "$out/bench-mma.json" <<'PY'
import json, sys
m = {r['id']: r for r in json.load(open(sys.argv[2]))}
for r in json.load(open(sys.argv[1])):
    o = m.get(r['id'])
    print(f"  {r['id']:<36} {r['TFLOPs']:7.1f}" + (f"   mma.sync {o['TFLOPs']:7.1f}  x{r['TFLOPs']/o['TFLOPs']:.2f}" if o else ""))
PY
echo "== peers: FlashInfer fa2/fa3 + SDPA on hd128 causal 1 x 16k (same call)"
timeout 200 bench/run-peers --no-decode --no-cascade --skip-flex --prefill-cases hd128_causal_1x16384,hd128_full_1x16384 --budget 170 > "$out/run-peers.log" 2>&1; echo "run-peers rc=$?"
tail -25 "$out/run-peers.log"
echo "== other GPU tests (t=$(( $(date +%s) - T0 )) s)"
timeout 110 $bin/tests/kvattn_tests --gtest_filter='GpuPrefill.SplitSchedulesMatch:GpuPrefill.EmptyRequestsAndBatches:GpuPrefill.StridedQueries*:GpuPrefill.StructuredAndOnesInputs:GpuPrefill.MisalignedKVIsAnError:GpuPrefill.FailedPlan*:GpuPrefill.UnsupportedShapes*:GpuPrefill.GraphCapture*:GpuGraph*:GpuCascade*:GpuBlockSparse*' > "$out/tests-other.log" 2>&1; echo "rc=$?"
grep -E "^\[ +(OK|FAILED) +\]|Failure" "$out/tests-other.log" | head -40; tail -2 "$out/tests-other.log"
echo "== ncu (t=$(( $(date +%s) - T0 )) s)"
timeout 60 ncu --clock-control none --kernel-name regex:"kvattn_prefill_wgmma" --launch-skip 3 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  $bin/apps/kvattn bench prefill --cases hd128_causal_1x16384 --iters 3 > "$out/ncu.txt" 2>&1; echo "ncu rc=$?"
grep -E "Throughput|Duration|Stall|Warp Cycles|Eligible|Issued|Pipe|L2|Active" "$out/ncu.txt" | head -40
