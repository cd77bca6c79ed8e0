"""flashinfer.prefill: the paged and ragged BatchPrefill wrappers and single_prefill_with_kv_cache
over kvattn.BatchPrefill."""

import functools
from typing import Optional

import kvattn as _kv
from kvattn.flashinfer._common import (
    _Planned, _WrapperBase, _check_backend, _check_layout, _check_ndim, _copy_into, _dtype_of, _is_cuda,
    _kv_dtype_name, _np, _pack_mask, _require_none, _single_workspace, _slice, _to_host, _to_nhd,
    _unsupported, _variant, _workspace,
)
from kvattn.flashinfer.quantization import packbits


_PREFILL_UNSUPPORTED = dict(
    prefix_len_ptr="POD / multi-item scoring", token_pos_in_items_ptr="multi-item scoring",
    max_item_len_ptr="multi-item scoring", seq_lens="the trtllm-gen / cuDNN backends",
    seq_lens_q="the trtllm-gen / cuDNN backends", block_tables="the trtllm-gen backend",
    max_token_per_sequence="the cuDNN backend", max_sequence_kv="the cuDNN backend")


def _check_prefill_args(use_fp16_qk_reduction, token_pos_in_items_len, extra):
    if use_fp16_qk_reduction:
        _unsupported("use_fp16_qk_reduction", "kvattn accumulates q.k in f32")
    if token_pos_in_items_len:
        _unsupported("token_pos_in_items_len", "multi-item scoring")
    for name, value in extra.items():
        if value is not None:
            _unsupported(name, _PREFILL_UNSUPPORTED[name])


def _graph_buffers(names_and_bufs):
    """use_cuda_graph=True: the buffers FlashInfer requires, each given."""
    missing = [name for name, buf in names_and_bufs if buf is None]
    if missing:
        raise ValueError("use_cuda_graph=True needs " + ", ".join(missing))


def _graph_capacity(wrapper, host_qo, max_batch):
    """The scheduler's CUDA-graph capacity: set by the first graph-mode plan() (its query tokens
    are the most a later plan may have, FlashInfer's rule), checked at the later ones."""
    tokens = int(_np(host_qo)[-1])
    if wrapper._graph_capacity is None:
        wrapper._graph_capacity = _kv.GraphCapacity(max_batch=max_batch, max_tokens=max(tokens, 1))
    elif tokens > wrapper._graph_capacity.max_tokens:
        raise ValueError(f"qo_indptr: {tokens} query tokens, more than the "
                         f"{wrapper._graph_capacity.max_tokens} of the first plan() in CUDA-graph mode "
                         "(FlashInfer's rule: the first plan sets the most)")
    return wrapper._graph_capacity


def _copy_mask(bufs, mask, mask_indptr):
    """Graph mode: the packed mask and its offsets into custom_mask_buf / mask_indptr_buf, when
    given (kvattn stages its own copy in the workspace)."""
    if mask is None:
        return
    if bufs["custom_mask"] is not None:
        _copy_into(bufs["custom_mask"], mask, "custom_mask_buf")
    if bufs["mask_indptr"] is not None:
        _copy_into(bufs["mask_indptr"], mask_indptr, "mask_indptr_buf")


class BatchPrefillWithPagedKVCacheWrapper(_WrapperBase):
    """Prefill / append attention over a paged KV cache (FlashInfer's wrapper of the same name, on
    kvattn.BatchPrefill). The causal mask is aligned bottom-right (query i at kv_len - qo_len + i).

    use_cuda_graph=True needs qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf and
    paged_kv_last_page_len_buf, sized for the largest batch: plan() copies the page table into them
    (the kernels read the page ids from there at run and graph-replay time) and the first plan's
    query tokens are the most any later plan may have (FlashInfer's rule). custom_mask_buf and
    mask_indptr_buf, when given, receive the packed mask and its offsets (kvattn stages its own
    copy in the workspace)."""

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend: str = "auto", jit_args=None) -> None:
        self._init_common(float_workspace_buffer, kv_layout, backend, jit_args)
        self._use_cuda_graph = bool(use_cuda_graph)
        if use_cuda_graph:
            _graph_buffers([("qo_indptr_buf", qo_indptr_buf), ("paged_kv_indptr_buf", paged_kv_indptr_buf),
                            ("paged_kv_indices_buf", paged_kv_indices_buf),
                            ("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf)])
        self._graph_bufs = dict(qo_indptr=qo_indptr_buf, paged_kv_indptr=paged_kv_indptr_buf,
                                paged_kv_indices=paged_kv_indices_buf,
                                paged_kv_last_page_len=paged_kv_last_page_len_buf,
                                custom_mask=custom_mask_buf, mask_indptr=mask_indptr_buf)
        self._graph_capacity = None  # set by the first graph-mode plan()
        self._native = self._make_native()

    def _graph_tables(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                      host_qo, host_indptr, gpu):
        """Graph mode: the tables copied into the fixed buffers; returns the page ids the plan
        reads (the buffer's first nnz) and the scheduler's capacity."""
        b = self._graph_bufs
        capacity = _graph_capacity(self, host_qo, len(b["qo_indptr"]) - 1)
        _copy_into(b["qo_indptr"], qo_indptr, "qo_indptr_buf")
        _copy_into(b["paged_kv_indptr"], paged_kv_indptr, "paged_kv_indptr_buf")
        _copy_into(b["paged_kv_last_page_len"], paged_kv_last_page_len, "paged_kv_last_page_len_buf")
        nnz = int(_np(host_indptr)[-1])
        page_ids = _copy_into(b["paged_kv_indices"], _slice(paged_kv_indices, nnz), "paged_kv_indices_buf")
        return (page_ids if gpu else _to_host(page_ids)), capacity

    def _make_native(self):
        return _kv.BatchPrefill(_workspace(self._float_workspace_buffer), self._kv_layout)

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
             num_qo_heads: int, num_kv_heads: int, head_dim_qk: int, page_size: int,
             head_dim_vo: Optional[int] = None, custom_mask=None, packed_custom_mask=None,
             causal: bool = False, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, sm_scale: Optional[float] = None,
             window_left: int = -1, logits_soft_cap: Optional[float] = None,
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
             q_data_type="float16", kv_data_type=None, non_blocking: bool = True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len: int = 0,
             max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None,
             max_token_per_sequence=None, max_sequence_kv=None) -> None:
        """Plans the batch: qo_indptr [B+1] and the paged table (int32). custom_mask: a flat bool
        mask of each request's qo_len x kv_len in turn (or packed_custom_mask: its little-endian
        segment_packbits); causal / window_left / logits_soft_cap / pos_encoding_mode as FlashInfer."""
        _check_prefill_args(use_fp16_qk_reduction, token_pos_in_items_len, dict(
            prefix_len_ptr=prefix_len_ptr, token_pos_in_items_ptr=token_pos_in_items_ptr,
            max_item_len_ptr=max_item_len_ptr, seq_lens=seq_lens, seq_lens_q=seq_lens_q,
            block_tables=block_tables, max_token_per_sequence=max_token_per_sequence,
            max_sequence_kv=max_sequence_kv))
        q_name = _kv_dtype_name(q_data_type)
        kv_name = _kv_dtype_name(kv_data_type) or q_name
        host_qo = _to_host(qo_indptr)
        host_indptr = _to_host(paged_kv_indptr)
        host_last = _to_host(paged_kv_last_page_len)
        gpu = _is_cuda(self._float_workspace_buffer)
        graph = None
        if self._use_cuda_graph:
            page_ids, graph = self._graph_tables(qo_indptr, paged_kv_indptr, paged_kv_indices,
                                                 paged_kv_last_page_len, host_qo, host_indptr, gpu)
        else:
            page_ids = paged_kv_indices if gpu else _to_host(paged_kv_indices)
        mask, mask_indptr = _pack_mask(custom_mask, packed_custom_mask, host_qo,
                                       (host_indptr, page_ids, host_last), paged=True,
                                       page_size=int(page_size))
        if self._use_cuda_graph:
            _copy_mask(self._graph_bufs, mask, mask_indptr)
        variant_kwargs = dict(causal=causal, pos_encoding_mode=pos_encoding_mode,
                              window_left=window_left, logits_soft_cap=logits_soft_cap,
                              sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
                              user=self._jit_variant)
        native_kwargs = dict(qo_indptr=host_qo, page_table=(host_indptr, page_ids, host_last),
                             page_size=int(page_size), custom_mask=mask, mask_indptr=mask_indptr,
                             num_qo_heads=int(num_qo_heads), num_kv_heads=int(num_kv_heads),
                             head_dim_qk=int(head_dim_qk), head_dim_vo=int(head_dim_vo or 0),
                             q_dtype=q_name, kv_dtype=kv_name, o_dtype=q_name)
        if graph is not None:
            native_kwargs["scheduler"] = _kv.SchedulerOptions(cuda_graph=graph)
        v = _variant(**variant_kwargs)
        if mask is not None:
            v = v.with_custom_mask()
            variant_kwargs["_custom_mask"] = True
        self._native.plan(**native_kwargs, variant=v)
        self._planned = _Planned(native_kwargs, variant_kwargs, q_name)

    begin_forward = plan

    def _replan_for(self, **overrides):
        p = self._planned
        custom = p.variant_kwargs.get("_custom_mask", False)
        vk = {k: val for k, val in p.variant_kwargs.items() if k != "_custom_mask"}
        changed = any(val is not None and vk.get(k) != val for k, val in overrides.items())
        if changed and self._use_cuda_graph:
            _unsupported(", ".join(k for k, v in overrides.items() if v is not None),
                         "a run() override differing from plan() in CUDA-graph mode; pass it to plan()")
        if changed:
            vk.update({k: val for k, val in overrides.items() if val is not None})
            v = _variant(**vk)
            self._native.plan(**p.native_kwargs, variant=v.with_custom_mask() if custom else v)
            if custom:
                vk["_custom_mask"] = True
            self._planned = _Planned(p.native_kwargs, vk, p.out_dtype)

    def run(self, q, paged_kv_cache, *args, k_scale: Optional[float] = None,
            v_scale: Optional[float] = None, out=None, lse=None, return_lse: bool = False,
            enable_pdl: Optional[bool] = None, window_left: Optional[int] = None):
        """Prefill attention: q [nnz_qo, num_qo_heads, head_dim_qk]; paged_kv_cache (k, v) or 5-D.
        Returns out, or (out, lse) with return_lse=True."""
        if args:
            _unsupported("*args", "extra positional arguments of JIT variants")
        if self._planned is None:
            raise RuntimeError("BatchPrefillWithPagedKVCacheWrapper.run() was called before plan()")
        self._replan_for(k_scale=k_scale, v_scale=v_scale, window_left=window_left)
        return self._run(q, paged_kv_cache, None, out, lse, return_lse)

    def forward(self, q, paged_kv_cache, causal: bool = False, pos_encoding_mode: str = "NONE",
                use_fp16_qk_reduction: bool = False, k_scale: Optional[float] = None,
                v_scale: Optional[float] = None, window_left: int = -1,
                logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
                rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
                return_lse: bool = False):
        """Deprecated in FlashInfer: run() with these variant arguments in place of plan()'s."""
        self._respecify(use_fp16_qk_reduction, causal=causal, pos_encoding_mode=pos_encoding_mode,
                        window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                        rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, return_lse=return_lse)

    run_return_lse = functools.partialmethod(run, return_lse=True)
    forward_return_lse = functools.partialmethod(forward, return_lse=True)

    def end_forward(self) -> None:
        pass


class BatchPrefillWithRaggedKVCacheWrapper(_WrapperBase):
    """Prefill attention over ragged K/V ([nnz_kv, num_kv_heads, head_dim], NHD) for a batch
    (FlashInfer's wrapper of the same name, on kvattn.BatchPrefill). use_cuda_graph=True needs
    qo_indptr_buf and kv_indptr_buf (plan() copies the indptrs into them; the first plan's query
    tokens are the most a later plan may have), as the paged wrapper; a captured run() reads the
    K/V tensors it was captured with."""

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend: str = "auto", jit_args=None) -> None:
        self._init_common(float_workspace_buffer, kv_layout, backend, jit_args)
        if kv_layout != "NHD":
            _unsupported("kv_layout", f"{kv_layout!r} for ragged K/V; kvattn takes NHD "
                         "([nnz, heads, dim])")
        self._use_cuda_graph = bool(use_cuda_graph)
        if use_cuda_graph:
            _graph_buffers([("qo_indptr_buf", qo_indptr_buf), ("kv_indptr_buf", kv_indptr_buf)])
        self._graph_bufs = dict(qo_indptr=qo_indptr_buf, kv_indptr=kv_indptr_buf,
                                custom_mask=custom_mask_buf, mask_indptr=mask_indptr_buf)
        self._graph_capacity = None  # set by the first graph-mode plan()
        self._native = self._make_native()

    def _make_native(self):
        return _kv.BatchPrefill(_workspace(self._float_workspace_buffer), "NHD")

    def plan(self, qo_indptr, kv_indptr, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
             head_dim_vo: Optional[int] = None, custom_mask=None, packed_custom_mask=None,
             causal: bool = False, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, window_left: int = -1,
             logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
             q_data_type="float16", kv_data_type=None, non_blocking: bool = True,
             prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len: int = 0,
             max_item_len_ptr=None) -> None:
        """Plans the batch: qo_indptr and kv_indptr [B+1] (int32). Other arguments as
        BatchPrefillWithPagedKVCacheWrapper.plan."""
        _check_prefill_args(use_fp16_qk_reduction, token_pos_in_items_len, dict(
            prefix_len_ptr=prefix_len_ptr, token_pos_in_items_ptr=token_pos_in_items_ptr,
            max_item_len_ptr=max_item_len_ptr))
        q_name = _kv_dtype_name(q_data_type)
        kv_name = _kv_dtype_name(kv_data_type) or q_name
        host_qo = _to_host(qo_indptr)
        host_kv = _to_host(kv_indptr)
        mask, mask_indptr = _pack_mask(custom_mask, packed_custom_mask, host_qo, host_kv)
        graph = None
        if self._use_cuda_graph:
            b = self._graph_bufs
            graph = _graph_capacity(self, host_qo, len(b["qo_indptr"]) - 1)
            _copy_into(b["qo_indptr"], qo_indptr, "qo_indptr_buf")
            _copy_into(b["kv_indptr"], kv_indptr, "kv_indptr_buf")
            _copy_mask(b, mask, mask_indptr)
        variant_kwargs = dict(causal=causal, pos_encoding_mode=pos_encoding_mode,
                              window_left=window_left, logits_soft_cap=logits_soft_cap,
                              sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
                              user=self._jit_variant)
        native_kwargs = dict(qo_indptr=host_qo, kv_indptr=host_kv, custom_mask=mask,
                             mask_indptr=mask_indptr, num_qo_heads=int(num_qo_heads),
                             num_kv_heads=int(num_kv_heads), head_dim_qk=int(head_dim_qk),
                             head_dim_vo=int(head_dim_vo or 0), q_dtype=q_name, kv_dtype=kv_name,
                             o_dtype=q_name)
        if graph is not None:
            native_kwargs["scheduler"] = _kv.SchedulerOptions(cuda_graph=graph)
        v = _variant(**variant_kwargs)
        if mask is not None:
            v = v.with_custom_mask()
        self._native.plan(**native_kwargs, variant=v)
        self._planned = _Planned(native_kwargs, variant_kwargs, q_name)

    begin_forward = plan

    def run(self, q, k, v, *args, out=None, lse=None, return_lse: bool = False,
            enable_pdl: Optional[bool] = None):
        """Ragged prefill: q [nnz_qo, Hq, Dqk], k [nnz_kv, Hkv, Dqk], v [nnz_kv, Hkv, Dvo].
        Returns out, or (out, lse) with return_lse=True."""
        if args:
            _unsupported("*args", "extra positional arguments of JIT variants")
        if self._planned is None:
            raise RuntimeError("BatchPrefillWithRaggedKVCacheWrapper.run() was called before plan()")
        return self._run(q, k, v, out, lse, return_lse)

    def forward(self, q, k, v, causal: bool = False, pos_encoding_mode: str = "NONE",
                use_fp16_qk_reduction: bool = False, window_left: int = -1,
                logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
                rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
                return_lse: bool = False):
        """Deprecated in FlashInfer: run() with these variant arguments in place of plan()'s."""
        self._respecify(use_fp16_qk_reduction, causal=causal, pos_encoding_mode=pos_encoding_mode,
                        window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                        rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, k, v, return_lse=return_lse)

    run_return_lse = functools.partialmethod(run, return_lse=True)
    forward_return_lse = functools.partialmethod(forward, return_lse=True)

    def end_forward(self) -> None:
        pass


def single_prefill_with_kv_cache(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None,
                                 custom_mask=None, packed_custom_mask=None, causal: bool = False,
                                 kv_layout: str = "NHD", pos_encoding_mode: str = "NONE",
                                 use_fp16_qk_reduction: bool = False,
                                 sm_scale: Optional[float] = None, window_left: int = -1,
                                 logits_soft_cap: Optional[float] = None,
                                 rope_scale: Optional[float] = None,
                                 rope_theta: Optional[float] = None, backend: str = "auto",
                                 return_lse: bool = False):
    """Prefill / append attention of one request: q [qo_len, num_qo_heads, head_dim_qk] over k, v
    ([kv_len, num_kv_heads, head_dim] in NHD, [num_kv_heads, kv_len, head_dim] in HND), the causal
    mask aligned bottom-right (query i at kv_len - qo_len + i; kvattn needs qo_len <= kv_len).
    custom_mask: bool [qo_len, kv_len] (True: attend), or packed_custom_mask: its little-endian
    packbits; either replaces causal. Returns out [qo_len, num_qo_heads, head_dim_vo] (o_dtype,
    default q's), or (out, lse [qo_len, num_qo_heads], base 2) with return_lse. On
    kvattn.BatchPrefill (ragged KV, HND as a transposed view: no copy)."""
    _require_none(scale_q=scale_q, scale_k=scale_k, scale_v=scale_v)
    if use_fp16_qk_reduction:
        _unsupported("use_fp16_qk_reduction", "kvattn accumulates q.k in f32")
    _check_backend(backend)
    _check_layout(kv_layout)
    _check_ndim(q, "q", 3, "[qo_len, num_qo_heads, head_dim]")
    _check_ndim(k, "k", 3, f"[kv_len, num_kv_heads, head_dim] ({kv_layout})")
    _check_ndim(v, "v", 3, f"[kv_len, num_kv_heads, head_dim_vo] ({kv_layout})")
    kk, vv = _to_nhd(k, kv_layout), _to_nhd(v, kv_layout)
    qo_len, kv_len = int(q.shape[0]), int(kk.shape[0])
    q_name = _dtype_of(q, "q")
    mask = mask_indptr = None
    if custom_mask is not None or packed_custom_mask is not None:
        nbytes = (qo_len * kv_len + 7) // 8
        # Masks on the host, where plan() reads them (a device tensor, as FlashInfer's callers
        # pass it, is read back).
        if packed_custom_mask is not None:
            mask = _to_host(packed_custom_mask)
        else:
            shape = tuple(int(s) for s in getattr(custom_mask, "shape", ()))
            if shape != (qo_len, kv_len):
                raise _kv.Error(f"custom_mask has shape {list(shape)} but [qo_len, kv_len] = "
                                f"[{qo_len}, {kv_len}] is expected")
            mask = packbits(_to_host(custom_mask), "little")
        mask_indptr = [0, nbytes]
    variant = _variant(causal=causal and mask is None, pos_encoding_mode=pos_encoding_mode,
                       window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                       rope_scale=rope_scale, rope_theta=rope_theta)
    if mask is not None:
        variant = variant.with_custom_mask()
    w = _kv.BatchPrefill(_single_workspace(q), "NHD")
    w.plan(qo_indptr=[0, qo_len], kv_indptr=[0, kv_len], custom_mask=mask, mask_indptr=mask_indptr,
           num_qo_heads=int(q.shape[1]), num_kv_heads=int(kk.shape[1]), head_dim_qk=int(q.shape[2]),
           head_dim_vo=int(vv.shape[2]), q_dtype=q_name, kv_dtype=_dtype_of(k, "k"),
           o_dtype=_kv_dtype_name(o_dtype) or q_name, variant=variant)
    return w.run(q, kk, vv, return_lse=return_lse)


single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache,
                                                            return_lse=True)
