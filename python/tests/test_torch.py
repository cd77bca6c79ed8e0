"""torch tensors in, torch tensors out (CPU, and CUDA where a GPU and the CUDA backend are there):
outputs in q's framework and on q's device, CUDA work on torch's current stream, CUDA-graph
capture of a decode planned in graph mode. Skipped where torch is not installed (CI installs
numpy only)."""

import numpy as np
import pytest

import kvattn
import reference as ref
from conftest import check_lse, check_output, page_table

torch = pytest.importorskip("torch")

CUDA = torch.cuda.is_available() and kvattn.has_cuda_backend
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device and kvattn's CUDA backend")
TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# The GPU's tensor-core kernels round the softmax weights to the KV dtype before P V (the MMA takes
# f16/bf16 operands): a relative 2^-9 (bf16) or 2^-11 (f16) per weight on top of the f32
# accumulation, so outputs are held to 2^-8 / 2^-10 of mag (tests/gpu_decode_test.cpp's bound).
GPU_ACCUMULATION = {"bf16": 2.0**-8, "f16": 2.0**-10, "f32": ref.ACCUMULATION}


def accumulation(device, dtype):
    return GPU_ACCUMULATION[dtype] if str(device).startswith("cuda") else ref.ACCUMULATION


def f64t(t):
    return t.detach().float().cpu().numpy().astype(np.float64)


def rand_t(gen, shape, dtype, device):
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1).to(dtype).to(device)


@pytest.fixture
def gen(rng):
    g = torch.Generator()
    g.manual_seed(int(rng.integers(2**62)))
    return g


def decode_torch(gen, rng, device, dtype="bf16", layout="NHD", workspace=None, indices_on_device=False,
                 stream=None):
    hq, hkv, d, ps = 8, 2, 64, 16
    lens = [1, 50, 130, 16]
    indptr, indices, last, num_pages = page_table(rng, lens, ps)
    shape = (num_pages, ps, hkv, d) if layout == "NHD" else (num_pages, hkv, ps, d)
    td = TORCH_DTYPES[dtype]
    k, v = rand_t(gen, shape, td, device), rand_t(gen, shape, td, device)
    q = rand_t(gen, (len(lens), hq, d), td, device)
    dec = kvattn.BatchDecode(workspace, layout)
    ids = torch.from_numpy(indices).to(device) if indices_on_device else torch.from_numpy(indices)
    dec.plan(page_table=(torch.from_numpy(indptr), ids, torch.from_numpy(last)), page_size=ps,
             num_qo_heads=hq, num_kv_heads=hkv, head_dim_qk=d, q_dtype=td)
    if stream is not None:
        with torch.cuda.stream(stream):
            out, lse = dec.run(q, (k, v), return_lse=True)
        stream.synchronize()
    else:
        out, lse = dec.run(q, (k, v), return_lse=True)
    assert isinstance(out, torch.Tensor) and out.device == q.device and out.dtype == td
    assert isinstance(lse, torch.Tensor) and lse.device == q.device and lse.dtype == torch.float32
    ks = ref.gather_paged(f64t(k), layout, indptr, indices, last, ps)
    vs = ref.gather_paged(f64t(v), layout, indptr, indices, last, ps)
    want_o, want_lse, mag = ref.batch_attention(f64t(q), np.arange(len(lens) + 1), ks, vs, ref.Var())
    check_output(out.cpu().float().numpy(), want_o, mag, dtype, accumulation(device, dtype))
    check_lse(lse.cpu().numpy(), want_lse)
    return dec


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_torch_cpu_decode(gen, rng, dtype):
    decode_torch(gen, rng, "cpu", dtype)


def test_torch_cpu_ops(gen):
    v = rand_t(gen, (5, 2, 16), torch.bfloat16, "cpu")
    s = torch.zeros(5, 2)
    vo, so = kvattn.merge_state(v, s, v.clone(), s.clone())
    assert isinstance(vo, torch.Tensor) and vo.dtype == torch.bfloat16
    assert torch.equal(vo, v) and torch.allclose(so, torch.ones(5, 2))
    q = rand_t(gen, (3, 2, 16), torch.float16, "cpu")
    qo, ko = kvattn.apply_rope(q, q.clone(), torch.tensor([0, 1, 2], dtype=torch.int32))
    assert torch.equal(qo[0], q[0]) and isinstance(ko, torch.Tensor)


def test_torch_cpu_int64_indices_rejected(rng):
    dec = kvattn.BatchDecode()
    with pytest.raises(TypeError, match="kv_indptr has dtype torch.int64"):
        dec.plan(page_table=(torch.tensor([0, 1]), torch.tensor([0], dtype=torch.int32),
                             torch.tensor([1], dtype=torch.int32)),
                 page_size=1, num_qo_heads=1, num_kv_heads=1, head_dim_qk=8)


# ---- CUDA --------------------------------------------------------------------------------------------
@pytest.fixture
def workspace():
    return torch.empty(128 << 20, dtype=torch.uint8, device="cuda")


@needs_cuda
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cuda_decode(gen, rng, workspace, dtype, layout):
    decode_torch(gen, rng, "cuda", dtype, layout, workspace)


@needs_cuda
def test_cuda_decode_device_indices_on_a_side_stream(gen, rng, workspace):
    s = torch.cuda.Stream()
    decode_torch(gen, rng, "cuda", "bf16", "NHD", workspace, indices_on_device=True, stream=s)


@needs_cuda
def test_cuda_prefill_ragged_and_flashinfer(gen, rng, workspace):
    import kvattn.flashinfer as fi

    hq, hkv, d = 8, 2, 128
    qo_lens, kv_lens = [17, 64, 5], [40, 64, 300]
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
    q = rand_t(gen, (qo_indptr[-1], hq, d), torch.bfloat16, "cuda")
    k = rand_t(gen, (kv_indptr[-1], hkv, d), torch.bfloat16, "cuda")
    v = rand_t(gen, (kv_indptr[-1], hkv, d), torch.bfloat16, "cuda")
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace)
    w.plan(torch.from_numpy(qo_indptr).cuda(), torch.from_numpy(kv_indptr).cuda(), hq, hkv, d,
           causal=True, q_data_type=torch.bfloat16)
    out, lse = w.run(q, k, v, return_lse=True)
    assert out.is_cuda and out.dtype == torch.bfloat16
    ks = [f64t(k[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(3)]
    vs = [f64t(v[kv_indptr[b]:kv_indptr[b + 1]]) for b in range(3)]
    want_o, want_lse, mag = ref.batch_attention(f64t(q), qo_indptr, ks, vs, ref.Var(causal=True))
    check_output(out.float().cpu().numpy(), want_o, mag, "bf16", GPU_ACCUMULATION["bf16"])
    check_lse(lse.cpu().numpy(), want_lse)


@needs_cuda
def test_cuda_merge_and_append(gen, rng):
    n, h, d = 64, 4, 128
    va, vb = rand_t(gen, (n, h, d), torch.float16, "cuda"), rand_t(gen, (n, h, d), torch.float16, "cuda")
    sa = (torch.rand(n, h, generator=gen) * 8 - 4).cuda()
    sb = (torch.rand(n, h, generator=gen) * 8 - 4).cuda()
    vo, so = kvattn.merge_state(va, sa, vb, sb)
    assert vo.is_cuda
    want_o, want_s, mag = ref.merge(f64t(va), f64t(sa), f64t(vb), f64t(sb))
    check_output(vo.float().cpu().numpy(), want_o, mag, "f16", 1e-5)
    ps, hkv = 16, 2
    indptr, indices, last, num_pages = page_table(rng, [20, 3], ps)
    kc = torch.zeros(num_pages, ps, hkv, d, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros_like(kc)
    ak = rand_t(gen, (4, hkv, d), torch.float32, "cuda")
    dev = lambda a: torch.from_numpy(np.asarray(a, np.int32)).cuda()
    kvattn.append_paged_kv_cache(ak, ak, dev([0, 0, 1, 1]), dev([18, 19, 1, 2]), (kc, vc),
                                 (dev(indptr), dev(indices), dev(last)))
    torch.cuda.synchronize()
    page = indices[indptr[0] + 18 // ps]
    assert torch.equal(kc[page, 18 % ps], ak[0].to(torch.bfloat16))


@needs_cuda
def test_cuda_graph_capture_and_replay_after_replan(gen, rng, workspace):
    hq, hkv, d, ps = 32, 8, 128, 16
    max_batch, max_pages = 8, 256
    k = rand_t(gen, (max_pages, ps, hkv, d), torch.bfloat16, "cuda")
    v = rand_t(gen, (max_pages, ps, hkv, d), torch.bfloat16, "cuda")
    q = rand_t(gen, (max_batch, hq, d), torch.bfloat16, "cuda")
    ids = torch.zeros(max_pages, dtype=torch.int32, device="cuda")
    out = torch.empty(max_batch, hq, d, dtype=torch.bfloat16, device="cuda")
    sched = kvattn.SchedulerOptions(cuda_graph=kvattn.GraphCapacity(max_batch=max_batch,
                                                                    max_tokens=max_batch))
    dec = kvattn.BatchDecode(workspace)

    def plan(lens):
        indptr, indices, last, _ = page_table(rng, lens, ps, spare_pages=max_pages - sum(
            (n + ps - 1) // ps for n in lens))
        ids[: len(indices)].copy_(torch.from_numpy(indices))
        dec.plan(page_table=(indptr, ids[: len(indices)], last), page_size=ps, num_qo_heads=hq,
                 num_kv_heads=hkv, head_dim_qk=d, q_dtype=torch.bfloat16, scheduler=sched)
        return indptr, indices, last

    def check(lens, table):
        indptr, indices, last = table
        ks = ref.gather_paged(f64t(k), "NHD", indptr, indices, last, ps)
        vs = ref.gather_paged(f64t(v), "NHD", indptr, indices, last, ps)
        b = len(lens)
        want, _, mag = ref.batch_attention(f64t(q[:b]), np.arange(b + 1), ks, vs, ref.Var())
        check_output(out[:b].float().cpu().numpy(), want, mag, "bf16", GPU_ACCUMULATION["bf16"])

    lens = [100] * max_batch
    table = plan(lens)
    dec.run(q, (k, v), out=out)  # compiles the kernels before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dec.run(q, (k, v), out=out)
    graph.replay()
    torch.cuda.synchronize()
    check(lens, table)
    lens = [1000, 3, 700, 64, 1, 1200, 9, 300]  # a re-plan with new lengths, same capacity
    table = plan(lens)
    graph.replay()
    torch.cuda.synchronize()
    check(lens, table)
