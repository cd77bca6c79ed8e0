#!/usr/bin/env bash
# Session 15 call 5 (the final kernels): the decode peers (bench/run-peers: FlashInfer 0.3.1
# CUDA-core and tensor-core decode, SDPA, cuDNN, Flex; every output against float64) on kvattn's
# default route, and in the same call kvattn on the decode kernels alone (KVATTN_DECODE_KERNEL=decode)
# and on the prefill kernels' decode shape (--via-prefill), for issues 4 and 5.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s15; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for p in default decode; do $D/kvattn4 jit precompile --preset $p -j 16 2>&1 | tail -1; done
C=b64_l4096_h32-8,b1_l32768_h32-8,zipf64_h32-8,long32k_63x512_h32-8,b64_l1016_h32-8,b64_l4096_p1_h32-8,b16_l4096_h32-8,b64_l32768_h32-8,b256_l4096_h32-8
for r in 1 2; do
  KVATTN_DECODE_KERNEL=decode timeout 90 $D/kvattn4 bench decode --cases $C > "$out/r$r-decode-kernels.txt" 2>&1
  timeout 90 $D/kvattn4 bench decode --via-prefill --cases $C > "$out/r$r-via-prefill.txt" 2>&1
done
for f in r1-decode-kernels r2-decode-kernels r1-via-prefill r2-via-prefill; do echo "== $f"; cut -c1-100 "$out/$f.txt" | tail -9; done
echo "kvattn t=$((SECONDS - t0)) s"
KVATTN_BIN=$D/kvattn4 KVATTN_COMMIT=final-s15 OUT="$out" timeout $((575 - (SECONDS - t0))) bench/run-peers --fi-cache-in .fi-cache --cases $C --no-cascade --prefill off --budget $((470 - (SECONDS - t0))) > "$out/run-peers-stdout.log" 2>&1
echo "run-peers exit $? at $((SECONDS - t0)) s"; tail -40 "$out/run-peers-stdout.log"
