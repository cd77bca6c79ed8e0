"""User variants from Python (kvattn.Variant.custom, docs/VARIANTS.md) on the CPU backend: the
examples of examples/variants/ on BatchDecode, BatchPrefill (paged and ragged) and
BlockSparseAttention with numpy inputs against the float64 reference (reference.UserHooks, the
same formulas in float64), composition with the built-in switches, the tensors' lifetime, the
Variant's API, and the error paths (the library's messages).

The sources are compiled by the system's C++ compiler into a cache directory that this module
points KVATTN_CACHE_DIR at (a fresh temporary directory), so a run never depends on ~/.cache.
"""

import copy
import gc
import math
import pathlib
import re
import weakref

import numpy as np
import pytest

import kvattn
import reference as ref
from conftest import FLOAT_DTYPES, cast, check_lse, check_output, f64, np_dtype, page_table, rand

REPO = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "variants"


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory):
    """KVATTN_CACHE_DIR for every compile of this module (set before its first plan)."""
    path = tmp_path_factory.mktemp("kvattn-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVATTN_CACHE_DIR", str(path))
        mp.delenv("KVATTN_CXX", raising=False)
        yield path


def example(name):
    return (EXAMPLES / f"{name}.h").read_text()


def compiled_variants(cache_dir):
    return sorted(p.name for p in cache_dir.glob("cpu-variant-*.so"))


# ---- the examples, as (kvattn.Variant, reference hooks) ---------------------------------------------
# Each builder gets the rng and the number of query heads and returns (variant, hooks, causal): the
# user variant alone, its float64 hooks, and whether prefill turns the built-in causal mask on with
# it (the StreamingLLM and PrefixLM masks are causal, or not, by themselves).
MAX_LEN = 128  # positions the tensors indexed by position cover


def soft_cap(rng, hq):
    cap = 4.0
    v = kvattn.Variant.custom(example("soft_cap"), name="soft_cap", scalars={"cap": cap})
    return v, ref.UserHooks(logits_transform=lambda x, *_: cap * np.tanh(x / cap)), True


def alibi(rng, hq):
    slopes = cast(-rng.uniform(0.0, 0.2, 2 * hq), "f32")[::2]  # a strided view: read as given
    s = f64(slopes)
    v = kvattn.Variant.custom(example("alibi"), name="alibi", tensors={"slopes": slopes})
    hooks = ref.UserHooks(logits_transform=lambda x, b, qp, kp, h, hk: x + s[h] * (kp - qp))
    return v, hooks, True


def sigmoid(rng, hq):
    bias = -1.5
    v = kvattn.Variant.custom(example("sigmoid"), name="sigmoid", scalars={"bias": bias})
    hooks = ref.UserHooks(use_softmax=False,
                          logits_transform=lambda x, *_: 1.0 / (1.0 + np.exp(-(x + bias))))
    return v, hooks, True


def document_mask(rng, hq):
    ids = np.cumsum(rng.random(MAX_LEN) < 0.08).astype(np.int32)  # non-decreasing document ids
    v = kvattn.Variant.custom(example("document_mask"), name="document_mask", tensors={"doc_ids": ids})
    return v, ref.UserHooks(logits_mask=lambda b, qp, kp, h, hk: ids[qp] == ids[kp]), True


def learned_sink(rng, hq):
    sinks = cast(rng.uniform(-3, 3, hq), "f32")
    s = f64(sinks)
    v = kvattn.Variant.custom(example("learned_sink"), name="learned_sink", tensors={"sinks": sinks})
    return v, ref.UserHooks(sink_logit=lambda b, h: s[h]), True


def streaming_sink(rng, hq):
    num_sink, window = 4, 16
    v = kvattn.Variant.custom(example("streaming_sink"), name="streaming_sink",
                              scalars={"num_sink": num_sink, "window": window})
    hooks = ref.UserHooks(
        logits_mask=lambda b, qp, kp, h, hk: (kp <= qp) & ((kp < num_sink) | (kp >= qp - window)))
    return v, hooks, False


def prefix_lm(rng, hq):
    prefix = np.array([5, 0, 40, 7, 3, 9], np.int32)  # per request (block-sparse: request 0)
    v = kvattn.Variant.custom(example("prefix_lm"), name="prefix_lm", tensors={"prefix_len": prefix})
    hooks = ref.UserHooks(logits_mask=lambda b, qp, kp, h, hk: (kp <= qp) | (kp < prefix[b]))
    return v, hooks, False


def t5_bias(rng, hq):
    buckets, max_distance = 16, 64
    bias = cast(rng.uniform(-2, 2, (buckets, hq)), "f32").T  # [hq, buckets], column-major
    b64 = f64(bias)

    def bucket(d):  # the example's bucketing, in float32 as the hook computes it
        n = np.where(d < 0, -d, 0)
        exact = buckets // 2
        with np.errstate(divide="ignore"):
            scaled = (np.log(np.maximum(n, 1).astype(np.float32) / np.float32(exact))
                      / np.log(np.float32(max_distance) / np.float32(exact)))
        far = np.minimum(exact + (scaled * np.float32(buckets - exact)).astype(np.int64), buckets - 1)
        return np.where(n < exact, n, far)

    v = kvattn.Variant.custom(example("t5_bias"), name="t5_bias", scalars={"max_distance": max_distance},
                              tensors={"bias": bias})
    hooks = ref.UserHooks(logits_transform=lambda x, b, qp, kp, h, hk: x + b64[h, bucket(kp - qp)])
    return v, hooks, True


EXAMPLE_BUILDERS = {f.__name__: f for f in [soft_cap, alibi, sigmoid, document_mask, learned_sink,
                                            streaming_sink, prefix_lm, t5_bias]}


# ---- runs of each wrapper against the reference ------------------------------------------------------
def run_decode(rng, variant, var, *, kv_lens, dtype, hq=8, hkv=2, d=32, page_size=5, split=16,
               kv_dtype=None):
    kv_dtype = kv_dtype or dtype
    indptr, indices, last, num_pages = page_table(rng, kv_lens, page_size)
    k = cast(rand(rng, (num_pages, page_size, hkv, d)), kv_dtype)
    v = cast(rand(rng, (num_pages, page_size, hkv, d)), kv_dtype)
    q = cast(rand(rng, (len(kv_lens), hq, d)), dtype)
    dec = kvattn.BatchDecode()
    dec.plan(page_table=(indptr, indices, last), page_size=page_size, num_qo_heads=hq,
             num_kv_heads=hkv, head_dim_qk=d, q_dtype=dtype, kv_dtype=kv_dtype, variant=variant,
             scheduler=kvattn.SchedulerOptions(fixed_split_size=split))
    res = dec.run(q, (k, v), return_lse=var.has_lse())
    ks = ref.gather_paged(f64(k), "NHD", indptr, indices, last, page_size)
    vs = ref.gather_paged(f64(v), "NHD", indptr, indices, last, page_size)
    check(res, ref.batch_attention(f64(q), np.arange(len(kv_lens) + 1), ks, vs, var), dtype)
    return dec


def run_paged(rng, variant, var, *, lens, dtype, hq=8, hkv=2, d=32, page_size=5, split=0,
              kv_dtype=None):
    kv_dtype = kv_dtype or dtype
    qo_lens, kv_lens = zip(*lens)
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    indptr, indices, last, num_pages = page_table(rng, kv_lens, page_size)
    k = cast(rand(rng, (num_pages, page_size, hkv, d)), kv_dtype)
    v = cast(rand(rng, (num_pages, page_size, hkv, d)), kv_dtype)
    q = cast(rand(rng, (qo_indptr[-1], hq, d)), dtype)
    pre = kvattn.BatchPrefill()
    pre.plan(qo_indptr=qo_indptr, page_table=(indptr, indices, last), page_size=page_size,
             num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=d, q_dtype=dtype, kv_dtype=kv_dtype,
             variant=variant, scheduler=kvattn.SchedulerOptions(fixed_split_size=split))
    res = pre.run(q, (k, v), return_lse=var.has_lse())
    ks = ref.gather_paged(f64(k), "NHD", indptr, indices, last, page_size)
    vs = ref.gather_paged(f64(v), "NHD", indptr, indices, last, page_size)
    check(res, ref.batch_attention(f64(q), qo_indptr, ks, vs, var), dtype)
    return pre


def run_ragged(rng, variant, var, *, lens, dtype, hq=8, hkv=8, d=32, split=16):
    qo_lens, kv_lens = zip(*lens)
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    q = cast(rand(rng, (qo_indptr[-1], hq, d)), dtype)
    k = cast(rand(rng, (kv_indptr[-1], hkv, d)), dtype)
    v = cast(rand(rng, (kv_indptr[-1], hkv, d)), dtype)
    pre = kvattn.BatchPrefill()
    pre.plan(qo_indptr=qo_indptr, kv_indptr=kv_indptr, num_qo_heads=hq, num_kv_heads=hkv,
             head_dim_qk=d, q_dtype=dtype, variant=variant,
             scheduler=kvattn.SchedulerOptions(fixed_split_size=split))
    res = pre.run(q, k, v, return_lse=var.has_lse())
    ks = [f64(k[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(len(kv_lens))]
    vs = [f64(v[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(len(kv_lens))]
    check(res, ref.batch_attention(f64(q), qo_indptr, ks, vs, var), dtype)
    return pre


def run_bsr(rng, variant, var, *, dtype, R=4, C=8, mb=6, nb=8, hq=4, hkv=2, d=16):
    M, N = mb * R, nb * C
    present = rng.random((mb, nb)) < 0.5
    present[1, :] = False  # a block row with no block: o = 0 (lse = -inf, or the sink)
    indptr = np.concatenate([[0], np.cumsum(present.sum(axis=1))]).astype(np.int32)
    indices = np.concatenate([np.flatnonzero(row) for row in present]).astype(np.int32)
    q = cast(rand(rng, (M, hq, d)), dtype)
    k = cast(rand(rng, (N, hkv, d)), dtype)
    v = cast(rand(rng, (N, hkv, d)), dtype)
    bsa = kvattn.BlockSparseAttention()
    bsa.plan(bsr=kvattn.BSRMatrix(indptr, indices, M, N, R, C), num_qo_heads=hq, num_kv_heads=hkv,
             head_dim_qk=d, q_dtype=dtype, variant=variant)
    res = bsa.run(q, k, v, return_lse=var.has_lse())
    blocks = with_fields(var, mask=lambda b, i, j: bool(present[i // R, j // C]))
    check(res, ref.batch_attention(f64(q), [0, M], [f64(k)], [f64(v)], blocks), dtype)
    return bsa


def with_fields(var, **fields):
    """A copy of the reference variant `var` with some fields replaced."""
    out = copy.copy(var)
    out.__dict__.update(fields)
    return out


def check(res, want, dtype):
    want_o, want_lse, mag = want
    if want_lse is None:
        assert isinstance(res, np.ndarray), "no lse was asked for"
        check_output(res, want_o, mag, dtype)
    else:
        out, lse = res
        check_output(out, want_o, mag, dtype)
        check_lse(lse, want_lse)


def random_lens(rng, n, *, decode=False, max_len=90):
    lens = []
    for _ in range(n):
        kv = int(rng.integers(1, max_len + 1))
        lens.append((1 if decode else int(rng.integers(1, kv + 1)), kv))
    return lens


KINDS = ["decode", "paged", "ragged", "block_sparse"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(EXAMPLE_BUILDERS))
def test_example(rng, name, kind, dtype):
    hq = 4 if kind == "block_sparse" else 8
    variant, hooks, causal = EXAMPLE_BUILDERS[name](rng, hq)
    if kind == "decode":
        lens = random_lens(rng, 3, decode=True)
        kv_lens = [kv for _, kv in lens] + ([0] if name == "learned_sink" else [])  # no key: o = 0
        run_decode(rng, variant, ref.Var(user=hooks), kv_lens=kv_lens, dtype=dtype)
    elif kind == "paged":
        run_paged(rng, variant.with_causal(causal), ref.Var(causal=causal, user=hooks),
                  lens=random_lens(rng, 4), dtype=dtype, split=16 if name == "learned_sink" else 0)
    elif kind == "ragged":
        lens = random_lens(rng, 3) + [(0, 0), (5, 9)]
        run_ragged(rng, variant.with_causal(causal), ref.Var(causal=causal, user=hooks), lens=lens,
                   dtype=dtype)
    else:
        run_bsr(rng, variant, ref.Var(user=hooks), dtype=dtype)


def test_builtin_sink_variants(rng):
    """kvattn.variants.learned_sinks / streaming_sinks: kvattn's own user variants."""
    sinks = cast(rng.uniform(-3, 3, 8), "f32")
    v = kvattn.variants.learned_sinks(sinks)
    assert v.describe() == "custom(learned_sinks)"
    hooks = ref.UserHooks(sink_logit=lambda b, h: f64(sinks)[h])
    run_decode(rng, v, ref.Var(user=hooks), kv_lens=[30, 0, 77], dtype="bf16")
    run_paged(rng, v.with_causal(), ref.Var(causal=True, user=hooks), lens=random_lens(rng, 3), dtype="f32", split=16)
    s = kvattn.variants.streaming_sinks(3, 10)
    hooks = ref.UserHooks(logits_mask=lambda b, qp, kp, h, hk: (kp <= qp) & ((kp < 3) | (kp >= qp - 10)))
    run_ragged(rng, s, ref.Var(user=hooks), lens=random_lens(rng, 3), dtype="f16")
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="streaming_sinks: num_sink"):
            kvattn.variants.streaming_sinks(bad, 4)
    with pytest.raises(ValueError, match="streaming_sinks: window = -2"):
        kvattn.variants.streaming_sinks(4, -2)


def test_flashinfer_wrappers_take_a_user_variant_as_jit_args(rng):
    """kvattn.flashinfer's wrappers: jit_args=kvattn.Variant carrying a user variant, composed with
    the wrapper's own switches (here a soft-cap and the causal mask) at every plan()."""
    import kvattn.flashinfer as fi
    ws = np.zeros(1 << 20, np.uint8)
    hq, hkv, d, ps = 8, 2, 32, 5
    slopes = cast(-rng.uniform(0.0, 0.2, hq), "f32")
    user = kvattn.Variant.custom(example("alibi"), name="alibi", tensors={"slopes": slopes})
    hooks = ref.UserHooks(logits_transform=lambda x, b, qp, kp, h, hk: x + f64(slopes)[h] * (kp - qp))
    kv_lens = [30, 1, 64]
    indptr, indices, last, num_pages = page_table(rng, kv_lens, ps)
    k = cast(rand(rng, (num_pages, ps, hkv, d)), "f32")
    v = cast(rand(rng, (num_pages, ps, hkv, d)), "f32")
    q = cast(rand(rng, (3, hq, d)), "f32")
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", jit_args=user)
    w.plan(indptr, indices, last, hq, hkv, d, ps, logits_soft_cap=5.0, q_data_type="float32")
    out, lse = w.run(q, (k, v), return_lse=True)
    ks = ref.gather_paged(f64(k), "NHD", indptr, indices, last, ps)
    vs = ref.gather_paged(f64(v), "NHD", indptr, indices, last, ps)
    check((out, lse), ref.batch_attention(f64(q), np.arange(4), ks, vs, ref.Var(soft_cap=5.0, user=hooks)), "f32")
    lens = [(7, 20), (1, 1), (12, 12)]
    qo = np.concatenate([[0], np.cumsum([a for a, _ in lens])]).astype(np.int32)
    kvp = np.concatenate([[0], np.cumsum([b for _, b in lens])]).astype(np.int32)
    q = cast(rand(rng, (int(qo[-1]), hq, d)), "f32")
    kr = cast(rand(rng, (int(kvp[-1]), hkv, d)), "f32")
    vr = cast(rand(rng, (int(kvp[-1]), hkv, d)), "f32")
    p = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", jit_args=user)
    p.plan(qo, kvp, hq, hkv, d, causal=True, q_data_type="float32")
    out, lse = p.run(q, kr, vr, return_lse=True)
    want = ref.batch_attention(f64(q), qo, [f64(kr)[kvp[b]:kvp[b + 1]] for b in range(3)],
                               [f64(vr)[kvp[b]:kvp[b + 1]] for b in range(3)], ref.Var(causal=True, user=hooks))
    check((out, lse), want, "f32")
    with pytest.raises(NotImplementedError, match="'jit_args'.*kvattn.Variant"):
        fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", jit_args=kvattn.variants.causal())


def test_document_mask_of_packed_sequences(rng):
    # FlexAttention's example: documents packed in one request, causal within each; the same
    # through a paged cache.
    n = 120
    ids = np.cumsum(rng.random(n) < 0.06).astype(np.int32)
    variant = kvattn.variants.causal().with_custom(example("document_mask"), name="document_mask",
                                                   tensors={"doc_ids": ids})
    var = ref.Var(causal=True, user=ref.UserHooks(logits_mask=lambda b, qp, kp, h, hk: ids[qp] == ids[kp]))
    run_ragged(rng, variant, var, lens=[(n, n)], dtype="f32", hq=4, hkv=2)
    run_paged(rng, variant, var, lens=[(n, n)], dtype="f32", hq=4, hkv=2, page_size=16)


# ---- composition with the built-ins -----------------------------------------------------------------
def test_composes_with_builtin_masks_transforms_and_scales(rng):
    # A user transform runs after the built-in soft-cap and ALiBi; its mask is ANDed with causal
    # and the window; fp8 KV with scales.
    hq = 8
    slopes = cast(-rng.uniform(0.0, 0.3, hq), "f32")
    s = f64(slopes)
    variant = (kvattn.variants.causal().with_window(20).with_soft_cap(5.0).with_alibi()
               .with_custom(example("alibi"), name="alibi", tensors={"slopes": slopes})
               .with_scales(1.0, 0.5, 2.0))
    assert variant.describe() == ("causal+window(20)+soft_cap(5)+alibi+scales(q=1, k=0.5, v=2)"
                                  "+custom(alibi)")
    hooks = ref.UserHooks(logits_transform=lambda x, b, qp, kp, h, hk: x + s[h] * (kp - qp))
    var = ref.Var(causal=True, window_left=20, soft_cap=5.0, alibi=True, k_scale=0.5, v_scale=2.0,
                  user=hooks)
    kv_dtype = "e4m3" if "bf16" in FLOAT_DTYPES else "f16"
    run_paged(rng, variant, var, lens=random_lens(rng, 3), dtype="f16", kv_dtype=kv_dtype)
    run_decode(rng, variant.with_causal(False), with_fields(var, causal=False),
               kv_lens=[70, 3, 41], dtype="f16", kv_dtype=kv_dtype)


def test_user_variants_equal_to_builtins(rng):
    # soft_cap.h and sigmoid.h compute what the built-in switches do: the same reference.
    run_ragged(rng, kvattn.variants.causal().with_custom(example("soft_cap"), name="soft_cap",
                                                         scalars={"cap": 3.0}),
               ref.Var(causal=True, soft_cap=3.0), lens=[(9, 30), (17, 17)], dtype="f32")
    run_ragged(rng, kvattn.variants.causal().with_custom(example("sigmoid"), name="sigmoid",
                                                         scalars={"bias": 0.25}),
               ref.Var(causal=True, sigmoid=True, sigmoid_bias=0.25), lens=[(9, 30), (17, 17)],
               dtype="f32")


OUTPUT_TRANSFORM = """
struct Variant {
  static bool logits_mask(const Params& p, int, int64_t qo_pos, int64_t kv_pos, int, int) {
    return ((qo_pos + kv_pos) % p.period) != 1;
  }
  static float logits_transform(const Params& p, float logit, int batch, int64_t, int64_t, int,
                                int kv_head) {
    return logit + p.shift * float(kv_head) - 0.125f * float(batch);
  }
  static float output_transform(const Params& p, float value, int, int64_t qo_pos, int qo_head,
                                int dim) {
    return value * p.out_scale + 0.015625f * float(dim % 3) - 0.0009765625f * float(qo_head) +
           p.offsets(qo_pos % p.offsets.size(0));
  }
};
"""


def test_output_transform_and_every_parameter_kind(rng):
    # i32 and f32 scalars (an int given as f32 by a pair), a tensor read in output_transform, the
    # batch index in the transform. The output transform's constants and offsets are multiples of
    # 2^-10, so that its value on a row that sees no key (o = 0, nothing accumulated) is exact in
    # f32 (the tolerance covers the accumulation, not the hook's own rounding).
    offsets = cast(np.round(rng.uniform(-0.5, 0.5, 7) * 1024) / 1024, "f32")
    off = f64(offsets)
    variant = kvattn.Variant(window_left=24).with_custom(
        OUTPUT_TRANSFORM, name="scaled_window",
        scalars={"shift": 0.25, "out_scale": ("f32", 2), "period": 3}, tensors={"offsets": offsets})
    c = variant.custom_variant
    assert (c.f32_params, c.i32_params, c.tensor_params) == (["shift", "out_scale"], ["period"],
                                                             [("offsets", kvattn.DType.f32, 1)])
    assert variant.custom_scalars == {"shift": 0.25, "out_scale": 2.0, "period": 3}
    hooks = ref.UserHooks(
        logits_mask=lambda b, qp, kp, h, hk: (qp + kp) % 3 != 1,
        logits_transform=lambda x, b, qp, kp, h, hk: x + 0.25 * hk - 0.125 * b,
        output_transform=lambda o, b, qp, h, e: o * 2.0 + 2.0**-6 * (e % 3) - 2.0**-10 * h + off[qp % 7])
    var = ref.Var(window_left=24, user=hooks)
    run_decode(rng, variant, var, kv_lens=[40, 1, 77], dtype="f32")
    run_paged(rng, variant.with_causal(), ref.Var(causal=True, window_left=24, user=hooks),
              lens=random_lens(rng, 3), dtype="f32")
    run_bsr(rng, variant, var, dtype="f32")


# ---- the Variant's API ------------------------------------------------------------------------------
def test_variant_api():
    ids = np.zeros(8, np.int32)
    src = example("document_mask")
    v = kvattn.Variant.custom(src, name="doc", tensors={"doc_ids": ids})
    assert v.describe() == "custom(doc)" and repr(v) == "Variant(custom(doc))"
    assert isinstance(v.custom_variant, kvattn.CustomVariant)
    assert v.custom_variant.name == "doc" and v.custom_variant.source == src
    assert v.custom_variant.tensor_params == [("doc_ids", kvattn.DType.i32, 1)]
    assert "doc_ids" in repr(v.custom_variant)
    assert v.custom_tensors["doc_ids"] is ids and v.custom_scalars == {}
    # The fluent methods keep the user variant and its tensors; with_custom composes.
    w = v.with_causal().with_window(64)
    assert w.describe() == "causal+window(64)+custom(doc)" and w.custom_tensors["doc_ids"] is ids
    assert copy.copy(w) == w and copy.copy(w).custom_tensors["doc_ids"] is ids
    c = kvattn.variants.causal().with_custom(src, name="doc", tensors={"doc_ids": ids})
    assert c == v.with_causal() and c != v
    # Equality: the same name, source, declarations, values; tensors by the memory they view.
    assert kvattn.Variant.custom(src, name="doc", tensors={"doc_ids": ids}) == v
    assert kvattn.Variant.custom(src, name="doc", tensors={"doc_ids": ids[:]}) == v  # same memory
    assert kvattn.Variant.custom(src, name="doc", tensors={"doc_ids": ids.copy()}) != v
    assert kvattn.Variant.custom(src, name="doc2", tensors={"doc_ids": ids}) != v
    assert kvattn.Variant.custom(src + " ", name="doc", tensors={"doc_ids": ids}) != v
    assert v != kvattn.Variant() and kvattn.Variant() == kvattn.Variant()
    assert v != "custom(doc)" and not (v == 3) and v.custom_variant != 3
    assert kvattn.Variant().custom_variant is None and kvattn.Variant().custom_tensors == {}
    s = kvattn.variants.custom(example("soft_cap"), name="soft_cap", scalars={"cap": 2})
    assert s.custom_variant.i32_params == ["cap"]  # an int declares an i32 ...
    f = kvattn.Variant.custom(example("soft_cap"), name="soft_cap", scalars={"cap": ("f32", 2)})
    assert f.custom_variant.f32_params == ["cap"] and f.custom_scalars == {"cap": 2.0}  # ... unless typed
    assert f != s
    assert f == kvattn.Variant.custom(example("soft_cap"), name="soft_cap", scalars={"cap": 2.0})
    assert f != kvattn.Variant.custom(example("soft_cap"), name="soft_cap", scalars={"cap": 2.5})
    n = kvattn.Variant.custom("struct Variant {};", scalars={"a": np.float32(0.5), "b": np.int64(-3),
                                                             "c": (kvattn.DType.i32, 7),
                                                             "d": (np.float32, 1)})
    assert n.custom_variant.f32_params == ["a", "d"] and n.custom_variant.i32_params == ["b", "c"]
    assert n.custom_scalars == {"a": 0.5, "d": 1.0, "b": -3, "c": 7}
    assert n.custom_variant.name == "custom"
    # A new user variant replaces the old one.
    r = v.with_custom(example("soft_cap"), name="soft_cap", scalars={"cap": 1.0})
    assert r.describe() == "custom(soft_cap)" and r.custom_tensors == {}


def test_with_custom_values_rebinds_without_recompiling(rng, cache_dir):
    hq = 4
    sinks = cast(rng.uniform(-3, 3, hq), "f32")
    variant = kvattn.Variant.custom(example("learned_sink"), name="learned_sink", tensors={"sinks": sinks})
    run_decode(rng, variant, ref.Var(user=ref.UserHooks(sink_logit=lambda b, h: f64(sinks)[h])),
               kv_lens=[3, 20], dtype="f32", hq=hq)
    before = compiled_variants(cache_dir)
    other = cast(rng.uniform(-3, 3, hq), "f32")
    moved = variant.with_custom_values(tensors={"sinks": other})
    assert moved.custom_tensors["sinks"] is other and variant.custom_tensors["sinks"] is sinks
    assert moved != variant and moved.custom_variant == variant.custom_variant
    run_decode(rng, moved, ref.Var(user=ref.UserHooks(sink_logit=lambda b, h: f64(other)[h])),
               kv_lens=[3, 20], dtype="f32", hq=hq)
    assert compiled_variants(cache_dir) == before  # the same declaration: the same compiled object
    # Scalars: an int fills an f32 parameter; the others keep their values.
    t5 = kvattn.Variant.custom(example("streaming_sink"), name="streaming_sink",
                               scalars={"num_sink": 2, "window": 8})
    assert t5.with_custom_values(scalars={"window": 3}).custom_scalars == {"num_sink": 2, "window": 3}
    cap = kvattn.Variant.custom(example("soft_cap"), name="soft_cap", scalars={"cap": 2.0})
    assert cap.with_custom_values(scalars={"cap": 5}).custom_scalars == {"cap": 5.0}


# ---- the tensors' lifetime ---------------------------------------------------------------------------
def test_the_variant_and_the_wrapper_keep_the_tensors_alive(rng):
    hq, n = 4, 40
    ids = np.cumsum(rng.random(n) < 0.1).astype(np.int32)
    want_ids = ids.copy()
    alive = weakref.ref(ids)
    variant = kvattn.variants.causal().with_custom(example("document_mask"), name="document_mask",
                                                   tensors={"doc_ids": ids})
    del ids
    gc.collect()
    assert alive() is not None, "the Variant must keep its tensors alive"
    var = ref.Var(causal=True, user=ref.UserHooks(
        logits_mask=lambda b, qp, kp, h, hk: want_ids[qp] == want_ids[kp]))
    pre = run_ragged(rng, variant.with_window(30), with_fields(var, window_left=30), lens=[(n, n)],
                     dtype="f32", hq=hq, hkv=hq, d=16)
    # Only the wrapper holds the Variant of its plan now (with_window made a new one).
    del variant
    gc.collect()
    assert alive() is not None, "the wrapper must keep its plan's Variant alive"
    q = cast(rand(rng, (n, hq, 16)), "f32")
    k = cast(rand(rng, (n, hq, 16)), "f32")
    v = cast(rand(rng, (n, hq, 16)), "f32")
    junk = [np.full(n, 7, np.int32) for _ in range(64)]  # would take the freed memory's place
    out = pre.run(q, k, v)
    del junk
    hooks = ref.UserHooks(logits_mask=lambda b, qp, kp, h, hk: want_ids[qp] == want_ids[kp])
    want = ref.batch_attention(f64(q), [0, n], [f64(k)], [f64(v)],
                               ref.Var(causal=True, window_left=30, user=hooks))
    check_output(out, want[0], want[2], "f32")
    # A new plan without the user variant lets go of it.
    pre.plan(qo_indptr=[0, n], kv_indptr=[0, n], num_qo_heads=hq, num_kv_heads=hq, head_dim_qk=16,
             q_dtype="f32")
    gc.collect()
    assert alive() is None


# ---- errors -------------------------------------------------------------------------------------------
def small_decode(variant, q_dtype="f32"):
    dec = kvattn.BatchDecode()
    dec.plan(page_table=([0, 1], [0], [3]), page_size=4, num_qo_heads=4, num_kv_heads=2,
             head_dim_qk=16, q_dtype=q_dtype, variant=variant)
    return dec


BROKEN = """struct Variant {
  static float logits_transform(const Params& p, float logit, int, int64_t, int64_t, int, int) {
    return logit + p.missing;
  }
};
"""


def test_compile_errors_name_the_users_lines():
    with pytest.raises(kvattn.Error, match=r"custom variant broken does not compile") as e:
        small_decode(kvattn.Variant.custom(BROKEN, name="broken"))
    assert "broken.variant:3:" in str(e.value) and "missing" in str(e.value)
    # A tensor the source reads but the Variant does not declare: the compiler names it.
    with pytest.raises(kvattn.Error, match=r"alibi\.variant:\d+:.*slopes"):
        small_decode(kvattn.Variant.custom(example("alibi"), name="alibi"))
    with pytest.raises(kvattn.Error, match="logits_mask must be callable as static bool logits_mask"):
        small_decode(kvattn.Variant.custom(
            "struct Variant {\n  static bool logits_mask(const Params&, int b) { return b == 0; }\n};\n",
            name="wrong_signature"))
    with pytest.raises(kvattn.Error, match="sink_logit needs the softmax"):
        small_decode(kvattn.Variant.custom(
            "struct Variant {\n  static constexpr bool use_softmax = false;\n"
            "  static float sink_logit(const Params&, int, int) { return 0; }\n};\n", name="no_softmax"))
    with pytest.raises(kvattn.Error, match="custom variant no_struct does not compile"):
        small_decode(kvattn.Variant.custom("float f() { return 1; }\n", name="no_struct"))


def test_a_missing_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("KVATTN_CXX", "/nonexistent/kvattn-no-such-compiler")
    with pytest.raises(kvattn.Error, match=re.escape("the C++ compiler '/nonexistent/kvattn-no-such-"
                                                     "compiler' could not be run (install g++ or "
                                                     "clang++, or set KVATTN_CXX)")):
        small_decode(kvattn.Variant.custom(example("soft_cap") + "\n// python\n", name="soft_cap",
                                           scalars={"cap": 2.0}))


def test_parameter_errors_name_the_parameter():
    src = example("alibi")
    slopes = np.ones(4, np.float32)
    # Dtypes a tensor parameter cannot have.
    with pytest.raises(kvattn.DTypeError, match="custom variant alibi: tensor parameter slopes has "
                                                r"dtype float64 \(f32, i32 or u8 are supported\)"):
        kvattn.Variant.custom(src, name="alibi", tensors={"slopes": np.ones(4)})
    with pytest.raises(kvattn.DTypeError, match="custom variant alibi: tensor parameter slopes has "
                                                r"dtype f16 \(f32, i32 or u8 are supported\)"):
        kvattn.Variant.custom(src, name="alibi", tensors={"slopes": np.ones(4, np.float16)})
    with pytest.raises(kvattn.Error, match=r"tensor parameter slopes has ndim = 5 \(1 to 4"):
        kvattn.Variant.custom(src, name="alibi", tensors={"slopes": np.ones((1,) * 5, np.float32)})
    with pytest.raises(kvattn.Error, match="tensor parameter slopes is a 0-d tensor"):
        kvattn.Variant.custom(src, name="alibi", tensors={"slopes": np.float32(1.0)})
    with pytest.raises(TypeError, match="tensor parameter slopes: expected a tensor"):
        kvattn.Variant.custom(src, name="alibi", tensors={"slopes": [1.0, 2.0]})
    # A declared tensor given another dtype or rank later: plan() says so (the C++ checks).
    v = kvattn.Variant.custom(src, name="alibi", tensors={"slopes": slopes})
    with pytest.raises(kvattn.DTypeError, match="custom variant alibi: tensor parameter slopes has "
                                                "dtype i32 but was declared f32"):
        small_decode(v.with_custom_values(tensors={"slopes": np.ones(4, np.int32)}))
    with pytest.raises(kvattn.Error, match="tensor parameter slopes has 2 dimensions but was "
                                           "declared with 1"):
        small_decode(v.with_custom_values(tensors={"slopes": np.ones((2, 2), np.float32)}))
    with pytest.raises(kvattn.Error, match="a value was given for slope, which is not a declared "
                                           "parameter"):
        v.with_custom_values(tensors={"slope": slopes})
    with pytest.raises(kvattn.Error, match="slopes is a tensor parameter; give it in tensors="):
        v.with_custom_values(scalars={"slopes": 1.0})
    with pytest.raises(kvattn.Error, match="has no user variant"):
        kvattn.variants.causal().with_custom_values(scalars={"cap": 1.0})
    # Scalars.
    cap = example("soft_cap")
    with pytest.raises(TypeError, match="scalar parameter cap is a bool"):
        kvattn.Variant.custom(cap, name="soft_cap", scalars={"cap": True})
    with pytest.raises(TypeError, match="scalar parameter cap: expected an int, a float or a "
                                        r"\(dtype, value\) pair, got str"):
        kvattn.Variant.custom(cap, name="soft_cap", scalars={"cap": "2"})
    with pytest.raises(kvattn.Error, match=r"scalar parameter cap = 2147483648 does not fit in int32"):
        kvattn.Variant.custom(cap, name="soft_cap", scalars={"cap": 2**31})
    with pytest.raises(kvattn.DTypeError, match=r"scalar parameter cap has dtype bf16 \(f32 or i32"):
        kvattn.Variant.custom(cap, name="soft_cap", scalars={"cap": ("bf16", 2.0)})
    with pytest.raises(kvattn.DTypeError, match="scalar parameter cap has dtype i32 but the value "
                                                "2.5 is not an int"):
        kvattn.Variant.custom(cap, name="soft_cap", scalars={"cap": ("i32", 2.5)})
    with pytest.raises(kvattn.Error, match=r"a tuple must be \(dtype, value\)"):
        kvattn.Variant.custom(cap, name="soft_cap", scalars={"cap": ("f32", 1, 2)})
    f = kvattn.Variant.custom(cap, name="soft_cap", scalars={"cap": 2.0})
    with pytest.raises(kvattn.DTypeError, match="scalar parameter cap is declared f32 but a value of "
                                                "dtype i32 was given"):
        f.with_custom_values(scalars={"cap": ("i32", 2)})
    i = kvattn.Variant.custom(cap, name="soft_cap", scalars={"cap": 2})
    with pytest.raises(kvattn.DTypeError, match="scalar parameter cap has dtype i32 but the value "
                                                "2.5 is not an int"):
        i.with_custom_values(scalars={"cap": 2.5})
    with pytest.raises(TypeError, match="the keys of scalars= are parameter names"):
        kvattn.Variant.custom(cap, name="soft_cap", scalars={1: 2.0})
    # Names (the C++ checks of the declaration).
    with pytest.raises(kvattn.Error, match='custom variant name "not a name" is not an identifier'):
        kvattn.Variant.custom(cap, name="not a name", scalars={"cap": 2.0})
    with pytest.raises(kvattn.Error, match='f32 parameter name "2cap" is not an identifier'):
        kvattn.Variant.custom(cap, name="soft_cap", scalars={"2cap": 2.0})
    with pytest.raises(kvattn.Error, match="parameter cap is declared twice"):
        kvattn.Variant.custom(cap, name="soft_cap", scalars={"cap": 2.0},
                              tensors={"cap": np.ones(1, np.float32)})
    with pytest.raises(kvattn.Error, match="custom variant custom has an empty source"):
        kvattn.Variant.custom("")
    with pytest.raises(TypeError):
        kvattn.Variant.custom(cap, name="soft_cap", scalars=[("cap", 2.0)])


def test_tensor_on_another_device_and_no_lse_without_softmax():
    from test_corruptions import KDL_CUDA, raw  # a DLPack producer of any device (ctypes)
    slopes = np.ones(4, np.float32)
    v = kvattn.Variant.custom(example("alibi"), name="alibi",
                              tensors={"slopes": raw(slopes, device=(KDL_CUDA, 0))})
    with pytest.raises(kvattn.Error, match="tensor parameter slopes is on cuda:0 but the plan "
                                           "computes on cpu"):
        small_decode(v)
    dec = small_decode(kvattn.Variant.custom(example("sigmoid"), name="sigmoid", scalars={"bias": 0.0}))
    q = np.zeros((1, 4, 16), np.float32)
    k = np.zeros((1, 4, 2, 16), np.float32)
    with pytest.raises(kvattn.Error, match="lse was requested but the user variant sigmoid has "
                                           r"use_softmax = false \(no lse\)"):
        dec.run(q, (k, k), return_lse=True)
    out, lse = np.full((1, 4, 16), np.nan, np.float32), np.full((1, 4), np.nan, np.float32)
    with pytest.raises(kvattn.Error, match="use_softmax = false"):
        dec.run(q, (k, k), out=out, lse=lse)
    assert np.isnan(out).all() and np.isnan(lse).all()  # nothing written
    assert dec.run(q, (k, k)).shape == (1, 4, 16)
