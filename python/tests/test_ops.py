"""The stand-alone operations on the CPU backend with numpy inputs: merge_state,
merge_state_in_place, merge_states, append_paged_kv_cache, apply_rope.

Tolerances: merging folds in f32, so beyond the output rounding (2u of the output dtype) an output
may be off by a few f32 ulps of mag = |o_a| w_a + |o_b| w_b, times the exponent's size (exp2 of
differences up to ~20 here): 1e-5 * mag is an 8x margin. Merged LSEs: a few ulps of |lse|, so
1e-6 max(1, |lse|) (tests/ops_merge_test.cpp). RoPE: the f32 angle pos * f_t carries ~|a| ulps,
so an element may be off by (|x0| + |x1|) (64 |a| + 8) 2^-24 before rounding (ops_rope_test.cpp).
Appends are exact: equal dtypes copy the bits, conversions round to nearest even once.
"""

import numpy as np
import pytest

import kvattn
import reference as ref
from conftest import FLOAT_DTYPES, FP8_DTYPES, cast, check_output, f64, np_dtype, page_table, rand

MERGE_ACC = 1e-5


def merge_lse_ok(got, want):
    g = np.asarray(got, np.float64)
    assert np.array_equal(np.isneginf(g), np.isneginf(want))
    fin = np.isfinite(want)
    assert (np.abs(g[fin] - want[fin]) <= 1e-6 * np.maximum(1.0, np.abs(want[fin]))).all()


def states(rng, n, h, d, dtype, neg_inf_rows=()):
    o = cast(rand(rng, (n, h, d)), dtype)
    s = rng.uniform(-10, 10, size=(n, h)).astype(np.float32)
    for r in neg_inf_rows:
        s[r] = -np.inf
    return o, s


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_merge_state(rng, dtype):
    n, h, d = 9, 4, 32
    va, sa = states(rng, n, h, d, dtype, neg_inf_rows=[2, 5])
    vb, sb = states(rng, n, h, d, dtype, neg_inf_rows=[5, 7])
    if dtype == "f32":
        va[2] = np.nan  # a side with lse = -inf is never read
    vo, so = kvattn.merge_state(va, sa, vb, sb)
    assert vo.dtype == np_dtype(dtype) and so.dtype == np.float32
    want_o, want_s, mag = ref.merge(f64(va), f64(sa), f64(vb), f64(sb))
    check_output(vo, want_o, mag, dtype, MERGE_ACC)
    merge_lse_ok(so, want_s)
    assert (f64(vo[5]) == 0).all() and np.isneginf(so[5]).all()


def test_merge_state_outputs_given_and_other_dtype(rng):
    n, h, d = 5, 2, 16
    va, sa = states(rng, n, h, d, "f16")
    vb, sb = states(rng, n, h, d, "f16")
    vo = np.full((n, h, d), np.nan, np.float32)
    so = np.full((n, h), np.nan, np.float32)
    r = kvattn.merge_state(va, sa, vb, sb, v_out=vo, s_out=so)
    assert r[0] is vo and r[1] is so
    want_o, want_s, mag = ref.merge(f64(va), f64(sa), f64(vb), f64(sb))
    check_output(vo, want_o, mag, "f32", MERGE_ACC)
    merge_lse_ok(so, want_s)
    # In place: the output aliases an input exactly.
    kvattn.merge_state(va, sa, vb, sb, v_out=va, s_out=sa)
    check_output(va, want_o, mag, "f16", MERGE_ACC)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_merge_state_in_place_with_mask(rng, dtype):
    n, h, d = 8, 3, 16
    v, s = states(rng, n, h, d, dtype, neg_inf_rows=[1])
    vo, so = states(rng, n, h, d, dtype, neg_inf_rows=[3])
    mask = (rng.random(n) < 0.5).astype(np.uint8)
    mask[0], mask[1] = 1, 1
    want_o, want_s, mag = ref.merge(f64(v), f64(s), f64(vo), f64(so))
    keep = mask == 0
    want_o[keep], want_s[keep], mag[keep] = f64(v)[keep], f64(s)[keep], 0
    assert kvattn.merge_state_in_place(v, s, vo, so, mask) is None
    check_output(v, want_o, mag, dtype, MERGE_ACC)
    merge_lse_ok(s, want_s)
    # Without a mask every row merges.
    v2, s2 = states(rng, n, h, d, dtype)
    w_o, w_s, w_mag = ref.merge(f64(v2), f64(s2), f64(vo), f64(so))
    kvattn.merge_state_in_place(v2, s2, vo, so)
    check_output(v2, w_o, w_mag, dtype, MERGE_ACC)
    merge_lse_ok(s2, w_s)


@pytest.mark.parametrize("k", [0, 1, 5])
def test_merge_states(rng, k):
    n, h, d = 6, 2, 32
    v = cast(rand(rng, (n, k, h, d)), "f32")
    s = rng.uniform(-5, 5, size=(n, k, h)).astype(np.float32)
    if k > 1:
        s[0, 1] = -np.inf
        s[2] = -np.inf
    vo, so = kvattn.merge_states(v, s)
    assert vo.shape == (n, h, d) and so.shape == (n, h)
    want_o = np.zeros((n, h, d))
    want_s = np.full((n, h), -np.inf)
    mag = np.zeros((n, h, d))
    for i in range(k):  # fold in index order
        want_o, want_s, m = ref.merge(want_o, want_s, f64(v[:, i]), f64(s[:, i]))
        mag = m + mag
    check_output(vo, want_o, mag, "f32", MERGE_ACC)
    merge_lse_ok(so, want_s)


# ---- append ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("combined", [False, True])
@pytest.mark.parametrize("append_dtype,cache_dtype", [("f16", "f16"), ("f32", "f16")]
                         + [("f32", "bf16"), ("f16", "e4m3")] * bool(FP8_DTYPES))
def test_append_paged_kv_cache(rng, layout, combined, append_dtype, cache_dtype):
    ps, hkv, d = 4, 2, 16
    old = [3, 0, 9]   # tokens already cached
    new = [2, 5, 4]   # tokens appended
    lens = [a + b for a, b in zip(old, new)]
    indptr, indices, last, num_pages = page_table(rng, lens, ps)
    shape = (num_pages, ps, hkv, d) if layout == "NHD" else (num_pages, hkv, ps, d)
    if combined:
        kv = cast(rand(rng, (num_pages, 2) + shape[1:]), cache_dtype)
        cache, kc, vc = kv, kv[:, 0], kv[:, 1]
    else:
        kc = cast(rand(rng, shape), cache_dtype)
        vc = cast(rand(rng, shape), cache_dtype)
        cache = (kc, vc)
    before_k, before_v = kc.copy(), vc.copy()
    batch = np.concatenate([[b] * n for b, n in enumerate(new)]).astype(np.int32)
    pos = np.concatenate([np.arange(o, o + n) for o, n in zip(old, new)]).astype(np.int32)
    ak = cast(rand(rng, (len(batch), hkv, d)), append_dtype)
    av = cast(rand(rng, (len(batch), hkv, d)), append_dtype)
    out = kvattn.append_paged_kv_cache(ak, av, batch, pos, cache, (indptr, indices, last),
                                       kv_layout=layout)
    assert out is None
    want_k, want_v = before_k.copy(), before_v.copy()
    for r in range(len(batch)):
        b, t = batch[r], pos[r]
        page, slot = indices[indptr[b] + t // ps], t % ps
        ck = ak[r].astype(np.float64).astype(np_dtype(cache_dtype))  # one RNE rounding
        cv = av[r].astype(np.float64).astype(np_dtype(cache_dtype))
        if layout == "NHD":
            want_k[page, slot], want_v[page, slot] = ck, cv
        else:
            want_k[page, :, slot], want_v[page, :, slot] = ck, cv
    assert np.array_equal(kc.view(np.uint8), want_k.view(np.uint8))
    assert np.array_equal(vc.view(np.uint8), want_v.view(np.uint8))


def test_append_rejected_call_leaves_cache_untouched(rng):
    ps, hkv, d = 4, 1, 8
    indptr, indices, last, num_pages = page_table(rng, [6], ps)
    kc = cast(rand(rng, (num_pages, ps, hkv, d)), "f32")
    vc = cast(rand(rng, (num_pages, ps, hkv, d)), "f32")
    before = kc.copy()
    ak = cast(rand(rng, (2, hkv, d)), "f32")
    with pytest.raises(ValueError, match="positions"):
        kvattn.append_paged_kv_cache(ak, ak, [0, 0], [5, 6], (kc, vc), (indptr, indices, last))
    assert np.array_equal(kc, before)


# ---- RoPE -----------------------------------------------------------------------------------------
def rope_check(got, x, pos, dtype, **cfg):
    want = ref.rope(f64(x), pos, **cfg)
    d = cfg.get("rotary_dim") or x.shape[-1]
    f = ref.rope_frequencies(d, cfg.get("theta", 1e4), cfg.get("scale", 1.0), cfg.get("llama31"))
    a = np.abs(np.asarray(pos, np.float64))[:, None] * f[None, :]  # [n, d/2]
    pair = np.abs(f64(x))
    inter = cfg.get("interleave", False)
    i0 = np.arange(0, d, 2) if inter else np.arange(d // 2)
    i1 = np.arange(1, d, 2) if inter else np.arange(d // 2, d)
    tol = np.zeros_like(want)
    bound = (pair[..., i0] + pair[..., i1]) * ((64 * a + 8) * 2.0**-24)[:, None, :]
    tol[..., i0] = bound
    tol[..., i1] = bound
    # `mag` = tol / ACCUMULATION makes check_output's accumulation term exactly tol.
    check_output(got, want, tol / ref.ACCUMULATION, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("cfg", [
    dict(),
    dict(theta=5e5, scale=2.0),
    dict(interleave=True),
    dict(rotary_dim=16),
    dict(theta=5e5, llama31=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position=256.0)),
], ids=["plain", "theta_scale", "interleave", "partial", "llama31"])
def test_apply_rope(rng, dtype, cfg):
    n, hq, hk, d = 7, 4, 2, 32
    q = cast(rand(rng, (n, hq, d)), dtype)
    k = cast(rand(rng, (n, hk, d)), dtype)
    pos = rng.integers(0, 300, size=n).astype(np.int32)
    kw = dict(rotary_dim=cfg.get("rotary_dim", 0), rope_theta=cfg.get("theta", 1e4),
              rope_scale=cfg.get("scale", 1.0), interleave=cfg.get("interleave", False))
    if "llama31" in cfg:
        kw["llama31"] = kvattn.Llama31Scaling(**cfg["llama31"])
    qo, ko = kvattn.apply_rope(q, k, pos, **kw)
    assert qo.dtype == q.dtype and ko.shape == k.shape
    rope_check(qo, q, pos, dtype, **cfg)
    rope_check(ko, k, pos, dtype, **cfg)
    # In place: outputs alias the inputs exactly.
    q2, k2 = q.copy(), k.copy()
    r = kvattn.apply_rope(q2, k2, pos, q_out=q2, k_out=k2, **kw)
    assert r[0] is q2 and r[1] is k2
    assert np.array_equal(q2.view(np.uint8), qo.view(np.uint8))
    assert np.array_equal(k2.view(np.uint8), ko.view(np.uint8))
