"""FlashInfer-compatible names over kvattn (issue 26's `kvattn.flashinfer`).

The wrappers take FlashInfer 0.3's argument names, order and defaults, so that code written for
`flashinfer` runs with `import kvattn.flashinfer as flashinfer`:

    BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper, BlockSparseAttentionWrapper,
    MultiLevelCascadeAttentionWrapper, single_decode_with_kv_cache, single_prefill_with_kv_cache
    (and its _return_lse form), merge_state, merge_state_in_place, merge_states,
    append_paged_kv_cache, get_seq_lens, get_batch_indices_positions, packbits, segment_packbits,
    apply_rope(_inplace), apply_rope_pos_ids(_inplace), apply_llama31_rope(_inplace),
    apply_llama31_rope_pos_ids(_inplace), apply_rope_with_cos_sin_cache(_inplace)

Conventions kept: LSE in base 2; run() returns out, or (out, lse) with return_lse=True; the paged
cache is a (k_cache, v_cache) tuple or a 5-D [pages, 2, ...] tensor in NHD or HND; dtypes as torch
dtypes or strings ("float16"); index arrays int32. Tensors may be torch (CPU or CUDA) or numpy
arrays (the CPU backend). A FlashInfer parameter that kvattn does not support raises
NotImplementedError naming it (never silently ignored); performance hints that do not change the
result (use_tensor_cores, enable_pdl, non_blocking) are accepted.
"""

import functools
from typing import Any, List, Optional, Sequence, Tuple

import kvattn as _kv
from kvattn import _kvattn as _native

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "append_paged_kv_cache",
    "get_seq_lens",
    "get_batch_indices_positions",
    "packbits",
    "segment_packbits",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "BlockSparseAttentionWrapper",
    "MultiLevelCascadeAttentionWrapper",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
]


# ---- helpers ----------------------------------------------------------------------------------------
def _unsupported(name: str, why: str = "") -> None:
    raise NotImplementedError(
        f"kvattn.flashinfer: parameter {name!r} is not supported" + (f" ({why})" if why else ""))


def _require_default(name: str, value: Any, default: Any = None, why: str = "") -> None:
    if value is None and default is None:
        return
    if value is not default and value != default:
        _unsupported(name, why)


def _framework(x) -> str:
    return type(x).__module__.split(".", 1)[0]


def _is_cuda(x) -> bool:
    if x is None:
        return False
    if hasattr(x, "__dlpack_device__"):
        return x.__dlpack_device__()[0] in (2, 13)  # kDLCUDA, kDLCUDAManaged
    return False


def _to_host(x):
    """A host (CPU) array of x: torch .cpu(), cupy .get(); numpy and lists as they are."""
    if x is None or isinstance(x, (list, tuple)):
        return x
    fw = _framework(x)
    if fw == "torch":
        return x if x.device.type == "cpu" else x.cpu()
    if fw == "cupy":
        return x.get()
    return x


def _np(x):
    import numpy as np

    x = _to_host(x)
    if _framework(x) == "torch":
        return x.numpy()
    return np.asarray(x)


_ALIASES = {
    "f32": ("float32", "float", "fp32"), "f16": ("float16", "half", "fp16"),
    "bf16": ("bfloat16",), "e4m3": ("float8_e4m3fn", "fp8_e4m3"), "e5m2": ("float8_e5m2", "fp8_e5m2"),
    "i32": ("int32",), "u8": ("uint8",),
}


def _same_dtype(t, d) -> bool:
    if isinstance(d, _kv.DType):
        return d == t
    s = d if isinstance(d, str) else getattr(d, "__name__", None) or str(d)
    s = s.replace("torch.", "")
    return s == t.name or s in _ALIASES[t.name]


def _kv_dtype_name(d) -> Optional[str]:
    """The kvattn dtype name of a FlashInfer dtype argument (torch dtype or string), or None."""
    if d is None:
        return None
    for t in _kv.DType:
        if _same_dtype(t, d):
            return t.name
    raise _kv.DTypeError(f"dtype {d!r} is not supported by kvattn (float32, float16, bfloat16, "
                         "float8_e4m3fn, float8_e5m2)")


def _variant(*, causal=False, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None,
             sm_scale=None, rope_scale=None, rope_theta=None, q_scale=None, k_scale=None,
             v_scale=None) -> "_kv.Variant":
    v = _kv.Variant(causal=bool(causal))
    if window_left is not None and window_left >= 0:
        v = v.with_window(int(window_left))
    if logits_soft_cap:
        v = v.with_soft_cap(float(logits_soft_cap))
    mode = pos_encoding_mode
    if mode == "ROPE_LLAMA":
        v = v.with_rope(_kv.RopeConfig(rope_scale=1.0 if rope_scale is None else float(rope_scale),
                                       rope_theta=1e4 if rope_theta is None else float(rope_theta)))
    elif mode == "ALIBI":
        v = v.with_alibi()
    elif mode != "NONE":
        _unsupported("pos_encoding_mode", f"{mode!r}; kvattn takes NONE, ROPE_LLAMA or ALIBI")
    if sm_scale is not None:
        v = v.with_sm_scale(float(sm_scale))
    if q_scale is not None or k_scale is not None or v_scale is not None:
        v = v.with_scales(_scalar(q_scale), _scalar(k_scale), _scalar(v_scale))
    return v


def _scalar(x) -> float:
    if x is None:
        return 1.0
    if hasattr(x, "item"):
        return float(x.item())
    return float(x)


def _workspace(buf):
    """The workspace the native wrapper gets: the buffer on a GPU, none for the CPU backend (a host
    uint8 buffer is used as scratch when large enough)."""
    return buf


def _check_layout(kv_layout: str) -> str:
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout = {kv_layout!r} is not a layout (NHD or HND)")
    return kv_layout


def _copy_into(buf, x, name):
    """buf[:len(x)] = x, in buf's framework (the fixed buffers of CUDA-graph mode)."""
    n = len(x)
    if len(buf) < n:
        raise ValueError(f"{name} holds {len(buf)} elements but the plan needs {n}")
    if _framework(buf) == "torch":
        import torch

        src = x if _framework(x) == "torch" else torch.as_tensor(_np(x))
        buf[:n].copy_(src, non_blocking=True)
    else:
        buf[:n] = _np(x)
    return buf[:n]


def _mask_indptr(qo_indptr, kv_indptr_or_table, paged=False, page_size=1):
    """Byte offsets of each request's packed mask: ceil(qo_len * kv_len / 8) bytes each. The index
    arrays are checked first by the library's own checks (kvattn.Error naming the array), as
    plan() would."""
    import numpy as np

    qo = np.array(_native._indptr_values("qo_indptr", qo_indptr), dtype=np.int64)
    if paged:
        kv_lens = np.array(_native._page_table_lengths(kv_indptr_or_table, page_size), dtype=np.int64)
        what = "the page table"
    else:
        kvp = np.array(_native._indptr_values("kv_indptr", kv_indptr_or_table), dtype=np.int64)
        kv_lens = kvp[1:] - kvp[:-1]
        what = "kv_indptr"
    if len(qo) - 1 != len(kv_lens):
        raise _kv.Error(f"qo_indptr has {len(qo)} elements (batch_size {len(qo) - 1}) but {what} "
                        f"describes batch_size {len(kv_lens)}")
    sizes = (qo[1:] - qo[:-1]) * kv_lens
    return np.concatenate([[0], np.cumsum((sizes + 7) // 8)]).astype(np.int32), sizes


def _pack_mask(custom_mask, packed_custom_mask, qo_indptr, kv, paged=False, page_size=1):
    """(packed mask, mask_indptr) for the native plan: packed_custom_mask as given (the library
    checks its dtype and length; a device tensor, as FlashInfer's callers pass it, is read back to
    the host, where plan() reads masks), or custom_mask (flat bools) packed little-endian."""
    import numpy as np

    if custom_mask is None and packed_custom_mask is None:
        return None, None
    mask_indptr, sizes = _mask_indptr(qo_indptr, kv, paged, page_size)
    if packed_custom_mask is not None:
        return _to_host(packed_custom_mask), mask_indptr
    flat = _np(custom_mask).astype(bool).ravel()
    bit_indptr = np.concatenate([[0], np.cumsum(sizes)])
    if len(flat) != bit_indptr[-1]:
        raise _kv.Error(f"custom_mask has {len(flat)} elements but the batch's qo_len x kv_len "
                        f"sum to {int(bit_indptr[-1])}")
    packed, _ = segment_packbits(flat, bit_indptr, bitorder="little")
    return np.asarray(packed, dtype=np.uint8), mask_indptr


class _Planned:
    """The arguments of the last plan(), for the run-time overrides (scales, window_left)."""

    def __init__(self, native_kwargs, variant_kwargs, out_dtype):
        self.native_kwargs = native_kwargs
        self.variant_kwargs = variant_kwargs
        self.out_dtype = out_dtype


class _WrapperBase:
    def _init_common(self, float_workspace_buffer, kv_layout, backend, jit_args):
        if backend not in ("auto",):
            _unsupported("backend", f"{backend!r}; kvattn chooses its kernels itself ('auto')")
        _require_default("jit_args", jit_args)
        self._float_workspace_buffer = float_workspace_buffer
        self._kv_layout = _check_layout(kv_layout)
        self._planned: Optional[_Planned] = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None) -> None:
        self._float_workspace_buffer = float_workspace_buffer
        self._native = self._make_native()
        self._planned = None

    def _replan_for(self, **overrides) -> None:
        """Re-plans when run() asks for other scales or window than plan() had."""
        p = self._planned
        vk = dict(p.variant_kwargs)
        changed = False
        for key, val in overrides.items():
            if val is not None and vk.get(key) != val:
                vk[key] = val
                changed = True
        if changed:
            if self._use_cuda_graph:
                _unsupported(", ".join(k for k, v in overrides.items() if v is not None),
                             "a run() override differing from plan() in CUDA-graph mode; "
                             "pass it to plan()")
            self._native.plan(**p.native_kwargs, variant=_variant(**vk))
            self._planned = _Planned(p.native_kwargs, vk, p.out_dtype)

    def _run(self, q, k, v, out, lse, return_lse):
        if self._planned is None:
            raise RuntimeError(f"{type(self).__name__}.run() was called before plan()")
        if lse is not None:
            return_lse = True
        res = self._native.run(q, k, v, out=out, lse=lse, return_lse=return_lse)
        return res


# ---- decode --------------------------------------------------------------------------------------------
class BatchDecodeWithPagedKVCacheWrapper(_WrapperBase):
    """Decode attention over a paged KV cache for a batch of requests (FlashInfer's wrapper of the
    same name, on kvattn.BatchDecode).

    float_workspace_buffer: a uint8 tensor on the device that runs (torch CUDA: kvattn's GPU
    backend; CPU tensor or numpy array: the CPU backend). use_cuda_graph=True needs the three
    paged_kv_*_buffer arrays, sized for the largest batch: plan() copies the page table into them
    and the kernels read the page ids from there at run (and graph-replay) time.
    """

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 use_tensor_cores: bool = False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend: str = "auto", jit_args=None) -> None:
        self._init_common(float_workspace_buffer, kv_layout, backend, jit_args)
        self._use_cuda_graph = bool(use_cuda_graph)
        self._use_tensor_cores = bool(use_tensor_cores)  # a hint: kvattn picks its kernels
        if use_cuda_graph and (paged_kv_indptr_buffer is None or paged_kv_indices_buffer is None
                               or paged_kv_last_page_len_buffer is None):
            raise ValueError("use_cuda_graph=True needs paged_kv_indptr_buffer, "
                             "paged_kv_indices_buffer and paged_kv_last_page_len_buffer")
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._native = self._make_native()

    def _make_native(self):
        return _kv.BatchDecode(_workspace(self._float_workspace_buffer), self._kv_layout)

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    def plan(self, indptr, indices, last_page_len, num_qo_heads: int, num_kv_heads: int,
             head_dim: int, page_size: int, pos_encoding_mode: str = "NONE", window_left: int = -1,
             logits_soft_cap: Optional[float] = None, q_data_type="float16", kv_data_type=None,
             data_type=None, sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, non_blocking: bool = True, block_tables=None,
             seq_lens=None, fixed_split_size: Optional[int] = None,
             disable_split_kv: bool = False) -> None:
        """Plans the batch: indptr [B+1], indices [nnz], last_page_len [B] (int32; host or device:
        indptr and last_page_len are read on the host). data_type (deprecated in FlashInfer) sets
        both q_data_type and kv_data_type."""
        _require_default("block_tables", block_tables, why="the trtllm-gen backend's page table")
        _require_default("seq_lens", seq_lens, why="the trtllm-gen backend's lengths")
        if data_type is not None:
            q_data_type = kv_data_type = data_type
        q_name = _kv_dtype_name(q_data_type)
        kv_name = _kv_dtype_name(kv_data_type) or q_name
        host_indptr = _to_host(indptr)
        host_last = _to_host(last_page_len)
        gpu = _is_cuda(self._float_workspace_buffer)
        if self._use_cuda_graph:
            nnz = int(_np(host_indptr)[-1])
            _copy_into(self._paged_kv_indptr_buf, indptr, "paged_kv_indptr_buffer")
            _copy_into(self._paged_kv_last_page_len_buf, last_page_len, "paged_kv_last_page_len_buffer")
            page_ids = _copy_into(self._paged_kv_indices_buf, _slice(indices, nnz),
                                  "paged_kv_indices_buffer")
            if not gpu:
                page_ids = _to_host(page_ids)
            max_batch = len(self._paged_kv_indptr_buf) - 1
            graph = _kv.GraphCapacity(max_batch=max_batch, max_tokens=max_batch)
        else:
            page_ids = indices if gpu else _to_host(indices)
            graph = None
        sched = _kv.SchedulerOptions(
            fixed_split_size=int(fixed_split_size) if fixed_split_size and fixed_split_size > 0 else 0,
            disable_split_kv=bool(disable_split_kv), cuda_graph=graph)
        variant_kwargs = dict(pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                              logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                              rope_scale=rope_scale, rope_theta=rope_theta)
        native_kwargs = dict(page_table=(host_indptr, page_ids, host_last), page_size=int(page_size),
                             num_qo_heads=int(num_qo_heads), num_kv_heads=int(num_kv_heads),
                             head_dim_qk=int(head_dim), q_dtype=q_name, kv_dtype=kv_name,
                             o_dtype=q_name, scheduler=sched)
        self._native.plan(**native_kwargs, variant=_variant(**variant_kwargs))
        self._planned = _Planned(native_kwargs, variant_kwargs, q_name)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale: Optional[float] = None,
            k_scale: Optional[float] = None, v_scale: Optional[float] = None, out=None, lse=None,
            return_lse: bool = False, enable_pdl: Optional[bool] = None,
            window_left: Optional[int] = None, sinks=None):
        """Decode attention: q [B, num_qo_heads, head_dim]; paged_kv_cache (k_cache, v_cache) or
        5-D. Returns out, or (out, lse) (lse base 2) with return_lse=True. q_scale * k_scale
        scale the logits and v_scale the output (a differing value re-plans, as does window_left)."""
        if args:
            _unsupported("*args", "extra positional arguments of JIT variants")
        _require_default("sinks", sinks, why="attention sinks")
        if self._planned is None:
            raise RuntimeError("BatchDecodeWithPagedKVCacheWrapper.run() was called before plan()")
        self._replan_for(q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, window_left=window_left)
        return self._run(q, paged_kv_cache, None, out, lse, return_lse)

    def forward(self, q, paged_kv_cache, pos_encoding_mode: str = "NONE", q_scale=None,
                k_scale=None, v_scale=None, window_left: int = -1, logits_soft_cap=None,
                sm_scale=None, rope_scale=None, rope_theta=None):
        """Deprecated in FlashInfer: run() with the plan's variant (the variant arguments must
        match plan()'s)."""
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q, paged_kv_cache, **kwargs):
        return self.run(q, paged_kv_cache, return_lse=True,
                        **{k: kwargs[k] for k in ("q_scale", "k_scale", "v_scale") if k in kwargs})

    def end_forward(self) -> None:
        pass


def _slice(x, n):
    return x[:n]


# ---- prefill -----------------------------------------------------------------------------------------
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


class BatchPrefillWithPagedKVCacheWrapper(_WrapperBase):
    """Prefill / append attention over a paged KV cache (FlashInfer's wrapper of the same name, on
    kvattn.BatchPrefill). The causal mask is aligned bottom-right (query i at kv_len - qo_len + i)."""

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend: str = "auto", jit_args=None) -> None:
        self._init_common(float_workspace_buffer, kv_layout, backend, jit_args)
        if use_cuda_graph:
            _unsupported("use_cuda_graph", "graph-mode prefill from Python is not wired yet; "
                         "kvattn.BatchPrefill with SchedulerOptions(cuda_graph=...) is")
        self._use_cuda_graph = False
        self._native = self._make_native()

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
        page_ids = paged_kv_indices if gpu else _to_host(paged_kv_indices)
        mask, mask_indptr = _pack_mask(custom_mask, packed_custom_mask, host_qo,
                                       (host_indptr, page_ids, host_last), paged=True,
                                       page_size=int(page_size))
        variant_kwargs = dict(causal=causal, pos_encoding_mode=pos_encoding_mode,
                              window_left=window_left, logits_soft_cap=logits_soft_cap,
                              sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        native_kwargs = dict(qo_indptr=host_qo, page_table=(host_indptr, page_ids, host_last),
                             page_size=int(page_size), custom_mask=mask, mask_indptr=mask_indptr,
                             num_qo_heads=int(num_qo_heads), num_kv_heads=int(num_kv_heads),
                             head_dim_qk=int(head_dim_qk), head_dim_vo=int(head_dim_vo or 0),
                             q_dtype=q_name, kv_dtype=kv_name, o_dtype=q_name)
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

    def forward(self, q, paged_kv_cache, causal: bool = False, **kwargs):
        return self.run(q, paged_kv_cache)

    def forward_return_lse(self, q, paged_kv_cache, causal: bool = False, **kwargs):
        return self.run(q, paged_kv_cache, return_lse=True)

    def end_forward(self) -> None:
        pass


class BatchPrefillWithRaggedKVCacheWrapper(_WrapperBase):
    """Prefill attention over ragged K/V ([nnz_kv, num_kv_heads, head_dim], NHD) for a batch
    (FlashInfer's wrapper of the same name, on kvattn.BatchPrefill)."""

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend: str = "auto", jit_args=None) -> None:
        self._init_common(float_workspace_buffer, kv_layout, backend, jit_args)
        if kv_layout != "NHD":
            _unsupported("kv_layout", f"{kv_layout!r} for ragged K/V; kvattn takes NHD "
                         "([nnz, heads, dim])")
        if use_cuda_graph:
            _unsupported("use_cuda_graph", "graph-mode prefill from Python is not wired yet")
        self._use_cuda_graph = False
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
        variant_kwargs = dict(causal=causal, pos_encoding_mode=pos_encoding_mode,
                              window_left=window_left, logits_soft_cap=logits_soft_cap,
                              sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        native_kwargs = dict(qo_indptr=host_qo, kv_indptr=host_kv, custom_mask=mask,
                             mask_indptr=mask_indptr, num_qo_heads=int(num_qo_heads),
                             num_kv_heads=int(num_kv_heads), head_dim_qk=int(head_dim_qk),
                             head_dim_vo=int(head_dim_vo or 0), q_dtype=q_name, kv_dtype=kv_name,
                             o_dtype=q_name)
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

    def forward(self, q, k, v, causal: bool = False, **kwargs):
        return self.run(q, k, v)

    def forward_return_lse(self, q, k, v, causal: bool = False, **kwargs):
        return self.run(q, k, v, return_lse=True)

    def end_forward(self) -> None:
        pass


# ---- operations ---------------------------------------------------------------------------------------
def merge_state(v_a, s_a, v_b, s_b) -> Tuple[Any, Any]:
    """(V, S) of two attention states over disjoint KV: v [n, H, D], s [n, H] float32, base 2."""
    return _kv.merge_state(v_a, s_a, v_b, s_b)


def merge_state_in_place(v, s, v_other, s_other, mask=None) -> None:
    """v, s <- merge of (v, s) and (v_other, s_other); rows whose mask is 0 (or False) stay."""
    if mask is not None and _framework(mask) == "torch" and str(mask.dtype) == "torch.bool":
        import torch

        mask = mask.to(torch.uint8)
    elif mask is not None and str(getattr(mask, "dtype", "")) == "bool":
        mask = mask.astype("uint8")
    _kv.merge_state_in_place(v, s, v_other, s_other, mask)


def merge_states(v, s) -> Tuple[Any, Any]:
    """Merges the k states of each row: v [n, k, H, D], s [n, k, H] -> (V [n, H, D], S [n, H])."""
    return _kv.merge_states(v, s)


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                          kv_indices, kv_indptr, kv_last_page_len, kv_layout: str = "NHD") -> None:
    """Writes row r of append_key / append_value at token positions[r] of request
    batch_indices[r] (the page table already counts the appended tokens)."""
    _kv.append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache,
                              (kv_indptr, kv_indices, kv_last_page_len),
                              kv_layout=_check_layout(kv_layout))


def get_seq_lens(kv_indptr, kv_last_page_len, page_size: int):
    """KV length of each request: page_size * (pages - 1) + last_page_len (0 without pages), in
    the framework of kv_indptr."""
    import numpy as np

    ind = _np(kv_indptr).astype(np.int64)
    last = _np(kv_last_page_len).astype(np.int64)
    pages = ind[1:] - ind[:-1]
    lens = np.where(pages > 0, (pages - 1) * page_size + last, 0).astype(np.int32)
    return _like(lens, kv_indptr)


def get_batch_indices_positions(append_indptr, seq_lens, nnz: int):
    """For each of the nnz appended rows: its request and its position, the appended tokens being
    the last append_len of the request's seq_len (FlashInfer's helper). Returns (batch_indices,
    positions), int32, in the framework of append_indptr."""
    import numpy as np

    ind = _np(append_indptr).astype(np.int64)
    lens = _np(seq_lens).astype(np.int64)
    batch = np.zeros(nnz, np.int32)
    pos = np.zeros(nnz, np.int32)
    for b in range(len(ind) - 1):
        a, e = ind[b], ind[b + 1]
        batch[a:e] = b
        pos[a:e] = np.arange(lens[b] - (e - a), lens[b])
    return _like(batch, append_indptr), _like(pos, append_indptr)


def packbits(x, bitorder: str = "big"):
    """numpy.packbits of a flat bool array (bitorder 'big' or 'little')."""
    import numpy as np

    return _like(np.packbits(_np(x).astype(bool).ravel(), bitorder=bitorder), x)


def segment_packbits(x, indptr, bitorder: str = "big"):
    """Packs each segment x[indptr[i]:indptr[i+1]] on its own (each starts a new byte). Returns
    (packed, new_indptr)."""
    import numpy as np

    flat = _np(x).astype(bool).ravel()
    ind = _np(indptr).astype(np.int64)
    parts = [np.packbits(flat[ind[i]:ind[i + 1]], bitorder=bitorder) for i in range(len(ind) - 1)]
    new = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int32)
    packed = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    return _like(packed, x), _like(new, indptr)


def _like(a, ref):
    """numpy array a in ref's framework and on its device (torch), else numpy."""
    if ref is not None and _framework(ref) == "torch":
        import torch

        return torch.from_numpy(a).to(ref.device)
    return a


# ---- pieces shared by the single-request functions, the block-sparse and cascade wrappers -------------
def _check_ndim(x, name: str, ndim: int, what: str) -> None:
    if not hasattr(x, "shape"):
        raise TypeError(f"{name}: expected a tensor (numpy, torch, ...), got {type(x).__name__}")
    if len(x.shape) != ndim:
        raise _kv.Error(f"{name} must be {ndim}-D {what}, got shape {list(x.shape)}")


def _dtype_of(x, name: str) -> str:
    """The kvattn dtype name of tensor x's dtype (DTypeError naming x when kvattn has none)."""
    try:
        return _kv_dtype_name(x.dtype)
    except _kv.DTypeError:
        raise _kv.DTypeError(f"{name} has dtype {x.dtype}, which kvattn does not take (float32, "
                             "float16, bfloat16; float8_e4m3fn, float8_e5m2 for K/V)") from None


_SINGLE_WORKSPACES = {}


def _single_workspace(like):
    """The workspace of a single-request call: none (the CPU backend) for host tensors, else a
    32 MB uint8 buffer on like's device, allocated once per device (FlashInfer's single_*
    functions keep such a buffer too)."""
    if not _is_cuda(like):
        return None
    key = (_framework(like), tuple(like.__dlpack_device__()))
    ws = _SINGLE_WORKSPACES.get(key)
    if ws is None:
        from . import _frameworks

        ws = _SINGLE_WORKSPACES[key] = _frameworks.empty(like, (32 << 20,), "u8")
    return ws


def _host_ints(name: str, x, expected_len: int = -1) -> List[int]:
    """The values of a 1-D int32 array (host or device: copied to the host) or list, checked by the
    library (kvattn.Error naming `name`)."""
    return _native._int32_values(name, _to_host(x), expected_len)


def _host_indptr(name: str, x, expected_len: int = -1) -> List[int]:
    return _native._indptr_values(name, _to_host(x), expected_len)


def _positions_i32(x, name: str):
    """Position ids / offsets / indptr as int32: FlashInfer takes int32 or int64; kvattn reads int32,
    so an int64 array is converted in its own framework: on the host after a range check, on a
    CUDA device without one (the check would read the values back and synchronise; values past
    int32 wrap)."""
    dt = str(getattr(x, "dtype", "")).replace("torch.", "")
    if dt != "int64":
        return x
    if _is_cuda(x):
        if _framework(x) == "torch":
            import torch

            return x.to(torch.int32)
        return x.astype("int32")
    import numpy as np

    host = _np(x)
    if host.size and (host.min() < -(2**31) or host.max() > 2**31 - 1):
        bad = int(host.min()) if host.min() < -(2**31) else int(host.max())
        raise _kv.Error(f"{name} holds {bad}, which does not fit in int32")
    if _framework(x) == "torch":
        import torch

        return x.to(torch.int32)
    return np.asarray(x).astype(np.int32)


def _padded_page_table(qo_lens, pages, last_page_len, page_size, bits=None, pad_page=0):
    """A page table for BatchPrefill in which every request has qo_len <= kv_len, as kvattn
    requires, and the custom mask that gives the same attention as FlashInfer's (which allows
    qo_len > kv_len).

    qo_lens, pages (each request's page ids), last_page_len: the requests. bits: None, or each
    request's [qo_len, kv_len] bool mask (FlashInfer's custom mask). A request with qo_len > kv_len
    gets ceil((qo_len - kv_len) / page_size) full pages of `pad_page` in front of its own, masked
    off: the queries' positions p(i) = kv_len - qo_len + i and the keys' both shift by the padding,
    and causal, window, ALiBi and RoPE depend on key and query positions only through j - p(i), so
    the visible set and the logits stay FlashInfer's (query rows that see no key give o = 0 and
    lse = -inf). Returns (indptr, indices, last_page_len, mask bytes or None, mask_indptr or None)
    as numpy arrays; the mask is None when neither padding nor bits are needed."""
    import numpy as np

    kv_lens = [0 if not p else page_size * (len(p) - 1) + int(l)
               for p, l in zip(pages, last_page_len)]
    pad = [max(0, -(-(q - kv) // page_size)) if q > kv else 0 for q, kv in zip(qo_lens, kv_lens)]
    need_mask = bits is not None or any(pad)
    new_pages, new_last, parts = [], [], []
    for b, (q, kv, p) in enumerate(zip(qo_lens, kv_lens, pages)):
        new_pages.append([pad_page] * pad[b] + list(p))
        new_last.append(int(last_page_len[b]) if p else (page_size if pad[b] else 0))
        if need_mask:
            m = np.zeros((q, pad[b] * page_size + kv), dtype=bool)
            m[:, pad[b] * page_size:] = True if bits is None else np.asarray(bits[b], dtype=bool)
            parts.append(np.packbits(m.ravel(), bitorder="little"))
    indptr = np.concatenate([[0], np.cumsum([len(p) for p in new_pages])]).astype(np.int32)
    indices = np.array([i for p in new_pages for i in p], dtype=np.int32)
    last = np.array(new_last, dtype=np.int32)
    if not need_mask:
        return indptr, indices, last, None, None
    mask_indptr = np.concatenate([[0], np.cumsum([len(x) for x in parts])]).astype(np.int32)
    mask = np.concatenate(parts).astype(np.uint8) if parts else np.zeros(0, np.uint8)
    return indptr, indices, last, mask, mask_indptr


def _require_none(**params) -> None:
    for name, value in params.items():
        if value is not None:
            _unsupported(name, "per-head fp8 scale tensors (kvattn takes scalar q/k/v scales)")


def _check_backend(backend: str) -> None:
    if backend != "auto":
        _unsupported("backend", f"{backend!r}; kvattn chooses its kernels itself ('auto')")


# ---- single request --------------------------------------------------------------------------------------
def single_decode_with_kv_cache(q, k, v, kv_layout: str = "NHD", pos_encoding_mode: str = "NONE",
                                use_tensor_cores: bool = False, q_scale: Optional[float] = None,
                                k_scale: Optional[float] = None, v_scale: Optional[float] = None,
                                window_left: int = -1, logits_soft_cap: Optional[float] = None,
                                sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                                rope_theta: Optional[float] = None, return_lse: bool = False):
    """Decode attention of one request: q [num_qo_heads, head_dim] over k, v ([kv_len,
    num_kv_heads, head_dim] in NHD, [num_kv_heads, kv_len, head_dim] in HND). Returns out
    [num_qo_heads, head_dim_vo] (q's dtype), or (out, lse [num_qo_heads], base 2) with return_lse.
    q_scale * k_scale scale the logits and v_scale the output (FlashInfer folds them the same way);
    with ROPE_LLAMA the query sits at position kv_len - 1. On kvattn.BatchDecode, the request's K/V
    one page of kv_len tokens (no copy). use_tensor_cores is a hint."""
    _check_layout(kv_layout)
    _check_ndim(q, "q", 2, "[num_qo_heads, head_dim]")
    _check_ndim(k, "k", 3, f"[kv_len, num_kv_heads, head_dim] ({kv_layout})")
    _check_ndim(v, "v", 3, f"[kv_len, num_kv_heads, head_dim_vo] ({kv_layout})")
    nhd = kv_layout == "NHD"
    kv_len, hkv = (int(k.shape[0]), int(k.shape[1])) if nhd else (int(k.shape[1]), int(k.shape[0]))
    if kv_len == 0:
        raise _kv.Error("k has kv_len = 0; single_decode_with_kv_cache needs at least one key")
    q_name = _dtype_of(q, "q")
    w = _kv.BatchDecode(_single_workspace(q), kv_layout)
    w.plan(page_table=([0, 1], [0], [kv_len]), page_size=kv_len, num_qo_heads=int(q.shape[0]),
           num_kv_heads=hkv, head_dim_qk=int(q.shape[1]), head_dim_vo=int(v.shape[2]),
           q_dtype=q_name, kv_dtype=_dtype_of(k, "k"), o_dtype=q_name,
           variant=_variant(pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                            logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                            rope_scale=rope_scale, rope_theta=rope_theta, q_scale=q_scale,
                            k_scale=k_scale, v_scale=v_scale))
    res = w.run(q[None], (k[None], v[None]), return_lse=return_lse)
    if return_lse:
        return res[0][0], res[1][0]
    return res[0]


def _to_nhd(x, kv_layout):
    """[kv_len, heads, dim] view of a single request's K or V (HND: the first two axes swapped)."""
    return x if kv_layout == "NHD" else x.swapaxes(0, 1)


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
        if packed_custom_mask is not None:
            mask = packed_custom_mask
        else:
            shape = tuple(int(s) for s in getattr(custom_mask, "shape", ()))
            if shape != (qo_len, kv_len):
                raise _kv.Error(f"custom_mask has shape {list(shape)} but [qo_len, kv_len] = "
                                f"[{qo_len}, {kv_len}] is expected")
            mask = packbits(custom_mask, "little")
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


# ---- block-sparse ------------------------------------------------------------------------------------------
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


# ---- multi-level cascade ---------------------------------------------------------------------------------
class MultiLevelCascadeAttentionWrapper:
    """Cascade attention over N levels of one paged cache (FlashInfer's wrapper of the same name),
    on one kvattn.CascadeAttention: level l attends each of its groups of queries
    (qo_indptr_arr[l]) to the pages of paged_kv_*_arr[l], the levels' states are merged, and only
    the last level (the requests' own KV) is causal, as in FlashInfer. A level group with more
    queries than keys (a short shared prefix under many queries) or without pages, which
    FlashInfer allows, is handled by the C++ class (chunks over the same pages; a group without
    pages contributes nothing). The levels share the workspace: on a GPU, CascadeAttention gives
    each level's plan its own part of it.

    Position-dependent options (window_left >= 0, pos_encoding_mode ROPE_LLAMA or ALIBI) are
    refused by kvattn.CascadeAttention.plan with a kvattn.Error: a level's keys do not know their
    position in a row's whole sequence."""

    def __init__(self, num_levels, float_workspace_buffer, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, qo_indptr_buf_arr=None, paged_kv_indptr_buf_arr=None,
                 paged_kv_indices_buf_arr=None, paged_kv_last_page_len_buf_arr=None) -> None:
        if use_cuda_graph:
            _unsupported("use_cuda_graph", "graph-mode prefill from Python is not wired yet")
        if int(num_levels) < 1:
            raise _kv.Error(f"num_levels = {num_levels} must be >= 1")
        self._num_levels = int(num_levels)
        self._float_workspace_buffer = float_workspace_buffer
        self._kv_layout = _check_layout(kv_layout)
        self._use_cuda_graph = False
        self._native = _kv.CascadeAttention(_workspace(float_workspace_buffer), self._kv_layout)
        self._planned = False
        self._plan_args = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return False

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffers=None) -> None:
        self._float_workspace_buffer = float_workspace_buffer
        self._native = _kv.CascadeAttention(_workspace(float_workspace_buffer), self._kv_layout)
        self._planned = False
        if self._plan_args is not None:
            self.plan(*self._plan_args[0], **self._plan_args[1])

    def plan(self, qo_indptr_arr: Sequence, paged_kv_indptr_arr: Sequence,
             paged_kv_indices_arr: Sequence, paged_kv_last_page_len: Sequence, num_qo_heads: int,
             num_kv_heads: int, head_dim: int, page_size: int, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False,
             sm_scale: Optional[float] = None, window_left: int = -1,
             logits_soft_cap: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, q_data_type="float16", kv_data_type=None) -> None:
        """Plans every level: the four arrays hold one int32 array per level (qo_indptr [B_l + 1]
        over the same queries, the level's page table), from the most shared level to the
        requests' own pages. causal applies to the last level only; window_left >= 0 and
        ROPE_LLAMA / ALIBI raise kvattn.Error. Errors about a level's arrays name it ("level 1:
        kv_last_page_len[0] = 5 ..."). Other arguments as
        BatchPrefillWithPagedKVCacheWrapper.plan."""
        if use_fp16_qk_reduction:
            _unsupported("use_fp16_qk_reduction", "kvattn accumulates q.k in f32")
        arrays = dict(qo_indptr_arr=qo_indptr_arr, paged_kv_indptr_arr=paged_kv_indptr_arr,
                      paged_kv_indices_arr=paged_kv_indices_arr,
                      paged_kv_last_page_len=paged_kv_last_page_len)
        for name, arr in arrays.items():
            if len(arr) != self._num_levels:
                raise _kv.Error(f"{name} has {len(arr)} levels but num_levels = {self._num_levels}")
        q_name = _kv_dtype_name(q_data_type)
        kv_name = _kv_dtype_name(kv_data_type) or q_name
        # The index arrays on the host, as FlashInfer's plan() reads them (a CUDA tensor is copied
        # back): CascadeAttention cuts groups with more queries than keys into chunks, which needs
        # host page ids, and its qo_indptr is a host array.
        levels = [(_to_host(qo_indptr_arr[lvl]),
                   (_to_host(paged_kv_indptr_arr[lvl]), _to_host(paged_kv_indices_arr[lvl]),
                    _to_host(paged_kv_last_page_len[lvl])))
                  for lvl in range(self._num_levels)]
        variant = _variant(causal=causal, pos_encoding_mode=pos_encoding_mode,
                           window_left=window_left, logits_soft_cap=logits_soft_cap,
                           sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        self._planned = False
        self._native.plan(levels=levels, page_size=int(page_size), num_qo_heads=int(num_qo_heads),
                          num_kv_heads=int(num_kv_heads), head_dim_qk=int(head_dim),
                          q_dtype=q_name, kv_dtype=kv_name, o_dtype=q_name, variant=variant)
        self._planned = True
        self._plan_args = ((qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr,
                            paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size),
                           dict(causal=causal, pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale,
                                window_left=window_left, logits_soft_cap=logits_soft_cap,
                                rope_scale=rope_scale, rope_theta=rope_theta,
                                q_data_type=q_data_type, kv_data_type=kv_data_type))

    begin_forward = plan

    def run(self, q, paged_kv_cache):
        """q [num_queries, num_qo_heads, head_dim]; paged_kv_cache (k_cache, v_cache) or 5-D.
        Returns out [num_queries, num_qo_heads, head_dim] (q's dtype)."""
        if not self._planned:
            raise RuntimeError("MultiLevelCascadeAttentionWrapper.run() was called before plan()")
        return self._native.run(q, paged_kv_cache)

    forward = run


# ---- RoPE --------------------------------------------------------------------------------------------------
def _rope(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, inplace, llama31=None):
    kw = dict(rotary_dim=int(rotary_dim or 0), interleave=bool(interleave),
              rope_scale=float(rope_scale), rope_theta=float(rope_theta), llama31=llama31)
    if inplace:
        _kv.apply_rope(q, k, pos_ids, q_out=q, k_out=k, **kw)
        return None
    return _kv.apply_rope(q, k, pos_ids, **kw)


def _rope_ragged(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, inplace,
                 llama31=None):
    """The (indptr, offsets) forms through kvattn's apply_rope_ragged: row i of segment b at
    offsets[b] + i - indptr[b], computed by the library (on the GPU by the kernel, so a CUDA call
    reads nothing back and can be captured in a CUDA graph)."""
    kw = dict(rotary_dim=int(rotary_dim or 0), interleave=bool(interleave),
              rope_scale=float(rope_scale), rope_theta=float(rope_theta), llama31=llama31)
    ind, off = _positions_i32(indptr, "indptr"), _positions_i32(offsets, "offsets")
    if inplace:
        _kv.apply_rope_ragged(q, k, ind, off, q_out=q, k_out=k, **kw)
        return None
    return _kv.apply_rope_ragged(q, k, ind, off, **kw)


def _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len):
    """FlashInfer's Llama 3.1 arguments as kvattn's: its rope_scale is the scaling factor (the
    plain frequencies are not divided by it)."""
    return _kv.Llama31Scaling(factor=float(rope_scale), low_freq_factor=float(low_freq_factor),
                              high_freq_factor=float(high_freq_factor),
                              original_max_position=float(old_context_len))


def apply_rope(q, k, indptr, offsets, rotary_dim: Optional[int] = None, interleave: bool = False,
               rope_scale: float = 1, rope_theta: float = 1e4):
    """RoPE of a ragged batch: q [nnz, Hq, D], k [nnz, Hk, D], row i of segment b (indptr [B+1])
    at position offsets[b] + i - indptr[b]; the first rotary_dim (None: all) elements of each
    head, rotate-half or interleaved, f_t = theta^(-2t/rotary_dim) / rope_scale. Returns (q_rope,
    k_rope), new tensors in q's framework."""
    return _rope_ragged(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta,
                        False)


def apply_rope_inplace(q, k, indptr, offsets, rotary_dim: Optional[int] = None,
                       interleave: bool = False, rope_scale: float = 1,
                       rope_theta: float = 1e4) -> None:
    """apply_rope into q and k."""
    _rope_ragged(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta, True)


def apply_rope_pos_ids(q, k, pos_ids, rotary_dim: Optional[int] = None, interleave: bool = False,
                       rope_scale: float = 1, rope_theta: float = 1e4):
    """RoPE of q [nnz, Hq, D] and k [nnz, Hk, D] at pos_ids [nnz] (int32 or int64). Returns
    (q_rope, k_rope)."""
    return _rope(q, k, _positions_i32(pos_ids, "pos_ids"), rotary_dim, interleave, rope_scale,
                 rope_theta, False)


def apply_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim: Optional[int] = None,
                               interleave: bool = False, rope_scale: float = 1,
                               rope_theta: float = 1e4) -> None:
    """apply_rope_pos_ids into q and k."""
    _rope(q, k, _positions_i32(pos_ids, "pos_ids"), rotary_dim, interleave, rope_scale,
          rope_theta, True)


def apply_llama31_rope(q, k, indptr, offsets, rotary_dim: Optional[int] = None,
                       interleave: bool = False, rope_scale: float = 8, rope_theta: float = 5e5,
                       low_freq_factor: float = 1, high_freq_factor: float = 4,
                       old_context_len: int = 8192):
    """apply_rope with Llama 3.1's frequencies: f_t kept where its wavelength is below
    old_context_len / high_freq_factor, divided by rope_scale above old_context_len /
    low_freq_factor, blended between. Returns (q_rope, k_rope)."""
    return _rope_ragged(q, k, indptr, offsets, rotary_dim, interleave, 1.0, rope_theta, False,
                        _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len))


def apply_llama31_rope_inplace(q, k, indptr, offsets, rotary_dim: Optional[int] = None,
                               interleave: bool = False, rope_scale: float = 8,
                               rope_theta: float = 5e5, low_freq_factor: float = 1,
                               high_freq_factor: float = 4, old_context_len: int = 8192) -> None:
    """apply_llama31_rope into q and k."""
    _rope_ragged(q, k, indptr, offsets, rotary_dim, interleave, 1.0, rope_theta, True,
                 _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len))


def apply_llama31_rope_pos_ids(q, k, pos_ids, rotary_dim: Optional[int] = None,
                               interleave: bool = False, rope_scale: float = 8,
                               rope_theta: float = 5e5, low_freq_factor: float = 1,
                               high_freq_factor: float = 4, old_context_len: int = 8192):
    """apply_rope_pos_ids with Llama 3.1's frequencies. Returns (q_rope, k_rope)."""
    return _rope(q, k, _positions_i32(pos_ids, "pos_ids"), rotary_dim, interleave, 1.0, rope_theta,
                 False, _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len))


def apply_llama31_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim: Optional[int] = None,
                                       interleave: bool = False, rope_scale: float = 8,
                                       rope_theta: float = 5e5, low_freq_factor: float = 1,
                                       high_freq_factor: float = 4,
                                       old_context_len: int = 8192) -> None:
    """apply_llama31_rope_pos_ids into q and k."""
    _rope(q, k, _positions_i32(pos_ids, "pos_ids"), rotary_dim, interleave, 1.0, rope_theta, True,
          _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len))


def _rope_cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, inplace):
    """query [nnz, Hq * head_size] (or [nnz, Hq, head_size]) and key alike, viewed as 3-D
    without a copy (in place writes through the views)."""
    head_size = int(head_size)

    def heads(x, name):
        if not hasattr(x, "shape") or len(x.shape) not in (2, 3):
            raise _kv.Error(f"{name} must be [nnz, num_heads * head_size] or [nnz, num_heads, "
                            f"head_size], got {getattr(x, 'shape', type(x).__name__)}")
        width = int(x.shape[-1]) * (int(x.shape[1]) if len(x.shape) == 3 else 1)
        if head_size <= 0 or width % head_size:
            raise _kv.Error(f"{name} has {width} elements per token, not a multiple of head_size = "
                            f"{head_size}")
        shape = (int(x.shape[0]), width // head_size, head_size)
        v = x.view(*shape) if _framework(x) == "torch" else x.reshape(shape)
        if inplace and _framework(x) != "torch":
            import numpy as np

            if v.size and not np.shares_memory(v, x):
                raise _kv.Error(f"{name} cannot be viewed as {list(shape)} without a copy, so it "
                                "cannot be rotated in place")
        return v

    q3, k3 = heads(query, "query"), heads(key, "key")
    pos = _positions_i32(positions, "positions")
    if inplace:
        _kv.apply_rope_with_cos_sin_cache(q3, k3, pos, cos_sin_cache, q_out=q3, k_out=k3,
                                          interleave=not is_neox)
        return None
    qo, ko = _kv.apply_rope_with_cos_sin_cache(q3, k3, pos, cos_sin_cache, interleave=not is_neox)
    return qo.reshape(tuple(query.shape)), ko.reshape(tuple(key.shape))


def apply_rope_with_cos_sin_cache(positions, query, key, head_size: int, cos_sin_cache,
                                  is_neox: bool = True):
    """RoPE with a precomputed table (vLLM's / SGLang's form): row p of cos_sin_cache
    [max_position, rotary_dim] (float32) is cos of the rotary_dim / 2 frequencies at position p,
    then their sin. query [nnz, Hq * head_size], key [nnz, Hk * head_size] (3-D also taken),
    positions [nnz] (int32 or int64); is_neox: rotate-half pairs (x[t], x[t + rotary_dim / 2]),
    else interleaved (x[2t], x[2t + 1]). Returns (query_out, key_out), shaped like the inputs."""
    return _rope_cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, False)


def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size: int, cos_sin_cache,
                                          is_neox: bool = True) -> None:
    """apply_rope_with_cos_sin_cache into query and key."""
    _rope_cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, True)
