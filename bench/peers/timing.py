"""GPU timing as `kvattn bench` does it (apps/bench_command.cpp): CUDA events around each call,
calls back to back, inputs rotated over enough copies that a call's data has left the L2 when it
is read again (cold L2), median of the timed calls after warm-up calls.

One addition for Python callers: before the timed calls a spin kernel (torch.cuda._sleep) holds
the GPU for a few milliseconds, so that every timed call is queued before the first one starts
and the events measure GPU time, not the interpreter's per-call overhead (kvattn's C++ loop
launches faster than its kernels run and needs no such lead-in).
"""
import time

import torch

CYCLES_PER_MS = 2.0e6  # about the H200's 1.98 GHz; only sizes the lead-in


def _lead_in(ms):
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None and ms > 0:
        sleep(int(ms * CYCLES_PER_MS))


def median_ms(run, copies=1, iters=30, warm=3, lead_in_ms=None):
    """run(i) launches one call on input copy i (0 <= i < copies). Returns (median ms, all ms)."""
    if not torch.cuda.is_available():  # PEERS_DEVICE=cpu smoke tests: wall clock, meaningless
        ms = []
        for i in range(warm + iters):
            t0 = time.perf_counter()
            run(i % copies)
            ms.append((time.perf_counter() - t0) * 1e3)
        ms = sorted(ms[warm:])
        return ms[len(ms) // 2], ms
    for i in range(warm):
        run(i % copies)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    _lead_in(min(20.0, 0.25 * iters) if lead_in_ms is None else lead_in_ms)
    for i in range(iters):
        starts[i].record()
        run(i % copies)
        ends[i].record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return ms[len(ms) // 2], ms


def median_host_us(fn, reps=20, warm=3):
    """Median wall time of fn() in microseconds (plan() on the host), after warm-up calls."""
    for _ in range(warm):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    us = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        us.append((time.perf_counter() - t0) * 1e6)
    us.sort()
    return us[len(us) // 2]
