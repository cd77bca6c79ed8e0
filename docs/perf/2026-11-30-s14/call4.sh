#!/usr/bin/env bash
# Session 14 call 4: Nsight Compute on 16 x 4096 (32/8), the TMA decode kernel one CTA per item
# against the dynamic grid (20% slower there with the same items per CTA).
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s14; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn_new3 jit precompile --preset default -j 16 2>&1 | tail -1
KVATTN_DECODE_GRID=dynamic $D/kvattn_new3 jit precompile --preset default -j 16 2>&1 | tail -1
prof() {  # name case [env]
  local name=$1 case=$2; shift 2
  env "$@" ncu --set full -o /tmp/$name --kernel-name regex:kvattn_decode_mma --launch-skip 4 --launch-count 1 \
    $D/kvattn_new3 bench decode --cases $case --iters 3 > "$out/ncu-$name.log" 2>&1
  ncu --import /tmp/$name.ncu-rep --page source --csv --print-source sass > "$out/$name.csv" 2>/dev/null
  ncu --import /tmp/$name.ncu-rep --page details > "$out/$name-details.txt" 2>/dev/null
  echo "== $name t=$((SECONDS - t0)) s"
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Registers Per|Achieved Occupancy|Waves Per SM|Grid Size|Dynamic Shared" "$out/$name-details.txt" | head -14
}
prof items b16_l4096_h32-8 KVATTN_DECODE_GRID=items
prof dyn b16_l4096_h32-8 KVATTN_DECODE_GRID=dynamic
