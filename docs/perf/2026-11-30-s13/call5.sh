#!/usr/bin/env bash
# Session 13 call 5: plan() A/B pinned to the GPU's NUMA-local cores (kvattn_old: c4f35d8's
# library; kvattn_new: one-pass knobs, fold-only tables staged only when folding, events as
# before), five rounds, each plan followed by its run and a sync; unpinned once for reference.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s13; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
nvidia-smi topo -m | tee "$out/topo.txt"; lscpu | grep -iE "numa|socket|thread|core" | tee "$out/lscpu.txt"
cpus=$(nvidia-smi topo -m | awk '/^GPU0/ {for (i=2;i<=NF;i++) if ($i ~ /^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$/) {print $i; exit}}')
echo "GPU0 CPU affinity: ${cpus:-unknown}"; pin=$(echo "${cpus:-0}" | sed -E 's/[-,].*//'); pin=$((pin + 2)); echo "pinned to CPU $pin"
for b in old new; do $D/kvattn_$b jit precompile --preset decode -j 16 2>&1 | tail -1; done
C=b256_l4096_h32-8,zipf64_h32-8,b1_l32768_h32-8,b16_l4096_h32-8,b64_l4096_h32-8,long32k_63x512_h32-8,b64_l4096_p1_h32-8
for r in 1 2 3 4 5; do for b in old new; do echo "== $b r$r"; taskset -c $pin $D/kvattn_$b bench decode --cases $C --iters 5 2>&1 | tail -n +2; done; done > "$out/plan-ab-pinned.txt" 2>&1
sed -E "s/ +/ /g" "$out/plan-ab-pinned.txt" | cut -c1-100
for b in old new; do echo "== $b unpinned"; $D/kvattn_$b bench decode --cases $C --iters 5 2>&1 | tail -n +2; done > "$out/plan-ab-unpinned.txt" 2>&1
sed -E "s/ +/ /g" "$out/plan-ab-unpinned.txt" | cut -c1-100
taskset -c $pin $D/kvattn_new bench decode --json --cases $C --iters 5 > "$out/new-pinned.json" 2>&1
echo "bench t=$((SECONDS - t0)) s"
$D/tests_new --gtest_filter='GpuPlanStaging.*:GpuGraph.*:GpuDecode.SkewedBatches:GpuPrefill.RequestLengths' > "$out/tests.log" 2>&1
echo "tests exit $? at $((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  SKIPPED|  PASSED)" "$out/tests.log" | tail -4
