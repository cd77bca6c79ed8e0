"""flashinfer.sparse: BlockSparseAttentionWrapper over kvattn's paged prefill (a block row is a
request over its listed column blocks)."""

from typing import Optional

import kvattn as _kv
from kvattn.flashinfer._common import (
    _check_backend, _check_ndim, _host_indptr, _host_ints, _kv_dtype_name, _np, _padded_page_table,
    _require_none, _to_host, _unsupported, _variant, _workspace,
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
