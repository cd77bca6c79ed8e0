#!/usr/bin/env bash
# Session 12 call 5 (370aabc): Nsight Compute on the hd128 1 x 16k causal prefill kernel, plain
# (t31) against soft-cap exact (t5) and soft-cap tanh.approx (t29): pipe use, issue slots, stalls
# per SASS line, to see what limits soft-cap.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s12; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
KVATTN_PREFILL_TANH=approx $D/kvattn_new jit precompile --preset bench-prefill -j 16 2>&1 | tail -1
prof() {  # name case [env]
  local name=$1 case=$2; shift 2
  env "$@" ncu --set full -o /tmp/$name --kernel-name regex:kvattn_prefill_bf16 --launch-skip 4 --launch-count 1 \
    $D/kvattn_new bench prefill --cases $case --iters 3 > "$out/ncu-$name.log" 2>&1
  ncu --import /tmp/$name.ncu-rep --page source --csv --print-source sass > "$out/$name.csv" 2>/dev/null
  ncu --import /tmp/$name.ncu-rep --page details > "$out/$name-details.txt" 2>/dev/null
  echo "== $name t=$((SECONDS - t0)) s"
  grep -E "Duration|Issue Slots Busy|Issued Ipc|Executed Ipc A|No Eligible|Warp Cycles Per Issued|Registers Per|Compute \(SM\) Th" "$out/$name-details.txt" | head -12
}
prof plain hd128_causal_1x16384 KVATTN_PREFILL_TUNING=31
prof softcap hd128_causal_1x16384_softcap KVATTN_PREFILL_TUNING=5
prof approx hd128_causal_1x16384_softcap KVATTN_PREFILL_TANH=approx
ls -la "$out"
