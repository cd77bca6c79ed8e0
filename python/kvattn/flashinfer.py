"""FlashInfer-compatible names over kvattn (the start of issue 26's `kvattn.flashinfer`).

The wrappers take FlashInfer 0.3's argument names, order and defaults, so that code written for
`flashinfer` runs with `import kvattn.flashinfer as flashinfer`:

    BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper, merge_state, merge_state_in_place, merge_states,
    append_paged_kv_cache, get_seq_lens, get_batch_indices_positions, packbits, segment_packbits

Conventions kept: LSE in base 2; run() returns out, or (out, lse) with return_lse=True; the paged
cache is a (k_cache, v_cache) tuple or a 5-D [pages, 2, ...] tensor in NHD or HND; dtypes as torch
dtypes or strings ("float16"); index arrays int32. Tensors may be torch (CPU or CUDA) or numpy
arrays (the CPU backend). A FlashInfer parameter that kvattn does not support raises
NotImplementedError naming it (never silently ignored); performance hints that do not change the
result (use_tensor_cores, enable_pdl, non_blocking) are accepted.
"""

from typing import Any, Optional, Tuple

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
    raise TypeError(f"dtype {d!r} is not supported by kvattn (float32, float16, bfloat16, "
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
    checks its dtype, length and device), or custom_mask (flat bools) packed little-endian."""
    import numpy as np

    if custom_mask is None and packed_custom_mask is None:
        return None, None
    mask_indptr, sizes = _mask_indptr(qo_indptr, kv, paged, page_size)
    if packed_custom_mask is not None:
        return packed_custom_mask, mask_indptr
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
