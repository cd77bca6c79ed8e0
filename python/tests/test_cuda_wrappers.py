"""kvattn.flashinfer's wrappers and kvattn's native classes on torch CUDA tensors (the GPU backend),
against the float64 reference: paged decode in every layout and KV dtype (fp8 with scales), the
decode variants, a CUDA-graph capture of the decode wrapper, paged and ragged prefill (the Hopper
tier's long runs among them), custom masks, block-sparse, cascade, the single-request functions,
decode's custom mask and shared-prefix paths, and user variants on the decode kernels (every
example, split rows, a graph capture). Skipped without torch, a CUDA device or kvattn's
CUDA backend (CI has none of them: python/tests run there on the CPU backend).

Inputs are drawn in numpy as the CPU tests draw them (conftest.cast rounds to the stored dtype) and
moved to the GPU bit for bit, so the reference reads exactly the values the kernels read.
Tolerances: reference.py's per-dtype output rounding plus GPU_ACCUMULATION x sum |w v|, the
tensor-core kernels rounding the softmax weights to the MMA's 16-bit type before P V (2^-8 for bf16,
2^-10 for f16; fp8 K/V run f16 MMAs under f16 q, and are held to q's bound); the LSE as on the CPU."""

import numpy as np
import pytest

import kvattn
import reference as ref
from conftest import cast, check_lse, check_output, f64, page_table, rand

torch = pytest.importorskip("torch")
import kvattn.flashinfer as fi  # noqa: E402
from test_custom_variant import EXAMPLE_BUILDERS, MAX_LEN, example  # noqa: E402
from test_flashinfer_wrappers import bsr_problem, bsr_reference, cascade_levels, cascade_reference  # noqa: E402

CUDA = torch.cuda.is_available() and kvattn.has_cuda_backend
pytestmark = pytest.mark.skipif(not CUDA, reason="needs torch with a CUDA device and kvattn's CUDA backend")

GPU_ACCUMULATION = {"bf16": 2.0**-8, "f16": 2.0**-10, "f32": ref.ACCUMULATION}
TORCH = {"f16": "float16", "bf16": "bfloat16", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}
_VIEWS = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


def cuda(x):
    """The numpy array x on the GPU, bit for bit (bf16 / fp8 through an integer view)."""
    x = np.ascontiguousarray(x)
    if x.dtype.name in _VIEWS:
        return torch.from_numpy(x.view(_VIEWS[x.dtype.name])).view(getattr(torch, x.dtype.name)).cuda()
    return torch.from_numpy(x).cuda()


def host(t):
    return t.detach().float().cpu().numpy()


def check_gpu(out, want, mag, dtype, what="out"):
    assert out.is_cuda
    check_output(host(out), want, mag, dtype, GPU_ACCUMULATION[dtype], what)


def capture_and_replay(run, out, check_first, replans):
    """run() once (its kernels compile), captured in a CUDA graph, replayed and checked
    (check_first()); then for each replan (a callable that re-plans and returns the check of its
    result) the graph is replayed into a NaN-filled out and checked."""
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    check_first()
    for replan in replans:
        check = replan()
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check()


@pytest.fixture
def workspace():
    return torch.empty(128 << 20, dtype=torch.uint8, device="cuda")


def paged_problem(rng, lens, ps, hkv, d, layout, kv_dtype):
    indptr, indices, last, num_pages = page_table(rng, lens, ps)
    shape = (num_pages, ps, hkv, d) if layout == "NHD" else (num_pages, hkv, ps, d)
    k, v = cast(rand(rng, shape), kv_dtype), cast(rand(rng, shape), kv_dtype)
    ks = ref.gather_paged(f64(k), layout, indptr, indices, last, ps)
    vs = ref.gather_paged(f64(v), layout, indptr, indices, last, ps)
    return (indptr, indices, last), k, v, ks, vs


DECODE_VARIANTS = {
    "plain": (dict(), dict()),
    "window_cap": (dict(window_left=700, logits_soft_cap=30.0), dict(window_left=700, soft_cap=30.0)),
    "alibi": (dict(pos_encoding_mode="ALIBI", sm_scale=0.1), dict(alibi=True, sm_scale=0.1)),
    "rope": (dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=5e5), dict(rope=dict(theta=5e5))),
}


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_dtype", ["same", "e4m3", "e5m2"])
@pytest.mark.parametrize("variant", list(DECODE_VARIANTS))
def test_decode_wrapper(rng, workspace, dtype, layout, kv_dtype, variant):
    hq, hkv, d, ps = 32, 8, 128, 16
    kv_dtype = dtype if kv_dtype == "same" else kv_dtype
    fp8 = kv_dtype != dtype
    lens = [1, 200, 2500, 33, 4096, 0]
    table, k, v, ks, vs = paged_problem(rng, lens, ps, hkv, d, layout, kv_dtype)
    q = cast(rand(rng, (len(lens), hq, d)), dtype)
    kw, var_kw = DECODE_VARIANTS[variant]
    scales = dict(k_scale=0.5, v_scale=2.0) if fp8 else {}
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, layout)
    w.plan(*(cuda(a) for a in table), hq, hkv, d, ps, q_data_type=getattr(torch, TORCH[dtype]),
           kv_data_type=getattr(torch, TORCH[kv_dtype]), **kw)
    out, lse = w.run(cuda(q), (cuda(k), cuda(v)), return_lse=True, **scales)
    assert out.dtype == getattr(torch, TORCH[dtype]) and lse.dtype == torch.float32
    want_o, want_lse, mag = ref.batch_attention(f64(q), np.arange(len(lens) + 1), ks, vs,
                                                ref.Var(**var_kw, **scales))
    check_gpu(out, want_o, mag, dtype)
    check_lse(host(lse), want_lse)


def test_decode_wrapper_cuda_graph_replays_after_replans(rng, workspace):
    hq, hkv, d, ps, batch, max_pages = 32, 8, 128, 16, 6, 600
    bufs = (torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
            torch.zeros(max_pages, dtype=torch.int32, device="cuda"),
            torch.zeros(batch, dtype=torch.int32, device="cuda"))
    k = cast(rand(rng, (max_pages, ps, hkv, d)), "bf16")
    v = cast(rand(rng, (max_pages, ps, hkv, d)), "bf16")
    kc, vc = cuda(k), cuda(v)
    q = cast(rand(rng, (batch, hq, d)), "bf16")
    qc = cuda(q)
    out = torch.empty(batch, hq, d, dtype=torch.bfloat16, device="cuda")
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=bufs[0],
                                              paged_kv_indices_buffer=bufs[1], paged_kv_last_page_len_buffer=bufs[2])

    def plan(lens):
        spare = max_pages - sum(-(-n // ps) for n in lens)
        indptr, indices, last, _ = page_table(rng, lens, ps, spare_pages=spare)
        w.plan(cuda(indptr), cuda(indices), cuda(last), hq, hkv, d, ps, q_data_type=torch.bfloat16,
               logits_soft_cap=30.0)
        return indptr, indices, last

    def check(lens, table):
        ks = ref.gather_paged(f64(k), "NHD", *table, ps)
        vs = ref.gather_paged(f64(v), "NHD", *table, ps)
        want, _, mag = ref.batch_attention(f64(q), np.arange(batch + 1), ks, vs, ref.Var(soft_cap=30.0))
        check_gpu(out, want, mag, "bf16")

    def replan(lens):
        table = plan(lens)
        return lambda: check(lens, table)

    capture_and_replay(lambda: w.run(qc, (kc, vc), out=out), out, replan([100] * batch),
                       [lambda lens=lens: replan(lens)
                        for lens in ([3000, 1, 64, 700, 2, 4000], [17, 5000, 9, 1, 300, 1200])])


def test_prefill_wrapper_cuda_graph_replays_after_replans(rng, workspace):
    """The paged prefill wrapper in graph mode: captured once, replayed after re-plans that move
    the same token budget between requests and change every KV length."""
    hq, hkv, d, ps, batch, max_pages, tokens = 32, 8, 128, 16, 3, 800, 428
    bufs = dict(qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
                paged_kv_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device="cuda"),
                paged_kv_indices_buf=torch.zeros(max_pages, dtype=torch.int32, device="cuda"),
                paged_kv_last_page_len_buf=torch.zeros(batch, dtype=torch.int32, device="cuda"))
    k = cast(rand(rng, (max_pages, ps, hkv, d)), "bf16")
    v = cast(rand(rng, (max_pages, ps, hkv, d)), "bf16")
    kc, vc = cuda(k), cuda(v)
    q = cast(rand(rng, (tokens, hq, d)), "bf16")
    qc = cuda(q)
    out = torch.empty(tokens, hq, d, dtype=torch.bfloat16, device="cuda")
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", use_cuda_graph=True, **bufs)

    def plan(qo_lens, kv_lens):
        qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
        spare = max_pages - sum(-(-n // ps) for n in kv_lens)
        table = page_table(rng, kv_lens, ps, spare_pages=spare)[:3]
        w.plan(cuda(qo_indptr), *(cuda(a) for a in table), hq, hkv, d, ps, causal=True,
               q_data_type=torch.bfloat16)
        return qo_indptr, table

    def check(plan_result):
        qo_indptr, table = plan_result
        ks = ref.gather_paged(f64(k), "NHD", *table, ps)
        vs = ref.gather_paged(f64(v), "NHD", *table, ps)
        want, _, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs, ref.Var(causal=True))
        check_gpu(out, want, mag, "bf16")

    def replan(qo_lens, kv_lens):
        planned = plan(qo_lens, kv_lens)
        return lambda: check(planned)

    capture_and_replay(lambda: w.run(qc, (kc, vc), out=out), out, replan([300, 100, 28], [700, 100, 2000]),
                       [lambda a=a, b=b: replan(a, b)
                        for a, b in (([28, 300, 100], [28, 5000, 900]), ([1, 1, 426], [3000, 64, 426]))])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("ps", [1, 16])
def test_prefill_paged_wrapper(rng, workspace, dtype, causal, ps):
    hq, hkv, d = 32, 8, 128
    qo_lens, kv_lens = [1, 100, 300], [257, 100, 700]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    table, k, v, ks, vs = paged_problem(rng, kv_lens, ps, hkv, d, "NHD", dtype)
    q = cast(rand(rng, (qo_indptr[-1], hq, d)), dtype)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    w.plan(cuda(qo_indptr), *(cuda(a) for a in table), hq, hkv, d, ps, causal=causal,
           q_data_type=getattr(torch, TORCH[dtype]))
    out, lse = w.run(cuda(q), (cuda(k), cuda(v)), return_lse=True)
    want_o, want_lse, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs, ref.Var(causal=causal))
    check_gpu(out, want_o, mag, dtype)
    check_lse(host(lse), want_lse)


@pytest.mark.parametrize("packed", [False, True])
def test_prefill_ragged_wrapper_custom_mask(rng, workspace, packed):
    hq, hkv, d = 8, 2, 128
    qo_lens, kv_lens = [40, 70], [90, 70]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    masks = [rng.random((a, b)) < 0.5 for a, b in zip(qo_lens, kv_lens)]
    masks[0][3] = False  # a query that sees nothing: o = 0, lse = -inf
    flat = np.concatenate([m.ravel() for m in masks])
    q = cast(rand(rng, (qo_indptr[-1], hq, d)), "bf16")
    k = cast(rand(rng, (kv_indptr[-1], hkv, d)), "bf16")
    v = cast(rand(rng, (kv_indptr[-1], hkv, d)), "bf16")
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace)
    if packed:
        bit_indptr = np.concatenate([[0], np.cumsum([m.size for m in masks])]).astype(np.int32)
        pm, _ = fi.segment_packbits(cuda(flat), cuda(bit_indptr), bitorder="little")
        w.plan(cuda(qo_indptr), cuda(kv_indptr), hq, hkv, d, packed_custom_mask=pm, q_data_type=torch.bfloat16)
    else:
        w.plan(cuda(qo_indptr), cuda(kv_indptr), hq, hkv, d, custom_mask=cuda(flat), q_data_type=torch.bfloat16)
    out, lse = w.run(cuda(q), cuda(k), cuda(v), return_lse=True)
    ks = [f64(k[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(2)]
    vs = [f64(v[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(2)]
    want_o, want_lse, mag = ref.batch_attention(f64(q), qo_indptr, ks, vs,
                                                ref.Var(mask=lambda b, i, j: bool(masks[b][i, j])))
    check_gpu(out, want_o, mag, "bf16")
    check_lse(host(lse), want_lse)


@pytest.mark.parametrize("R,C", [(1, 1), (16, 16), (4, 8)])
def test_block_sparse_wrapper(rng, workspace, R, C):
    M, N, hq, hkv, d = 8 * R, 24 * C, 8, 2, 128
    _, indptr, indices = bsr_problem(rng, M, N, R, C)
    q, k, v = (cast(rand(rng, (n, h, d)), "f16") for n, h in ((M, hq), (N, hkv), (N, hkv)))
    w = fi.BlockSparseAttentionWrapper(workspace)
    w.plan(cuda(indptr), cuda(indices), M, N, R, C, hq, hkv, d, q_data_type="float16", o_data_type="float16",
           logits_soft_cap=5.0, sm_scale=0.1)
    out, lse = w.run(cuda(q), cuda(k), cuda(v), return_lse=True)
    want_o, want_lse, mag = bsr_reference(q, k, v, indptr, indices, M, R, C, dict(soft_cap=5.0, sm_scale=0.1))
    check_gpu(out, want_o, mag, "f16")
    check_lse(host(lse), want_lse)


@pytest.mark.parametrize("levels", [2, 3])
def test_cascade_wrapper(rng, workspace, levels):
    hq, hkv, d, ps, B = 32, 8, 128, 16, 6
    qo_last = [1, 2, 1, 1, 3, 1]
    total = sum(qo_last)
    specs = [([0, total], [1000])]  # a prefix shared by every request
    if levels == 3:
        specs.append(([0, 4, total], [300, 77]))  # two groups with their own shared blocks
    specs.append((list(np.concatenate([[0], np.cumsum(qo_last)])), [int(x) for x in rng.integers(3, 400, size=B)]))
    arrays, num_pages = cascade_levels(rng, specs, ps)
    k = cast(rand(rng, (num_pages, ps, hkv, d)), "bf16")
    v = cast(rand(rng, (num_pages, ps, hkv, d)), "bf16")
    q = cast(rand(rng, (total, hq, d)), "bf16")
    w = fi.MultiLevelCascadeAttentionWrapper(levels, workspace, "NHD")
    w.plan(*[[cuda(x[i]) for x in arrays] for i in range(4)], hq, hkv, d, ps, causal=True,
           q_data_type=torch.bfloat16)
    out = w.run(cuda(q), (cuda(k), cuda(v)))
    want, mag = cascade_reference(q, arrays, k, v, "NHD", ps, dict(causal=True), "bf16")
    # Each level's output is rounded to bf16 before the merge, and each level's P to the MMA type:
    # both bounds once per level (the CPU test's argument, test_flashinfer_wrappers).
    assert out.is_cuda
    rtol = ref.OUTPUT_TOLERANCE["bf16"][0]
    check_output(host(out), want, mag, "bf16", (GPU_ACCUMULATION["bf16"] + rtol) * levels)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_single_request_functions(rng, dtype):
    hq, hkv, d = 32, 8, 128
    n = 3000
    q1 = cast(rand(rng, (hq, d)), dtype)
    k, v = cast(rand(rng, (n, hkv, d)), dtype), cast(rand(rng, (n, hkv, d)), dtype)
    out, lse = fi.single_decode_with_kv_cache(cuda(q1), cuda(k), cuda(v), logits_soft_cap=30.0, return_lse=True)
    want_o, want_lse, mag = ref.batch_attention(f64(q1)[None], [0, 1], [f64(k)], [f64(v)], ref.Var(soft_cap=30.0))
    check_gpu(out, want_o[0], mag[0], dtype)
    check_lse(host(lse), want_lse[0])
    qo = 200
    q = cast(rand(rng, (qo, hq, d)), dtype)
    out, lse = fi.single_prefill_with_kv_cache(cuda(q), cuda(k), cuda(v), causal=True, return_lse=True)
    want_o, want_lse, mag = ref.batch_attention(f64(q), [0, qo], [f64(k)], [f64(v)], ref.Var(causal=True))
    check_gpu(out, want_o, mag, dtype)
    check_lse(host(lse), want_lse)


def test_native_decode_custom_mask_and_shared_prefix(rng, workspace):
    hq, hkv, d, ps = 32, 8, 128, 16
    # A custom mask (the prefill kernels' decode shape runs it) beside a window.
    lens = [300, 1, 2000, 0, 64]
    table, k, v, ks, vs = paged_problem(rng, lens, ps, hkv, d, "NHD", "bf16")
    q = cast(rand(rng, (len(lens), hq, d)), "bf16")
    masks = [rng.random(n) < 0.6 for n in lens]
    packed = [np.packbits(m.astype(np.uint8), bitorder="little") for m in masks]
    mask_indptr = np.cumsum([0] + [len(b) for b in packed]).astype(np.int32)
    dec = kvattn.BatchDecode(workspace)
    dec.plan(page_table=tuple(cuda(a) if i == 1 else a for i, a in enumerate(table)), page_size=ps, num_qo_heads=hq,
             num_kv_heads=hkv, head_dim_qk=d, q_dtype=torch.bfloat16,
             variant=kvattn.variants.custom_mask().with_window(1500), custom_mask=np.concatenate(packed),
             mask_indptr=mask_indptr)
    out, lse = dec.run(cuda(q), (cuda(k), cuda(v)), return_lse=True)
    var = ref.Var(window_left=1500, mask=lambda b, i, j: bool(masks[b][j]))
    want_o, want_lse, mag = ref.batch_attention(f64(q), np.arange(len(lens) + 1), ks, vs, var)
    check_gpu(out, want_o, mag, "bf16")
    check_lse(host(lse), want_lse)
    # Requests whose page lists begin with the same pages (a radix-tree cache), host page ids:
    # 'always' runs the cascade, 'never' flat decode; both against the flat reference.
    shared, own = 64, [int(x) for x in rng.integers(1, 300, size=8)]
    full = [shared * ps + n for n in own]
    counts = [-(-n // ps) for n in own]
    num_pages = shared + sum(counts) + 1
    perm = rng.permutation(num_pages).astype(np.int32)
    prefix, rest = perm[:shared], perm[shared:]
    offs = np.concatenate([[0], np.cumsum(counts)])
    indices = np.concatenate([np.concatenate([prefix, rest[offs[b]:offs[b + 1]]]) for b in range(8)]).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum([shared + c for c in counts])]).astype(np.int32)
    last = np.array([(n - 1) % ps + 1 for n in own], np.int32)
    kk, vv = cast(rand(rng, (num_pages, ps, hkv, d)), "bf16"), cast(rand(rng, (num_pages, ps, hkv, d)), "bf16")
    q = cast(rand(rng, (8, hq, d)), "bf16")
    ks = ref.gather_paged(f64(kk), "NHD", indptr, indices, last, ps)
    vs = ref.gather_paged(f64(vv), "NHD", indptr, indices, last, ps)
    assert [len(x) for x in ks] == full
    want_o, want_lse, mag = ref.batch_attention(f64(q), np.arange(9), ks, vs, ref.Var())
    for mode, family in [("always", "cascade"), ("never", None)]:
        dec = kvattn.BatchDecode(workspace)
        dec.plan(page_table=(indptr, indices, last), page_size=ps, num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=d,
                 q_dtype=torch.bfloat16, shared_prefix=mode)
        assert (dec.kernel_family() == "cascade") == (family == "cascade"), (mode, dec.kernel_family())
        out, lse = dec.run(cuda(q), (cuda(kk), cuda(vv)), return_lse=True)
        check_output(host(out), want_o, mag, "bf16", 2 * GPU_ACCUMULATION["bf16"], mode)
        check_lse(host(lse), want_lse, what=f"lse ({mode})")


# ---- user variants on the GPU decode kernels ------------------------------------------------------
@pytest.mark.parametrize("kv_dtype", ["bf16", "e4m3"])
@pytest.mark.parametrize("name", sorted(EXAMPLE_BUILDERS))
def test_user_variant_decode(rng, workspace, name, kv_dtype):
    """Each example of examples/variants/ with its parameter tensors on the GPU, split rows (a
    fixed split of 32 tokens) included, against the float64 reference's hooks."""
    hq, hkv, d, ps = 32, 8, 128, 16
    variant, hooks, _ = EXAMPLE_BUILDERS[name](rng, hq)
    variant = variant.with_custom_values(tensors={n: torch.from_numpy(np.ascontiguousarray(t)).cuda()
                                                  for n, t in variant.custom_tensors.items()})
    lens = [1, 77, MAX_LEN, 33, 100, 0]
    table, k, v, ks, vs = paged_problem(rng, lens, ps, hkv, d, "NHD", kv_dtype)
    q = cast(rand(rng, (len(lens), hq, d)), "bf16")
    var = ref.Var(user=hooks)
    for split in (0, 32):
        dec = kvattn.BatchDecode(workspace)
        dec.plan(page_table=table, page_size=ps, num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=d,
                 q_dtype=torch.bfloat16, kv_dtype=TORCH[kv_dtype], variant=variant,
                 scheduler=kvattn.SchedulerOptions(fixed_split_size=split))
        assert dec.kernel_name().startswith("decode_mma_") and f"_u{name}_" in dec.kernel_name(), dec.kernel_name()
        if not var.has_lse():  # only the compiled variant knows: refused before anything is written
            with pytest.raises(kvattn.Error, match=f"the user variant {name} has use_softmax = false"):
                dec.run(cuda(q), (cuda(k), cuda(v)), return_lse=True)
        res = dec.run(cuda(q), (cuda(k), cuda(v)), return_lse=var.has_lse())
        out, lse = res if var.has_lse() else (res, None)
        want_o, want_lse, mag = ref.batch_attention(f64(q), np.arange(len(lens) + 1), ks, vs, var)
        check_gpu(out, want_o, mag, "bf16", f"out (split {split})")
        if lse is not None:
            check_lse(host(lse), want_lse, what=f"lse (split {split})")


def test_user_variant_decode_cuda_graph_replays_after_replans(rng, workspace):
    """A user variant with sinks and an output transform, captured once and replayed after
    re-plans of the batch (graph mode keeps the staged parameter block where the capture saw it)."""
    hq, hkv, d, ps, batch = 32, 8, 128, 16, 6
    source = (example("learned_sink").replace("struct Variant {", "struct Variant {\n"
              "  static float output_transform(const Params& p, float value, int, int64_t qo_pos, int, int dim) {\n"
              "    return value * p.scale + 1e-3f * float((qo_pos + dim) % 5);\n  }"))
    sinks = cast(rng.uniform(-3, 6, hq), "f32")
    variant = kvattn.Variant.custom(source, name="sink_scaled", scalars={"scale": 1.25},
                                    tensors={"sinks": torch.from_numpy(sinks).cuda()})
    hooks = ref.UserHooks(sink_logit=lambda b, h: f64(sinks)[h],
                          # C's % (the hook's): the sign of the dividend (an empty row's q_pos is -1)
                          output_transform=lambda o, b, qp, h, e: o * 1.25 + 1e-3 * np.fmod(qp + e, 5))
    max_pages = 600
    k = cast(rand(rng, (max_pages, ps, hkv, d)), "bf16")
    v = cast(rand(rng, (max_pages, ps, hkv, d)), "bf16")
    kc, vc = cuda(k), cuda(v)
    q = cast(rand(rng, (batch, hq, d)), "bf16")
    qc = cuda(q)
    out = torch.empty(batch, hq, d, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(batch, hq, dtype=torch.float32, device="cuda")
    dec = kvattn.BatchDecode(workspace)
    graph_mode = kvattn.SchedulerOptions(cuda_graph=kvattn.GraphCapacity(max_batch=batch, max_tokens=batch))

    def plan(lens):
        spare = max_pages - sum(-(-n // ps) for n in lens)
        table = page_table(rng, lens, ps, spare_pages=spare)[:3]
        dec.plan(page_table=table, page_size=ps, num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=d,
                 q_dtype=torch.bfloat16, variant=variant, scheduler=graph_mode)
        return table

    def check(table):
        ks = ref.gather_paged(f64(k), "NHD", *table, ps)
        vs = ref.gather_paged(f64(v), "NHD", *table, ps)
        want_o, want_lse, mag = ref.batch_attention(f64(q), np.arange(batch + 1), ks, vs, ref.Var(user=hooks))
        check_gpu(out, want_o, mag, "bf16")
        check_lse(host(lse), want_lse)

    def replan(lens):
        table = plan(lens)
        return lambda: check(table)

    capture_and_replay(lambda: dec.run(qc, (kc, vc), out=out, lse=lse), out, replan([100] * batch),
                       [lambda lens=lens: replan(lens)
                        for lens in ([3000, 1, 64, 700, 0, 4000], [17, 5000, 9, 1, 300, 1200])])
