#!/usr/bin/env bash
# One device call: cascade/shared-prefix GPU tests (+ memcheck), decode regression subset, bench cascade.
set -uo pipefail
out=${OUT:-gpu-out}; mkdir -p "$out"
export KVATTN_CACHE_DIR=$PWD/.jit-cache
B=build/release
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
start=$SECONDS
$B/apps/kvattn jit precompile --arch sm_90a -j 16 > "$out/precompile.log" 2>&1; echo "precompile rc=$? $((SECONDS-start)) s"
$B/tests/kvattn_tests --gtest_filter='GpuCascade.*:GpuSharedPrefix.*' > "$out/gpu-cascade.log" 2>&1; echo "cascade tests rc=$? $((SECONDS-start)) s"
grep -E "OK|FAILED|Failure|error" "$out/gpu-cascade.log" | head -30
# decode suites passed in the previous call


timeout 150 $B/apps/kvattn bench cascade --json > "$out/bench-cascade.json" 2> "$out/bench-cascade.err"; echo "bench rc=$? $((SECONDS-start)) s"
tail -5 "$out/bench-cascade.err"
python3 - "$out/bench-cascade.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
print(f"{'case':28} {'cascade':>9} {'pieces':>9} {'flat':>9} {'x flat':>7} {'auto':>9} {'chose':>8} {'auto/flat':>9} {'plan':>7} {'autoplan':>8} {'diffC':>7} {'diffA':>7}")
for r in rows:
    print(f"{r['case']:28} {r['ms']*1e3:9.1f} {r['pieces_ms']*1e3:9.1f} {r['flat_ms']*1e3:9.1f} {r['speedup']:7.2f} {r['auto_ms']*1e3:9.1f} {r['auto_family']:>8} {r['auto_speedup']:9.2f} {r['plan_us']:7.1f} {r['auto_plan_us']:8.1f} {r['max_abs_diff_cascade_vs_flat']:7.4f} {r['max_abs_diff_auto_vs_flat']:7.4f}")
PY
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 $B/tests/kvattn_tests --gtest_filter='GpuCascade.*:GpuSharedPrefix.*' --gtest_brief=1 > "$out/memcheck.log" 2>&1; echo "memcheck rc=$? $((SECONDS-start)) s"
tail -3 "$out/memcheck.log"
echo "total $((SECONDS-start)) s"
