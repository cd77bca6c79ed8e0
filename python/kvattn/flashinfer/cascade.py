"""flashinfer.cascade: the attention-state merges and MultiLevelCascadeAttentionWrapper over
kvattn.CascadeAttention."""

from typing import Any, Optional, Sequence, Tuple

import kvattn as _kv
from kvattn.flashinfer._common import (
    _check_layout, _dtype_of, _framework, _kv_dtype_name, _to_host, _unsupported, _variant, _workspace,
)


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


class BatchDecodeWithSharedPrefixPagedKVCacheWrapper:
    """FlashInfer's older two-level cascade for decode (deprecated there in favour of
    MultiLevelCascadeAttentionWrapper): one shared prefix as ragged K/V given at forward(), each
    request's own pages planned by begin_forward(); the two states merge. No position encoding."""

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD") -> None:
        from kvattn.flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper

        self._kv_layout = _check_layout(kv_layout)
        self._unique = BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None) -> None:
        self._unique.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def begin_forward(self, unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len,
                      num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
                      data_type="float16") -> None:
        # data_type is q's dtype too (FlashInfer's plan() would keep q at float16 beside it).
        self._unique.plan(unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len,
                          num_qo_heads, num_kv_heads, head_dim, page_size, q_data_type=data_type,
                          kv_data_type=data_type)

    def forward(self, q, k_shared, v_shared, unique_kv_cache):
        """q [batch, Hq, D]; k_shared / v_shared [shared_len, Hkv, D] (NHD) or [Hkv, shared_len, D]
        (HND); unique_kv_cache as the decode wrapper's paged cache. Returns out [batch, Hq, D]."""
        from kvattn.flashinfer.prefill import single_prefill_with_kv_cache

        o, s = single_prefill_with_kv_cache(q, k_shared, v_shared, kv_layout=self._kv_layout,
                                            return_lse=True)
        o_unique, s_unique = self._unique.run(q, unique_kv_cache, return_lse=True)
        merge_state_in_place(o, s, o_unique, s_unique)
        return o

    def end_forward(self) -> None:
        pass


class BatchPrefillWithSharedPrefixPagedKVCacheWrapper:
    """FlashInfer's older two-level cascade for prefill/append (deprecated there): one shared
    prefix as ragged K/V (every query sees all of it), then each request's own pages (causal or
    not, aligned bottom-right within them), merged. No position encoding."""

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD") -> None:
        from kvattn.flashinfer.prefill import BatchPrefillWithPagedKVCacheWrapper

        self._kv_layout = _check_layout(kv_layout)
        self._unique = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None) -> None:
        self._unique.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def begin_forward(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                      num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int) -> None:
        # Planned at forward(), which brings causal and the dtypes (FlashInfer's begin_forward has
        # neither and plans float16).
        self._table = (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                       num_qo_heads, num_kv_heads, head_dim, page_size)
        self._planned_for = None

    def forward(self, q, k_shared, v_shared, unique_kv_cache, causal: bool = False,
                use_fp16_qk_reduction: bool = False, sm_scale: Optional[float] = None,
                rope_scale: Optional[float] = None, rope_theta: Optional[float] = None):
        """q [nnz_qo, Hq, D]; k_shared / v_shared as the decode form's; causal applies within each
        request's own pages. Returns out [nnz_qo, Hq, D]."""
        from kvattn.flashinfer.prefill import single_prefill_with_kv_cache

        o, s = single_prefill_with_kv_cache(q, k_shared, v_shared, kv_layout=self._kv_layout,
                                            use_fp16_qk_reduction=use_fp16_qk_reduction,
                                            sm_scale=sm_scale, rope_scale=rope_scale,
                                            rope_theta=rope_theta, return_lse=True)
        if getattr(self, "_table", None) is None:
            raise RuntimeError("BatchPrefillWithSharedPrefixPagedKVCacheWrapper.forward() was called "
                               "before begin_forward()")
        cache = unique_kv_cache[0] if isinstance(unique_kv_cache, (tuple, list)) else unique_kv_cache
        key = (bool(causal), sm_scale, rope_scale, rope_theta, _dtype_of(q, "q"), _dtype_of(cache, "unique_kv_cache"))
        if key != self._planned_for:
            self._unique.plan(*self._table, causal=bool(causal), sm_scale=sm_scale,
                              rope_scale=rope_scale, rope_theta=rope_theta, q_data_type=key[4],
                              kv_data_type=key[5])
            self._planned_for = key
        o_unique, s_unique = self._unique.run(q, unique_kv_cache, return_lse=True)
        merge_state_in_place(o, s, o_unique, s_unique)
        return o

    def end_forward(self) -> None:
        pass
