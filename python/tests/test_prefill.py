"""kvattn.BatchPrefill (ragged and paged KV) and kvattn.BlockSparseAttention on the CPU backend
with numpy inputs, against the float64 reference."""

import numpy as np
import pytest

import kvattn
import reference as ref
from conftest import (FLOAT_DTYPES, FP8_DTYPES, cast, check_lse, check_output, f64, np_dtype,
                      page_table, rand)


def ragged_case(rng, *, qo_lens, kv_lens, hq, hkv, dqk, dvo=None, dtype="f16", kv_dtype=None,
                o_dtype=None, variant=None, var=None, mask_bytes=None, mask_indptr=None,
                return_lse=True):
    dvo = dvo or dqk
    kv_dtype, o_dtype = kv_dtype or dtype, o_dtype or dtype
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    q = cast(rand(rng, (qo_indptr[-1], hq, dqk)), dtype)
    k = cast(rand(rng, (kv_indptr[-1], hkv, dqk)), kv_dtype)
    v = cast(rand(rng, (kv_indptr[-1], hkv, dvo)), kv_dtype)
    pre = kvattn.BatchPrefill()
    pre.plan(qo_indptr=qo_indptr, kv_indptr=kv_indptr, num_qo_heads=hq, num_kv_heads=hkv,
             head_dim_qk=dqk, head_dim_vo=dvo, q_dtype=dtype, kv_dtype=kv_dtype, o_dtype=o_dtype,
             variant=variant, custom_mask=mask_bytes, mask_indptr=mask_indptr)
    res = pre.run(q, k, v, return_lse=return_lse)
    out, lse = res if return_lse else (res, None)
    assert isinstance(out, np.ndarray) and out.dtype == np_dtype(o_dtype)
    ks = [f64(k[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(len(kv_lens))]
    vs = [f64(v[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(len(kv_lens))]
    want_o, want_lse, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs, var or ref.Var())
    check_output(out, want_o, mag, o_dtype)
    if return_lse:
        check_lse(lse, want_lse)
    return pre


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2)])
def test_ragged(rng, dtype, causal, hq, hkv):
    # Prefill (qo_len = kv_len), append (qo_len < kv_len) and an empty request in one batch.
    var = ref.Var(causal=causal)
    ragged_case(rng, qo_lens=[7, 1, 0, 20], kv_lens=[7, 30, 5, 45], hq=hq, hkv=hkv, dqk=64,
                dtype=dtype, variant=kvattn.Variant(causal=causal), var=var)


def test_kernel_name_on_the_cpu(rng):
    # '' before plan(), 'cpu' after a CPU plan (GPU names: the C++ GpuPrefill.KernelNameNamesTheTier).
    assert kvattn.BatchPrefill().kernel_name() == ""
    pre = ragged_case(rng, qo_lens=[3], kv_lens=[5], hq=2, hkv=2, dqk=32, dtype="f32")
    assert pre.kernel_name() == "cpu"


def test_ragged_head_dims_differ_and_output_dtype(rng):
    ragged_case(rng, qo_lens=[5, 9], kv_lens=[12, 9], hq=4, hkv=2, dqk=64, dvo=32, dtype="f16",
                o_dtype="f32", variant=kvattn.variants.causal(), var=ref.Var(causal=True))


@pytest.mark.parametrize("name", ["window", "soft_cap", "alibi", "rope", "sigmoid", "scales"])
def test_ragged_variants(rng, name):
    cases = {
        "window": (kvattn.variants.sliding_window(6), ref.Var(causal=True, window_left=6)),
        "soft_cap": (kvattn.variants.causal().with_soft_cap(3.0), ref.Var(causal=True, soft_cap=3.0)),
        "alibi": (kvattn.variants.causal().with_alibi(), ref.Var(causal=True, alibi=True)),
        "rope": (kvattn.variants.causal().with_rope(kvattn.RopeConfig(interleave=True)),
                 ref.Var(causal=True, rope=dict(interleave=True))),
        "sigmoid": (kvattn.variants.sigmoid(0.25).with_causal(), ref.Var(causal=True, sigmoid=True,
                                                                         sigmoid_bias=0.25)),
        "scales": (kvattn.Variant(sm_scale=0.2).with_scales(1.5, 0.5, 2.0),
                   ref.Var(sm_scale=0.2, q_scale=1.5, k_scale=0.5, v_scale=2.0)),
    }
    variant, var = cases[name]
    ragged_case(rng, qo_lens=[10, 3], kv_lens=[25, 3], hq=4, hkv=2, dqk=32, dtype="f32",
                variant=variant, var=var, return_lse=name != "sigmoid")


def packbits_little(bits):
    """Bit b of the flat array at byte b // 8, position b % 8 (SEMANTICS.md)."""
    bits = np.asarray(bits, dtype=np.uint8).ravel()
    pad = (-len(bits)) % 8
    bits = np.concatenate([bits, np.zeros(pad, np.uint8)]).reshape(-1, 8)
    return (bits << np.arange(8, dtype=np.uint8)).sum(axis=1).astype(np.uint8)


def test_custom_mask(rng):
    qo_lens, kv_lens = [5, 3, 6], [9, 3, 6]
    masks = [rng.random((q, k)) < 0.6 for q, k in zip(qo_lens, kv_lens)]
    masks[2][1, :] = False  # a row that sees nothing: o = 0, lse = -inf
    packed = [packbits_little(m) for m in masks]
    mask_indptr = np.concatenate([[0], np.cumsum([len(p) for p in packed])]).astype(np.int32)
    mask_bytes = np.concatenate(packed)
    var = ref.Var(mask=lambda b, i, j: bool(masks[b][i, j]))
    ragged_case(rng, qo_lens=qo_lens, kv_lens=kv_lens, hq=4, hkv=1, dqk=32, dtype="f16",
                variant=kvattn.variants.custom_mask(), var=var, mask_bytes=mask_bytes,
                mask_indptr=mask_indptr)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_paged_prefill(rng, layout, dtype, page_size):
    hq, hkv, d = 8, 2, 32
    qo_lens, kv_lens = [4, 1, 17], [10, 33, 17]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    indptr, indices, last, num_pages = page_table(rng, kv_lens, page_size)
    shape = (num_pages, page_size, hkv, d) if layout == "NHD" else (num_pages, hkv, page_size, d)
    kv = cast(rand(rng, (num_pages, 2) + shape[1:]), dtype)  # one 5-D [pages, 2, ...] cache
    q = cast(rand(rng, (qo_indptr[-1], hq, d)), dtype)
    pre = kvattn.BatchPrefill(kv_layout=layout)
    pre.plan(qo_indptr=qo_indptr, page_table=(indptr, indices, last), page_size=page_size,
             num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=d, q_dtype=dtype,
             variant=kvattn.variants.causal())
    out5, lse5 = pre.run(q, kv, return_lse=True)
    out2 = pre.run(q, (kv[:, 0], kv[:, 1]))  # the same cache as two strided 4-D views
    out3 = pre.run(q, kv[:, 0], kv[:, 1])
    ks = ref.gather_paged(f64(kv[:, 0]), layout, indptr, indices, last, page_size)
    vs = ref.gather_paged(f64(kv[:, 1]), layout, indptr, indices, last, page_size)
    want_o, want_lse, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs, ref.Var(causal=True))
    for out in (out5, out2, out3):
        check_output(out, want_o, mag, dtype)
    check_lse(lse5, want_lse)


@pytest.mark.parametrize("kv_dtype", FP8_DTYPES)
def test_paged_prefill_fp8(rng, kv_dtype):
    hq, hkv, d, ps = 4, 2, 32, 8
    qo_lens, kv_lens = [3, 8], [11, 8]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    indptr, indices, last, num_pages = page_table(rng, kv_lens, ps)
    k = cast(rand(rng, (num_pages, ps, hkv, d), -4, 4), kv_dtype)
    v = cast(rand(rng, (num_pages, ps, hkv, d), -4, 4), kv_dtype)
    q = cast(rand(rng, (qo_indptr[-1], hq, d)), "f16")
    pre = kvattn.BatchPrefill()
    pre.plan(qo_indptr=qo_indptr, page_table=kvattn.PageTable(indptr, indices, last), page_size=ps,
             num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=d, q_dtype="f16", kv_dtype=kv_dtype,
             variant=kvattn.variants.causal().with_scales(1.0, 0.25, 0.5))
    out, lse = pre.run(q, (k, v), return_lse=True)
    ks = ref.gather_paged(f64(k), "NHD", indptr, indices, last, ps)
    vs = ref.gather_paged(f64(v), "NHD", indptr, indices, last, ps)
    want_o, want_lse, mag = ref.batch_attention(
        f64(q), qo_indptr, ks, vs, ref.Var(causal=True, k_scale=0.25, v_scale=0.5))
    check_output(out, want_o, mag, "f16")
    check_lse(lse, want_lse)


def test_prefill_schedule(rng):
    pre = ragged_case(rng, qo_lens=[40, 2], kv_lens=[40, 200], hq=4, hkv=2, dqk=32, dtype="f32",
                      variant=kvattn.variants.causal(), var=ref.Var(causal=True))
    plan = pre.schedule()
    assert plan.batch_size == 2 and plan.num_kv_heads == 2 and plan.group_size == 2
    rows = {}
    for it in plan.items:
        assert it.q_begin < it.q_end
        for r in range(it.q_begin, it.q_end):
            rows.setdefault((it.request, it.kv_head, r), []).append((it.kv_begin, it.kv_end))
    # Each query row of each request and KV head is computed, its chunks tiling a KV range that
    # causality allows.
    for (b, h, r), chunks in rows.items():
        chunks.sort()
        assert all(a[1] == c[0] for a, c in zip(chunks, chunks[1:]))
    assert len({(b, h) for b, h, _ in rows}) == 4


# ---- block-sparse ---------------------------------------------------------------------------------
@pytest.mark.parametrize("R,C", [(1, 1), (4, 8), (3, 5)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_block_sparse(rng, R, C, dtype):
    mb, nb = 4, 5
    M, N = mb * R, nb * C
    hq, hkv, d = 4, 2, 32
    present = rng.random((mb, nb)) < 0.5
    present[1, :] = False  # a block row with no block: o = 0, lse = -inf
    indptr = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)
    indices = np.concatenate([np.flatnonzero(row) for row in present]).astype(np.int32)
    q = cast(rand(rng, (M, hq, d)), dtype)
    k = cast(rand(rng, (N, hkv, d)), dtype)
    v = cast(rand(rng, (N, hkv, d)), dtype)
    bsa = kvattn.BlockSparseAttention()
    bsa.plan(bsr=kvattn.BSRMatrix(indptr, indices, M, N, R, C), num_qo_heads=hq, num_kv_heads=hkv,
             head_dim_qk=d, q_dtype=dtype)
    out, lse = bsa.run(q, k, v, return_lse=True)
    var = ref.Var(mask=lambda b, i, j: bool(present[i // R, j // C]))
    want_o, want_lse, mag = ref.batch_attention(f64(q), [0, M], [f64(k)], [f64(v)], var)
    check_output(out, want_o, mag, dtype)
    check_lse(lse, want_lse)
    # The tuple form of the BSR gives the same plan.
    bsa.plan(bsr=(indptr, indices, M, N, R, C), num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=d,
             q_dtype=dtype)
    assert bsa.schedule().batch_size == mb


def test_block_sparse_causal_positions(rng):
    # Positions for masks: key j at j, query i at i + N - M (bottom-right).
    M, N, R, C = 6, 12, 2, 3
    indptr = np.array([0, 4, 8, 12], np.int32)
    indices = np.array([0, 1, 2, 3] * 3, np.int32)
    q = cast(rand(rng, (M, 2, 16)), "f32")
    k = cast(rand(rng, (N, 2, 16)), "f32")
    v = cast(rand(rng, (N, 2, 16)), "f32")
    bsa = kvattn.BlockSparseAttention()
    bsa.plan(bsr=kvattn.BSRMatrix(indptr, indices, M, N, R, C), num_qo_heads=2, num_kv_heads=2,
             head_dim_qk=16, q_dtype="f32", variant=kvattn.variants.causal())
    out, lse = bsa.run(q, k, v, return_lse=True)
    want_o, want_lse, mag = ref.batch_attention(f64(q), [0, M], [f64(k)], [f64(v)], ref.Var(causal=True))
    check_output(out, want_o, mag, "f32")
    check_lse(lse, want_lse)
