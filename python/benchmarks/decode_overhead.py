"""Host time of BatchDecode.plan() + run() from Python for a 64-request decode (32/8 heads, hd 128,
pages of 16, 4096 tokens each, bf16) on the GPU, and of the same calls' parts, in microseconds
(median of N, after warm-up; run() only launches, so no synchronisation inside the loop).

    python3 python/benchmarks/decode_overhead.py [N]

Prints one JSON line: for each, the time seen from Python, the time inside the C++ call
(BatchDecode._last_native_ns) and their difference, the binding's cost (argument conversion,
DLPack imports, output allocation, the current-stream lookup)."""

import json
import sys
import time

import numpy as np
import torch

import kvattn

N = int(sys.argv[1]) if len(sys.argv) > 1 else 300
B, HQ, HKV, D, PS, L = 64, 32, 8, 128, 16, 4096
pages = B * L // PS
indptr = np.arange(0, pages + 1, L // PS, dtype=np.int32)
indices = torch.arange(pages, dtype=torch.int32, device="cuda")
last = np.full(B, PS, np.int32)
k = torch.randn(pages, PS, HKV, D, dtype=torch.bfloat16, device="cuda")
v = torch.randn_like(k)
q = torch.randn(B, HQ, D, dtype=torch.bfloat16, device="cuda")
out = torch.empty_like(q)
ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
dec = kvattn.BatchDecode(ws, "NHD")
table = (indptr, indices, last)


def plan():
    dec.plan(page_table=table, page_size=PS, num_qo_heads=HQ, num_kv_heads=HKV, head_dim_qk=D,
             q_dtype=torch.bfloat16)


def med(f, n=N):
    """Median host time of f() and of the C++ calls inside it (BatchDecode._last_native_ns after
    each of plan() and run()), in microseconds."""
    total, native = [], []
    for _ in range(n):
        t = time.perf_counter_ns()
        inner = f()
        total.append(time.perf_counter_ns() - t)
        native.append(inner or 0)
        torch.cuda.synchronize()  # outside the timed part: each call starts on an idle queue
    return round(float(np.median(total)) / 1e3, 2), round(float(np.median(native)) / 1e3, 2)


def plan_and_run(out_given):
    plan()
    ns = dec._last_native_ns
    if out_given:
        dec.run(q, (k, v), out=out)
    else:
        dec.run(q, (k, v))
    return ns + dec._last_native_ns


def only(f):
    def g():
        f()
        return dec._last_native_ns
    return g


plan()
dec.run(q, (k, v), out=out)
torch.cuda.synchronize()
res = {}
for name, f in [("plan", only(plan)),
                ("run_out_given", only(lambda: dec.run(q, (k, v), out=out))),
                ("run_alloc_out", only(lambda: dec.run(q, (k, v)))),
                ("plan_plus_run_out_given", lambda: plan_and_run(True)),
                ("plan_plus_run_alloc_out", lambda: plan_and_run(False))]:
    t, c = med(f)
    res[name] = {"python_us": t, "cpp_us": c, "binding_us": round(t - c, 2)}
res["torch_empty_us"] = med(lambda: (torch.empty_like(q), 0)[1])[0]
res["kernel_family"] = dec.kernel_family()
print(json.dumps(res))
