#!/usr/bin/env bash
# Session 15 call 10 (final kernels: the decode shape's uniform variant, 6 x 16 at 2 CTAs per SM,
# for decode batches without a dominant request): the decode peers (run-peers) on kvattn's default,
# and in the same call the default, the decode kernels alone and --via-prefill; the decode-shape
# tests and memcheck.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s15; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
for p in default decode; do $D/kvattn10 jit precompile --preset $p -j 16 2>&1 | tail -1; done
C=b64_l4096_h32-8,b1_l32768_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8,b64_l4096_p1_h32-8,b16_l4096_h32-8,b64_l32768_h32-8,b256_l4096_h32-8
{ timeout 90 $D/kvattn10 bench decode --cases $C; KVATTN_DECODE_KERNEL=decode timeout 90 $D/kvattn10 bench decode --cases $C;
  timeout 90 $D/kvattn10 bench decode --via-prefill --cases $C; timeout 90 $D/kvattn10 bench decode --cases $C; } > "$out/rows.txt" 2>&1
cut -c1-100 "$out/rows.txt"
echo "kvattn t=$((SECONDS - t0)) s"
KVATTN_BIN=$D/kvattn10 KVATTN_COMMIT=final-s15-uniform OUT="$out" timeout 150 bench/run-peers --fi-cache-in .fi-cache --cases $C --no-cascade --prefill off --budget 120 > "$out/run-peers-stdout.log" 2>&1
echo "run-peers exit $? at $((SECONDS - t0)) s"; grep -E "^\| (1|16|64|256) " "$out/run-peers-stdout.log" | head -12
timeout 200 $D/tests10 --gtest_filter='GpuPrefill.DecodeShapes:GpuDecodeRoute.*:GpuDecode.OnThePrefillKernels*:GpuGraph.*:GpuPlanStaging.*' > "$out/tests.log" 2>&1
echo "tests exit $? t=$((SECONDS - t0)) s"; grep -E "^\[(  FAILED  |  PASSED)" "$out/tests.log" | tail -3
timeout 60 compute-sanitizer --tool memcheck $D/tests10 --gtest_filter='GpuDecodeRoute.*' > "$out/memcheck.log" 2>&1
echo "memcheck exit $? t=$((SECONDS - t0)) s"; tail -1 "$out/memcheck.log"
rm -f "$out"/*.png "$out/run-peers.log" "$out/table.md"
