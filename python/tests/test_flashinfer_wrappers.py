"""kvattn.flashinfer's single-request functions, BlockSparseAttentionWrapper,
MultiLevelCascadeAttentionWrapper and the RoPE family: FlashInfer 0.3's signatures, on the CPU
backend with numpy inputs, against the float64 reference (reference.py), and their error paths.

Tolerances are reference.py's (2u of the output dtype, ACCUMULATION x sum |w v|, LSE 2e-4), except:
the cascade stores each level's output in the output dtype before merging (FlashInfer does too),
which adds up to 2u x the level's magnitude per level, and the f32 merge (1e-5 x mag, test_ops.py);
RoPE as test_ops.py argues ((|x0| + |x1|) (64 |a| + 8) 2^-24 before rounding).
"""

import inspect

import numpy as np
import pytest

import kvattn
import kvattn.flashinfer as fi
import reference as ref
from conftest import FLOAT_DTYPES, cast, check_lse, check_output, f64, rand
from test_ops import rope_check

WORKSPACE = np.zeros(1 << 20, np.uint8)
FI = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def params(fn):
    return inspect.signature(fn).parameters


# ---- signatures (FlashInfer 0.3.1: names, order, defaults) ------------------------------------------
def test_signatures_follow_flashinfer():
    p = params(fi.single_decode_with_kv_cache)
    assert list(p) == ["q", "k", "v", "kv_layout", "pos_encoding_mode", "use_tensor_cores", "q_scale",
                       "k_scale", "v_scale", "window_left", "logits_soft_cap", "sm_scale", "rope_scale",
                       "rope_theta", "return_lse"]
    assert p["kv_layout"].default == "NHD" and p["window_left"].default == -1
    assert p["return_lse"].default is False and p["use_tensor_cores"].default is False
    p = params(fi.single_prefill_with_kv_cache)
    assert list(p) == ["q", "k", "v", "scale_q", "scale_k", "scale_v", "o_dtype", "custom_mask",
                       "packed_custom_mask", "causal", "kv_layout", "pos_encoding_mode",
                       "use_fp16_qk_reduction", "sm_scale", "window_left", "logits_soft_cap",
                       "rope_scale", "rope_theta", "backend", "return_lse"]
    assert p["causal"].default is False and p["backend"].default == "auto"
    assert fi.single_prefill_with_kv_cache_return_lse.keywords == {"return_lse": True}
    p = params(fi.BlockSparseAttentionWrapper.plan)
    assert list(p)[1:] == ["indptr", "indices", "M", "N", "R", "C", "num_qo_heads", "num_kv_heads",
                           "head_dim", "mask", "packed_mask", "causal", "pos_encoding_mode",
                           "use_fp16_qk_reduction", "logits_soft_cap", "sm_scale", "rope_scale",
                           "rope_theta", "q_data_type", "kv_data_type", "o_data_type", "non_blocking"]
    assert p["q_data_type"].default == "float16" and p["o_data_type"].default == "float16"
    p = params(fi.BlockSparseAttentionWrapper.run)
    assert list(p)[1:] == ["q", "k", "v", "scale_q", "scale_k", "scale_v", "out", "lse", "return_lse",
                           "enable_pdl"]
    assert list(params(fi.BlockSparseAttentionWrapper.__init__))[1:] == ["float_workspace_buffer", "backend"]
    p = params(fi.MultiLevelCascadeAttentionWrapper.__init__)
    assert list(p)[1:] == ["num_levels", "float_workspace_buffer", "kv_layout", "use_cuda_graph",
                           "qo_indptr_buf_arr", "paged_kv_indptr_buf_arr", "paged_kv_indices_buf_arr",
                           "paged_kv_last_page_len_buf_arr"]
    p = params(fi.MultiLevelCascadeAttentionWrapper.plan)
    assert list(p)[1:] == ["qo_indptr_arr", "paged_kv_indptr_arr", "paged_kv_indices_arr",
                           "paged_kv_last_page_len", "num_qo_heads", "num_kv_heads", "head_dim",
                           "page_size", "causal", "pos_encoding_mode", "use_fp16_qk_reduction",
                           "sm_scale", "window_left", "logits_soft_cap", "rope_scale", "rope_theta",
                           "q_data_type", "kv_data_type"]
    assert list(params(fi.MultiLevelCascadeAttentionWrapper.run))[1:] == ["q", "paged_kv_cache"]
    ragged = ["q", "k", "indptr", "offsets", "rotary_dim", "interleave", "rope_scale", "rope_theta"]
    pos = ["q", "k", "pos_ids", "rotary_dim", "interleave", "rope_scale", "rope_theta"]
    llama = ["low_freq_factor", "high_freq_factor", "old_context_len"]
    for fn, names in [(fi.apply_rope, ragged), (fi.apply_rope_inplace, ragged),
                      (fi.apply_rope_pos_ids, pos), (fi.apply_rope_pos_ids_inplace, pos),
                      (fi.apply_llama31_rope, ragged + llama), (fi.apply_llama31_rope_inplace, ragged + llama),
                      (fi.apply_llama31_rope_pos_ids, pos + llama),
                      (fi.apply_llama31_rope_pos_ids_inplace, pos + llama)]:
        assert list(params(fn)) == names, fn.__name__
        assert params(fn)["rotary_dim"].default is None and params(fn)["interleave"].default is False
    assert params(fi.apply_rope)["rope_scale"].default == 1 and params(fi.apply_rope)["rope_theta"].default == 1e4
    p = params(fi.apply_llama31_rope)
    assert (p["rope_scale"].default, p["rope_theta"].default, p["low_freq_factor"].default,
            p["high_freq_factor"].default, p["old_context_len"].default) == (8, 5e5, 1, 4, 8192)
    for fn in (fi.apply_rope_with_cos_sin_cache, fi.apply_rope_with_cos_sin_cache_inplace):
        assert list(params(fn)) == ["positions", "query", "key", "head_size", "cos_sin_cache", "is_neox"]
        assert params(fn)["is_neox"].default is True
    for name in ("single_decode_with_kv_cache", "BlockSparseAttentionWrapper", "apply_rope_with_cos_sin_cache"):
        assert name in fi.__all__


# ---- single request -------------------------------------------------------------------------------------
def _kv(rng, n, h, d, dtype, layout):
    x = cast(rand(rng, (n, h, d)), dtype)
    return x if layout == "NHD" else np.ascontiguousarray(x.swapaxes(0, 1)), x


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("mode", ["NONE", "ROPE_LLAMA", "ALIBI"])
def test_single_decode(rng, dtype, layout, mode):
    hq, hkv, d, n = 8, 2, 32, 37
    q = cast(rand(rng, (hq, d)), dtype)
    k, k_nhd = _kv(rng, n, hkv, d, dtype, layout)
    v, v_nhd = _kv(rng, n, hkv, d, dtype, layout)
    out, lse = fi.single_decode_with_kv_cache(q, k, v, kv_layout=layout, pos_encoding_mode=mode,
                                              window_left=20, logits_soft_cap=4.0, sm_scale=0.3,
                                              rope_theta=1e3, q_scale=1.5, k_scale=0.5, v_scale=2.0,
                                              return_lse=True)
    assert out.shape == (hq, d) and out.dtype == q.dtype and lse.shape == (hq,)
    var = ref.Var(window_left=20, soft_cap=4.0, sm_scale=0.3, q_scale=1.5, k_scale=0.5, v_scale=2.0,
                  alibi=mode == "ALIBI", rope=dict(theta=1e3) if mode == "ROPE_LLAMA" else None)
    want_o, want_lse, mag = ref.batch_attention(f64(q)[None], [0, 1], [f64(k_nhd)], [f64(v_nhd)], var)
    check_output(out, want_o[0], mag[0], dtype)
    check_lse(lse, want_lse[0])
    plain = fi.single_decode_with_kv_cache(q, k, v, kv_layout=layout, use_tensor_cores=True)
    want_o, _, mag = ref.batch_attention(f64(q)[None], [0, 1], [f64(k_nhd)], [f64(v_nhd)], ref.Var())
    check_output(plain, want_o[0], mag[0], dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("case", ["causal", "mask", "packed", "window_rope", "alibi_cap"])
def test_single_prefill(rng, dtype, layout, case):
    hq, hkv, dqk, dvo, qo, kv = 4, 2, 32, 16, 9, 23
    q = cast(rand(rng, (qo, hq, dqk)), dtype)
    k, k_nhd = _kv(rng, kv, hkv, dqk, dtype, layout)
    v, v_nhd = _kv(rng, kv, hkv, dvo, dtype, layout)
    mask = rng.random((qo, kv)) < 0.5
    mask[2] = False  # a query that sees nothing: o = 0, lse = -inf
    kw, var = {}, ref.Var()
    if case == "causal":
        kw, var = dict(causal=True), ref.Var(causal=True)
    elif case == "mask":  # causal is ignored beside a mask, as in FlashInfer
        kw, var = dict(custom_mask=mask, causal=True), ref.Var(mask=lambda b, i, j: bool(mask[i, j]))
    elif case == "packed":
        kw = dict(packed_custom_mask=np.packbits(mask.ravel(), bitorder="little"))
        var = ref.Var(mask=lambda b, i, j: bool(mask[i, j]))
    elif case == "window_rope":
        kw = dict(causal=True, window_left=5, pos_encoding_mode="ROPE_LLAMA", rope_scale=2.0, rope_theta=500.0)
        var = ref.Var(causal=True, window_left=5, rope=dict(theta=500.0, scale=2.0))
    else:
        kw = dict(pos_encoding_mode="ALIBI", logits_soft_cap=3.0, sm_scale=0.2)
        var = ref.Var(alibi=True, soft_cap=3.0, sm_scale=0.2)
    out, lse = fi.single_prefill_with_kv_cache(q, k, v, kv_layout=layout, return_lse=True, **kw)
    assert out.shape == (qo, hq, dvo) and out.dtype == q.dtype
    want_o, want_lse, mag = ref.batch_attention(f64(q), [0, qo], [f64(k_nhd)], [f64(v_nhd)], var)
    check_output(out, want_o, mag, dtype)
    check_lse(lse, want_lse)
    out2, lse2 = fi.single_prefill_with_kv_cache_return_lse(q, k, v, kv_layout=layout, o_dtype="float32", **kw)
    assert out2.dtype == np.float32
    check_output(out2, want_o, mag, "f32")



@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", ["plain", "causal", "rope_alibi_window"])
def test_single_prefill_more_queries_than_keys(rng, dtype, case):
    """qo_len > kv_len, as FlashInfer takes it: query i at kv_len - qo_len + i (negative for the
    first rows), so under causal the first qo_len - kv_len rows see no key (o = 0, lse = -inf)."""
    hq, hkv, d, qo, kv = 4, 2, 32, 21, 6
    q = cast(rand(rng, (qo, hq, d)), dtype)
    k, k_nhd = _kv(rng, kv, hkv, d, dtype, "NHD")
    v, v_nhd = _kv(rng, kv, hkv, d, dtype, "NHD")
    kw, var = {}, ref.Var()
    if case == "causal":
        kw, var = dict(causal=True), ref.Var(causal=True)
    elif case == "rope_alibi_window":
        kw = dict(pos_encoding_mode="ROPE_LLAMA", window_left=4)
        var = ref.Var(window_left=4, rope=dict(theta=1e4, scale=1.0))
    out, lse = fi.single_prefill_with_kv_cache(q, k, v, return_lse=True, **kw)
    want_o, want_lse, mag = ref.batch_attention(f64(q), [0, qo], [f64(k_nhd)], [f64(v_nhd)], var)
    check_output(out, want_o, mag, dtype)
    check_lse(lse, want_lse)
    if case == "causal":
        assert np.all(np.isneginf(lse[:qo - kv])) and not np.any(f64(out[:qo - kv]))
        kw_alibi = dict(pos_encoding_mode="ALIBI", causal=True)
        out, lse = fi.single_prefill_with_kv_cache(q, k, v, return_lse=True, **kw_alibi)
        want_o, want_lse, mag = ref.batch_attention(f64(q), [0, qo], [f64(k_nhd)], [f64(v_nhd)],
                                                    ref.Var(causal=True, alibi=True))
        check_output(out, want_o, mag, dtype)
        check_lse(lse, want_lse)

def test_single_errors(rng):
    q2, q3 = np.zeros((4, 16), np.float32), np.zeros((3, 4, 16), np.float32)
    k = np.zeros((5, 2, 16), np.float32)
    with pytest.raises(kvattn.Error, match=r"q must be 2-D \[num_qo_heads, head_dim\], got shape \[3, 4, 16\]"):
        fi.single_decode_with_kv_cache(q3, k, k)
    with pytest.raises(kvattn.Error, match=r"kv_len = 0"):
        fi.single_decode_with_kv_cache(q2, k[:0], k[:0])
    with pytest.raises(kvattn.Error, match=r"num_qo_heads = 3 is not a multiple of num_kv_heads = 2"):
        fi.single_decode_with_kv_cache(q2[:3], k, k)
    with pytest.raises(kvattn.DTypeError, match=r"q has dtype float64"):
        fi.single_decode_with_kv_cache(q2.astype(np.float64), k, k)
    with pytest.raises(ValueError, match=r"kv_layout = 'XYZ'"):
        fi.single_decode_with_kv_cache(q2, k, k, kv_layout="XYZ")
    with pytest.raises(NotImplementedError, match=r"'pos_encoding_mode'"):
        fi.single_decode_with_kv_cache(q2, k, k, pos_encoding_mode="ROPE_FOO")
    with pytest.raises(kvattn.Error, match=r"custom_mask has shape \[3, 4\] but \[qo_len, kv_len\] = \[3, 5\]"):
        fi.single_prefill_with_kv_cache(q3, k, k, custom_mask=np.ones((3, 4), bool))
    with pytest.raises(kvattn.Error, match=r"custom_mask"):
        fi.single_prefill_with_kv_cache(q3, k, k, packed_custom_mask=np.zeros(1, np.uint8))
    for name in ("scale_q", "scale_k", "scale_v"):
        with pytest.raises(NotImplementedError, match=rf"'{name}'"):
            fi.single_prefill_with_kv_cache(q3, k, k, **{name: np.ones(4, np.float32)})
    with pytest.raises(NotImplementedError, match=r"'use_fp16_qk_reduction'"):
        fi.single_prefill_with_kv_cache(q3, k, k, use_fp16_qk_reduction=True)
    with pytest.raises(NotImplementedError, match=r"'backend'"):
        fi.single_prefill_with_kv_cache(q3, k, k, backend="cudnn")


# ---- block-sparse ---------------------------------------------------------------------------------------
def bsr_problem(rng, M, N, R, C, density=0.4, empty_row=True):
    mb, nb = -(-M // R), N // C
    present = rng.random((mb, nb)) < density
    if empty_row and mb > 1:
        present[1] = False  # a block row with no block: o = 0, lse = -inf
    indptr = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)
    indices = np.concatenate([np.flatnonzero(r) for r in present]).astype(np.int32)
    return present, indptr, indices


def bsr_reference(q, k, v, indptr, indices, M, R, C, var_kw, block_mask=None):
    """FlashInfer's semantics: block row r is a request of its queries over the keys of its listed
    column blocks (in order); positions within that request."""
    mb = len(indptr) - 1
    hq, dv = q.shape[1], v.shape[2]
    o, lse, mag = np.zeros((M, hq, dv)), np.full((M, hq), -np.inf), np.zeros((M, hq, dv))
    for r in range(mb):
        a, e = r * R, min(M, (r + 1) * R)
        blocks = indices[indptr[r]:indptr[r + 1]]
        cols = np.concatenate([np.arange(c * C, (c + 1) * C) for c in blocks]) if len(blocks) else np.zeros(0, int)
        var = ref.Var(**var_kw)
        if block_mask is not None:
            var.mask = lambda b, i, j, r=r: bool(block_mask[indptr[r] + j // C, i, j % C])
        if e == a:
            continue
        ob, lb, mbag = ref.attention_one(f64(q[a:e]), f64(k[cols]), f64(v[cols]), var)
        o[a:e], mag[a:e], lse[a:e] = ob, mbag, lb
    return o, lse, mag


@pytest.mark.parametrize("R,C", [(1, 1), (4, 2), (3, 5), (2, 8)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_block_sparse_wrapper(rng, R, C, dtype):
    M, N, hq, hkv, d = 5 * R, 4 * C, 4, 2, 32
    present, indptr, indices = bsr_problem(rng, M, N, R, C)
    q, k, v = (cast(rand(rng, (n, h, d)), dtype) for n, h in ((M, hq), (N, hkv), (N, hkv)))
    w = fi.BlockSparseAttentionWrapper(WORKSPACE)
    w.plan(indptr, indices, M, N, R, C, hq, hkv, d, q_data_type=FI[dtype], o_data_type=FI[dtype],
           logits_soft_cap=5.0, sm_scale=0.25)
    out, lse = w.run(q, k, v, return_lse=True)
    want_o, want_lse, mag = bsr_reference(q, k, v, indptr, indices, M, R, C, dict(soft_cap=5.0, sm_scale=0.25))
    check_output(out, want_o, mag, dtype)
    check_lse(lse, want_lse)
    # Preallocated outputs; o_data_type defaults to float16 as FlashInfer's.
    o_buf, l_buf = np.full((M, hq, d), np.nan, np.float16), np.full((M, hq), np.nan, np.float32)
    w.plan(indptr, indices, M, N, R, C, hq, hkv, d, q_data_type=FI[dtype], logits_soft_cap=5.0, sm_scale=0.25)
    r = w.run(q, k, v, out=o_buf, lse=l_buf)
    assert r[0] is o_buf and r[1] is l_buf
    check_output(o_buf, want_o, mag, "f16")
    check_lse(l_buf, want_lse)


@pytest.mark.parametrize("case", ["mask", "packed", "causal", "rope", "alibi", "ragged_rows"])
def test_block_sparse_wrapper_flashinfer_semantics(rng, case):
    """Masks inside blocks, and the position-dependent variants with FlashInfer's positions (within
    each block row's gathered keys), including block rows with fewer keys than queries (R > kept
    keys, an empty row) and M not a multiple of R."""
    R, C, hq, hkv, d = 4, 2, 2, 1, 16
    M = 13 if case == "ragged_rows" else 16
    N = 10
    present, indptr, indices = bsr_problem(rng, M, N, R, C, density=0.35)
    present[0] = False
    present[0, 3] = True  # block row 0: 2 keys under 4 queries
    indptr = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)
    indices = np.concatenate([np.flatnonzero(r) for r in present]).astype(np.int32)
    nnz = len(indices)
    q, k, v = (cast(rand(rng, (n, h, d)), "f32") for n, h in ((M, hq), (N, hkv), (N, hkv)))
    block_mask = rng.random((nnz, R, C)) < 0.6
    kw, var_kw, bm = {}, {}, None
    if case == "mask":
        kw, bm = dict(mask=block_mask), block_mask
    elif case == "packed":  # FlashInfer's packed layout: each block row's qo x kv bits from a byte
        parts = []
        for r in range(len(indptr) - 1):
            m = block_mask[indptr[r]:indptr[r + 1]].transpose(1, 0, 2).reshape(R, -1)
            parts.append(np.packbits(m.ravel(), bitorder="little"))
        kw, bm = dict(packed_mask=np.concatenate(parts)), block_mask
    elif case == "causal":
        kw, var_kw = dict(causal=True), dict(causal=True)
    elif case == "rope":
        kw, var_kw = dict(causal=True, pos_encoding_mode="ROPE_LLAMA", rope_theta=100.0), \
            dict(causal=True, rope=dict(theta=100.0))
    elif case == "alibi":
        kw, var_kw = dict(pos_encoding_mode="ALIBI"), dict(alibi=True)
    w = fi.BlockSparseAttentionWrapper(WORKSPACE)
    w.plan(indptr, indices, M, N, R, C, hq, hkv, d, q_data_type="float32", o_data_type="float32", **kw)
    out, lse = w.run(q, k, v, return_lse=True)
    want_o, want_lse, mag = bsr_reference(q, k, v, indptr, indices, M, R, C, var_kw, bm)
    check_output(out, want_o, mag, "f32")
    check_lse(lse, want_lse)



def _partition(rng, total, parts):
    """parts block sizes >= 0 summing to total (some empty when parts > 1)."""
    cuts = np.sort(rng.integers(0, total + 1, size=parts - 1))
    return np.diff(np.concatenate([[0], cuts, [total]])).astype(np.int32)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", ["plain", "causal", "rope_cap"])
def test_variable_block_sparse_wrapper(rng, dtype, case):
    """Block sizes and masks of their own per KV head; each (KV head, row block) against attention
    over the tokens of its selected column blocks, positions within them (FlashInfer's rule)."""
    hq, hkv, d, qo_len, kv_len, nr, nc = 6, 3, 16, 23, 31, 4, 5
    g = hq // hkv
    rows = np.stack([_partition(rng, qo_len, nr) for _ in range(hkv)])
    cols = np.stack([_partition(rng, kv_len, nc) for _ in range(hkv)])
    mask = rng.random((hkv, nr, nc)) < 0.5
    mask[0, 0] = False  # a row block that sees nothing: o = 0, lse = -inf
    q = cast(rand(rng, (hq, qo_len, d)), dtype)
    k = cast(rand(rng, (hkv, kv_len, d)), dtype)
    v = cast(rand(rng, (hkv, kv_len, d)), dtype)
    kw, var = {}, ref.Var()
    if case == "causal":
        kw, var = dict(causal=True), ref.Var(causal=True)
    elif case == "rope_cap":
        kw = dict(pos_encoding_mode="ROPE_LLAMA", logits_soft_cap=4.0, rope_theta=500.0)
        var = ref.Var(soft_cap=4.0, rope=dict(theta=500.0, scale=1.0))
    w = fi.VariableBlockSparseAttentionWrapper(np.zeros(1 << 20, np.float32))
    w.plan(mask, rows, cols, hq, hkv, d, q_data_type=FI[dtype], **kw)
    out, lse = w.run(q, k, v, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype and lse.shape == (hq, qo_len)
    want_o = np.zeros((hq, qo_len, d))
    want_lse = np.full((hq, qo_len), -np.inf)
    mag = np.zeros((hq, qo_len, d))
    for h in range(hkv):
        r0 = np.concatenate([[0], np.cumsum(rows[h])])
        c0 = np.concatenate([[0], np.cumsum(cols[h])])
        for r in range(nr):
            keys = np.concatenate([np.arange(c0[c], c0[c + 1]) for c in range(nc) if mask[h, r, c]] or
                                  [np.zeros(0, np.int64)]).astype(np.int64)
            qs = f64(q[h * g:(h + 1) * g, r0[r]:r0[r + 1]]).transpose(1, 0, 2)  # [rows, g, d]
            o_r, s_r, m_r = ref.batch_attention(qs, [0, len(qs)], [f64(k[h][keys])[:, None]],
                                                [f64(v[h][keys])[:, None]], var)
            want_o[h * g:(h + 1) * g, r0[r]:r0[r + 1]] = o_r.transpose(1, 0, 2)
            want_lse[h * g:(h + 1) * g, r0[r]:r0[r + 1]] = s_r.T
            mag[h * g:(h + 1) * g, r0[r]:r0[r + 1]] = m_r.transpose(1, 0, 2)
    check_output(out, want_o, mag, dtype)
    check_lse(lse, want_lse)
    assert np.all(np.isneginf(lse[:g, :rows[0, 0]])) and not np.any(f64(out[:g, :rows[0, 0]]))
    # out= and lse= receive the same result.
    o_buf, s_buf = np.empty_like(out), np.empty_like(lse)
    w.run(q, k, v, out=o_buf, lse=s_buf)
    assert np.array_equal(o_buf.view(np.uint8), out.view(np.uint8)) and np.array_equal(s_buf, lse)


def test_variable_block_sparse_wrapper_errors(rng):
    w = fi.VariableBlockSparseAttentionWrapper(WORKSPACE)
    mask = np.ones((2, 2, 3), bool)
    rows = np.array([[3, 4], [5, 2]], np.int32)
    cols = np.array([[1, 2, 3], [2, 2, 2]], np.int32)
    with pytest.raises(kvattn.Error, match=r"num_qo_heads = 3 is not a multiple of num_kv_heads = 2"):
        w.plan(mask, rows, cols, 3, 2, 16)
    with pytest.raises(kvattn.Error, match=r"block_mask_map has shape \[2, 2, 3\] but must be \[num_kv_heads = 4"):
        w.plan(mask, rows, cols, 4, 4, 16)
    with pytest.raises(kvattn.Error, match=r"block_row_sz has shape \[2, 3\]"):
        w.plan(mask, cols, cols, 4, 2, 16)
    with pytest.raises(kvattn.Error, match=r"block_col_sz sums to 6 for KV head 1 but 7 for KV head 0"):
        w.plan(mask, rows, np.array([[1, 2, 4], [2, 2, 2]], np.int32), 4, 2, 16)
    with pytest.raises(kvattn.Error, match=r"block_row_sz\[0, 1\] = -1 is negative"):
        w.plan(mask, np.array([[8, -1], [5, 2]], np.int32), cols, 4, 2, 16)
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(np.zeros((4, 7, 16), np.float32), np.zeros((2, 6, 16), np.float32), np.zeros((2, 6, 16), np.float32))
    with pytest.raises(NotImplementedError, match="'use_fp16_qk_reduction'"):
        w.plan(mask, rows, cols, 4, 2, 16, use_fp16_qk_reduction=True)
    w.plan(mask, rows, cols, 4, 2, 16, q_data_type="float32")
    with pytest.raises(kvattn.Error, match=r"k has shape \[2, 5, 16\] but the plan needs \[2, 6, 16\]"):
        w.run(np.zeros((4, 7, 16), np.float32), np.zeros((2, 5, 16), np.float32), np.zeros((2, 6, 16), np.float32))

def test_block_sparse_wrapper_forward_replans_and_errors(rng):
    M, N, R, C, hq, hkv, d = 8, 8, 2, 2, 2, 2, 16
    present, indptr, indices = bsr_problem(rng, M, N, R, C)
    q, k, v = (cast(rand(rng, (n, h, d)), "f32") for n, h in ((M, hq), (N, hkv), (N, hkv)))
    w = fi.BlockSparseAttentionWrapper(WORKSPACE)
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(q, k, v)
    w.plan(indptr, indices, M, N, R, C, hq, hkv, d, q_data_type="float32", o_data_type="float32")
    out = w.forward(q, k, v, logits_soft_cap=2.0)
    want_o, _, mag = bsr_reference(q, k, v, indptr, indices, M, R, C, dict(soft_cap=2.0))
    check_output(out, want_o, mag, "f32")
    with pytest.raises(NotImplementedError, match="'scale_q'"):
        w.run(q, k, v, scale_q=np.ones(hq, np.float32))
    with pytest.raises(NotImplementedError, match="'backend'"):
        fi.BlockSparseAttentionWrapper(WORKSPACE, backend="trtllm-gen")
    with pytest.raises(NotImplementedError, match="'use_fp16_qk_reduction'"):
        w.plan(indptr, indices, M, N, R, C, hq, hkv, d, use_fp16_qk_reduction=True)
    bad = indices.copy()
    bad[0] = N // C
    for kw in ({}, dict(causal=True)):  # either path names the argument and the value
        with pytest.raises(kvattn.Error, match=rf"bsr indices\[0\] = {N // C} is out of range \[0, {N // C}\)"):
            w.plan(indptr, bad, M, N, R, C, hq, hkv, d, q_data_type="float32", **kw)
        with pytest.raises(kvattn.Error, match=r"bsr indptr"):
            w.plan(indptr[:-1], indices, M, N, R, C, hq, hkv, d, q_data_type="float32", **kw)
    with pytest.raises(kvattn.Error, match=r"bsr N = 9 is not a multiple of C = 2"):
        w.plan(indptr, indices, M, 9, R, C, hq, hkv, d, causal=True)
    with pytest.raises(kvattn.Error, match=r"mask has shape"):
        w.plan(indptr, indices, M, N, R, C, hq, hkv, d, mask=np.ones((len(indices), R, R + 1), bool))
    with pytest.raises(kvattn.Error, match=r"bsr M = 7 is not a multiple of R = 2|q"):
        w.plan(indptr, indices, M, N, R, C, hq, hkv, d, q_data_type="float32", o_data_type="float32")
        w.run(q[:7], k, v)


# ---- cascade --------------------------------------------------------------------------------------------
def cascade_reference(q, levels, k_cache, v_cache, layout, ps, var_kw, dtype):
    """(o, mag) of the merged levels, each as reference.batch_attention; causal on the last."""
    o = lse = mag_total = None
    parts = []
    for lvl, (qo_indptr, indptr, indices, last) in enumerate(levels):
        kw = dict(var_kw)
        kw["causal"] = kw.get("causal", False) and lvl == len(levels) - 1
        ks = ref.gather_paged(f64(k_cache), layout, indptr, indices, last, ps)
        vs = ref.gather_paged(f64(v_cache), layout, indptr, indices, last, ps)
        parts.append(ref.batch_attention(f64(q), qo_indptr, ks, vs, ref.Var(**kw)))
    o, lse, _ = parts[-1]
    for ol, sl, _ in parts[:-1]:
        o, lse, _ = ref.merge(o, lse, ol, sl)
    mag_total = np.zeros_like(o)
    with np.errstate(invalid="ignore", over="ignore"):
        for ol, sl, ml in parts:
            wgt = np.where(np.isneginf(sl), 0.0, np.exp2(sl - np.where(np.isneginf(lse), 0.0, lse)))
            mag_total += ml * wgt[..., None]
    return o, mag_total


def cascade_levels(rng, specs, ps):
    """The levels' arrays (qo_indptr, kv_indptr, kv_indices, last_page_len) of specs, one
    (qo_indptr, kv lengths per group) per level, over one cache of disjoint shuffled pages; and
    that cache's page count (two spare pages)."""
    counts = [[-(-n // ps) for n in lens] for _, lens in specs]
    num_pages = sum(sum(c) for c in counts) + 2
    perm = rng.permutation(num_pages).astype(np.int32)
    arrays, at = [], 0
    for (qo_indptr, lens), cnt in zip(specs, counts):
        indptr = np.concatenate([[0], np.cumsum(cnt)]).astype(np.int32)
        indices = perm[at:at + indptr[-1]].copy()
        at += indptr[-1]
        last = np.array([(n - 1) % ps + 1 if n else 0 for n in lens], np.int32)
        arrays.append((np.array(qo_indptr, np.int32), indptr, indices, last))
    return arrays, num_pages


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("levels,variant", [(2, "causal"), (3, "causal"), (2, "cap"), (3, "plain")])
def test_cascade_wrapper(rng, dtype, layout, levels, variant):
    hq, hkv, d, ps = 4, 2, 16, 4
    B = 5
    # Level 0: one prefix shared by all B requests (a short one: fewer keys than the 8 queries);
    # level 1 (of 3): two groups, the second without pages for the "plain" case; last: each
    # request's own tokens, 1-2 queries each.
    qo_last = [1, 2, 1, 2, 2]
    total = sum(qo_last)
    specs = [([0, total], [6])]
    if levels == 3:
        specs.append(([0, 3, total], [9, 0 if variant == "plain" else 14]))
    own = [int(x) for x in rng.integers(2, 12, size=B)]
    specs.append((list(np.concatenate([[0], np.cumsum(qo_last)])), own))
    levels_arrays, num_pages = cascade_levels(rng, specs, ps)
    shape = (num_pages, ps, hkv, d) if layout == "NHD" else (num_pages, hkv, ps, d)
    k_cache, v_cache = cast(rand(rng, shape), dtype), cast(rand(rng, shape), dtype)
    q = cast(rand(rng, (total, hq, d)), dtype)
    kw = {"causal": dict(causal=True), "cap": dict(causal=True, logits_soft_cap=3.0, sm_scale=0.4),
          "plain": dict()}[variant]
    var_kw = {"causal": dict(causal=True), "cap": dict(causal=True, soft_cap=3.0, sm_scale=0.4),
              "plain": dict()}[variant]
    w = fi.MultiLevelCascadeAttentionWrapper(levels, WORKSPACE, layout)
    assert not w.is_cuda_graph_enabled
    w.plan([x[0] for x in levels_arrays], [x[1] for x in levels_arrays], [x[2] for x in levels_arrays],
           [x[3] for x in levels_arrays], hq, hkv, d, ps, q_data_type=FI[dtype], **kw)
    out = w.run(q, (k_cache, v_cache))
    assert out.shape == (total, hq, d) and out.dtype == q.dtype
    want, mag = cascade_reference(q, levels_arrays, k_cache, v_cache, layout, ps, var_kw, dtype)
    rtol = ref.OUTPUT_TOLERANCE[dtype][0]
    check_output(out, want, mag, dtype, accumulation=ref.ACCUMULATION + 1e-5 + rtol * levels)
    # The 5-D cache form gives the same result.
    out5 = w.run(q, np.stack([k_cache, v_cache], axis=1))
    assert np.array_equal(out5.view(np.uint8), out.view(np.uint8))
    # The wrapper is kvattn.CascadeAttention over the same levels (causal on the last one only).
    native = kvattn.CascadeAttention(kv_layout=layout)
    native.plan(levels=[(x[0], x[1:]) for x in levels_arrays], page_size=ps, num_qo_heads=hq,
                num_kv_heads=hkv, head_dim_qk=d, q_dtype=dtype,
                variant=fi._variant(**kw))
    assert np.array_equal(native.run(q, (k_cache, v_cache)).view(np.uint8), out.view(np.uint8))
    # reset_workspace_buffer re-plans on the new buffer.
    w.reset_workspace_buffer(np.zeros(1 << 16, np.uint8))
    assert np.array_equal(w.run(q, (k_cache, v_cache)).view(np.uint8), out.view(np.uint8))



@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("stage", ["decode", "append", "append_causal"])
def test_shared_prefix_wrappers(rng, dtype, layout, stage):
    """FlashInfer's older two-level cascade: a shared prefix as ragged K/V at forward(), each
    request's own pages planned at begin_forward(); against flat attention over prefix + own keys
    (causal within the own keys: with qo_len <= own length every query sees the whole prefix)."""
    hq, hkv, d, ps, B, shared = 4, 2, 16, 4, 3, 7
    own = [int(x) for x in rng.integers(3, 10, size=B)]
    qo = [1] * B if stage == "decode" else [int(rng.integers(1, n + 1)) for n in own]
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    [(_, indptr, indices, last)], num_pages = cascade_levels(rng, [(qo_indptr, own)], ps)
    shape = (num_pages, ps, hkv, d) if layout == "NHD" else (num_pages, hkv, ps, d)
    k_cache, v_cache = cast(rand(rng, shape), dtype), cast(rand(rng, shape), dtype)
    k_sh, k_sh_nhd = _kv(rng, shared, hkv, d, dtype, layout)
    v_sh, v_sh_nhd = _kv(rng, shared, hkv, d, dtype, layout)
    q = cast(rand(rng, (int(qo_indptr[-1]), hq, d)), dtype)
    if stage == "decode":
        w = fi.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(WORKSPACE, layout)
        w.begin_forward(indptr, indices, last, hq, hkv, d, ps, data_type=FI[dtype])
        out = w.forward(q, k_sh, v_sh, (k_cache, v_cache))
    else:
        w = fi.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(WORKSPACE, layout)
        w.begin_forward(qo_indptr, indptr, indices, last, hq, hkv, d, ps)
        out = w.forward(q, k_sh, v_sh, (k_cache, v_cache), causal=stage == "append_causal")
    assert out.shape == q.shape and out.dtype == q.dtype
    ks = ref.gather_paged(f64(k_cache), layout, indptr, indices, last, ps)
    vs = ref.gather_paged(f64(v_cache), layout, indptr, indices, last, ps)
    ks = [np.concatenate([f64(k_sh_nhd), x]) for x in ks]
    vs = [np.concatenate([f64(v_sh_nhd), x]) for x in vs]
    want_o, _, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs, ref.Var(causal=stage == "append_causal"))
    check_output(out, want_o, mag, dtype, accumulation=ref.ACCUMULATION + 1e-5 + 2 * ref.OUTPUT_TOLERANCE[dtype][0])

def test_cascade_wrapper_errors(rng):
    with pytest.raises(NotImplementedError, match="'use_cuda_graph'"):
        fi.MultiLevelCascadeAttentionWrapper(2, WORKSPACE, use_cuda_graph=True)
    w = fi.MultiLevelCascadeAttentionWrapper(2, WORKSPACE)
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(np.zeros((1, 1, 8), np.float32), np.zeros((1, 2, 4, 1, 8), np.float32))
    one = np.array([0, 1], np.int32)
    args = ([one, one], [one, one], [np.array([0], np.int32)] * 2, [np.array([4], np.int32)] * 2, 1, 1, 8, 4)
    with pytest.raises(kvattn.Error, match=r"qo_indptr_arr has 1 levels but num_levels = 2"):
        w.plan([one], *args[1:])
    with pytest.raises(kvattn.Error, match=r"level 1: qo_indptr\[1\] = 2 but level 0 covers 1 query rows"):
        w.plan([one, np.array([0, 2], np.int32)], *args[1:])
    with pytest.raises(kvattn.Error, match=r"level 1: kv_last_page_len\[0\] = 5 is out of range \[1, 4\]"):
        w.plan(*args[:3], [np.array([4], np.int32), np.array([5], np.int32)], *args[4:])
    with pytest.raises(NotImplementedError, match="'use_fp16_qk_reduction'"):
        w.plan(*args, use_fp16_qk_reduction=True)
    with pytest.raises(RuntimeError, match="before plan"):  # no failed plan() counts as a plan
        w.run(np.zeros((1, 1, 8), np.float32), np.zeros((1, 2, 4, 1, 8), np.float32))
    # Position-dependent options: kvattn.CascadeAttention's own error (a level does not know
    # where its keys sit in a row's whole sequence).
    for kw, what in [(dict(window_left=3), "a sliding window"),
                     (dict(pos_encoding_mode="ROPE_LLAMA"), "fused RoPE"),
                     (dict(pos_encoding_mode="ALIBI", causal=True), "ALiBi")]:
        with pytest.raises(kvattn.Error, match=f"CascadeAttention does not support {what} .*: a level "
                                               "does not know where its keys sit"):
            w.plan(*args, q_data_type="float32", **kw)
    w.plan(*args, q_data_type="float32", window_left=-1)
    with pytest.raises(kvattn.Error, match=r"paged k"):
        w.run(np.zeros((1, 1, 8), np.float32), (np.zeros((1, 4, 1, 9), np.float32),) * 2)


# ---- RoPE -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 16])
def test_rope_family(rng, dtype, interleave, rotary_dim):
    d, hq, hk = 32, 4, 2
    seg = [3, 0, 5, 2]
    indptr = np.concatenate([[0], np.cumsum(seg)]).astype(np.int32)
    offsets = rng.integers(0, 200, size=len(seg)).astype(np.int32)
    n = int(indptr[-1])
    pos = np.concatenate([o + np.arange(s) for o, s in zip(offsets, seg)]).astype(np.int32)
    q, k = cast(rand(rng, (n, hq, d)), dtype), cast(rand(rng, (n, hk, d)), dtype)
    common = dict(rotary_dim=rotary_dim, interleave=interleave)
    cfg = dict(interleave=interleave, rotary_dim=rotary_dim or 0)
    l31 = dict(factor=4.0, low_freq_factor=1.0, high_freq_factor=3.0, original_max_position=64.0)
    cases = [
        (fi.apply_rope, (indptr, offsets), dict(rope_scale=2.0, rope_theta=500.0), dict(scale=2.0, theta=500.0)),
        (fi.apply_rope_pos_ids, (pos,), dict(rope_scale=2.0, rope_theta=500.0), dict(scale=2.0, theta=500.0)),
        (fi.apply_rope_pos_ids, (pos.astype(np.int64),), {}, {}),
        (fi.apply_llama31_rope, (indptr, offsets),
         dict(rope_scale=4.0, rope_theta=1e4, high_freq_factor=3.0, old_context_len=64), dict(theta=1e4, llama31=l31)),
        (fi.apply_llama31_rope_pos_ids, (pos,),
         dict(rope_scale=4.0, rope_theta=1e4, high_freq_factor=3.0, old_context_len=64), dict(theta=1e4, llama31=l31)),
    ]
    inplace = {fi.apply_rope: fi.apply_rope_inplace, fi.apply_rope_pos_ids: fi.apply_rope_pos_ids_inplace,
               fi.apply_llama31_rope: fi.apply_llama31_rope_inplace,
               fi.apply_llama31_rope_pos_ids: fi.apply_llama31_rope_pos_ids_inplace}
    for fn, pos_args, kw, ref_kw in cases:
        qr, kr = fn(q, k, *pos_args, **common, **kw)
        assert qr.shape == q.shape and qr.dtype == q.dtype
        rope_check(qr, q, pos, dtype, **cfg, **ref_kw)
        rope_check(kr, k, pos, dtype, **cfg, **ref_kw)
        q2, k2 = q.copy(), k.copy()
        assert inplace[fn](q2, k2, *pos_args, **common, **kw) is None
        assert np.array_equal(q2.view(np.uint8), qr.view(np.uint8))
        assert np.array_equal(k2.view(np.uint8), kr.view(np.uint8))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [32, 12])
@pytest.mark.parametrize("three_d", [False, True])
def test_rope_with_cos_sin_cache(rng, dtype, is_neox, rotary_dim, three_d):
    head_size, hq, hk, n, max_pos, theta = 32, 4, 2, 9, 300, 1e4
    inv = theta ** (-np.arange(0, rotary_dim, 2) / rotary_dim)
    angles = np.arange(max_pos)[:, None] * inv[None, :]
    cache = np.concatenate([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    positions = rng.integers(0, max_pos, size=n)  # int64, as vLLM / SGLang pass them
    shape_q = (n, hq, head_size) if three_d else (n, hq * head_size)
    shape_k = (n, hk, head_size) if three_d else (n, hk * head_size)
    query, key = cast(rand(rng, shape_q), dtype), cast(rand(rng, shape_k), dtype)
    qo, ko = fi.apply_rope_with_cos_sin_cache(positions, query, key, head_size, cache, is_neox=is_neox)
    assert qo.shape == query.shape and ko.shape == key.shape and qo.dtype == query.dtype
    cfg = dict(theta=theta, interleave=not is_neox, rotary_dim=rotary_dim)
    rope_check(qo.reshape(n, hq, head_size), query.reshape(n, hq, head_size), positions, dtype, **cfg)
    rope_check(ko.reshape(n, hk, head_size), key.reshape(n, hk, head_size), positions, dtype, **cfg)
    q2, k2 = query.copy(), key.copy()
    assert fi.apply_rope_with_cos_sin_cache_inplace(positions, q2, k2, head_size, cache, is_neox) is None
    assert np.array_equal(q2.view(np.uint8), qo.view(np.uint8)) and np.array_equal(k2.view(np.uint8), ko.view(np.uint8))


def test_rope_with_an_arbitrary_table(rng):
    # A random table: the rotation reads exactly row pos, column t (cos) and rotary_dim / 2 + t (sin).
    n, h, hs, rd = 6, 3, 16, 10
    table = rng.uniform(-1, 1, size=(20, rd)).astype(np.float32)
    pos = rng.integers(0, 20, size=n).astype(np.int32)
    x = cast(rand(rng, (n, h, hs)), "f32")
    for interleave in (False, True):
        got, _ = kvattn.apply_rope_with_cos_sin_cache(x, x[:, :1], pos, table, interleave=interleave)
        want = f64(x).copy()
        c, s = f64(table[pos, :rd // 2])[:, None, :], f64(table[pos, rd // 2:])[:, None, :]
        i0 = np.arange(0, rd, 2) if interleave else np.arange(rd // 2)
        i1 = i0 + 1 if interleave else i0 + rd // 2
        want[..., i0] = f64(x)[..., i0] * c - f64(x)[..., i1] * s
        want[..., i1] = f64(x)[..., i1] * c + f64(x)[..., i0] * s
        assert np.allclose(f64(got), want, rtol=0, atol=4 * 2.0**-24 * 4)
        assert np.array_equal(got[..., rd:], x[..., rd:])


def test_rope_errors(rng):
    q = np.zeros((3, 2, 16), np.float32)
    with pytest.raises(kvattn.Error, match=r"offsets has 2 elements but 3 are expected"):
        fi.apply_rope(q, q.copy(), [0, 1, 2, 3], [0, 0])
    with pytest.raises(kvattn.Error, match=r"indptr is not non-decreasing"):
        fi.apply_rope(q, q.copy(), [0, 2, 1, 3], [0, 0, 0])
    with pytest.raises(kvattn.Error, match=r"pos_ids has 2 elements but 3 are expected"):
        fi.apply_rope_pos_ids(q, q.copy(), np.array([0, 1], np.int32))
    with pytest.raises(kvattn.Error, match=r"pos_ids holds 4294967296, which does not fit in int32"):
        fi.apply_rope_pos_ids(q, q.copy(), np.array([0, 1, 2**32], np.int64))
    with pytest.raises(kvattn.Error, match=r"rotary_dim = 7 must be even"):
        fi.apply_rope_pos_ids(q, q.copy(), np.arange(3, dtype=np.int32), rotary_dim=7)
    with pytest.raises(kvattn.Error, match=r"llama31 needs 0 < low_freq_factor < high_freq_factor"):
        fi.apply_llama31_rope_pos_ids(q, q.copy(), np.arange(3, dtype=np.int32), low_freq_factor=4)
    cache = np.zeros((4, 8), np.float32)
    with pytest.raises(kvattn.Error, match=r"pos_ids\[2\] = 9 is out of range \[0, 4\)"):
        fi.apply_rope_with_cos_sin_cache(np.array([0, 1, 9]), q.reshape(3, 32), q.reshape(3, 32), 16, cache)
    with pytest.raises(kvattn.DTypeError, match=r"cos_sin_cache has dtype f16 but f32 is expected"):
        fi.apply_rope_with_cos_sin_cache(np.array([0, 1, 2]), q.reshape(3, 32), q.reshape(3, 32), 16,
                                         cache.astype(np.float16))
    with pytest.raises(kvattn.Error, match=r"query has 32 elements per token, not a multiple of head_size = 12"):
        fi.apply_rope_with_cos_sin_cache(np.array([0, 1, 2]), q.reshape(3, 32), q.reshape(3, 32), 12, cache)
    strided = np.zeros((3, 4, 10), np.float32)[:, :, :8]  # heads of 8, padded: not [3, 2, 16] as a view
    with pytest.raises(kvattn.Error, match=r"query cannot be viewed as \[3, 2, 16\] without a copy"):
        fi.apply_rope_with_cos_sin_cache_inplace(np.array([0, 1, 2]), strided, q.reshape(3, 32), 16, cache)
