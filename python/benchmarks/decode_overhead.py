"""Host time of BatchDecode.plan() + run() from Python for a 64-request decode (32/8 heads, hd 128,
pages of 16, 4096 tokens each, bf16) on the GPU, and of the same calls' parts, in microseconds
(median of N, after warm-up; run() only launches, so no synchronisation inside the loop).

    python3 python/benchmarks/decode_overhead.py [N]

Prints one JSON line. The C++ side of the same calls is what `kvattn bench decode` times as plan();
the difference is the binding's cost (argument conversion, DLPack imports, output allocation,
the current-stream lookup)."""

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
    ts = []
    for _ in range(n):
        t = time.perf_counter_ns()
        f()
        ts.append(time.perf_counter_ns() - t)
        torch.cuda.synchronize()  # outside the timed part: each call starts on an idle queue
    return float(np.median(ts)) / 1e3


plan()
dec.run(q, (k, v), out=out)
torch.cuda.synchronize()
res = {
    "plan_us": med(plan),
    "run_out_given_us": med(lambda: dec.run(q, (k, v), out=out)),
    "run_alloc_out_us": med(lambda: dec.run(q, (k, v))),
    "plan_plus_run_us": med(lambda: (plan(), dec.run(q, (k, v), out=out))),
    "torch_empty_us": med(lambda: torch.empty_like(q)),
    "current_stream_us": med(lambda: torch.cuda.current_stream().cuda_stream),
    "kernel_family": dec.kernel_family(),
}
print(json.dumps(res))
