#!/usr/bin/env bash
# Session 17 call 7 (a97c407): plain softmax by halves above hd 128 (ragged): bench prefill's hd 256
# cases, new default against the old bits (KVATTN_PREFILL_TUNING=23), two rounds; the prefill and
# block-sparse GPU suites with every long shape forced by halves (KVATTN_PREFILL_TUNING=535: plain,
# masked, transformed and split kernels by parts with a running maximum), then default suites;
# then the peers on hd 256 causal 1 x 16k.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s17; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for p in default decode bench-prefill; do $D/kvattn7 jit precompile --preset $p -j 16 2>&1 | tail -1; done
for t in 23 535; do KVATTN_PREFILL_TUNING=$t $D/kvattn7 jit precompile --preset bench-prefill -j 16 2>&1 | tail -1; done
C=hd256_causal_1x16384,hd256_full_1x16384,hd256_causal_4x4096,hd256_causal_16x1024
for r in 1 2; do
  echo "== round $r default (halves)"; timeout 60 $D/kvattn7 bench prefill --cases $C 2>&1 | tail -4
  echo "== round $r old bits 23"; KVATTN_PREFILL_TUNING=23 timeout 60 $D/kvattn7 bench prefill --cases $C 2>&1 | tail -4
done > "$out/rows.txt"
cut -c1-110 "$out/rows.txt"; echo "bench t=$((SECONDS - t0)) s"
KVATTN_PREFILL_TUNING=535 timeout 200 $D/tests7 --gtest_filter='GpuPrefill.*:GpuBlockSparse.*' > "$out/tests-t535.log" 2>&1
echo "tests t535 exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  PASSED|==========)" "$out/tests-t535.log" | tail -6
timeout 100 $D/tests7 --gtest_filter='GpuPrefill.HeadDims:GpuPrefill.GraphCapture*:GpuPrefill.SplitSchedulesMatch:GpuBlockSparse.GraphCapture*:GpuGraph.*' > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  PASSED|==========)" "$out/tests.log" | tail -6
left=$((540 - (SECONDS - t0)))
KVATTN_BIN=$D/kvattn7 KVATTN_COMMIT=${COMMIT:-s17} OUT="$out" timeout $left bench/run-peers --no-decode --no-cascade \
  --prefill-cases hd256_causal_1x16384 --budget $((left - 30)) > "$out/run-peers-stdout.log" 2>&1
echo "run-peers exit $? at $((SECONDS - t0)) s"; grep -E "^\| 1 x 16384|flashinfer_jit" "$out/run-peers-stdout.log" | head
rm -f "$out"/*.png "$out/run-peers.log"
