#!/usr/bin/env bash
# Session 15 call 7: where the sm_90 route's plan() time goes (KVATTN_PLAN_TRACE=1: the runner's
# phases, one line per plan), against the decode kernels' plan, two alternated rounds.
set -uo pipefail
export KVATTN_CACHE_DIR=/tmp/jit; D=.scratch/s15; out=${OUT:-gpu-out}; mkdir -p "$out"; t0=$SECONDS
$D/kvattn7 jit precompile --preset default -j 16 2>&1 | tail -1; $D/kvattn7 jit precompile --preset decode -j 16 2>&1 | tail -1
C=b64_l4096_h32-8,b256_l4096_h32-8,zipf64_h32-8
for r in 1 2; do for m in route decode; do
  e=X=1; [ $m = decode ] && e=KVATTN_DECODE_KERNEL=decode
  env $e KVATTN_PLAN_TRACE=1 timeout 90 $D/kvattn7 bench decode --cases $C > "$out/r$r-$m.txt" 2> "$out/r$r-$m-trace.txt"
done; done
python3 - "$out" <<'PY'
import re, sys, statistics as st
out = sys.argv[1]
for r in (1, 2):
    for m in ("route", "decode"):
        rows = [l.split(None, 1)[1] for l in open(f"{out}/r{r}-{m}-trace.txt") if l.startswith("[plan]")]
        # The bench plans each case 3 + 200 times with host ids, then 3 + 200 with device ids, then once
        # more per timed setting: take the blocks of 203 device-id plans per case.
        print(f"== round {r} {m}: {len(rows)} plans")
        for k, name in enumerate(["64 x 4096", "256 x 4096", "zipf"]):
            block = rows[k * 406 + 203 + 3: k * 406 + 406]
            phases = {}
            for l in block:
                for nm, v in re.findall(r"([a-z+]+) ([\d.]+)", l.split("(runner")[0]): phases.setdefault(nm, []).append(float(v))
                phases.setdefault("runner", []).append(float(re.search(r"runner ([\d.]+)", l).group(1)))
            print(f"  {name:11s} " + "  ".join(f"{nm} {st.median(v):.1f}" for nm, v in phases.items()))
        for l in open(f"{out}/r{r}-{m}.txt").read().splitlines()[1:]: print("  ", l[:100])
PY
echo "t=$((SECONDS - t0)) s"
