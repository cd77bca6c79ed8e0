"""flashinfer.sparse: BlockSparseAttentionWrapper and VariableBlockSparseAttentionWrapper over
kvattn's paged prefill (a block row is a request over its listed column blocks)."""

from typing import Optional

import kvattn as _kv
from kvattn.flashinfer._common import (
    _check_backend, _check_ndim, _framework, _host_indptr, _host_ints, _kv_dtype_name, _np,
    _padded_page_table, _require_none, _to_host, _unsupported, _variant, _workspace,
)


class BlockSparseAttentionWrapper:
    """Attention with a block-sparse (BSR) mask (FlashInfer's wrapper of the same name): query row
    i sees key j iff block (i // R, j // C) is listed (and, with `mask`, its bit inside the block).

    As in FlashInfer, each block row is a request over the keys of its listed column blocks, so the
    positions of causal, ALiBi and RoPE are those within that request (query i of a block row at
    kv_len - qo_len + i of the row's gathered keys), and M need not be a multiple of R (the last
    block row is shorter). Without a mask and with position-free variants, this runs on
    kvattn.BlockSparseAttention; otherwise on kvattn.BatchPrefill over K/V viewed as pages of C
    tokens (block rows with fewer keys than queries padded with masked pages, see
    _padded_page_table). head_dim is both head dims; o_data_type defaults to float16, as
    FlashInfer's."""

    def __init__(self, float_workspace_buffer, backend: str = "auto") -> None:
        _check_backend(backend)
        self._float_workspace_buffer = float_workspace_buffer
        self._planned = None
        self._native = None

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None,
                               vector_sparse_indices_buffer=None,
                               vector_sparse_indptr_buffer=None) -> None:
        self._float_workspace_buffer = float_workspace_buffer
        if self._planned is not None:
            self.plan(**self._planned)

    def plan(self, indptr, indices, M: int, N: int, R: int, C: int, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, mask=None, packed_mask=None, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
             q_data_type="float16", kv_data_type=None, o_data_type="float16",
             non_blocking: bool = True) -> None:
        """Plans the BSR: indptr [MB + 1] and indices [nnz] (int32, column block ids < N / C),
        MB = ceil(M / R); mask: bool [nnz, R, C] (True: attend) or packed_mask (FlashInfer's
        packed layout: each block row's [qo_len, kv_len] bits, little-endian, from a byte
        boundary). Other arguments as BatchPrefillWithPagedKVCacheWrapper.plan."""
        import numpy as np

        if use_fp16_qk_reduction:
            _unsupported("use_fp16_qk_reduction", "kvattn accumulates q.k in f32")
        planned = dict(indptr=indptr, indices=indices, M=M, N=N, R=R, C=C,
                       num_qo_heads=num_qo_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                       mask=mask, packed_mask=packed_mask, causal=causal,
                       pos_encoding_mode=pos_encoding_mode, logits_soft_cap=logits_soft_cap,
                       sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
                       q_data_type=q_data_type, kv_data_type=kv_data_type,
                       o_data_type=o_data_type)
        M, N, R, C = int(M), int(N), int(R), int(C)
        q_name = _kv_dtype_name(q_data_type)
        kv_name = _kv_dtype_name(kv_data_type) or q_name
        o_name = _kv_dtype_name(o_data_type) or q_name
        variant = _variant(causal=causal, pos_encoding_mode=pos_encoding_mode,
                           logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                           rope_scale=rope_scale, rope_theta=rope_theta)
        shape = dict(num_qo_heads=int(num_qo_heads), num_kv_heads=int(num_kv_heads),
                     head_dim_qk=int(head_dim), q_dtype=q_name, kv_dtype=kv_name, o_dtype=o_name)
        ws = _workspace(self._float_workspace_buffer)
        positional = causal or pos_encoding_mode != "NONE"
        if mask is None and packed_mask is None and not positional and R >= 1 and M % R == 0:
            native = _kv.BlockSparseAttention(ws)
            native.plan(bsr=_kv.BSRMatrix(_to_host(indptr), _to_host(indices), M, N, R, C),
                        variant=variant, **shape)
            self._native, self._paged, self._C = native, False, C
        else:
            if R < 1 or C < 1:
                raise _kv.Error(f"bsr block size R x C = {R} x {C} must be at least 1 x 1")
            if M < 0 or N < 0 or N % C:
                raise _kv.Error(f"bsr N = {N} is not a multiple of C = {C}" if N >= 0 and M >= 0
                                else f"bsr M = {M}, N = {N} must be >= 0")
            mb = -(-M // R)
            ind = _host_indptr("bsr indptr", indptr, mb + 1)
            idx = _host_ints("bsr indices", indices)
            if len(idx) < ind[-1]:
                raise _kv.Error(f"bsr indptr[{mb}] = {ind[-1]} exceeds the length of bsr indices "
                                f"({len(idx)})")
            nb = N // C
            for j, c in enumerate(idx[:ind[-1]]):
                if not 0 <= c < nb:
                    raise _kv.Error(f"bsr indices[{j}] = {c} is out of range [0, {nb})")
            qo_lens = [min(R, M - r * R) for r in range(mb)]
            pages = [idx[ind[r]:ind[r + 1]] for r in range(mb)]
            bits = None
            if packed_mask is not None or mask is not None:
                bits = _bsr_bits(mask, packed_mask, qo_lens, pages, R, C)
            t_indptr, t_indices, t_last, cmask, cmask_indptr = _padded_page_table(
                qo_lens, pages, [C] * mb, C, bits)
            if cmask is not None:
                variant = variant.with_custom_mask()
            native = _kv.BatchPrefill(ws, "NHD")
            native.plan(qo_indptr=np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32),
                        page_table=(t_indptr, t_indices, t_last), page_size=C, custom_mask=cmask,
                        mask_indptr=cmask_indptr, variant=variant, **shape)
            self._native, self._paged, self._C = native, True, C
        self._planned = planned
        self._o_dtype = o_name

    begin_forward = plan

    def run(self, q, k, v, scale_q=None, scale_k=None, scale_v=None, out=None, lse=None,
            return_lse: bool = False, enable_pdl: Optional[bool] = None):
        """q [M, num_qo_heads, head_dim], k, v [N, num_kv_heads, head_dim]. Returns out [M,
        num_qo_heads, head_dim] (o_data_type), or (out, lse [M, num_qo_heads], base 2)."""
        _require_none(scale_q=scale_q, scale_k=scale_k, scale_v=scale_v)
        if self._native is None:
            raise RuntimeError("BlockSparseAttentionWrapper.run() was called before plan()")
        if lse is not None:
            return_lse = True
        if self._paged:  # K/V as pages of C tokens: [N / C, C, heads, dim]
            _check_ndim(k, "k", 3, "[N, num_kv_heads, head_dim]")
            _check_ndim(v, "v", 3, "[N, num_kv_heads, head_dim]")
            C = self._C
            kp = k.reshape(int(k.shape[0]) // C, C, int(k.shape[1]), int(k.shape[2]))
            vp = v.reshape(int(v.shape[0]) // C, C, int(v.shape[1]), int(v.shape[2]))
            if int(k.shape[0]) % C or int(v.shape[0]) % C:
                raise _kv.Error(f"k has {k.shape[0]} rows, v {v.shape[0]}, but plan() had N a "
                                f"multiple of C = {C}")
            return self._native.run(q, (kp, vp), out=out, lse=lse, return_lse=return_lse)
        return self._native.run(q, k, v, out=out, lse=lse, return_lse=return_lse)

    def forward(self, q, k, v, scale_q=None, scale_k=None, scale_v=None,
                pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
                logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
                rope_scale: Optional[float] = None, rope_theta: Optional[float] = None):
        """Deprecated in FlashInfer: run() with these variant arguments (re-plans when they
        differ from plan()'s)."""
        if self._planned is None:
            raise RuntimeError("BlockSparseAttentionWrapper.forward() was called before plan()")
        new = dict(pos_encoding_mode=pos_encoding_mode, logits_soft_cap=logits_soft_cap,
                   sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        if any(self._planned[key] != val for key, val in new.items()):
            self.plan(**{**self._planned, **new}, use_fp16_qk_reduction=use_fp16_qk_reduction)
        elif use_fp16_qk_reduction:
            _unsupported("use_fp16_qk_reduction", "kvattn accumulates q.k in f32")
        return self.run(q, k, v, scale_q, scale_k, scale_v)

    def end_forward(self) -> None:
        pass


def _bsr_bits(mask, packed_mask, qo_lens, pages, R, C):
    """Each block row's [qo_len, kv_len] bool mask from FlashInfer's BSR mask [nnz, R, C] (or from
    its packed layout)."""
    import numpy as np

    out = []
    if packed_mask is not None:
        flat = np.unpackbits(_np(packed_mask).astype(np.uint8, copy=False), bitorder="little")
        pos = 0
        for q, p in zip(qo_lens, pages):
            n = q * len(p) * C
            if pos + n > len(flat):
                raise _kv.Error(f"packed_mask has {len(flat) // 8} bytes but the block rows need "
                                f"more ({(pos + n + 7) // 8} at least)")
            out.append(flat[pos:pos + n].reshape(q, len(p) * C).astype(bool))
            pos += (n + 7) // 8 * 8
        return out
    m = _np(mask).astype(bool)
    nnz = sum(len(p) for p in pages)
    if m.ndim != 3 or m.shape[0] < nnz or m.shape[1] != R or m.shape[2] != C:
        raise _kv.Error(f"mask has shape {list(m.shape)} but [nnz, R, C] = [{nnz}, {R}, {C}] is "
                        "expected")
    start = 0
    for q, p in zip(qo_lens, pages):
        blocks = m[start:start + len(p)]  # [n, R, C] -> [R, n * C]: row i over the gathered keys
        out.append(blocks.transpose(1, 0, 2).reshape(R, len(p) * C)[:q])
        start += len(p)
    return out


def _permuted(x, axes):
    """x with its axes permuted, in its framework (torch permute, numpy transpose)."""
    return x.permute(*axes) if _framework(x) == "torch" else x.transpose(axes)


def _contiguous(x):
    if _framework(x) == "torch":
        return x.contiguous()
    import numpy as np

    return np.ascontiguousarray(x)


class VariableBlockSparseAttentionWrapper:
    """Block-sparse attention with block sizes of its own per KV head (FlashInfer's wrapper of the
    same name): KV head h cuts the qo_len queries into row blocks block_row_sz[h] and the kv_len
    keys into column blocks block_col_sz[h]; row block r of head h (its queries, for every query
    head of h's group) sees the column blocks c with block_mask_map[h, r, c].

    As FlashInfer does, each (KV head, row block) is one request of kvattn.BatchPrefill over a
    page-1 cache whose page ids are the token ids of its selected column blocks, so causal and
    RoPE positions are those within the request (query i of a row block at kv_len - qo_len + i of
    its gathered keys); a row block without selected blocks gives o = 0 and lse = -inf. q is
    [num_qo_heads, qo_len, head_dim] and k, v [num_kv_heads, kv_len, head_dim] (HND)."""

    def __init__(self, float_workspace_buffer, backend: str = "auto") -> None:
        _check_backend(backend)
        self._float_workspace_buffer = float_workspace_buffer
        self._native = _kv.BatchPrefill(_workspace(float_workspace_buffer), "NHD")
        self._planned = None

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None,
                               vector_sparse_indices_buffer=None,
                               vector_sparse_indptr_buffer=None) -> None:
        self._float_workspace_buffer = float_workspace_buffer
        self._native = _kv.BatchPrefill(_workspace(float_workspace_buffer), "NHD")
        if self._planned is not None:
            self.plan(**self._planned)

    def plan(self, block_mask_map, block_row_sz, block_col_sz, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
             non_blocking: bool = True, q_data_type="float16", kv_data_type=None) -> None:
        """block_mask_map bool [num_kv_heads, row blocks, column blocks]; block_row_sz int
        [num_kv_heads, row blocks] and block_col_sz [num_kv_heads, column blocks], each head's
        sizes summing to qo_len and kv_len (host or device; read on the host)."""
        import numpy as np

        if use_fp16_qk_reduction:
            _unsupported("use_fp16_qk_reduction", "kvattn accumulates q.k in f32")
        planned = dict(block_mask_map=block_mask_map, block_row_sz=block_row_sz,
                       block_col_sz=block_col_sz, num_qo_heads=num_qo_heads,
                       num_kv_heads=num_kv_heads, head_dim=head_dim, causal=causal,
                       pos_encoding_mode=pos_encoding_mode, logits_soft_cap=logits_soft_cap,
                       sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
                       q_data_type=q_data_type, kv_data_type=kv_data_type)
        hq, hkv = int(num_qo_heads), int(num_kv_heads)
        if hkv < 1 or hq < 1 or hq % hkv:
            raise _kv.Error(f"num_qo_heads = {hq} is not a multiple of num_kv_heads = {hkv}")
        mask = _np(block_mask_map).astype(bool)
        rows = _np(block_row_sz).astype(np.int64)
        cols = _np(block_col_sz).astype(np.int64)
        if mask.ndim != 3 or mask.shape[0] != hkv:
            raise _kv.Error(f"block_mask_map has shape {list(mask.shape)} but must be [num_kv_heads = "
                            f"{hkv}, row blocks, column blocks]")
        if rows.shape != mask.shape[:2]:
            raise _kv.Error(f"block_row_sz has shape {list(rows.shape)} but block_mask_map's "
                            f"[num_kv_heads, row blocks] is {list(mask.shape[:2])}")
        if cols.shape != (mask.shape[0], mask.shape[2]):
            raise _kv.Error(f"block_col_sz has shape {list(cols.shape)} but block_mask_map's "
                            f"[num_kv_heads, column blocks] is {[mask.shape[0], mask.shape[2]]}")
        for name, sz in (("block_row_sz", rows), ("block_col_sz", cols)):
            if sz.size and sz.min() < 0:
                h, b = np.argwhere(sz < 0)[0]
                raise _kv.Error(f"{name}[{h}, {b}] = {sz[h, b]} is negative")
            totals = sz.sum(axis=1)
            if totals.size and np.any(totals != totals[0]):
                h = int(np.argmax(totals != totals[0]))
                raise _kv.Error(f"{name} sums to {totals[h]} for KV head {h} but {totals[0]} for "
                                "KV head 0; every head covers the same tokens")
        qo_len = int(rows.sum(axis=1)[0]) if rows.size else 0
        kv_len = int(cols.sum(axis=1)[0]) if cols.size else 0
        # Request (h, r): the token ids, in the page-1 cache of all heads' keys (head h's at
        # h * kv_len), of its selected column blocks in order.
        col_start = np.cumsum(cols, axis=1) - cols + (np.arange(hkv) * kv_len)[:, None]
        h_idx, r_idx, c_idx = np.nonzero(mask)
        lengths = cols[h_idx, c_idx]
        per_request = np.zeros(hkv * mask.shape[1], np.int64)
        np.add.at(per_request, h_idx * mask.shape[1] + r_idx, lengths)
        ends = np.cumsum(lengths)
        ids = (np.repeat(col_start[h_idx, c_idx] - (ends - lengths), lengths)
               + np.arange(int(ends[-1]) if ends.size else 0))
        kv_indptr = np.concatenate([[0], np.cumsum(per_request)]).astype(np.int32)
        last = np.minimum(per_request, 1).astype(np.int32)
        qo_indptr = np.concatenate([[0], np.cumsum(rows.ravel())]).astype(np.int32)
        q_name = _kv_dtype_name(q_data_type)
        kv_name = _kv_dtype_name(kv_data_type) or q_name
        variant = _variant(causal=causal, pos_encoding_mode=pos_encoding_mode,
                           logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                           rope_scale=rope_scale, rope_theta=rope_theta)
        self._native.plan(qo_indptr=qo_indptr, page_table=(kv_indptr, ids.astype(np.int32), last),
                          page_size=1, num_qo_heads=hq // hkv, num_kv_heads=1,
                          head_dim_qk=int(head_dim), q_dtype=q_name, kv_dtype=kv_name,
                          o_dtype=q_name, variant=variant)
        self._shape = (hq, hkv, qo_len, kv_len, int(head_dim))
        self._planned = planned

    begin_forward = plan

    def run(self, q, k, v, out=None, lse=None, return_lse: bool = False,
            enable_pdl: Optional[bool] = None):
        """q [num_qo_heads, qo_len, head_dim], k / v [num_kv_heads, kv_len, head_dim]. Returns out
        [num_qo_heads, qo_len, head_dim], or (out, lse [num_qo_heads, qo_len]) with return_lse."""
        if self._planned is None:
            raise RuntimeError("VariableBlockSparseAttentionWrapper.run() was called before plan()")
        hq, hkv, qo_len, kv_len, d = self._shape
        g = hq // hkv
        for name, x, want in (("q", q, (hq, qo_len, d)), ("k", k, (hkv, kv_len, d)),
                              ("v", v, (hkv, kv_len, d))):
            if tuple(x.shape) != want:
                raise _kv.Error(f"{name} has shape {list(x.shape)} but the plan needs {list(want)}")
        # The kernel's layout: query rows (KV head, position) x the group's heads; keys as pages
        # of one token of one head.
        q_rows = _contiguous(_permuted(q.reshape(hkv, g, qo_len, d), (0, 2, 1, 3))).reshape(hkv * qo_len, g, d)
        k_pages = _contiguous(k).reshape(hkv * kv_len, 1, 1, d)
        v_pages = _contiguous(v).reshape(hkv * kv_len, 1, 1, d)
        want_lse = return_lse or lse is not None
        res = self._native.run(q_rows, (k_pages, v_pages), return_lse=want_lse)
        o_rows, s_rows = res if want_lse else (res, None)
        o = _contiguous(_permuted(o_rows.reshape(hkv, qo_len, g, d), (0, 2, 1, 3))).reshape(hq, qo_len, d)
        s = None
        if want_lse:
            s = _contiguous(_permuted(s_rows.reshape(hkv, qo_len, g), (0, 2, 1))).reshape(hq, qo_len)
        if out is not None:
            _copy_to(out, o, "out")
            o = out
        if lse is not None:
            _copy_to(lse, s, "lse")
            s = lse
        return (o, s) if want_lse else o

    forward = run


def _copy_to(dst, src, name):
    if tuple(dst.shape) != tuple(src.shape):
        raise _kv.Error(f"{name} has shape {list(dst.shape)} but the result is {list(src.shape)}")
    if _framework(dst) == "torch":
        dst.copy_(src)
    else:
        import numpy as np

        np.copyto(dst, src)
