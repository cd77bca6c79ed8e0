#!/usr/bin/env python3
"""Compiles FlashInfer kernel modules before anything is timed, all in one parallel ninja build
(FlashInfer JIT-compiles each module with nvcc on first use: about 30 s each one after another).
run.py calls build() with the modules its cases need; by hand:

  python3 bench/peers/jit_warmup.py decode:128 fa2:128 fa3:128 fa2:64:softcap

A module key is KIND:HEAD_DIM[:softcap], KIND one of decode (batch decode, CUDA-core path), fa2
(batch prefill template fa2, which FlashInfer's tensor-core decode path also runs on) and fa3
(the Hopper prefill template); always bf16 q/KV/out, int32 indices, no RoPE or sliding window.
Modules already built are skipped (ninja).
"""
import sys
import time

import torch


def spec(key):
    from flashinfer import jit

    parts = key.split(":")
    kind, hd, cap = parts[0], int(parts[1]), len(parts) > 2 and parts[2] == "softcap"
    bf16, i32 = torch.bfloat16, torch.int32
    if kind == "decode":
        return jit.gen_batch_decode_module(bf16, bf16, bf16, i32, hd, hd, 0, False, cap)
    if kind in ("fa2", "fa3"):
        return jit.gen_batch_prefill_module(kind, bf16, bf16, bf16, i32, hd, hd, 0, False, cap, False)
    raise ValueError(f"unknown module kind in {key!r}")


def build(keys, log=print):
    """Builds the modules; returns seconds taken. Failures are reported, not raised: the wrappers
    then build what they need on first use (slower, outside any timed region all the same)."""
    t0 = time.time()
    keys = sorted(set(keys))
    try:
        from flashinfer.jit import build_jit_specs

        build_jit_specs([spec(k) for k in keys], verbose=False)
        log(f"flashinfer JIT: {' '.join(keys)} ready in {time.time() - t0:.0f} s")
    except Exception as e:  # noqa: BLE001
        log(f"flashinfer JIT: parallel build failed after {time.time() - t0:.0f} s "
            f"({type(e).__name__}: {str(e)[-1500:]}); modules build on first use instead")
    return time.time() - t0


def main():
    keys = sys.argv[1:] or ["decode:128", "fa2:128", "fa3:128"]
    if any(k in ("-h", "--help") for k in keys):
        print(__doc__)
        return 0
    import flashinfer

    print(f"flashinfer {flashinfer.__version__}")
    build(keys)
    return 0


if __name__ == "__main__":
    sys.exit(main())
