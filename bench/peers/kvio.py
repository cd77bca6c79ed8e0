"""The exported inputs of `kvattn bench ... --save-io DIR` (apps/bench_io.h), read back.

- Manifest: DIR/manifest.json (format "kvattn-bench-io" 1, described in README.md here).
- Generator "kvattn-hash-v1": the same integer hash as apps/bench_io.h, written with operators
  that numpy int64 arrays and torch int64 tensors share, with every product below 2^63, so the
  CPU (numpy) and the GPU (torch) give the bits kvattn used. K/V caches too large to export
  are regenerated with it; the ones that were exported are compared against it.
- float64 references for paged decode and for prefill (ragged or paged), computed with torch
  on the GPU in chunks; for prefill on a sample of query rows (sample_rows) so that 16k x 16k
  causal cases cost seconds, not minutes.

numpy is needed for the files; torch only for the *_torch functions and the references.
"""
import json
import math
import os

import numpy as np

M32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9
# Where the peers run: "cuda"; PEERS_DEVICE=cpu runs the Python (generator, references, dense SDPA,
# reports) without a GPU as a smoke test, with wall-clock timing and no FlashInfer.
DEVICE = os.environ.get("PEERS_DEVICE", "cuda")


# ---- generator ----------------------------------------------------------------------------------
def _mul32(x, c):
    """(x * c) mod 2^32 for 0 <= x < 2^32 and a constant c < 2^32, without overflowing int64."""
    return ((x & 0xFFFF) * c + ((((x >> 16) * c) & 0xFFFF) << 16)) & M32


def mix32(x):
    """lowbias32 (apps/bench_io.h) on non-negative int64 values below 2^32."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash_u8(seed, i):
    """The generator's byte u for flat indices i (int64 array or tensor, i >= 0)."""
    t = mix32((((seed * GOLDEN) & M32) + (i >> 32)) & M32)
    return mix32((i & M32) ^ t) >> 24


def generate_numpy(seed, scale, shape, first=0):
    """Elements [first, first + prod(shape)) of tensor `seed` as float32 (exact bf16 values)."""
    n = int(np.prod(shape, dtype=np.int64))
    i = np.arange(first, first + n, dtype=np.int64)
    return ((hash_u8(seed, i) - 128).astype(np.float32) * np.float32(scale)).reshape(shape)


def generate_torch(seed, scale, shape, device=DEVICE, chunk=1 << 27):
    """Tensor `seed` as bfloat16 on `device`, made in chunks (int64 temporaries of chunk elements)."""
    import torch

    n = math.prod(shape)
    out = torch.empty(n, dtype=torch.bfloat16, device=device)
    for at in range(0, n, chunk):
        m = min(chunk, n - at)
        i = torch.arange(at, at + m, dtype=torch.int64, device=device)
        out[at:at + m] = ((hash_u8(seed, i) - 128).to(torch.float32) * scale).to(torch.bfloat16)
        del i
    return out.view(shape)


def bf16_bits_to_float32(u16):
    """numpy uint16 bf16 bits -> float32."""
    return (u16.astype(np.uint32) << 16).view(np.float32)


# ---- manifest and arrays ------------------------------------------------------------------------
class Export:
    """A --save-io directory: its manifest and its arrays."""

    def __init__(self, directory):
        self.dir = directory
        with open(os.path.join(directory, "manifest.json")) as f:
            self.manifest = json.load(f)
        if self.manifest.get("format") != "kvattn-bench-io" or self.manifest.get("format_version") != 1:
            raise ValueError(f"{directory}/manifest.json: not a kvattn-bench-io 1 manifest")
        gen = self.manifest["generator"]
        if gen["name"] != "kvattn-hash-v1":
            raise ValueError(f"unknown generator {gen['name']}")
        self.seeds, self.scales = gen["seeds"], gen["scales"]

    @property
    def cases(self):
        return self.manifest["cases"]

    def has_file(self, case, name):
        a = case["arrays"].get(name)
        return a is not None and a.get("file") is not None

    def numpy(self, case, name):
        """The array as numpy; bf16 is returned as float32 (exact)."""
        a = case["arrays"][name]
        x = np.load(os.path.join(self.dir, a["file"]))
        if list(x.shape) != list(a["shape"]):
            raise ValueError(f"{a['file']}: shape {x.shape}, manifest says {a['shape']}")
        return bf16_bits_to_float32(x) if a["dtype"] == "bf16" else x

    def torch(self, case, name, device=DEVICE):
        """The array as a torch tensor on `device` (bf16 as torch.bfloat16, bit for bit)."""
        import torch

        a = case["arrays"][name]
        x = np.load(os.path.join(self.dir, a["file"]))
        if a["dtype"] == "bf16":
            return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).to(device)
        return torch.from_numpy(x).to(device)

    def input(self, case, name, device=DEVICE, verify=True):
        """An input tensor (q, k_cache, v_cache, k, v): regenerated on `device` from the generator;
        when the file exists and `verify`, checked bit for bit against it."""
        import torch

        a = case["arrays"][name]
        key = name if name in self.seeds else {"k": "k_cache", "v": "v_cache"}.get(name, name)
        t = generate_torch(self.seeds[key], self.scales[key], a["shape"], device)
        if verify and a.get("file") is not None:
            f = self.torch(case, name, device)
            if not torch.equal(f.view(torch.int16), t.view(torch.int16)):
                raise ValueError(f"{case['id']}/{name}: the file differs from the generator's values")
        return t


# ---- page tables --------------------------------------------------------------------------------
def kv_lens_from_page_table(indptr, last_page_len, page_size):
    pages = np.diff(np.asarray(indptr, dtype=np.int64))
    return np.where(pages > 0, (pages - 1) * page_size + np.asarray(last_page_len, dtype=np.int64), 0)


def make_page_table(kv_lens, page_size, seed=1):
    """indptr, indices (a random permutation of the pool), last_page_len, num_pages (numpy int32)."""
    kv_lens = np.asarray(kv_lens, dtype=np.int64)
    pages = (kv_lens + page_size - 1) // page_size
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    num_pages = int(indptr[-1])
    indices = np.random.default_rng(seed).permutation(num_pages).astype(np.int32)
    last = np.where(pages > 0, kv_lens - (pages - 1) * page_size, 0).astype(np.int32)
    return indptr, indices, last, num_pages


def l2_copies(input_bytes):
    """As kvattn bench: enough copies of the inputs that one run's data has left the 60 MB L2
    before it is read again (at least 256 MB in rotation), 1 to 8."""
    return int(min(max(math.ceil(256e6 / max(input_bytes, 1)), 1), 8))


# ---- float64 references -------------------------------------------------------------------------
def _attend64(q, k, v, sm_scale, mask=None, soft_cap=0.0):
    """q [R, Hkv, G, D], k/v [L, Hkv, D] float64 -> out [R, Hkv, G, Dv], lse2 [R, Hkv, G].
    soft_cap c > 0: s <- c * tanh(s / c) on the scaled logit (../shared/SEMANTICS.md)."""
    import torch

    s = torch.einsum("rhgd,lhd->rhgl", q, k) * sm_scale
    if soft_cap:
        s = soft_cap * torch.tanh(s / soft_cap)
    if mask is not None:  # [R, L] bool, True = visible
        s = s.masked_fill(~mask[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    out = torch.einsum("rhgl,lhd->rhgd", p, v)
    return out, lse / math.log(2.0)


def gather_pages(cache, indices, begin, end, length):
    """Tokens [0, length) of a request whose pages are indices[begin:end] ([L, Hkv, D])."""
    pages = cache[indices[begin:end].long()]
    return pages.reshape(-1, cache.shape[2], cache.shape[3])[:length]


def reference_decode(q, k_cache, v_cache, indptr, indices, last_page_len, sm_scale):
    """Paged NHD decode in float64: q [B, Hq, D] -> out [B, Hq, Dv] f64, lse [B, Hq] (base 2)."""
    import torch

    B, Hq, D = q.shape
    Hkv, P = k_cache.shape[2], k_cache.shape[1]
    G = Hq // Hkv
    ip = indptr.tolist() if hasattr(indptr, "tolist") else list(indptr)
    lens = kv_lens_from_page_table(ip, np.asarray(last_page_len.tolist() if hasattr(last_page_len, "tolist") else last_page_len), P)
    out = torch.zeros(B, Hq, v_cache.shape[3], dtype=torch.float64, device=q.device)
    lse = torch.full((B, Hq), float("-inf"), dtype=torch.float64, device=q.device)
    for b in range(B):
        L = int(lens[b])
        if L == 0:
            continue
        k = gather_pages(k_cache, indices, ip[b], ip[b + 1], L).double()
        v = gather_pages(v_cache, indices, ip[b], ip[b + 1], L).double()
        o, l2 = _attend64(q[b].double().view(1, Hkv, G, D), k, v, sm_scale)
        out[b] = o.reshape(Hq, -1)
        lse[b] = l2.reshape(Hq)
    return out, lse


def reference_prefill(q, qo_indptr, kv_lens, get_kv, sm_scale, causal, soft_cap=0.0, rows_per_chunk=512):
    """Prefill in float64 with the causal mask aligned bottom-right (query i of a request sits at
    kv_len - qo_len + i). q [nnz_q, Hq, D]; get_kv(b) -> (k, v) [kv_len, Hkv, D] of request b.
    Returns out [nnz_q, Hq, Dv] f64 and lse [nnz_q, Hq] (base 2)."""
    import torch

    nnz, Hq, D = q.shape
    out, lse = None, torch.full((nnz, Hq), float("-inf"), dtype=torch.float64, device=q.device)
    qi = list(qo_indptr)
    for b in range(len(qi) - 1):
        k, v = get_kv(b)
        k, v = k.double(), v.double()
        Hkv, Lk = k.shape[1], k.shape[0]
        G = Hq // Hkv
        if out is None:
            out = torch.zeros(nnz, Hq, v.shape[2], dtype=torch.float64, device=q.device)
        Lq = qi[b + 1] - qi[b]
        for r0 in range(0, Lq, rows_per_chunk):
            r1 = min(Lq, r0 + rows_per_chunk)
            qq = q[qi[b] + r0:qi[b] + r1].double().view(r1 - r0, Hkv, G, D)
            mask = None
            if causal:
                pos = torch.arange(r0, r1, device=q.device)[:, None] + (Lk - Lq)
                mask = torch.arange(Lk, device=q.device)[None, :] <= pos
            o, l2 = _attend64(qq, k, v, sm_scale, mask, soft_cap)
            out[qi[b] + r0:qi[b] + r1] = o.reshape(r1 - r0, Hq, -1)
            lse[qi[b] + r0:qi[b] + r1] = l2.reshape(r1 - r0, Hq)
    return out, lse


def sample_rows(qo_lens, n=256):
    """The query rows (global indices into [nnz_q], sorted, int64) the prefill reference is computed
    for: n rows spread evenly over all nnz_q rows (np.linspace), plus the first and last row of
    every request (the causal mask's extremes); every row when that is not fewer."""
    qo_lens = np.asarray(qo_lens, dtype=np.int64)
    nnz = int(qo_lens.sum())
    ip = np.concatenate([[0], np.cumsum(qo_lens)])
    ends = np.concatenate([ip[:-1][qo_lens > 0], ip[1:][qo_lens > 0] - 1])
    if nnz <= n + len(ends):
        return np.arange(nnz, dtype=np.int64)
    spread = np.round(np.linspace(0, nnz - 1, n)).astype(np.int64)
    return np.unique(np.concatenate([spread, ends])).astype(np.int64)


def reference_prefill_rows(q, qo_indptr, kv_lens, get_kv, sm_scale, causal, rows, soft_cap=0.0, rows_per_chunk=64):
    """reference_prefill for the query rows `rows` only (global indices into q's first dimension,
    sorted, e.g. sample_rows()): out [R, Hq, Dv] f64 and lse [R, Hq] (base 2), row r of the result
    being query row rows[r]. Each request's K/V are fetched (get_kv) and widened to float64 once,
    and only for requests with sampled rows."""
    import torch

    _, Hq, D = q.shape
    rows = np.asarray(rows, dtype=np.int64)
    qi = np.asarray(list(qo_indptr), dtype=np.int64)
    req = np.searchsorted(qi, rows, side="right") - 1  # the request of each sampled row
    out = lse = None
    for b in np.unique(req).tolist():
        sel = np.nonzero(req == b)[0]  # positions in `rows`
        k, v = get_kv(b)
        k, v = k.double(), v.double()
        Hkv, Lk = k.shape[1], k.shape[0]
        G = Hq // Hkv
        Lq = int(qi[b + 1] - qi[b])
        if out is None:
            out = torch.zeros(len(rows), Hq, v.shape[2], dtype=torch.float64, device=q.device)
            lse = torch.full((len(rows), Hq), float("-inf"), dtype=torch.float64, device=q.device)
        for c0 in range(0, len(sel), rows_per_chunk):
            part = sel[c0:c0 + rows_per_chunk]
            g = torch.from_numpy(rows[part]).to(q.device)
            qq = q[g].double().view(len(part), Hkv, G, D)
            mask = None
            if causal:  # query i of the request sits at Lk - Lq + i
                pos = torch.from_numpy(rows[part] - qi[b] + (Lk - Lq)).to(q.device)[:, None]
                mask = torch.arange(Lk, device=q.device)[None, :] <= pos
            o, l2 = _attend64(qq, k, v, sm_scale, mask, soft_cap)
            at = torch.from_numpy(part).to(q.device)
            out[at] = o.reshape(len(part), Hq, -1)
            lse[at] = l2.reshape(len(part), Hq)
        del k, v
    return out, lse


def errors(out, ref_out, lse=None, ref_lse=None):
    """max abs error, error relative to max |ref|, and the lse's max abs error (finite rows)."""
    import torch

    d = (out.double() - ref_out).abs()
    r = {"max_abs_err": float(d.max()) if d.numel() else 0.0}
    scale = float(ref_out.abs().max()) if ref_out.numel() else 0.0
    r["rel_err"] = r["max_abs_err"] / scale if scale > 0 else r["max_abs_err"]
    if not bool(torch.isfinite(out.double()).all()):
        r["nonfinite"] = True
    if lse is not None and ref_lse is not None:
        fin = torch.isfinite(ref_lse)
        r["lse_max_abs_err"] = float((lse.double()[fin] - ref_lse[fin]).abs().max()) if bool(fin.any()) else 0.0
    return r
