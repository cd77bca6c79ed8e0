"""The RoPE ops beyond test_ops.py / test_flashinfer_wrappers.py: the native apply_rope_ragged (the
(indptr, offsets) form FlashInfer's apply_rope maps to) on the CPU with numpy, and, where torch
with CUDA and kvattn's CUDA backend are there, every RoPE entry point on CUDA tensors (the GPU
kernels) against the same call on the CPU, in place inside a fused QKV tensor, int64 positions
converted on the device, and captured in a CUDA graph.

Tolerances: the CPU results are held to the float64 reference by test_ops.py; the GPU's computed
cos/sin (CUDA's powf and sincosf) may differ from the C library's by a few ulps of the f32 angle
(positions below 1024 here: <= 16 * 2^-24 * 1024 radians) times |x0| + |x1| <= 2, plus two ulps
of the dtype at 1 (the rounding of either side); the table form writes the CPU's bits."""

import numpy as np
import pytest

import kvattn
import kvattn.flashinfer as fi
from conftest import FLOAT_DTYPES, cast, rand
from test_ops import rope_check


def segments(rng, lens):
    indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    offsets = rng.integers(-10, 900, size=len(lens)).astype(np.int32)
    pos = np.concatenate([o + np.arange(s) for o, s in zip(offsets, lens)] or [[]]).astype(np.int32)
    return indptr, offsets, pos


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("interleave", [False, True])
def test_ragged_equals_pos_ids(rng, dtype, interleave):
    indptr, offsets, pos = segments(rng, [4, 0, 7, 1])
    n = int(indptr[-1])
    q, k = cast(rand(rng, (n, 4, 32)), dtype), cast(rand(rng, (n, 2, 32)), dtype)
    kw = dict(rotary_dim=16, interleave=interleave, rope_theta=500.0)
    qa, ka = kvattn.apply_rope(q, k, pos, **kw)
    qb, kb = kvattn.apply_rope_ragged(q, k, indptr, offsets, **kw)
    assert np.array_equal(qa.view(np.uint8), qb.view(np.uint8))
    assert np.array_equal(ka.view(np.uint8), kb.view(np.uint8))
    rope_check(qb, q, pos, dtype, interleave=interleave, rotary_dim=16, theta=500.0)
    q2, k2 = q.copy(), k.copy()
    kvattn.apply_rope_ragged(q2, k2, indptr.tolist(), offsets.tolist(), q_out=q2, k_out=k2, **kw)
    assert np.array_equal(q2.view(np.uint8), qa.view(np.uint8))


def test_ragged_errors(rng):
    q = np.zeros((5, 2, 16), np.float32)
    with pytest.raises(kvattn.Error, match=r"indptr\[2\] = 4 but q has 5 rows"):
        kvattn.apply_rope_ragged(q, q.copy(), [0, 2, 4], [0, 0])
    with pytest.raises(kvattn.Error, match=r"offsets has 1 elements but 2 are expected"):
        kvattn.apply_rope_ragged(q, q.copy(), [0, 2, 5], [0])
    with pytest.raises(kvattn.Error, match=r"past int32"):
        kvattn.apply_rope_ragged(q, q.copy(), [0, 2, 5], [0, 2**31 - 2])
    with pytest.raises(kvattn.Error, match=r"indptr\[0\] = 1 but an indptr starts at 0"):
        fi.apply_rope(q, q.copy(), np.array([1, 2, 5], np.int64), [0, 0])


# ---- CUDA ---------------------------------------------------------------------------------------------
try:
    import torch
except ImportError:  # CI installs numpy only
    torch = None
CUDA = torch is not None and torch.cuda.is_available() and kvattn.has_cuda_backend
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs torch with a CUDA device and kvattn's CUDA backend")
ULP = {"f32": 2.0**-23, "f16": 2.0**-10, "bf16": 2.0**-7}


def torch_dtype(name):
    return {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[name]


def close_to_cpu(gpu, cpu, dtype, exact=False):
    g, c = gpu.detach().cpu().float().numpy(), cpu.detach().float().numpy()
    if exact:
        assert np.array_equal(gpu.detach().cpu().view(torch.int16 if gpu.element_size() == 2 else torch.int32).numpy(),
                              cpu.view(torch.int16 if cpu.element_size() == 2 else torch.int32).numpy())
        return
    tol = 16 * 2.0**-24 * 1024 * 2 + 2 * ULP[dtype]
    assert np.max(np.abs(g - c)) <= tol, np.max(np.abs(g - c))


@needs_cuda
@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_cuda_rope_family_matches_the_cpu(rng, dtype):
    td = torch_dtype(dtype)
    indptr, offsets, pos = segments(rng, [5, 0, 9, 3])
    n, hq, hk, d = int(indptr[-1]), 4, 2, 64
    q = torch.from_numpy(rand(rng, (n, hq, d)).astype(np.float32)).to(td)
    k = torch.from_numpy(rand(rng, (n, hk, d)).astype(np.float32)).to(td)
    qc, kc = q.cuda(), k.cuda()
    t = lambda a: torch.from_numpy(a)  # noqa: E731
    cases = [
        (fi.apply_rope, (t(indptr), t(offsets)), dict(rope_scale=2.0)),
        (fi.apply_rope_pos_ids, (t(pos),), dict(interleave=True)),
        (fi.apply_rope_pos_ids, (t(pos).long(),), dict(rotary_dim=32)),  # int64: converted on the device
        (fi.apply_llama31_rope, (t(indptr), t(offsets)), dict(old_context_len=256)),
        (fi.apply_llama31_rope_pos_ids, (t(pos),), dict(rotary_dim=16, interleave=True)),
    ]
    for fn, args, kw in cases:
        want_q, want_k = fn(q, k, *args, **kw)
        got_q, got_k = fn(qc, kc, *[a.cuda() for a in args], **kw)
        assert got_q.device.type == "cuda" and got_q.dtype == td
        close_to_cpu(got_q, want_q, dtype)
        close_to_cpu(got_k, want_k, dtype)
    # The table form in place inside a fused QKV tensor (vLLM's call), int64 positions.
    rd, max_pos = 48, 1024
    inv = 1e4 ** (-np.arange(0, rd, 2) / rd)
    ang = np.arange(max_pos)[:, None] * inv[None, :]
    cache = torch.from_numpy(np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32))
    qkv = torch.from_numpy(rand(rng, (n, (hq + 2 * hk) * d)).astype(np.float32)).to(td)
    qkv_c = qkv.cuda()
    positions = torch.from_numpy(rng.integers(0, max_pos, size=n))
    for is_neox in (True, False):
        a, b = qkv.clone(), qkv_c.clone()
        fi.apply_rope_with_cos_sin_cache_inplace(positions, a[:, :hq * d], a[:, hq * d:(hq + hk) * d], d, cache, is_neox)
        fi.apply_rope_with_cos_sin_cache_inplace(positions.cuda(), b[:, :hq * d], b[:, hq * d:(hq + hk) * d], d,
                                                 cache.cuda(), is_neox)
        torch.cuda.synchronize()
        close_to_cpu(b, a, dtype, exact=True)


@needs_cuda
def test_cuda_rope_is_graph_capturable(rng):
    n, hq, hk, d = 32, 8, 2, 128
    qkv = torch.randn(n, (hq + 2 * hk) * d, device="cuda", dtype=torch.bfloat16)
    positions = torch.randint(0, 512, (n,), device="cuda")  # int64, as vLLM passes them
    inv = 1e4 ** (-np.arange(0, d, 2) / d)
    ang = np.arange(512)[:, None] * inv[None, :]
    cache = torch.from_numpy(np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)).cuda()
    indptr = torch.tensor([0, 20, n], dtype=torch.int32, device="cuda")
    offsets = torch.tensor([3, 100], dtype=torch.int32, device="cuda")

    def step(x):
        q, k = x[:, :hq * d], x[:, hq * d:(hq + hk) * d]
        fi.apply_rope_with_cos_sin_cache_inplace(positions, q, k, d, cache)
        fi.apply_rope_inplace(q.view(n, hq, d), k.view(n, hk, d), indptr, offsets)

    eager = qkv.clone()
    step(eager)  # also warms the kernels up before the capture
    torch.cuda.synchronize()
    static = qkv.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(static)
    static.copy_(qkv)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, eager)
