#!/usr/bin/env bash
# Session 12 call 9: where plan() time goes on this host (KVATTN_PLAN_TRACE=1), 256 x 4096 and Zipf.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s12; out=${OUT:-gpu-out}; mkdir -p "$out"
$D/kvattn_gen jit precompile --preset decode -j 16 2>&1 | tail -1
for c in b256_l4096_h32-8 zipf64_h32-8 b64_l4096_h32-8; do
  KVATTN_PLAN_TRACE=1 $D/kvattn_gen bench decode --cases $c --iters 5 > "$out/trace-$c.txt" 2>&1
  echo "== $c"; grep "^\[plan\]" "$out/trace-$c.txt" | tail -4; grep -v "^\[" "$out/trace-$c.txt" | tail -1
done
