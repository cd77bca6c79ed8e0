"""kvattn.BatchDecode on the CPU backend with numpy inputs, against the float64 reference."""

import math

import numpy as np
import pytest

import kvattn
import reference as ref
from conftest import (FLOAT_DTYPES, FP8_DTYPES, cast, check_lse, check_output, f64, np_dtype,
                      page_table, rand)


def make_cache(rng, num_pages, page_size, hkv, dqk, dvo, layout, dtype, lo=-1.0, hi=1.0):
    shape = lambda d: (num_pages, page_size, hkv, d) if layout == "NHD" else (num_pages, hkv, page_size, d)
    return cast(rand(rng, shape(dqk), lo, hi), dtype), cast(rand(rng, shape(dvo), lo, hi), dtype)


def decode_case(rng, *, kv_lens, hq, hkv, dqk, dvo=None, page_size, layout="NHD", q_dtype="f16",
                kv_dtype=None, o_dtype=None, variant=None, var=None, combined=False,
                return_lse=True, accumulation=ref.ACCUMULATION, kv_range=1.0):
    dvo = dvo or dqk
    kv_dtype = kv_dtype or q_dtype
    o_dtype = o_dtype or q_dtype
    indptr, indices, last, num_pages = page_table(rng, kv_lens, page_size)
    k, v = make_cache(rng, num_pages, page_size, hkv, dqk, dvo, layout, kv_dtype, -kv_range, kv_range)
    q = cast(rand(rng, (len(kv_lens), hq, dqk)), q_dtype)
    dec = kvattn.BatchDecode(kv_layout=layout)
    dec.plan(page_table=kvattn.PageTable(indptr, indices, last), page_size=page_size,
             num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=dqk,
             head_dim_vo=dvo if dvo != dqk else 0, q_dtype=q_dtype, kv_dtype=kv_dtype,
             o_dtype=o_dtype, variant=variant)
    if combined:
        kv = np.stack([k, v], axis=1)
        res = dec.run(q, kv, return_lse=return_lse)
    else:
        res = dec.run(q, (k, v), return_lse=return_lse)
    out, lse = res if return_lse else (res, None)
    assert isinstance(out, np.ndarray) and out.dtype == np_dtype(o_dtype)
    assert out.shape == (len(kv_lens), hq, dvo)
    ks = ref.gather_paged(f64(k), layout, indptr, indices, last, page_size)
    vs = ref.gather_paged(f64(v), layout, indptr, indices, last, page_size)
    qo_indptr = np.arange(len(kv_lens) + 1)
    want_o, want_lse, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs, var or ref.Var())
    check_output(out, want_o, mag, o_dtype, accumulation)
    if return_lse:
        assert lse.dtype == np.float32 and lse.shape == (len(kv_lens), hq)
        check_lse(lse, want_lse)
    return dec


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (6, 1)])
def test_decode_dtypes_layouts_gqa(rng, dtype, layout, hq, hkv):
    decode_case(rng, kv_lens=[1, 17, 64, 5, 100], hq=hq, hkv=hkv, dqk=64, page_size=16,
                layout=layout, q_dtype=dtype)


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_decode_page_sizes_and_empty_requests(rng, page_size):
    # A request without pages sees nothing: o = 0 and lse = -inf.
    dec = decode_case(rng, kv_lens=[0, 7, 0, 33], hq=4, hkv=2, dqk=32, page_size=page_size,
                      q_dtype="f32")
    assert dec.kernel_family() == "cpu" and dec.kernel_name() == "cpu"


def test_decode_combined_5d_cache_and_dvo(rng):
    decode_case(rng, kv_lens=[9, 40], hq=4, hkv=2, dqk=64, dvo=32, page_size=8, combined=False,
                q_dtype="f32")
    decode_case(rng, kv_lens=[9, 40], hq=4, hkv=2, dqk=32, page_size=8, combined=True,
                layout="HND", q_dtype="f16")


def test_decode_output_dtype(rng):
    decode_case(rng, kv_lens=[12, 30], hq=4, hkv=4, dqk=32, page_size=4, q_dtype="f16", o_dtype="f32")
    if "bf16" in FLOAT_DTYPES:
        decode_case(rng, kv_lens=[12, 30], hq=4, hkv=4, dqk=32, page_size=4, q_dtype="f32",
                    o_dtype="bf16")


@pytest.mark.parametrize("name", ["window", "soft_cap", "alibi", "sm_scale", "rope", "rope_llama31",
                                  "sigmoid", "combo"])
def test_decode_variants(rng, name):
    lens = [3, 50, 21]
    cases = {
        "window": (kvattn.variants.sliding_window(10), ref.Var(causal=True, window_left=10)),
        "soft_cap": (kvattn.variants.soft_cap(2.5), ref.Var(soft_cap=2.5)),
        "alibi": (kvattn.variants.alibi(), ref.Var(alibi=True)),
        "sm_scale": (kvattn.Variant(sm_scale=0.3), ref.Var(sm_scale=0.3)),
        "rope": (kvattn.variants.rope(kvattn.RopeConfig(rope_theta=500.0, rope_scale=2.0)),
                 ref.Var(rope=dict(theta=500.0, scale=2.0))),
        "rope_llama31": (
            kvattn.variants.rope(kvattn.RopeConfig(rope_theta=5e5, llama31=kvattn.Llama31Scaling(
                factor=8.0, original_max_position=64.0))),
            ref.Var(rope=dict(theta=5e5, llama31=dict(factor=8.0, original_max_position=64.0)))),
        "sigmoid": (kvattn.variants.sigmoid(-0.5), ref.Var(sigmoid=True, sigmoid_bias=-0.5)),
        "combo": (kvattn.variants.sliding_window(16).with_soft_cap(4.0).with_alibi(),
                  ref.Var(causal=True, window_left=16, soft_cap=4.0, alibi=True)),
    }
    variant, var = cases[name]
    decode_case(rng, kv_lens=lens, hq=8, hkv=2, dqk=64, page_size=8, q_dtype="f32",
                variant=variant, var=var, return_lse=name != "sigmoid")


@pytest.mark.parametrize("kv_dtype", FP8_DTYPES)
def test_decode_fp8_kv_with_scales(rng, kv_dtype):
    variant = kvattn.Variant().with_scales(0.5, 2.0, 1.5)
    decode_case(rng, kv_lens=[20, 7], hq=4, hkv=2, dqk=32, page_size=16, q_dtype="f16",
                kv_dtype=kv_dtype, variant=variant, var=ref.Var(q_scale=0.5, k_scale=2.0, v_scale=1.5),
                kv_range=4.0)


def test_decode_preallocated_outputs_and_strided_q(rng):
    hq, hkv, d, ps = 4, 2, 32, 8
    lens = [10, 3]
    indptr, indices, last, num_pages = page_table(rng, lens, ps)
    k, v = make_cache(rng, num_pages, ps, hkv, d, d, "NHD", "f32")
    # q is a strided view (every other row of a bigger array): any strides but a contiguous head dim.
    big = cast(rand(rng, (2 * len(lens), hq, d)), "f32")
    q = big[::2]
    assert not q.flags["C_CONTIGUOUS"]
    dec = kvattn.BatchDecode(None, "NHD")
    dec.plan(page_table=(indptr, indices, last), page_size=ps, num_qo_heads=hq, num_kv_heads=hkv,
             head_dim_qk=d, q_dtype=np.float32)
    out = np.full((len(lens), hq, d), np.nan, dtype=np.float32)  # poisoned
    lse = np.full((len(lens), hq), np.nan, dtype=np.float32)
    res = dec.run(q, (k, v), out=out, lse=lse)
    assert res[0] is out and res[1] is lse
    ks = ref.gather_paged(f64(k), "NHD", indptr, indices, last, ps)
    vs = ref.gather_paged(f64(v), "NHD", indptr, indices, last, ps)
    want_o, want_lse, mag = ref.batch_attention(f64(q), [0, 1, 2], ks, vs, ref.Var())
    check_output(out, want_o, mag, "f32")
    check_lse(lse, want_lse)
    # Just out: a single array comes back.
    assert dec.run(q, k, v, out=out) is out


def test_decode_replan_and_schedule(rng):
    dec = kvattn.BatchDecode()
    assert dec.schedule() is None and dec.kernel_family() == "" and dec.kernel_name() == ""
    lens = [300, 5, 77, 1]
    indptr, indices, last, num_pages = page_table(rng, lens, 16)
    dec.plan(page_table=(indptr, indices, last), page_size=16, num_qo_heads=8, num_kv_heads=2,
             head_dim_qk=32, q_dtype="f32",
             scheduler=kvattn.SchedulerOptions(num_workers=3, fixed_split_size=64))
    plan = dec.schedule()
    assert plan.batch_size == 4 and plan.num_workers == 3 and plan.split_size == 64
    # Every (request, kv head) KV range is covered exactly once, in chunks of at most 64 tokens.
    covered = {}
    for it in plan.items:
        assert it.active and 0 <= it.worker < 3 and it.q_rows == 1
        assert it.kv_tokens <= 64
        covered.setdefault((it.request, it.kv_head), []).append((it.kv_begin, it.kv_end))
    for b, n in enumerate(lens):
        for h in range(2):
            chunks = sorted(covered[(b, h)])
            assert chunks[0][0] == 0 and chunks[-1][1] == n
            assert all(a[1] == c[0] for a, c in zip(chunks, chunks[1:]))
    assert plan.num_merges > 0 and all(m.num_slots >= 2 for m in plan.merges)
    assert list(plan.worker_begin) == sorted(plan.worker_begin)
    # A re-plan with other lengths is what the next run uses; the old snapshot is unchanged.
    decode_case(rng, kv_lens=[4, 4], hq=8, hkv=2, dqk=32, page_size=16, q_dtype="f32")
    assert plan.batch_size == 4


def test_decode_list_page_table(rng):
    # Lists of ints are copied to int32 host arrays.
    d, ps = 16, 4
    k, v = make_cache(rng, 3, ps, 1, d, d, "NHD", "f32")
    q = cast(rand(rng, (1, 2, d)), "f32")
    dec = kvattn.BatchDecode()
    dec.plan(page_table=([0, 2], [2, 0], [3]), page_size=ps, num_qo_heads=2, num_kv_heads=1,
             head_dim_qk=d, q_dtype="f32")
    out = dec.run(q, (k, v))
    ks = ref.gather_paged(f64(k), "NHD", [0, 2], [2, 0], [3], ps)
    vs = ref.gather_paged(f64(v), "NHD", [0, 2], [2, 0], [3], ps)
    want, _, mag = ref.batch_attention(f64(q), [0, 1], ks, vs, ref.Var())
    check_output(out, want, mag, "f32")


def test_decode_custom_mask(rng):
    """BatchDecode with a packed custom mask (kv_len bits per request), composed with a window."""
    kv_lens = [13, 1, 40, 0]
    hq, hkv, dqk, ps = 4, 2, 16, 4
    indptr, indices, last, num_pages = page_table(rng, kv_lens, ps)
    k, v = make_cache(rng, num_pages, ps, hkv, dqk, dqk, "NHD", "f32")
    q = cast(rand(rng, (len(kv_lens), hq, dqk)), "f32")
    masks = [rng.random((1, n)) < 0.6 for n in kv_lens]
    packed = [np.packbits(m.reshape(-1).astype(np.uint8), bitorder="little") for m in masks]
    mask_indptr = np.cumsum([0] + [len(b) for b in packed]).astype(np.int32)
    mask_bytes = np.concatenate(packed + [np.zeros(0, np.uint8)]).astype(np.uint8)
    variant = kvattn.variants.custom_mask().with_window(10)
    dec = kvattn.BatchDecode()
    dec.plan(page_table=(indptr, indices, last), page_size=ps, num_qo_heads=hq, num_kv_heads=hkv,
             head_dim_qk=dqk, q_dtype="f32", variant=variant, custom_mask=mask_bytes, mask_indptr=mask_indptr)
    out, lse = dec.run(q, (k, v), return_lse=True)
    ks = ref.gather_paged(f64(k), "NHD", indptr, indices, last, ps)
    vs = ref.gather_paged(f64(v), "NHD", indptr, indices, last, ps)
    var = ref.Var(window_left=10, mask=lambda b, i, j: bool(masks[b][i, j]))
    want_o, want_lse, mag = ref.batch_attention(f64(q), np.arange(len(kv_lens) + 1), ks, vs, var)
    check_output(out, want_o, mag, "f32", ref.ACCUMULATION)
    check_lse(lse, want_lse)
    with pytest.raises(kvattn.Error, match=r"mask_indptr"):
        dec.plan(page_table=(indptr, indices, last), page_size=ps, num_qo_heads=hq, num_kv_heads=hkv,
                 head_dim_qk=dqk, q_dtype="f32", variant=variant, custom_mask=mask_bytes,
                 mask_indptr=mask_indptr[:-1])
