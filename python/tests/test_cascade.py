"""kvattn.CascadeAttention (kvattn/cascade.h) on the CPU backend with numpy inputs: N levels of page
tables over one paged cache against a float64 reference of attention over each query row's
concatenated page lists (the flat problem the cascade stands for, computed row by row without any
merge), and the error paths.

Tolerances are reference.py's (2u of the output dtype, ACCUMULATION x sum |w v|, LSE 2e-4), plus what
the cascade adds: each level's state is stored in the output dtype before the merge (up to 2u of the
level's magnitude per level; the row's magnitude sum |w v| over all of its keys bounds the sum of
the levels') and the f32 merge (1e-5 x mag, test_ops.py).
"""

import numpy as np
import pytest

import kvattn
import reference as ref
from conftest import FLOAT_DTYPES, cast, check_lse, check_output, f64, np_dtype, rand


# ---- problems ---------------------------------------------------------------------------------------
class Problem:
    """A cascade over one cache of disjoint shuffled pages. specs: one (group_rows, group_kv_lens)
    per level, from the most shared to each request's own KV; every level's group_rows sum to the
    same total."""

    def __init__(self, rng, specs, *, hq=4, hkv=2, d=16, dvo=None, ps=4, dtype="f32",
                 layout="NHD", spare_pages=2):
        self.specs, self.hq, self.hkv, self.d, self.ps = specs, hq, hkv, d, ps
        self.dvo = dvo or d
        self.dtype, self.layout = dtype, layout
        self.rows = sum(specs[0][0])
        assert all(sum(r) == self.rows for r, _ in specs)
        counts = [[-(-n // ps) for n in lens] for _, lens in specs]
        self.num_pages = sum(sum(c) for c in counts) + spare_pages
        perm = rng.permutation(self.num_pages).astype(np.int32)
        self.levels, at = [], 0
        for (group_rows, lens), cnt in zip(specs, counts):
            qo_indptr = np.concatenate([[0], np.cumsum(group_rows)]).astype(np.int32)
            indptr = np.concatenate([[0], np.cumsum(cnt)]).astype(np.int32)
            indices = perm[at:at + indptr[-1]].copy()
            at += int(indptr[-1])
            last = np.array([(n - 1) % ps + 1 if n else 0 for n in lens], np.int32)
            self.levels.append((qo_indptr, (indptr, indices, last)))
        shape_k = (self.num_pages, ps, hkv, d) if layout == "NHD" else (self.num_pages, hkv, ps, d)
        shape_v = shape_k[:-1] + (self.dvo,)
        self.k = cast(rand(rng, shape_k), dtype)
        self.v = cast(rand(rng, shape_v), dtype)
        self.q = cast(rand(rng, (self.rows, hq, d)), dtype)

    def plan_kwargs(self, **kw):
        args = dict(levels=self.levels, page_size=self.ps, num_qo_heads=self.hq,
                    num_kv_heads=self.hkv, head_dim_qk=self.d,
                    head_dim_vo=self.dvo if self.dvo != self.d else 0, q_dtype=self.dtype)
        args.update(kw)
        return args

    def reference(self, causal=False, **var_kw):
        """(o, lse, mag) of attention over each row's concatenated pages, level 0's first; causal
        masks the last level bottom-right within each of its groups (the earlier levels wholly
        precede a row's own keys)."""
        k64, v64 = f64(self.k), f64(self.v)
        gathered = []
        for qo_indptr, (indptr, indices, last) in self.levels:
            ks = ref.gather_paged(k64, self.layout, indptr, indices, last, self.ps)
            vs = ref.gather_paged(v64, self.layout, indptr, indices, last, self.ps)
            group = np.repeat(np.arange(len(qo_indptr) - 1), np.diff(qo_indptr))
            gathered.append((qo_indptr, group, ks, vs))
        o = np.zeros((self.rows, self.hq, self.dvo))
        lse = np.full((self.rows, self.hq), -np.inf)
        mag = np.zeros_like(o)
        var = ref.Var(**var_kw)
        q64 = f64(self.q)
        for r in range(self.rows):
            ks, vs = [], []
            for qo_indptr, group, kl, vl in gathered:
                ks.append(kl[group[r]])
                vs.append(vl[group[r]])
            k, v = np.concatenate(ks), np.concatenate(vs)
            if causal:  # row i of a last-level group of n rows over m own keys sits at prefix + m - n + i
                qo_indptr, group = gathered[-1][0], gathered[-1][1]
                g = group[r]
                n, m = qo_indptr[g + 1] - qo_indptr[g], len(gathered[-1][2][g])
                visible = len(k) - m + (m - n + (r - qo_indptr[g])) + 1
                k, v = k[:visible], v[:visible]
            ob, lb, mb = ref.attention_one(q64[r:r + 1], k, v, var)
            o[r], lse[r], mag[r] = ob[0], lb[0], mb[0]
        return o, lse, mag

    def check(self, out, lse, want, want_lse, mag):
        rtol = ref.OUTPUT_TOLERANCE[self.dtype][0]
        check_output(out, want, mag, self.dtype,
                     accumulation=ref.ACCUMULATION + 1e-5 + rtol * len(self.levels))
        if lse is not None:
            check_lse(lse, want_lse)


def _own(rng, qo, extra=(0, 9)):
    """Each request's own kv_len: at least its rows."""
    return [q + int(rng.integers(*extra)) for q in qo]


def specs_for(rng, case):
    """(specs, causal) of a named case."""
    if case == "two_levels":  # one shared prefix ending in a partial page, then own pages
        qo = [1, 3, 2, 1]
        return [([sum(qo)], [10]), (qo, _own(rng, qo))], True
    if case == "three_levels":  # level 1: two groups, one of them without pages
        qo = [2, 1, 3, 1, 2]
        return [([sum(qo)], [13]), ([3, 6], [7, 0]), (qo, _own(rng, qo))], True
    if case == "more_rows_than_keys":  # level 0: 3 keys under 11 rows (cut into chunks)
        qo = [3, 4, 2, 2]
        return [([sum(qo)], [3]), (qo, _own(rng, qo))], True
    if case == "decode":  # one row per request in every group of the last level (BatchDecode)
        qo = [1] * 6
        return [([2, 4], [9, 6]), ([1, 2, 3], [5, 0, 4]), (qo, _own(rng, qo, (1, 12)))], True
    if case == "prefill_rows":  # causal last level with several rows per request, a first page
        qo = [5, 7, 4]
        return [([sum(qo)], [4]), ([12, 4], [17, 0]), (qo, [5, 9, 11])], True
    if case == "plain":  # no causal mask: every row sees every key of its groups
        qo = [4, 2, 3]
        return [([sum(qo)], [6]), (qo, _own(rng, qo))], False
    raise AssertionError(case)


CASES = ["two_levels", "three_levels", "more_rows_than_keys", "decode", "prefill_rows", "plain"]


# ---- results against the flat reference --------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_cascade_matches_flat_attention(rng, dtype, case):
    specs, causal = specs_for(rng, case)
    ps = int(rng.choice([1, 4, 16])) if case == "plain" else 4
    layout = str(rng.choice(["NHD", "HND"]))
    p = Problem(rng, specs, ps=ps, dtype=dtype, layout=layout)
    w = kvattn.CascadeAttention(kv_layout=layout)
    assert w.num_levels == 0 and w.schedule(0) is None
    variant = kvattn.variants.causal() if causal else kvattn.variants.plain()
    w.plan(**p.plan_kwargs(variant=variant))
    assert w.num_levels == len(specs) and w.kv_layout == kvattn.KVLayout.__members__[layout]
    out, lse = w.run(p.q, (p.k, p.v), return_lse=True)
    assert out.shape == (p.rows, p.hq, p.d) and out.dtype == p.q.dtype
    assert lse.shape == (p.rows, p.hq) and lse.dtype == np.float32
    want, want_lse, mag = p.reference(causal=causal)
    p.check(out, lse, want, want_lse, mag)
    # Without lse: the same output, bit for bit (the cascade keeps its own lse for the merge).
    only = w.run(p.q, (p.k, p.v))
    assert np.array_equal(only.view(np.uint8), out.view(np.uint8))
    # The 5-D cache, and k_cache with v_cache given, read the same pages.
    five = w.run(p.q, np.stack([p.k, p.v], axis=1))
    assert np.array_equal(five.view(np.uint8), out.view(np.uint8))
    split = w.run(p.q, p.k, p.v)
    assert np.array_equal(split.view(np.uint8), out.view(np.uint8))


@pytest.mark.parametrize("hq,hkv", [(8, 2), (3, 3), (6, 1)])
def test_cascade_gqa_variants_and_head_dims(rng, hq, hkv):
    """GQA/MQA groups, head_dim_vo != head_dim_qk, soft-cap, sm_scale and q/k/v scales on every
    level, an f16 output from f32 inputs."""
    qo = [2, 3, 1]
    specs = [([sum(qo)], [7]), ([4, 2], [0, 5]), (qo, _own(rng, qo))]
    p = Problem(rng, specs, hq=hq, hkv=hkv, d=32, dvo=16, ps=4, dtype="f32")
    variant = kvattn.variants.causal().with_soft_cap(2.5).with_sm_scale(0.3).with_scales(1.5, 0.5, 2.0)
    w = kvattn.CascadeAttention()
    w.plan(**p.plan_kwargs(variant=variant, o_dtype="f16"))
    out, lse = w.run(p.q, (p.k, p.v), return_lse=True)
    assert out.shape == (p.rows, hq, 16) and out.dtype == np.float16
    want, want_lse, mag = p.reference(causal=True, soft_cap=2.5, sm_scale=0.3, q_scale=1.5,
                                      k_scale=0.5, v_scale=2.0)
    p.dtype = "f16"  # the output's rounding
    p.check(out, lse, want, want_lse, mag)


@pytest.mark.skipif("bf16" not in FLOAT_DTYPES, reason="bf16 needs ml_dtypes")
def test_cascade_bf16_kv_and_fp8(rng):
    """bf16 q with an fp8 (e4m3) cache and a k/v scale; bf16 output."""
    qo = [3, 1, 2]
    p = Problem(rng, [([sum(qo)], [9]), (qo, _own(rng, qo))], ps=4, dtype="bf16")
    p.k = cast(f64(p.k), "e4m3")
    p.v = cast(f64(p.v), "e4m3")
    w = kvattn.CascadeAttention()
    w.plan(**p.plan_kwargs(kv_dtype="e4m3", variant=kvattn.variants.causal().with_scales(1.0, 0.75, 1.25)))
    out, lse = w.run(p.q, (p.k, p.v), return_lse=True)
    assert out.dtype == np_dtype("bf16")
    want, want_lse, mag = p.reference(causal=True, k_scale=0.75, v_scale=1.25)
    p.check(out, lse, want, want_lse, mag)


def test_cascade_lse_is_base_2_and_buffers_are_filled(rng):
    """lse= and out= buffers (NaN-poisoned) are written in place and returned; lse is log2 of the
    softmax denominator over the row's whole key set; a CascadeLevel / PageTable spelling gives
    the same bits as tuples and lists."""
    qo = [2, 2, 1]
    p = Problem(rng, [([sum(qo)], [5]), (qo, _own(rng, qo))], hq=2, hkv=1, d=8, ps=4)
    w = kvattn.CascadeAttention()
    w.plan(**p.plan_kwargs(variant=kvattn.variants.causal()))
    out = np.full((p.rows, p.hq, p.d), np.nan, np.float32)
    lse = np.full((p.rows, p.hq), np.nan, np.float32)
    got_out, got_lse = w.run(p.q, (p.k, p.v), out=out, lse=lse)
    assert got_out is out and got_lse is lse
    want, want_lse, mag = p.reference(causal=True)
    p.check(out, lse, want, want_lse, mag)
    # Base 2 by hand for row 0, head 0 (level 0's 5 keys and request 0's first own keys).
    q0 = f64(p.q)[0, 0]
    keys = np.concatenate([ref.gather_paged(f64(p.k), "NHD", *t, p.ps)[g]
                           for (qo_ind, t), g in zip(p.levels, [0, 0])])
    own = p.specs[1][1][0]
    keys = keys[:5 + own - qo[0] + 1]
    s = keys[:, 0, :] @ q0 / np.sqrt(p.d)
    assert lse[0, 0] == pytest.approx(np.log2(np.exp(s).sum()), abs=2e-4)
    # Only lse= given: (out, lse) returned.
    res = w.run(p.q, (p.k, p.v), lse=np.empty_like(lse))
    assert isinstance(res, tuple) and np.array_equal(res[0], out)
    # kvattn.CascadeLevel and kvattn.PageTable, and Python lists, are the same levels.
    spelled = [kvattn.CascadeLevel(qo_ind.tolist(), kvattn.PageTable(*(a.tolist() for a in t)))
               for qo_ind, t in p.levels]
    c = kvattn.CascadeLevel([0, 1], ([0, 1], [0], [1]))
    assert c.qo_indptr == [0, 1] and c.page_table[2] == [1]
    w2 = kvattn.CascadeAttention(None, "NHD")
    w2.plan(**p.plan_kwargs(levels=spelled, variant=kvattn.variants.causal()))
    again = w2.run(p.q, (p.k, p.v))
    assert np.array_equal(again, out)


def test_cascade_one_level_and_replans(rng):
    """One level is plain paged prefill; a re-plan with other levels and shapes replaces the plan
    (the per-level wrappers reused where the level count stays)."""
    qo = [2, 1, 3]
    one = Problem(rng, [(qo, _own(rng, qo))], ps=4)
    w = kvattn.CascadeAttention()
    w.plan(**one.plan_kwargs(variant=kvattn.variants.causal()))
    assert w.num_levels == 1
    want, want_lse, mag = one.reference(causal=True)
    out, lse = w.run(one.q, (one.k, one.v), return_lse=True)
    one.check(out, lse, want, want_lse, mag)
    for case in ["three_levels", "decode", "three_levels"]:
        specs, causal = specs_for(rng, case)
        p = Problem(rng, specs, ps=4)
        w.plan(**p.plan_kwargs(variant=kvattn.variants.causal()))
        assert w.num_levels == 3
        for lvl in range(3):
            assert w.schedule(lvl) is not None and w.schedule(lvl).num_items > 0
        want, want_lse, mag = p.reference(causal=True)
        out, lse = w.run(p.q, (p.k, p.v), return_lse=True)
        p.check(out, lse, want, want_lse, mag)
    w.check_errors()


def test_cascade_rows_without_any_level_pages(rng):
    """Rows whose groups have no pages in every earlier level take only their own keys; an empty
    request (no rows) in the last level is allowed."""
    qo = [2, 0, 3]
    specs = [([5], [0]), ([2, 3], [0, 6]), (qo, [4, 0, 3])]
    p = Problem(rng, specs, ps=4)
    w = kvattn.CascadeAttention()
    w.plan(**p.plan_kwargs(variant=kvattn.variants.causal()))
    out, lse = w.run(p.q, (p.k, p.v), return_lse=True)
    want, want_lse, mag = p.reference(causal=True)
    p.check(out, lse, want, want_lse, mag)


# ---- errors ------------------------------------------------------------------------------------------------
def _small(rng):
    qo = [2, 1]
    return Problem(rng, [([3], [5]), ([2, 1], [0, 4]), (qo, [3, 2])], hq=2, hkv=1, d=8, ps=4)


def test_cascade_plan_errors(rng):
    p = _small(rng)
    w = kvattn.CascadeAttention()
    with pytest.raises(kvattn.Error, match="CascadePlan.levels is empty; a cascade has at least one level"):
        w.plan(**p.plan_kwargs(levels=[]))
    levels = list(p.levels)
    levels[1] = (np.array([0, 1, 2], np.int32), levels[1][1])
    with pytest.raises(kvattn.Error, match=r"level 1: qo_indptr\[2\] = 2 but level 0 covers 3 query rows"):
        w.plan(**p.plan_kwargs(levels=levels))
    levels[1] = (np.array([0, 3], np.int32), p.levels[1][1])
    with pytest.raises(kvattn.Error, match="level 1: qo_indptr has .* but the level's page table has 2 page lists"):
        w.plan(**p.plan_kwargs(levels=levels))
    bad_last = (p.levels[2][1][0], p.levels[2][1][1], np.array([3, 5], np.int32))
    with pytest.raises(kvattn.Error, match=r"level 2: kv_last_page_len\[1\] = 5"):
        w.plan(**p.plan_kwargs(levels=p.levels[:2] + [(p.levels[2][0], bad_last)]))
    # The last level keeps BatchPrefill's rule (rows <= kv_len).
    short = (p.levels[2][1][0], p.levels[2][1][1], np.array([1, 2], np.int32))
    with pytest.raises(kvattn.Error, match="level 2: request 0 has qo_len = 2 > kv_len = 1"):
        w.plan(**p.plan_kwargs(levels=p.levels[:2] + [(p.levels[2][0], short)]))
    # Variants that depend on positions in the whole sequence, or have no lse to merge with.
    for variant, what in [(kvattn.variants.sliding_window(4), "a sliding window"),
                          (kvattn.variants.causal().with_alibi(), "ALiBi"),
                          (kvattn.variants.rope(kvattn.RopeConfig()), "fused RoPE"),
                          (kvattn.variants.custom_mask(), "a custom mask"),
                          (kvattn.variants.sigmoid(0.0), "sigmoid attention")]:
        with pytest.raises(kvattn.Error, match=f"CascadeAttention does not support {what}"):
            w.plan(**p.plan_kwargs(variant=variant))
    def with_indices(x):
        return [p.levels[0], (p.levels[1][0], (p.levels[1][1][0], x, p.levels[1][1][2])), p.levels[2]]

    with pytest.raises(kvattn.DTypeError, match=r"level 1: kv_indices has dtype f32 but i32 is expected"):
        w.plan(**p.plan_kwargs(levels=with_indices(p.levels[1][1][1].astype(np.float32))))
    # The binding's own checks name the level too.
    with pytest.raises(kvattn.DTypeError, match=r"level 1: kv_indices has dtype float64, which kvattn does not take"):
        w.plan(**p.plan_kwargs(levels=with_indices(p.levels[1][1][1].astype(np.float64))))
    with pytest.raises(kvattn.DTypeError, match=r"level 0: qo_indptr\[1\] is a str, not an int"):
        w.plan(**p.plan_kwargs(levels=[([0, "3"], p.levels[0][1])] + p.levels[1:]))
    with pytest.raises(TypeError, match=r"levels\[1\]: expected kvattn.CascadeLevel"):
        w.plan(**p.plan_kwargs(levels=[p.levels[0], p.levels[1][1], p.levels[2]]))
    with pytest.raises(TypeError, match="level 0: page_table: expected kvattn.PageTable"):
        w.plan(**p.plan_kwargs(levels=[(p.levels[0][0], "pages")]))
    with pytest.raises(TypeError, match="levels: expected a list"):
        w.plan(**p.plan_kwargs(levels=np.zeros(3)))
    with pytest.raises(TypeError, match="unexpected keyword argument 'kv_indptr'|kv_indptr"):
        w.plan(**p.plan_kwargs(kv_indptr=[0, 1]))
    # No failed plan() left a plan behind.
    assert w.num_levels == 0 and w.schedule(0) is None
    with pytest.raises(kvattn.Error, match=r"CascadeAttention.check_errors\(\) was called before plan\(\)"):
        w.check_errors()


def test_cascade_run_errors_write_nothing(rng):
    p = _small(rng)
    w = kvattn.CascadeAttention()
    with pytest.raises(kvattn.Error, match=r"CascadeAttention.run\(\) was called before plan\(\)"):
        w.run(p.q, (p.k, p.v))
    w.plan(**p.plan_kwargs(variant=kvattn.variants.causal()))
    out = np.full((p.rows, p.hq, p.d), np.nan, np.float32)
    before = out.copy()
    # A cache with fewer pages than the levels refer to: checked before the first level writes.
    with pytest.raises(kvattn.Error, match=r"level \d: kv_indices refers to page \d+, out of range \[0, 1\)"):
        w.run(p.q, (p.k[:1], p.v[:1]), out=out)
    assert np.array_equal(out, before, equal_nan=True)
    with pytest.raises(kvattn.DTypeError, match="out has dtype f16"):
        w.run(p.q, (p.k, p.v), out=np.zeros((p.rows, p.hq, p.d), np.float16))
    with pytest.raises(kvattn.Error, match="is read-only"):
        ro = np.zeros((p.rows, p.hq, p.d), np.float32)
        ro.flags.writeable = False
        w.run(p.q, (p.k, p.v), out=ro)
    with pytest.raises(kvattn.Error, match=r"level = 3 is out of range \[0, 3\)"):
        w.schedule(3)
    with pytest.raises(kvattn.Error, match=r"level = -1 is out of range"):
        w.schedule(-1)
    assert w.schedule(2) is not None
    w.check_errors()


# ---- BatchDecode finding shared prefixes itself (kvattn::SharedPrefix) -----------------------------------
def test_batch_decode_shared_prefix_modes(rng):
    ps = 4
    own = [int(rng.integers(1, 12)) for _ in range(6)]
    p = Problem(rng, [([6], [40 * ps]), ([1] * 6, own)], ps=ps)  # 160 shared tokens of full pages
    (_, (ind0, idx0, _)), (_, (ind1, idx1, last1)) = p.levels
    flat_indices = np.concatenate([np.concatenate([idx0, idx1[ind1[b]:ind1[b + 1]]]) for b in range(6)])
    flat_indptr = np.concatenate([[0], np.cumsum([len(idx0) + ind1[b + 1] - ind1[b] for b in range(6)])])
    table = (flat_indptr.astype(np.int32), flat_indices.astype(np.int32), last1)
    want, want_lse, mag = p.reference()
    for mode, family in [("always", "cascade"), ("never", "cpu"), ("automatic", None)]:
        d = kvattn.BatchDecode()
        d.plan(page_table=table, page_size=ps, num_qo_heads=p.hq, num_kv_heads=p.hkv, head_dim_qk=p.d,
               q_dtype=p.dtype, shared_prefix=mode)
        if family:
            assert d.kernel_family() == family, mode
        out, lse = d.run(p.q, p.k, p.v, return_lse=True)
        p.check(out, lse, want, want_lse, mag)
    with pytest.raises(ValueError, match="shared_prefix = 'sometimes' is not one of"):
        kvattn.BatchDecode().plan(page_table=table, page_size=ps, num_qo_heads=p.hq, num_kv_heads=p.hkv,
                                  head_dim_qk=p.d, q_dtype=p.dtype, shared_prefix="sometimes")
