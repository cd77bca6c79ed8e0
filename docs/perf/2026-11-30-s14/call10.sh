#!/usr/bin/env bash
# Session 14 call 10: the fixed cost of a single-request decode, piece by piece: requests too short
# to split (no merge kernel), the merge's early (PDL) launch on and off, and the split forced off.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s14; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn_main jit precompile --preset default -j 16 2>&1 | tail -1
b() { local e=$1; shift; echo "$e $* :: $(env $e timeout 30 $D/kvattn_main bench decode --cases custom_h32-8 "$@" 2>&1 | tail -1 | cut -c30-75)"; }
for r in 1 2; do
  for L in 1 16 64 256 1024; do b X=1 --kv-lens $L; b X=1 --kv-lens $L --no-split; done
  for L in 2048 32768; do
    b X=1 --kv-lens $L; b KVATTN_DECODE_PDL=0 --kv-lens $L; b KVATTN_DECODE_MERGE=fold --kv-lens $L
  done
done | tee "$out/fixed.txt"
KVATTN_PLAN_TRACE=1 timeout 30 $D/kvattn_main bench decode --cases custom_h32-8 --kv-lens 32768 --iters 3 2>&1 | grep -m3 "plan\]"
echo "t=$((SECONDS - t0)) s"
