"""Decode side by side: for each case that `kvattn bench decode --save-io` exported, the same page
table and tensors through FlashInfer's BatchDecodeWithPagedKVCacheWrapper (CUDA-core and
tensor-core paths), and, for uniform batches, PyTorch SDPA (FlashAttention-2 and cuDNN) and
FlexAttention on the same values in a dense [B, H, L, D] layout. Every output is checked against
a float64 reference; kvattn's exported output too.

GB/s counts the same bytes for every implementation, as kvattn bench does: K and V read
(kv_tokens * 2 * Hkv * D * 2) plus q and out (2 * B * Hq * D * 2).
"""
import torch
import torch.nn.functional as F

import kvio
import timing

WORKSPACE_BYTES = 512 << 20


def decode_bytes(case):
    D = case["head_dim_qk"]
    return case["kv_tokens"] * 2 * case["num_kv_heads"] * D * 2 + 2 * case["batch"] * case["num_qo_heads"] * D * 2


def base_row(case, impl):
    return dict(op="decode", id=case["id"], case=case["case"], heads=case["heads"], batch=case["batch"],
                kv_tokens=case["kv_tokens"], page_size=case["page_size"], impl=impl)


def timed(row, case, ms, copies):
    gbps = decode_bytes(case) / (ms * 1e-3) / 1e9
    row.update(ms=ms, GBps=gbps, pct_of_4800=100.0 * gbps / 4800.0, l2_copies=copies)
    return row


def compare(row, out, ref_out, lse=None, ref_lse=None, kvattn_out=None):
    row.update(kvio.errors(out, ref_out, lse, ref_lse))
    if kvattn_out is not None:
        row["vs_kvattn_max_abs"] = float((out.double() - kvattn_out.double()).abs().max())


class Flex:
    """torch.compile'd FlexAttention, compiled once per shape (as ../shared/bench/peers.py does)."""

    def __init__(self):
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        torch._dynamo.config.recompile_limit = 128
        self.fn = torch.compile(flex_attention, dynamic=False)

    def __call__(self, q, k, v, **kw):
        return self.fn(q, k, v, **kw)


def run_case(exp, case, args, fi, flex, log):
    """All rows of one exported decode case (kvattn's, FlashInfer's, the dense peers'). kvattn's
    timing is case["row"] (run.py puts the matching row of the --json output there)."""
    dev = kvio.DEVICE
    B, Hq, Hkv, D, P = case["batch"], case["num_qo_heads"], case["num_kv_heads"], case["head_dim_qk"], case["page_size"]
    sm_scale = case["sm_scale"]
    indptr = exp.torch(case, "kv_indptr", dev)
    indices = exp.torch(case, "kv_indices", dev)
    last = exp.torch(case, "kv_last_page_len", dev)
    q = exp.input(case, "q", dev)
    k_cache = exp.input(case, "k_cache", dev)
    v_cache = exp.input(case, "v_cache", dev)
    ref_out, ref_lse = kvio.reference_decode(q, k_cache, v_cache, indptr.cpu(), indices, last.cpu(), sm_scale)
    kv_out, kv_lse = exp.torch(case, "out", dev), exp.torch(case, "lse", dev)

    rows = []
    # kvattn: its timing from the export's row (the same run as the --json output), checked here.
    r = base_row(case, "kvattn")
    kr = case.get("row", {})
    r.update({k: kr[k] for k in ("ms", "GBps", "pct_of_4800", "plan_us", "plan_host_table_us", "l2_copies") if k in kr})
    compare(r, kv_out, ref_out, kv_lse, ref_lse)
    rows.append(r)
    log(r)

    cache_bytes = 2 * k_cache.numel() * 2
    copies = kvio.l2_copies(cache_bytes)
    caches = [(k_cache, v_cache)] + [(k_cache.clone(), v_cache.clone()) for _ in range(copies - 1)]

    if fi is not None:
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        for tc in (False, True):
            r = base_row(case, "flashinfer-tensor-core" if tc else "flashinfer-cuda-core")
            try:
                w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tc)

                def plan():
                    w.plan(indptr, indices, last, Hq, Hkv, D, P, q_data_type=torch.bfloat16,
                           kv_data_type=torch.bfloat16, sm_scale=sm_scale)

                r["plan_us"] = timing.median_host_us(plan)
                out = torch.empty_like(q)
                lse = torch.empty(B, Hq, dtype=torch.float32, device=dev)
                out.fill_(float("nan"))
                w.run(q, caches[0], out=out, lse=lse, return_lse=True)
                torch.cuda.synchronize()
                compare(r, out, ref_out, lse, ref_lse, kv_out)
                ms, _ = timing.median_ms(lambda i: w.run(q, caches[i], out=out), copies, args.iters)
                timed(r, case, ms, copies)
            except Exception as e:  # noqa: BLE001 - a failing peer is a row, not the end of the run
                r["error"] = f"{type(e).__name__}: {e}"[:500]
            rows.append(r)
            log(r)
        del workspace

    lens = case["kv_lens"]
    if not args.skip_dense and len(set(lens)) == 1:
        L, ip = lens[0], indptr.tolist()
        # The same values, dense: [B, Hkv, L, D], filled a request at a time (no stacked temporary).
        dense_k = torch.empty(B, Hkv, L, D, dtype=q.dtype, device=dev)
        dense_v = torch.empty_like(dense_k)
        for b in range(B):
            dense_k[b] = kvio.gather_pages(k_cache, indices, ip[b], ip[b + 1], L).transpose(0, 1)
            dense_v[b] = kvio.gather_pages(v_cache, indices, ip[b], ip[b + 1], L).transpose(0, 1)
        del caches, k_cache, v_cache
        dense = [(dense_k, dense_v)] + [(dense_k.clone(), dense_v.clone()) for _ in range(copies - 1)]
        q4 = q.view(B, Hq, 1, D)
        gqa = Hq != Hkv
        peers = [("torch-sdpa-fa2", torch.nn.attention.SDPBackend.FLASH_ATTENTION),
                 ("cudnn", torch.nn.attention.SDPBackend.CUDNN_ATTENTION)]
        for name, backend in peers:
            r = base_row(case, name)
            try:
                def call(i, backend=backend):
                    with torch.nn.attention.sdpa_kernel([backend]):
                        return F.scaled_dot_product_attention(q4, dense[i][0], dense[i][1], scale=sm_scale,
                                                              enable_gqa=gqa)
                compare(r, call(0).view(B, Hq, D), ref_out, kvattn_out=kv_out)
                ms, _ = timing.median_ms(call, copies, args.iters)
                timed(r, case, ms, copies)
            except Exception as e:  # noqa: BLE001
                r["error"] = f"{type(e).__name__}: {e}"[:500]
            rows.append(r)
            log(r)
        if flex is not None:
            r = base_row(case, "flex")
            try:
                def call(i):
                    return flex(q4, dense[i][0], dense[i][1], scale=sm_scale, enable_gqa=gqa)
                compare(r, call(0).view(B, Hq, D), ref_out, kvattn_out=kv_out)
                ms, _ = timing.median_ms(call, copies, args.iters)
                timed(r, case, ms, copies)
            except Exception as e:  # noqa: BLE001
                r["error"] = f"{type(e).__name__}: {e}"[:500]
            rows.append(r)
            log(r)
        del dense
    return rows
