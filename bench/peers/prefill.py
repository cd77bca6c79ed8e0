"""Prefill/append side by side: FlashInfer's BatchPrefillWithRaggedKVCacheWrapper and
BatchPrefillWithPagedKVCacheWrapper (backends fa2 and fa3), PyTorch SDPA (FlashAttention-2,
cuDNN) and FlexAttention (causal shapes, as ../shared/bench/peers.py) on kvattn's prefill shapes.
Where the cases come from (run.py decides):

1. an export of `kvattn bench prefill --save-io DIR`: the peers run on exactly the exported
   tensors (q, ragged k/v or the paged cache, qo_indptr, kv_indptr and the page table), and
   kvattn's own out and lse are checked against the float64 reference like the peers';
2. without an export, the rows of `kvattn bench prefill --json`: the peers run on the same shapes
   (heads, head dim, causal, soft-cap, ragged or paged with the same page size, the rows'
   per-request qo_lens/kv_lens; rows of older binaries without them: uniform lengths taken as
   tokens / batch, skewed cases skipped), with inputs made by the generator; kvattn's timing is
   listed beside them, its output unchecked;
3. `--prefill builtin`: the shapes of builtin_cases() below, peers only.

Case fields (an export's manifest uses the same, README.md): id, case, heads, num_qo_heads,
num_kv_heads, head_dim_qk, head_dim_vo, qo_lens, kv_lens, causal, soft_cap, kv ("ragged" or
"paged"), page_size, sm_scale; an export adds arrays q [nnz_q, Hq, D], qo_indptr, out, lse and
either k, v [nnz_kv, Hkv, D] + kv_indptr or k_cache, v_cache + kv_indptr, kv_indices,
kv_last_page_len.

TFLOP/s = 4 * (visible query-key pairs) * Hq * D / time; a causal query i of a request with
qo_len Lq and kv_len Lk sees Lk - Lq + i + 1 keys (aligned bottom-right, as in kvattn and
FlashInfer).

The float64 reference is computed for a sample of query rows (kvio.sample_rows: 256 rows spread
evenly over all nnz_q rows plus the first and last row of each request; every row of a small
case), all heads, each against its request's full K/V: a 16k x 16k causal case then costs a few
GB and seconds instead of 16k rows of float64 attention. max_abs_err, rel_err and
lse_max_abs_err are over those rows (`ref_rows` says how many); vs_kvattn_max_abs compares every
row with kvattn's exported output.
"""
import re

import numpy as np
import torch
import torch.nn.functional as F

import kvio
import timing

WORKSPACE_BYTES = 512 << 20
SEEDS = {"q": 1, "k": 2, "v": 3}
SCALES = {"q": 1.0 / 32, "k": 1.0 / 128, "v": 1.0 / 128}


def make_case(cid, name, qo, kv, causal, heads=(32, 32), head_dim=128, kv_layout="ragged", page=0, soft_cap=0.0,
              row=None):
    return dict(id=cid, case=name, op="prefill", qo_lens=list(qo), kv_lens=list(kv), causal=bool(causal),
                num_qo_heads=heads[0], num_kv_heads=heads[1], heads=f"{heads[0]}/{heads[1]}",
                head_dim_qk=head_dim, head_dim_vo=head_dim, kv=kv_layout, page_size=page,
                soft_cap=float(soft_cap or 0.0), sm_scale=head_dim ** -0.5, row=row or {})


def builtin_cases(quick=False):
    """../shared/ANCHORS.md's FlashInfer prefill shapes (32 heads, head dim 128), plus an append."""
    cases = [make_case("b_causal_1x16384", "1 x 16384 causal", [16384], [16384], True),
             make_case("b_causal_4x4096", "4 x 4096 causal", [4096] * 4, [4096] * 4, True)]
    if not quick:
        cases += [make_case("b_full_1x16384", "1 x 16384", [16384], [16384], False),
                  make_case("b_causal_1x16384_p16", "1 x 16384 causal, page 16", [16384], [16384], True,
                            kv_layout="paged", page=16),
                  make_case("b_causal_1x16384_p1", "1 x 16384 causal, page 1", [16384], [16384], True,
                            kv_layout="paged", page=1),
                  make_case("b_append_16x512_on_4k_p16", "append 16 x 512 on 4k, page 16", [512] * 16,
                            [4608] * 16, True, heads=(32, 8), kv_layout="paged", page=16)]
    return cases


def cases_from_rows(rows):
    """Peer cases for the rows of `kvattn bench prefill --json`: (cases, skipped [(id, why)])."""
    cases, skipped = [], []
    for r in rows:
        if r.get("alibi"):
            skipped.append((r.get("id", "?"), "ALiBi: no peer runs it here"))
            continue
        try:
            hq, hkv = (int(x) for x in r["heads"].split("/"))
            B, nq, nkv = int(r["batch"]), int(r["q_tokens"]), int(r["kv_tokens"])
            layout = str(r.get("kv", "ragged"))
            m = re.search(r"page (\d+)", layout)
            if r.get("qo_lens") and r.get("kv_lens"):
                qo, kv = [int(x) for x in r["qo_lens"]], [int(x) for x in r["kv_lens"]]
            elif "zipf" in r["id"] or nq % B or nkv % B:
                skipped.append((r["id"], "its per-request lengths are not in the row (an older kvattn)"))
                continue
            else:
                qo, kv = [nq // B] * B, [nkv // B] * B
            cases.append(make_case(r["id"], r["case"], qo, kv, r.get("causal", True),
                                   (hq, hkv), int(r["head_dim"]), "paged" if m else "ragged",
                                   int(m.group(1)) if m else 0, r.get("soft_cap", 0.0), row=r))
        except (KeyError, ValueError, TypeError) as e:
            skipped.append((r.get("id", "?"), f"unreadable row ({type(e).__name__}: {e})"))
    return cases, skipped


def flashinfer_modules(cases):
    """The FlashInfer modules these cases need: (backend, head_dim, soft-cap used). Cases are
    manifest entries, make_case() dicts or `kvattn bench prefill --list --json` entries."""
    return sorted({(b, int(c.get("head_dim_qk") or c.get("head_dim")), bool(c.get("soft_cap")))
                   for c in cases for b in ("fa2", "fa3")})


def visible_pairs(qo_lens, kv_lens, causal):
    n = 0
    for lq, lk in zip(qo_lens, kv_lens):
        n += lq * (lk - lq) + lq * (lq + 1) // 2 if causal else lq * lk
    return n


def flops(case):
    return 4.0 * visible_pairs(case["qo_lens"], case["kv_lens"], case["causal"]) * case["num_qo_heads"] * case["head_dim_qk"]


def base_row(case, impl, layout):
    return dict(op="prefill", id=case["id"], case=case["case"], heads=case["heads"], head_dim=case["head_dim_qk"],
                kv=layout, causal=case["causal"], soft_cap=case.get("soft_cap", 0.0), batch=len(case["qo_lens"]),
                q_tokens=int(sum(case["qo_lens"])), kv_tokens=int(sum(case["kv_lens"])),
                qo_lens=[int(x) for x in case["qo_lens"]], kv_lens=[int(x) for x in case["kv_lens"]],
                page_size=case.get("page_size"), impl=impl)


def _indptr(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def _scatter_to_pages(k, v, kv_lens, page_size, dev):
    """A paged NHD cache (shuffled pages) holding the ragged k/v, and its page table."""
    ip_np, ind_np, last_np, num_pages = kvio.make_page_table(kv_lens, page_size)
    Hkv, D = k.shape[1], k.shape[2]
    k_cache = torch.zeros(num_pages, page_size, Hkv, D, dtype=k.dtype, device=dev)
    v_cache = torch.zeros(num_pages, page_size, Hkv, v.shape[2], dtype=v.dtype, device=dev)
    indices = torch.from_numpy(ind_np).to(dev)
    kv_ip = _indptr(kv_lens)
    for b, L in enumerate(kv_lens):
        ids = indices[ip_np[b]:ip_np[b + 1]].long()
        pad = ids.numel() * page_size - L
        k_cache[ids] = F.pad(k[kv_ip[b]:kv_ip[b + 1]], (0, 0, 0, 0, 0, pad)).view(-1, page_size, Hkv, D)
        v_cache[ids] = F.pad(v[kv_ip[b]:kv_ip[b + 1]], (0, 0, 0, 0, 0, pad)).view(-1, page_size, Hkv, v.shape[2])
    return k_cache, v_cache, torch.from_numpy(ip_np).to(dev), indices, torch.from_numpy(last_np).to(dev)


def run_case(case, args, fi, flex, log, exp=None):
    """All rows of one prefill case (kvattn's, FlashInfer's, the dense peers')."""
    dev = kvio.DEVICE
    Hq, Hkv, D, Dv = case["num_qo_heads"], case["num_kv_heads"], case["head_dim_qk"], case["head_dim_vo"]
    qo_lens, kv_lens, causal, sm_scale = case["qo_lens"], case["kv_lens"], case["causal"], case["sm_scale"]
    cap = float(case.get("soft_cap") or 0.0)
    layout, P = case.get("kv", "ragged"), case.get("page_size") or 0
    nnz_q, nnz_kv = int(sum(qo_lens)), int(sum(kv_lens))
    qo_ip_np = _indptr(qo_lens)
    rows = []

    # Inputs: ragged k/v [nnz_kv, Hkv, D] or the paged cache, with the same values; from an
    # export, exactly its tensors and index arrays (inputs too big to write are regenerated).
    k = v = k_cache = v_cache = indptr = indices = last = kv_indptr = None
    if exp is not None:
        exp_qo = exp.numpy(case, "qo_indptr").astype(np.int32)
        if exp_qo.tolist() != qo_ip_np.tolist():
            raise ValueError(f"{case['id']}: qo_indptr does not match qo_lens")
        q = exp.input(case, "q", dev)
        if layout == "paged":
            k_cache, v_cache = exp.input(case, "k_cache", dev), exp.input(case, "v_cache", dev)
            indptr, indices, last = (exp.torch(case, n, dev) for n in ("kv_indptr", "kv_indices", "kv_last_page_len"))
            lens = kvio.kv_lens_from_page_table(indptr.cpu().numpy(), last.cpu().numpy(), P)
            if lens.tolist() != list(kv_lens):
                raise ValueError(f"{case['id']}: the page table does not match kv_lens")
        else:
            k, v = exp.input(case, "k", dev), exp.input(case, "v", dev)
            kv_indptr = exp.torch(case, "kv_indptr", dev)
            if kv_indptr.cpu().tolist() != _indptr(kv_lens).tolist():
                raise ValueError(f"{case['id']}: kv_indptr does not match kv_lens")
    else:
        q = kvio.generate_torch(SEEDS["q"], SCALES["q"], [nnz_q, Hq, D], dev)
        k = kvio.generate_torch(SEEDS["k"], SCALES["k"], [nnz_kv, Hkv, D], dev)
        v = kvio.generate_torch(SEEDS["v"], SCALES["v"], [nnz_kv, Hkv, Dv], dev)
        if layout == "paged":
            k_cache, v_cache, indptr, indices, last = _scatter_to_pages(k, v, kv_lens, P, dev)
    qo_indptr = torch.from_numpy(qo_ip_np).to(dev)
    if layout != "paged" and kv_indptr is None:
        kv_indptr = torch.from_numpy(_indptr(kv_lens)).to(dev)

    kv_ip = _indptr(kv_lens).tolist()
    if k is not None:
        def get_kv(b):
            return k[kv_ip[b]:kv_ip[b + 1]], v[kv_ip[b]:kv_ip[b + 1]]
    else:
        pip = indptr.tolist()

        def get_kv(b):
            return (kvio.gather_pages(k_cache, indices, pip[b], pip[b + 1], kv_lens[b]),
                    kvio.gather_pages(v_cache, indices, pip[b], pip[b + 1], kv_lens[b]))
    ref_out = ref_lse = ref_rows = None
    if not args.no_prefill_reference:
        sample = kvio.sample_rows(qo_lens, getattr(args, "ref_rows", 256))
        ref_out, ref_lse = kvio.reference_prefill_rows(q, qo_ip_np.tolist(), kv_lens, get_kv, sm_scale, causal,
                                                       sample, cap)
        ref_rows = torch.from_numpy(sample).to(dev)

    # kvattn: its row (timing) and, from an export, its output.
    kv_out = None
    if case.get("row"):
        r = base_row(case, "kvattn", layout)
        r.update({x: case["row"][x] for x in ("ms", "TFLOPs", "plan_us") if x in case["row"]})
        if exp is not None:
            kv_out, kv_lse = exp.torch(case, "out", dev), exp.torch(case, "lse", dev)
            if ref_out is not None:
                r.update(kvio.errors(kv_out[ref_rows], ref_out, kv_lse[ref_rows], ref_lse), ref_rows=len(ref_rows))
            if not bool(torch.isfinite(kv_out.float()).all()):  # every row written (out was poisoned)
                r["nonfinite"] = True
        else:
            r["note"] = "output not exported (run kvattn bench prefill with --save-io)"
        rows.append(r)
        log(r)

    def check(r, out, lse=None):
        if ref_out is not None:
            r.update(kvio.errors(out[ref_rows], ref_out, None if lse is None else lse[ref_rows], ref_lse),
                     ref_rows=len(ref_rows))
        if not bool(torch.isfinite(out.float()).all()):
            r["nonfinite"] = True
        if kv_out is not None:
            r["vs_kvattn_max_abs"] = float((out.double() - kv_out.double()).abs().max())

    def finish(r, call, copies):
        ms, _ = timing.median_ms(call, copies, args.iters_prefill)
        r.update(ms=ms, TFLOPs=flops(case) / (ms * 1e-3) / 1e12, l2_copies=copies)

    if fi is not None:
        first = (k_cache, v_cache) if layout == "paged" else (k, v)
        copies = kvio.l2_copies(2 * first[0].numel() * 2 + q.numel() * 2)
        ins = [first] + [(first[0].clone(), first[1].clone()) for _ in range(copies - 1)]
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        out = torch.empty(nnz_q, Hq, Dv, dtype=q.dtype, device=dev)
        lse = torch.empty(nnz_q, Hq, dtype=torch.float32, device=dev)
        common = dict(causal=causal, sm_scale=sm_scale, logits_soft_cap=cap or None, q_data_type=torch.bfloat16,
                      kv_data_type=torch.bfloat16)
        for backend in ("fa2", "fa3"):
            r = base_row(case, f"flashinfer-{backend}-{layout}", layout)
            try:
                if layout == "paged":
                    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)

                    def plan():
                        w.plan(qo_indptr, indptr, indices, last, Hq, Hkv, D, P, head_dim_vo=Dv, **common)

                    def call(i, **kw):
                        return w.run(q, ins[i], out=out, **kw)
                else:
                    w = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD", backend=backend)

                    def plan():
                        w.plan(qo_indptr, kv_indptr, Hq, Hkv, D, head_dim_vo=Dv, **common)

                    def call(i, **kw):
                        return w.run(q, ins[i][0], ins[i][1], out=out, **kw)
                r["plan_us"] = timing.median_host_us(plan, reps=5, warm=1)
                out.fill_(float("nan"))
                call(0, lse=lse, return_lse=True)
                torch.cuda.synchronize()
                check(r, out, lse)
                finish(r, call, copies)
            except Exception as e:  # noqa: BLE001 - a failing peer is a row
                r["error"] = f"{type(e).__name__}: {e}"[:500]
            rows.append(r)
            log(r)
        del ins, workspace, out, lse

    # Dense peers: equal lengths with qo_len == kv_len (SDPA's causal mask is aligned top-left) and
    # no soft-cap (SDPA has none).
    if not args.skip_dense and not cap and len(set(qo_lens)) == 1 and list(qo_lens) == list(kv_lens):
        B, S = len(qo_lens), qo_lens[0]
        if k is None:
            k = torch.cat([get_kv(b)[0] for b in range(B)])
            v = torch.cat([get_kv(b)[1] for b in range(B)])
        q4 = q.view(B, S, Hq, D).transpose(1, 2)
        k4 = k.view(B, S, Hkv, D).transpose(1, 2).contiguous()
        v4 = v.view(B, S, Hkv, Dv).transpose(1, 2).contiguous()
        copies = kvio.l2_copies(2 * k4.numel() * 2 + q.numel() * 2)
        dense = [(k4, v4)] + [(k4.clone(), v4.clone()) for _ in range(copies - 1)]
        gqa = Hq != Hkv
        peers = [("torch-sdpa-fa2", torch.nn.attention.SDPBackend.FLASH_ATTENTION),
                 ("cudnn", torch.nn.attention.SDPBackend.CUDNN_ATTENTION)]
        for name, backend in peers:
            r = base_row(case, name, "dense")
            try:
                def call(i, backend=backend):
                    with torch.nn.attention.sdpa_kernel([backend]):
                        return F.scaled_dot_product_attention(q4, dense[i][0], dense[i][1], is_causal=causal,
                                                              scale=sm_scale, enable_gqa=gqa)
                check(r, call(0).transpose(1, 2).reshape(nnz_q, Hq, Dv))
                finish(r, call, copies)
            except Exception as e:  # noqa: BLE001
                r["error"] = f"{type(e).__name__}: {e}"[:500]
            rows.append(r)
            log(r)
        if flex is not None and causal:  # as ../shared/bench/peers.py: Flex on causal shapes only
            r = base_row(case, "flex", "dense")
            try:
                from torch.nn.attention.flex_attention import create_block_mask
                bm = create_block_mask(lambda b, h, i, j: i >= j, B, None, S, S, device=dev)

                def call(i):
                    return flex(q4, dense[i][0], dense[i][1], block_mask=bm, scale=sm_scale, enable_gqa=gqa)
                check(r, call(0).transpose(1, 2).reshape(nnz_q, Hq, Dv))
                finish(r, call, copies)
            except Exception as e:  # noqa: BLE001
                r["error"] = f"{type(e).__name__}: {e}"[:500]
            rows.append(r)
            log(r)
        del dense
    return rows
