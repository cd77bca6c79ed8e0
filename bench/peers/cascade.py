"""Shared-prefix (cascade) decode side by side: for each case that `kvattn bench cascade --save-io`
exported (B requests sharing a prefix of whole pages, each with its own suffix pages, in one paged
cache), the same tensors and page tables through

- FlashInfer's MultiLevelCascadeAttentionWrapper (2 levels: the prefix as one request whose
  qo_len is B, then each request's suffix, merged; FlashInfer runs both levels on its paged
  prefill kernels, backend "auto", and merges in place), and
- FlashInfer's BatchDecodeWithPagedKVCacheWrapper (CUDA-core and tensor-core paths) over each
  request's whole page list (prefix pages then suffix pages: plain decode, no cascade).

kvattn's two rows (its cascade, composed from BatchPrefill + BatchDecode + merge_state, and its
plain BatchDecode over the whole lists) come from the export: timings from the --json row, outputs
checked here. Every output is checked against a float64 reference: plain attention of each query
over its prefix + suffix keys (kvio.reference_decode on the flat page table), and against kvattn's
cascade output.

GB/s counts the same bytes for everyone, those of plain decode (every request's prefix + suffix
K/V, q and out), so GB/s ratios are inverse time ratios.
"""
import torch

import decode
import kvio
import timing

WORKSPACE_BYTES = 512 << 20
LEVELS = ("level0", "level1")


def flat_bytes(case):
    D = case["head_dim_qk"]
    return case["kv_tokens"] * 2 * case["num_kv_heads"] * D * 2 + 2 * case["batch"] * case["num_qo_heads"] * D * 2


def base_row(case, impl):
    return dict(op="cascade", id=case["id"], case=case["case"], heads=case["heads"], batch=case["batch"],
                prefix_len=case["prefix_len"], suffix_len=case["suffix_len"], kv_tokens=case["kv_tokens"],
                cascade_kv_tokens=case["cascade_kv_tokens"], page_size=case["page_size"], impl=impl)


def timed(row, case, ms, copies):
    gbps = flat_bytes(case) / (ms * 1e-3) / 1e9
    row.update(ms=ms, GBps=gbps, pct_of_4800=100.0 * gbps / 4800.0, l2_copies=copies)
    return row


def flashinfer_keys(cases):
    """jit_warmup module keys: FlashInfer's cascade runs its paged prefill (fa3 on Hopper, fa2
    elsewhere: backend "auto"); flat decode the decode module (CUDA cores) and fa2 (tensor cores)."""
    keys = set()
    for c in cases:
        hd = int(c.get("head_dim_qk") or 128)
        keys |= {f"decode:{hd}", f"fa2:{hd}", f"fa3:{hd}"}
    return keys


def run_case(exp, case, args, fi, log):
    """All rows of one exported cascade case (kvattn's two, FlashInfer's three). kvattn's timings
    are case["row"] (run.py puts the matching row of the --json output there)."""
    dev = kvio.DEVICE
    B, Hq, Hkv, D, P = case["batch"], case["num_qo_heads"], case["num_kv_heads"], case["head_dim_qk"], case["page_size"]
    sm_scale = case["sm_scale"]
    tables = {lv: [exp.torch(case, f"{lv}_{n}", dev) for n in ("qo_indptr", "kv_indptr", "kv_indices",
                                                                  "kv_last_page_len")] for lv in LEVELS}
    indptr, indices, last = (exp.torch(case, n, dev) for n in ("kv_indptr", "kv_indices", "kv_last_page_len"))
    lens = kvio.kv_lens_from_page_table(indptr.cpu().numpy(), last.cpu().numpy(), P)
    if lens.tolist() != list(case["kv_lens"]):
        raise ValueError(f"{case['id']}: the flat page table does not match kv_lens")
    q = exp.input(case, "q", dev)
    k_cache = exp.input(case, "k_cache", dev)
    v_cache = exp.input(case, "v_cache", dev)
    ref_out, ref_lse = kvio.reference_decode(q, k_cache, v_cache, indptr.cpu(), indices, last.cpu(), sm_scale)
    kv_out, kv_lse = exp.torch(case, "out", dev), exp.torch(case, "lse", dev)

    rows = []
    kr = case.get("row", {})
    r = base_row(case, "kvattn")
    r.update({k: kr[k] for k in ("ms", "GBps", "pct_of_4800", "plan_us", "l2_copies", "speedup", "level0_ms",
                                 "level1_ms", "merge_ms", "cascade_read_GBps") if k in kr})
    decode.compare(r, kv_out, ref_out, kv_lse, ref_lse)
    rows.append(r)
    log(r)
    r = base_row(case, "kvattn-flat")
    r.update({k: kr["flat_" + k] for k in ("ms", "GBps", "pct_of_4800", "plan_us") if "flat_" + k in kr})
    if "l2_copies" in kr:
        r["l2_copies"] = kr["l2_copies"]
    decode.compare(r, exp.torch(case, "flat_out", dev), ref_out, exp.torch(case, "flat_lse", dev), ref_lse, kv_out)
    rows.append(r)
    log(r)
    if fi is None:
        return rows

    copies = kvio.l2_copies(2 * k_cache.numel() * 2)
    caches = [(k_cache, v_cache)] + [(k_cache.clone(), v_cache.clone()) for _ in range(copies - 1)]
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
    dtypes = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)

    r = base_row(case, "flashinfer-cascade")
    try:
        w = fi.MultiLevelCascadeAttentionWrapper(2, workspace, "NHD")
        qo, kvp, ids, lp = ([tables[lv][i] for lv in LEVELS] for i in range(4))

        def plan():
            w.plan(qo, kvp, ids, lp, Hq, Hkv, D, P, causal=False, sm_scale=sm_scale, **dtypes)

        r["plan_us"] = timing.median_host_us(plan)
        out = w.run(q, caches[0])  # returns out only (no lse)
        torch.cuda.synchronize()
        decode.compare(r, out, ref_out, kvattn_out=kv_out)
        ms, _ = timing.median_ms(lambda i: w.run(q, caches[i]), copies, args.iters)
        timed(r, case, ms, copies)
    except Exception as e:  # noqa: BLE001 - a failing peer is a row, not the end of the run
        r["error"] = f"{type(e).__name__}: {e}"[:500]
    rows.append(r)
    log(r)

    for tc in (False, True):
        r = base_row(case, "flashinfer-flat-tensor-core" if tc else "flashinfer-flat-cuda-core")
        try:
            w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tc)

            def plan():
                w.plan(indptr, indices, last, Hq, Hkv, D, P, sm_scale=sm_scale, **dtypes)

            r["plan_us"] = timing.median_host_us(plan)
            out = torch.empty_like(q)
            lse = torch.empty(B, Hq, dtype=torch.float32, device=dev)
            out.fill_(float("nan"))
            w.run(q, caches[0], out=out, lse=lse, return_lse=True)
            torch.cuda.synchronize()
            decode.compare(r, out, ref_out, lse, ref_lse, kv_out)
            ms, _ = timing.median_ms(lambda i: w.run(q, caches[i], out=out), copies, args.iters)
            timed(r, case, ms, copies)
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {e}"[:500]
        rows.append(r)
        log(r)
    del caches, workspace
    return rows
