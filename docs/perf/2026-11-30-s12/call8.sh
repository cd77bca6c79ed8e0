#!/usr/bin/env bash
# Session 12 call 8: `bench decode` on generated values (kvattn_gen) against the constant fill it
# used before (kvattn_constfill, 36c4757; same decode kernels), the issue-4 rows, two rounds.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s12; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
$D/kvattn_gen jit precompile --preset decode -j 16 2>&1 | tail -1
C=b64_l4096_h32-8,b1_l32768_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8,b64_l4096_p1_h32-8,b256_l4096_h32-8,b16_l4096_h32-8
for r in 1 2; do for b in constfill gen; do echo "== $b r$r"; $D/kvattn_$b bench decode --cases $C 2>&1 | tail -n +2; done; done > "$out/decode-fill.txt" 2>&1
sed -E "s/ +/ /g" "$out/decode-fill.txt" | cut -c1-80
echo "t=$((SECONDS - t0)) s"
