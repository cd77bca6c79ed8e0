"""Error paths: bad shapes, dtypes, index arrays and argument kinds raise kvattn.Error (a
ValueError) or kvattn.DTypeError (a TypeError too) whose message names the argument and value."""

import numpy as np
import pytest

import kvattn
from conftest import HAS_ML_DTYPES, cast, page_table, rand

HQ, HKV, D, PS = 4, 2, 16, 4


@pytest.fixture
def decode(rng):
    lens = [5, 9]
    indptr, indices, last, num_pages = page_table(rng, lens, PS, spare_pages=0)
    k = cast(rand(rng, (num_pages, PS, HKV, D)), "f32")
    v = cast(rand(rng, (num_pages, PS, HKV, D)), "f32")
    q = cast(rand(rng, (2, HQ, D)), "f32")
    dec = kvattn.BatchDecode()
    args = dict(page_table=(indptr, indices, last), page_size=PS, num_qo_heads=HQ,
                num_kv_heads=HKV, head_dim_qk=D, q_dtype="f32")
    dec.plan(**args)
    return dec, q, k, v, args


def test_exception_types():
    assert issubclass(kvattn.Error, ValueError)
    assert issubclass(kvattn.DTypeError, kvattn.Error)
    assert issubclass(kvattn.DTypeError, TypeError)


def test_run_before_plan():
    with pytest.raises(kvattn.Error, match=r"run\(\) was called before plan\(\)"):
        kvattn.BatchDecode().run(np.zeros((1, 1, 8), np.float32), np.zeros((1, 2, 1, 1, 8), np.float32))


def test_q_dtype_mismatch_and_unsupported(decode):
    dec, q, k, v, _ = decode
    with pytest.raises(TypeError, match=r"q has dtype f16 but the plan was made for q_dtype = f32"):
        dec.run(q.astype(np.float16), (k, v))
    with pytest.raises(TypeError, match=r"q has dtype float64"):
        dec.run(q.astype(np.float64), (k, v))
    with pytest.raises(TypeError, match=r"paged k has dtype i32 but the plan was made for kv_dtype = f32"):
        dec.run(q, (k.astype(np.int32), v))


def test_q_shape(decode):
    dec, q, k, v, _ = decode
    with pytest.raises(ValueError, match=r"^q\b.*"):
        dec.run(q[:, :3], (k, v))
    with pytest.raises(ValueError, match=r"q"):
        dec.run(q[:1], (k, v))
    with pytest.raises(ValueError, match=r"q is a 0-d tensor"):
        dec.run(np.float32(1.0), (k, v))


def test_negative_strides_name_the_argument(decode):
    dec, q, k, v, _ = decode
    with pytest.raises(ValueError, match=r"^q: .*stride"):
        dec.run(q[::-1], (k, v))


def test_not_a_tensor(decode):
    dec, q, k, v, _ = decode
    with pytest.raises(TypeError, match=r"q: expected a tensor .* got list"):
        dec.run(q.tolist(), (k, v))
    with pytest.raises(ValueError, match=r"tuple must be \(k_cache, v_cache\)"):
        dec.run(q, (k, v, v))
    with pytest.raises(TypeError, match=r"page_table: expected kvattn.PageTable"):
        dec.plan(**{**decode[4], "page_table": {"indptr": 0}})


def test_outputs(decode):
    dec, q, k, v, _ = decode
    out = np.empty((2, HQ, D), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"out is read-only"):
        dec.run(q, (k, v), out=out)
    with pytest.raises(ValueError, match=r"out"):
        dec.run(q, (k, v), out=np.empty((2, HQ, D + 1), np.float32))
    with pytest.raises(TypeError, match=r"out has dtype f16"):
        dec.run(q, (k, v), out=np.empty((2, HQ, D), np.float16))
    with pytest.raises(TypeError, match=r"lse has dtype f16"):
        dec.run(q, (k, v), lse=np.empty((2, HQ), np.float16))
    with pytest.raises(ValueError, match=r"lse"):
        dec.run(q, (k, v), lse=np.empty((3, HQ), np.float32))
    with pytest.raises(ValueError, match=r"out .*overlaps|out .*alias"):
        dec.run(q, (k, v), out=q)


def test_index_arrays(decode):
    dec, q, k, v, args = decode
    indptr, indices, last = args["page_table"]
    with pytest.raises(TypeError, match=r"kv_indptr has dtype int64"):
        dec.plan(**{**args, "page_table": (indptr.astype(np.int64), indices, last)})
    with pytest.raises(TypeError, match=r"kv_indices has dtype f32 but i32 is expected"):
        dec.plan(**{**args, "page_table": (indptr, indices.astype(np.float32), last)})
    bad = last.copy()
    bad[1] = PS + 1
    with pytest.raises(ValueError, match=rf"kv_last_page_len\[1\] = {PS + 1} is out of range"):
        dec.plan(**{**args, "page_table": (indptr, indices, bad)})
    with pytest.raises(ValueError, match=r"kv_indptr"):
        dec.plan(**{**args, "page_table": (indptr[::-1].copy(), indices, last)})
    with pytest.raises(ValueError, match=r"kv_indices\[\d+\] = -1 is negative"):
        dec.plan(**{**args, "page_table": (indptr, np.full_like(indices, -1), last)})
    with pytest.raises(ValueError, match=r"kv_indices\[3\] = 1 does not fit in int32|does not fit"):
        dec.plan(**{**args, "page_table": ([0, 1], [2**40], [1])})
    # A page id past the cache: found at run(), which has the cache.
    big = indices.copy()
    big[0] = 1000
    dec.plan(**{**args, "page_table": (indptr, big, last)})
    with pytest.raises(ValueError, match=r"kv_indices\[\d+\] = 1000 is out of range"):
        dec.run(q, (k, v))


def test_plan_arguments(decode):
    dec, q, k, v, args = decode
    with pytest.raises(TypeError, match=r"q_dtype: unknown dtype 'f64'"):
        dec.plan(**{**args, "q_dtype": "f64"})
    with pytest.raises(TypeError, match=r"q_dtype"):
        dec.plan(**{**args, "q_dtype": "i32"})
    with pytest.raises(ValueError, match=r"the variant has custom_mask on but no custom_mask was given"):
        dec.plan(**args, variant=kvattn.variants.custom_mask())
    with pytest.raises(ValueError, match=r"window_left = -5"):
        dec.plan(**args, variant=kvattn.Variant(window_left=-5))
    with pytest.raises(ValueError, match=r"num_qo_heads|num_kv_heads"):
        dec.plan(**{**args, "num_qo_heads": 3})
    with pytest.raises(ValueError, match=r"kv_layout = 'XYZ'"):
        kvattn.BatchDecode(kv_layout="XYZ")
    with pytest.raises(TypeError):
        dec.plan(**args, no_such_argument=1)
    # A failed plan leaves the previous one in force.
    assert dec.run(q, (k, v)).shape == (2, HQ, D)


def test_sigmoid_has_no_lse(rng, decode):
    dec, q, k, v, args = decode
    dec.plan(**args, variant=kvattn.variants.sigmoid())
    with pytest.raises(ValueError, match=r"lse was requested but sigmoid attention has no lse"):
        dec.run(q, (k, v), return_lse=True)


def test_prefill_errors(rng):
    pre = kvattn.BatchPrefill()
    base = dict(qo_indptr=[0, 4], num_qo_heads=2, num_kv_heads=1, head_dim_qk=8, q_dtype="f32")
    with pytest.raises(ValueError, match=r"kv_indptr \(ragged KV\) or page_table \(paged KV\) is required"):
        pre.plan(**base)
    with pytest.raises(ValueError, match=r"not both"):
        pre.plan(**base, kv_indptr=[0, 4], page_table=([0, 1], [0], [4]), page_size=4)
    pre.plan(**base, kv_indptr=[0, 3])  # qo_len 4 > kv_len 3 is planned, as FlashInfer plans it
    with pytest.raises(ValueError, match=r"custom_mask"):
        pre.plan(**base, kv_indptr=[0, 4], variant=kvattn.variants.custom_mask())
    pre.plan(**base, kv_indptr=[0, 4])
    q = np.zeros((4, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"^k\b"):
        pre.run(q, np.zeros((5, 1, 8), np.float32), np.zeros((4, 1, 8), np.float32))
    with pytest.raises(ValueError, match=r"v is required"):
        pre.run(q, np.zeros((4, 1, 8), np.float32))


def test_block_sparse_errors():
    bsa = kvattn.BlockSparseAttention()
    with pytest.raises(ValueError, match=r"bsr|M|R"):
        bsa.plan(bsr=kvattn.BSRMatrix([0, 1], [0], 5, 4, 2, 2), num_qo_heads=1, num_kv_heads=1,
                 head_dim_qk=8, q_dtype="f32")
    with pytest.raises(ValueError, match=r"indices"):
        bsa.plan(bsr=kvattn.BSRMatrix([0, 1], [7], 2, 4, 2, 2), num_qo_heads=1, num_kv_heads=1,
                 head_dim_qk=8, q_dtype="f32")
    with pytest.raises(TypeError, match=r"bsr: expected kvattn.BSRMatrix"):
        bsa.plan(bsr=[1, 2], num_qo_heads=1, num_kv_heads=1, head_dim_qk=8, q_dtype="f32")


def test_ops_errors(rng):
    v = np.zeros((3, 2, 8), np.float32)
    s = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match=r"v_b"):
        kvattn.merge_state(v, s, np.zeros((4, 2, 8), np.float32), np.zeros((4, 2), np.float32))
    with pytest.raises(TypeError, match=r"v_b has dtype f16 but v_a has dtype f32"):
        kvattn.merge_state(v, s, v.astype(np.float16), s)
    with pytest.raises(TypeError, match=r"s_a"):
        kvattn.merge_state(v, s.astype(np.float16), v, s)
    with pytest.raises(TypeError, match=r"mask has dtype"):
        kvattn.merge_state_in_place(v, s, v.copy(), s.copy(), np.ones(3, np.int32))
    with pytest.raises(ValueError, match=r"v"):
        kvattn.merge_states(v, s)  # 3-D, not [n, k, H, D]
    q = np.zeros((2, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"rotary_dim"):
        kvattn.apply_rope(q, q.copy(), [0, 1], rotary_dim=3)
    with pytest.raises(ValueError, match=r"pos_ids"):
        kvattn.apply_rope(q, q.copy(), [0, 1, 2])
    kc = np.zeros((2, 4, 1, 8), np.float32)
    with pytest.raises(ValueError, match=r"same slot|slot"):
        kvattn.append_paged_kv_cache(np.ones((2, 1, 8), np.float32), np.ones((2, 1, 8), np.float32),
                                     [0, 0], [1, 1], (kc, kc.copy()), ([0, 1], [0], [4]))
    with pytest.raises(ValueError, match=r"batch_indices"):
        kvattn.append_paged_kv_cache(np.ones((1, 1, 8), np.float32), np.ones((1, 1, 8), np.float32),
                                     [3], [1], (kc, kc.copy()), ([0, 1], [0], [4]))
    with pytest.raises(TypeError, match=r"page_table"):
        kvattn.append_paged_kv_cache(np.ones((1, 1, 8), np.float32), np.ones((1, 1, 8), np.float32),
                                     [0], [1], (kc, kc.copy()), None)


@pytest.mark.skipif(not HAS_ML_DTYPES, reason="needs ml_dtypes")
def test_bf16_arrays_are_views_not_copies(rng):
    import ml_dtypes

    # Writing through kvattn into an ml_dtypes bf16 array: the array itself must change.
    n, h, d = 2, 2, 8
    va = rand(rng, (n, h, d)).astype(ml_dtypes.bfloat16)
    sa = np.zeros((n, h), np.float32)
    vb = va.copy()
    out = np.zeros((n, h, d), ml_dtypes.bfloat16)
    kvattn.merge_state(va, sa, vb, sa, v_out=out, s_out=np.empty((n, h), np.float32))
    assert np.array_equal(out.astype(np.float32), va.astype(np.float32))
