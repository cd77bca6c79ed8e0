#!/usr/bin/env bash
set -uo pipefail
out=${OUT:-/tmp/out}; mkdir -p "$out"
export KVATTN_CACHE_DIR=$PWD/.jit-cache
bin=build/release
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
timeout 60 $bin/apps/kvattn jit precompile --arch sm_90a -j 16 --preset bench-prefill 2>&1 | tail -1
cases=hd128_causal_1x16384,hd128_causal_1x16384_softcap,hd128_causal_1x16384_gqa,hd128_causal_1x16384_gqa_softcap,hd64_causal_1x16384,hd64_causal_1x16384_softcap
for round in 1 2 3; do
  timeout 60 $bin/apps/kvattn bench prefill --cases $cases --json > "$out/round$round.json" 2>/dev/null
  python3 - "$out/round$round.json" $round <<'PY'
import json, sys
print("round", sys.argv[2], "  ".join(f"{r['id'].replace('_1x16384','')}={r['TFLOPs']:.1f}" for r in json.load(open(sys.argv[1]))))
PY
done
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
