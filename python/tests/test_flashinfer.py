"""kvattn.flashinfer: FlashInfer 0.3's wrapper names, arguments and defaults over kvattn, on the
CPU backend with numpy inputs, against the float64 reference."""

import inspect

import numpy as np
import pytest

import kvattn
import kvattn.flashinfer as fi
import reference as ref
from conftest import FLOAT_DTYPES, cast, check_lse, check_output, f64, page_table, rand

WORKSPACE = np.zeros(1 << 20, np.uint8)
NP_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def test_signatures_follow_flashinfer():
    p = inspect.signature(fi.BatchDecodeWithPagedKVCacheWrapper.plan).parameters
    assert list(p)[1:8] == ["indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads",
                            "head_dim", "page_size"]
    assert p["pos_encoding_mode"].default == "NONE" and p["window_left"].default == -1
    assert p["q_data_type"].default == "float16" and p["disable_split_kv"].default is False
    r = inspect.signature(fi.BatchDecodeWithPagedKVCacheWrapper.run).parameters
    assert list(r)[1:3] == ["q", "paged_kv_cache"] and r["return_lse"].default is False
    pp = inspect.signature(fi.BatchPrefillWithPagedKVCacheWrapper.plan).parameters
    assert list(pp)[1:9] == ["qo_indptr", "paged_kv_indptr", "paged_kv_indices",
                             "paged_kv_last_page_len", "num_qo_heads", "num_kv_heads",
                             "head_dim_qk", "page_size"]
    assert pp["causal"].default is False and pp["head_dim_vo"].default is None
    rp = inspect.signature(fi.BatchPrefillWithRaggedKVCacheWrapper.plan).parameters
    assert list(rp)[1:6] == ["qo_indptr", "kv_indptr", "num_qo_heads", "num_kv_heads", "head_dim_qk"]


# Where FlashInfer 0.3.1 defines each name (flashinfer/<module>.py), for code that imports it from
# there (`from flashinfer.cascade import merge_state`, `flashinfer.sparse.BlockSparseAttentionWrapper`).
FLASHINFER_MODULES = {
    "decode": ["BatchDecodeWithPagedKVCacheWrapper", "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
               "single_decode_with_kv_cache"],
    "prefill": ["BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper",
                "single_prefill_with_kv_cache", "single_prefill_with_kv_cache_return_lse"],
    "sparse": ["BlockSparseAttentionWrapper", "VariableBlockSparseAttentionWrapper"],
    "cascade": ["merge_state", "merge_state_in_place", "merge_states", "MultiLevelCascadeAttentionWrapper",
                "BatchDecodeWithSharedPrefixPagedKVCacheWrapper", "BatchPrefillWithSharedPrefixPagedKVCacheWrapper"],
    "page": ["append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"],
    "quantization": ["packbits", "segment_packbits"],
    "rope": ["apply_rope", "apply_rope_inplace", "apply_rope_pos_ids", "apply_rope_pos_ids_inplace",
             "apply_llama31_rope", "apply_llama31_rope_inplace", "apply_llama31_rope_pos_ids",
             "apply_llama31_rope_pos_ids_inplace", "apply_rope_with_cos_sin_cache",
             "apply_rope_with_cos_sin_cache_inplace"],
}


def test_submodule_paths_follow_flashinfer():
    import importlib

    listed = set()
    for module, names in FLASHINFER_MODULES.items():
        mod = importlib.import_module(f"kvattn.flashinfer.{module}")
        assert getattr(fi, module) is mod
        for name in names:
            assert getattr(mod, name) is getattr(fi, name), f"kvattn.flashinfer.{module}.{name}"
            listed.add(name)
    assert listed == set(fi.__all__)  # every top-level name has its FlashInfer module


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("mode", ["NONE", "ROPE_LLAMA", "ALIBI"])
def test_decode_wrapper(rng, dtype, layout, mode):
    hq, hkv, d, ps = 8, 2, 32, 16
    lens = [1, 40, 17]
    indptr, indices, last, num_pages = page_table(rng, lens, ps)
    shape = (num_pages, 2, ps, hkv, d) if layout == "NHD" else (num_pages, 2, hkv, ps, d)
    kv = cast(rand(rng, shape), dtype)
    q = cast(rand(rng, (len(lens), hq, d)), dtype)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, layout)
    w.plan(indptr, indices, last, hq, hkv, d, ps, pos_encoding_mode=mode, window_left=20,
           logits_soft_cap=5.0, q_data_type=NP_NAMES[dtype], rope_theta=1e3, sm_scale=0.25)
    out, lse = w.run(q, kv, return_lse=True)
    assert out.dtype == q.dtype
    rope = dict(theta=1e3) if mode == "ROPE_LLAMA" else None
    var = ref.Var(window_left=20, soft_cap=5.0, rope=rope, alibi=mode == "ALIBI", sm_scale=0.25)
    ks = ref.gather_paged(f64(kv[:, 0]), layout, indptr, indices, last, ps)
    vs = ref.gather_paged(f64(kv[:, 1]), layout, indptr, indices, last, ps)
    want_o, want_lse, mag = ref.batch_attention(f64(q), np.arange(len(lens) + 1), ks, vs, var)
    check_output(out, want_o, mag, dtype)
    check_lse(lse, want_lse)
    # The plain form returns the output alone; a tuple cache is the same cache.
    assert isinstance(w.run(q, (kv[:, 0], kv[:, 1])), np.ndarray)


def test_decode_wrapper_scales_and_graph_buffers(rng):
    hq, hkv, d, ps = 4, 1, 16, 4
    lens = [7, 3]
    indptr, indices, last, num_pages = page_table(rng, lens, ps)
    k = cast(rand(rng, (num_pages, ps, hkv, d)), "f32")
    v = cast(rand(rng, (num_pages, ps, hkv, d)), "f32")
    q = cast(rand(rng, (2, hq, d)), "f32")
    bufs = (np.zeros(9, np.int32), np.zeros(64, np.int32), np.zeros(8, np.int32))
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, "NHD", use_cuda_graph=True,
                                              paged_kv_indptr_buffer=bufs[0],
                                              paged_kv_indices_buffer=bufs[1],
                                              paged_kv_last_page_len_buffer=bufs[2])
    assert w.is_cuda_graph_enabled
    w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type="float32")
    assert np.array_equal(bufs[0][:3], indptr) and np.array_equal(bufs[1][:len(indices)], indices)
    out = w.run(q, (k, v))
    ks = ref.gather_paged(f64(k), "NHD", indptr, indices, last, ps)
    vs = ref.gather_paged(f64(v), "NHD", indptr, indices, last, ps)
    want_o, _, mag = ref.batch_attention(f64(q), [0, 1, 2], ks, vs, ref.Var())
    check_output(out, want_o, mag, "f32")
    # FlashInfer's older graph-mode class: the same wrapper, the buffers positional.
    bufs2 = tuple(np.zeros_like(b) for b in bufs)
    old = fi.decode.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(WORKSPACE, *bufs2, "NHD")
    assert old.is_cuda_graph_enabled and isinstance(old, fi.BatchDecodeWithPagedKVCacheWrapper)
    old.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type="float32")
    assert np.array_equal(bufs2[1][:len(indices)], indices)
    assert np.array_equal(old.run(q, (k, v)), out)
    # Scales at run(): in graph mode they must come with plan().
    with pytest.raises(NotImplementedError, match="k_scale"):
        w.run(q, (k, v), k_scale=0.5)
    e = fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    e.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type="float32", data_type="float32")
    out, lse = e.run(q, (k, v), q_scale=2.0, k_scale=0.5, v_scale=3.0, return_lse=True)
    want_o, want_lse, mag = ref.batch_attention(f64(q), [0, 1, 2], ks, vs,
                                                ref.Var(q_scale=2.0, k_scale=0.5, v_scale=3.0))
    check_output(out, want_o, mag, "f32")
    check_lse(lse, want_lse)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_paged_wrapper(rng, dtype, causal):
    hq, hkv, d, ps = 4, 2, 32, 8
    qo_lens, kv_lens = [5, 12], [20, 12]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    indptr, indices, last, num_pages = page_table(rng, kv_lens, ps)
    k = cast(rand(rng, (num_pages, ps, hkv, d)), dtype)
    v = cast(rand(rng, (num_pages, ps, hkv, d)), dtype)
    q = cast(rand(rng, (qo_indptr[-1], hq, d)), dtype)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, "NHD")
    w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, ps, causal=causal,
           q_data_type=NP_NAMES[dtype], window_left=9)
    out, lse = w.run(q, (k, v), return_lse=True)
    ks = ref.gather_paged(f64(k), "NHD", indptr, indices, last, ps)
    vs = ref.gather_paged(f64(v), "NHD", indptr, indices, last, ps)
    want_o, want_lse, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs,
                                                ref.Var(causal=causal, window_left=9))
    check_output(out, want_o, mag, dtype)
    check_lse(lse, want_lse)


def test_prefill_paged_wrapper_graph_buffers(rng):
    """use_cuda_graph=True: the tables land in the fixed buffers, the first plan's query tokens
    are the most a later plan may have, a run() override is refused; results as eager plans."""
    hq, hkv, d, ps = 4, 2, 32, 8
    bufs = dict(qo_indptr_buf=np.zeros(5, np.int32), paged_kv_indptr_buf=np.zeros(5, np.int32),
                paged_kv_indices_buf=np.zeros(64, np.int32), paged_kv_last_page_len_buf=np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="use_cuda_graph=True needs paged_kv_indices_buf"):
        fi.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, "NHD", use_cuda_graph=True,
                                               **{k: b for k, b in bufs.items() if k != "paged_kv_indices_buf"})
    w = fi.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE, "NHD", use_cuda_graph=True, **bufs)
    assert w.is_cuda_graph_enabled
    for qo_lens, kv_lens in (([5, 12, 3], [20, 12, 9]), ([1, 7], [30, 7])):
        qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
        indptr, indices, last, num_pages = page_table(rng, kv_lens, ps)
        k = cast(rand(rng, (num_pages, ps, hkv, d)), "f32")
        v = cast(rand(rng, (num_pages, ps, hkv, d)), "f32")
        q = cast(rand(rng, (qo_indptr[-1], hq, d)), "f32")
        w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, ps, causal=True, q_data_type="float32")
        assert np.array_equal(bufs["qo_indptr_buf"][:len(qo_indptr)], qo_indptr)
        assert np.array_equal(bufs["paged_kv_indptr_buf"][:len(indptr)], indptr)
        assert np.array_equal(bufs["paged_kv_indices_buf"][:len(indices)], indices)
        assert np.array_equal(bufs["paged_kv_last_page_len_buf"][:len(last)], last)
        out, lse = w.run(q, (k, v), return_lse=True)
        ks = ref.gather_paged(f64(k), "NHD", indptr, indices, last, ps)
        vs = ref.gather_paged(f64(v), "NHD", indptr, indices, last, ps)
        want_o, want_lse, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs, ref.Var(causal=True))
        check_output(out, want_o, mag, "f32")
        check_lse(lse, want_lse)
    with pytest.raises(NotImplementedError, match="v_scale"):
        w.run(q, (k, v), v_scale=2.0)
    qo_indptr = np.array([0, 30], np.int32)  # more query tokens than the first plan's 20
    indptr, indices, last, _ = page_table(rng, [30], ps)
    with pytest.raises(ValueError, match="qo_indptr: 30 query tokens, more than the 20"):
        w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, ps, causal=True, q_data_type="float32")
    indptr, indices, last, _ = page_table(rng, [9] * 5, ps)  # a batch past the buffers
    with pytest.raises(ValueError, match="qo_indptr_buf holds 5 elements but the plan needs 6"):
        w.plan(np.arange(6, dtype=np.int32), indptr, indices, last, hq, hkv, d, ps, q_data_type="float32")


def test_prefill_ragged_wrapper_graph_buffers(rng):
    """The ragged wrapper in graph mode: indptrs copied into the buffers, with a custom mask (its
    packed bits into custom_mask_buf); the first plan's query tokens bound the later ones."""
    hq, hkv, d = 4, 2, 16
    bufs = dict(qo_indptr_buf=np.zeros(4, np.int32), kv_indptr_buf=np.zeros(4, np.int32),
                custom_mask_buf=np.zeros(64, np.uint8), mask_indptr_buf=np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="use_cuda_graph=True needs kv_indptr_buf"):
        fi.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE, use_cuda_graph=True, qo_indptr_buf=bufs["qo_indptr_buf"])
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE, use_cuda_graph=True, **bufs)
    for qo_lens, kv_lens in (([3, 6], [7, 6]), ([8, 1], [8, 20])):
        qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
        kv_indptr = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
        masks = [rng.random((a, b)) < 0.5 for a, b in zip(qo_lens, kv_lens)]
        q = cast(rand(rng, (qo_indptr[-1], hq, d)), "f32")
        k = cast(rand(rng, (kv_indptr[-1], hkv, d)), "f32")
        v = cast(rand(rng, (kv_indptr[-1], hkv, d)), "f32")
        w.plan(qo_indptr, kv_indptr, hq, hkv, d, custom_mask=np.concatenate([m.ravel() for m in masks]),
               q_data_type="float32")
        assert np.array_equal(bufs["qo_indptr_buf"][:3], qo_indptr)
        assert np.array_equal(bufs["kv_indptr_buf"][:3], kv_indptr)
        bit_indptr = np.concatenate([[0], np.cumsum([m.size for m in masks])])
        packed, packed_indptr = fi.segment_packbits(np.concatenate([m.ravel() for m in masks]), bit_indptr,
                                                    bitorder="little")
        assert np.array_equal(bufs["custom_mask_buf"][:len(packed)], packed)
        assert np.array_equal(bufs["mask_indptr_buf"][:len(packed_indptr)], packed_indptr)
        out, lse = w.run(q, k, v, return_lse=True)
        ks = [f64(k)[kv_indptr[b]:kv_indptr[b + 1]] for b in range(2)]
        vs = [f64(v)[kv_indptr[b]:kv_indptr[b + 1]] for b in range(2)]
        want_o, want_lse, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs,
                                                    ref.Var(mask=lambda b, i, j: bool(masks[b][i, j])))
        check_output(out, want_o, mag, "f32")
        check_lse(lse, want_lse)
    with pytest.raises(ValueError, match="qo_indptr: 10 query tokens, more than the 9"):
        w.plan(np.array([0, 10], np.int32), np.array([0, 10], np.int32), hq, hkv, d, q_data_type="float32")


@pytest.mark.parametrize("packed", [False, True])
def test_prefill_ragged_wrapper_custom_mask(rng, packed):
    hq, hkv, dqk, dvo = 4, 4, 32, 16
    qo_lens, kv_lens = [3, 6], [7, 6]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    masks = [rng.random((a, b)) < 0.5 for a, b in zip(qo_lens, kv_lens)]
    flat = np.concatenate([m.ravel() for m in masks])
    q = cast(rand(rng, (qo_indptr[-1], hq, dqk)), "f16")
    k = cast(rand(rng, (kv_indptr[-1], hkv, dqk)), "f16")
    v = cast(rand(rng, (kv_indptr[-1], hkv, dvo)), "f16")
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE)
    if packed:
        bit_indptr = np.concatenate([[0], np.cumsum([m.size for m in masks])])
        pm, _ = fi.segment_packbits(flat, bit_indptr, bitorder="little")
        w.plan(qo_indptr, kv_indptr, hq, hkv, dqk, head_dim_vo=dvo, packed_custom_mask=pm)
    else:
        w.plan(qo_indptr, kv_indptr, hq, hkv, dqk, head_dim_vo=dvo, custom_mask=flat)
    out = w.run(q, k, v)
    ks = [f64(k[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(2)]
    vs = [f64(v[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(2)]
    want_o, _, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs,
                                         ref.Var(mask=lambda b, i, j: bool(masks[b][i, j])))
    check_output(out, want_o, mag, "f16")


def test_unsupported_parameters_raise():
    with pytest.raises(NotImplementedError, match="'backend'"):
        fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, backend="trtllm-gen")
    with pytest.raises(NotImplementedError, match="'jit_args'"):
        fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE, jit_args=[1])
    w = fi.BatchDecodeWithPagedKVCacheWrapper(WORKSPACE)
    args = ([0, 1], [0], [1], 1, 1, 8, 4)
    with pytest.raises(NotImplementedError, match="'block_tables'"):
        w.plan(*args, block_tables=np.zeros((1, 1), np.int32))
    with pytest.raises(NotImplementedError, match="'pos_encoding_mode'"):
        w.plan(*args, pos_encoding_mode="ROPE_FOO")
    w.plan(*args, q_data_type="float32")
    with pytest.raises(NotImplementedError, match="'sinks'"):
        w.run(np.zeros((1, 1, 8), np.float32), np.zeros((1, 2, 4, 1, 8), np.float32), sinks=[1.0])
    p = fi.BatchPrefillWithPagedKVCacheWrapper(WORKSPACE)
    with pytest.raises(NotImplementedError, match="'use_fp16_qk_reduction'"):
        p.plan([0, 1], [0, 1], [0], [1], 1, 1, 8, 4, use_fp16_qk_reduction=True)
    with pytest.raises(NotImplementedError, match="'prefix_len_ptr'"):
        p.plan([0, 1], [0, 1], [0], [1], 1, 1, 8, 4, prefix_len_ptr=np.zeros(1, np.int32))
    with pytest.raises(NotImplementedError, match="'kv_layout'"):
        fi.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE, "HND")
    with pytest.raises(RuntimeError, match="before plan"):
        fi.BatchPrefillWithRaggedKVCacheWrapper(WORKSPACE).run(None, None, None)


def test_helpers(rng):
    indptr = np.array([0, 2, 2, 5], np.int32)
    last = np.array([3, 0, 1], np.int32)
    assert list(fi.get_seq_lens(indptr, last, 4)) == [7, 0, 9]
    b, p = fi.get_batch_indices_positions(np.array([0, 2, 2, 5], np.int32),
                                          np.array([7, 0, 9], np.int32), 5)
    assert list(b) == [0, 0, 2, 2, 2] and list(p) == [5, 6, 6, 7, 8]
    bits = rng.random(21) < 0.5
    assert np.array_equal(fi.packbits(bits, "little"), np.packbits(bits, bitorder="little"))
    packed, new = fi.segment_packbits(bits, np.array([0, 5, 21]), bitorder="big")
    assert list(new) == [0, 1, 3]
    assert np.array_equal(packed[:1], np.packbits(bits[:5]))


def test_ops(rng):
    n, h, d = 4, 2, 16
    va, vb = cast(rand(rng, (n, h, d)), "f32"), cast(rand(rng, (n, h, d)), "f32")
    sa = rng.uniform(-3, 3, (n, h)).astype(np.float32)
    sb = rng.uniform(-3, 3, (n, h)).astype(np.float32)
    vo, so = fi.merge_state(va, sa, vb, sb)
    want_o, want_s, mag = ref.merge(f64(va), f64(sa), f64(vb), f64(sb))
    check_output(vo, want_o, mag, "f32", 1e-5)
    assert np.allclose(so, want_s, atol=1e-5)
    vs = np.stack([va, vb], axis=1)
    ss = np.stack([sa, sb], axis=1)
    vo2, so2 = fi.merge_states(vs, ss)
    check_output(vo2, want_o, mag, "f32", 1e-5)
    fi.merge_state_in_place(va, sa, vb, sb, mask=np.array([True, False, True, True]))
    assert np.array_equal(va[1], vs[1, 0])
    # append through FlashInfer's argument order
    ps, hkv = 4, 1
    kv = np.zeros((3, 2, ps, hkv, d), np.float32)
    ak = cast(rand(rng, (2, hkv, d)), "f32")
    fi.append_paged_kv_cache(ak, ak * 2, np.array([0, 0], np.int32), np.array([0, 1], np.int32),
                             kv, np.array([2], np.int32), np.array([0, 1], np.int32),
                             np.array([2], np.int32))
    assert np.array_equal(kv[2, 0, :2], ak) and np.array_equal(kv[2, 1, :2], ak * 2)


def test_deprecated_forward_replaces_the_plans_variant(rng):
    """FlashInfer's forward()/forward_return_lse() overwrite plan()'s variant arguments, defaults
    included; a workspace of another dtype (FlashInfer's tests pass int8) is used as bytes."""
    hq, hkv, d, ps = 4, 2, 16, 4
    qo_lens, kv_lens = [3, 5], [9, 5]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    indptr, indices, last, num_pages = page_table(rng, kv_lens, ps)
    k = cast(rand(rng, (num_pages, ps, hkv, d)), "f32")
    v = cast(rand(rng, (num_pages, ps, hkv, d)), "f32")
    q = cast(rand(rng, (int(qo_indptr[-1]), hq, d)), "f32")
    ks = ref.gather_paged(f64(k), "NHD", indptr, indices, last, ps)
    vs = ref.gather_paged(f64(v), "NHD", indptr, indices, last, ps)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(np.zeros(1 << 20, np.int8), "NHD")
    w.plan(qo_indptr, indptr, indices, last, hq, hkv, d, ps, causal=False, q_data_type="float32")
    for causal, cap in [(True, None), (False, 2.0), (True, None)]:
        out, lse = w.forward_return_lse(q, (k, v), causal=causal, logits_soft_cap=cap)
        want_o, want_lse, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs, ref.Var(causal=causal, soft_cap=cap or 0.0))
        check_output(out, want_o, mag, "f32")
        check_lse(lse, want_lse)
    # run() keeps what the last forward() planned.
    want_o, _, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs, ref.Var(causal=True))
    check_output(w.run(q, (k, v)), want_o, mag, "f32")
    with pytest.raises(NotImplementedError, match="'use_fp16_qk_reduction'"):
        w.forward(q, (k, v), use_fp16_qk_reduction=True)
    dec = fi.BatchDecodeWithPagedKVCacheWrapper(np.zeros(1 << 20, np.int8))
    dec.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type="float32", logits_soft_cap=3.0)
    out = dec.forward(q[:2], (k, v))  # forward's logits_soft_cap = None: no cap
    want_o, _, mag = ref.batch_attention(f64(q[:2]), [0, 1, 2], ks, vs, ref.Var())
    check_output(out, want_o, mag, "f32")
