"""flashinfer.decode: BatchDecodeWithPagedKVCacheWrapper and single_decode_with_kv_cache over
kvattn.BatchDecode."""

import functools
from typing import Optional

import kvattn as _kv
from kvattn.flashinfer._common import (
    _Planned, _WrapperBase, _check_layout, _check_ndim, _copy_into, _dtype_of, _is_cuda,
    _kv_dtype_name, _np, _require_default, _single_workspace, _slice, _to_host, _unsupported,
    _variant, _workspace,
)


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
        q_data_type and kv_data_type where they are None (q_data_type defaults to float16)."""
        _require_default("block_tables", block_tables, why="the trtllm-gen backend's page table")
        _require_default("seq_lens", seq_lens, why="the trtllm-gen backend's lengths")
        if data_type is not None:  # FlashInfer's rule: it fills whichever of the two is None
            q_data_type = data_type if q_data_type is None else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
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
                              rope_scale=rope_scale, rope_theta=rope_theta, user=self._jit_variant)
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
                sm_scale=None, rope_scale=None, rope_theta=None, return_lse: bool = False):
        """Deprecated in FlashInfer: run() with these variant arguments in place of plan()'s."""
        self._respecify(pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                        logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, rope_scale=rope_scale,
                        rope_theta=rope_theta)
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                        return_lse=return_lse)

    run_return_lse = functools.partialmethod(run, return_lse=True)
    forward_return_lse = functools.partialmethod(forward, return_lse=True)

    def end_forward(self) -> None:
        pass


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's older spelling of BatchDecodeWithPagedKVCacheWrapper(use_cuda_graph=True):
    the three page-table buffers are positional."""

    def __init__(self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer,
                 kv_layout: str = "NHD", use_tensor_cores: bool = False) -> None:
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True,
                         use_tensor_cores=use_tensor_cores, paged_kv_indptr_buffer=indptr_buffer,
                         paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer)


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
