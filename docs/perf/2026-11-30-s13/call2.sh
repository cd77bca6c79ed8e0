#!/usr/bin/env bash
# Session 13 call 2: plan() A/B with 200-plan medians and p90 (kvattn_old: c4f35d8's library with
# this session's bench code; kvattn_new: upload kernel + one-pass knobs), three rounds; plan phases;
# bench cascade on generated values (new) against the constant fill (kvattn_constfill, 36c4757).
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s13; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; which perf
$D/kvattn_old jit precompile --preset decode -j 16 2>&1 | tail -1
for b in new constfill; do $D/kvattn_$b jit precompile --preset default -j 16 2>&1 | tail -1; done
echo "precompile t=$((SECONDS - t0)) s"
C=b256_l4096_h32-8,zipf64_h32-8,b64_l4096_h32-8,b1_l32768_h32-8,long32k_63x512_h32-8,b16_l4096_h32-8
for r in 1 2 3; do for b in old new; do echo "== $b r$r"; $D/kvattn_$b bench decode --cases $C --iters 10 2>&1 | tail -n +2; done; done > "$out/plan-ab.txt" 2>&1
sed -E "s/ +/ /g" "$out/plan-ab.txt" | cut -c1-100
KVATTN_PLAN_TRACE=1 $D/kvattn_new bench decode --cases b256_l4096_h32-8 --iters 3 > "$out/trace-new.txt" 2>&1; grep "^\[plan\]" "$out/trace-new.txt" | tail -4
echo "decode t=$((SECONDS - t0)) s"
for r in 1 2; do for b in constfill new; do echo "== $b r$r"; $D/kvattn_$b bench cascade 2>&1; done; done > "$out/cascade-fill.txt" 2>&1
sed -E "s/ +/ /g" "$out/cascade-fill.txt" | cut -c1-110
echo "t=$((SECONDS - t0)) s"
