"""kvattn: an attention engine for LLM inference serving (batch decode, prefill/append,
block-sparse and cascade attention over a paged KV cache), from Python.

The names mirror the C++ API (include/kvattn/*.h)::

    import numpy as np, kvattn
    decode = kvattn.BatchDecode(kv_layout="NHD")           # no workspace: the CPU backend
    decode.plan(page_table=(indptr, indices, last_page_len), page_size=16, num_qo_heads=32,
                num_kv_heads=8, head_dim_qk=128, q_dtype="f16", variant=kvattn.variants.causal())
    out, lse = decode.run(q, (k_cache, v_cache), return_lse=True)   # numpy in, numpy out

kvattn.CascadeAttention runs N levels of page tables over one cache (shared prefixes, then each
request's own pages) and merges them::

    cascade = kvattn.CascadeAttention()
    cascade.plan(levels=[([0, 8], prefix_table), (qo_indptr, own_table)], page_size=16, ...)
    out = cascade.run(q, (k_cache, v_cache))

kvattn.Variant.custom(source, scalars=..., tensors=...) brings a user variant: C++ hooks compiled
at plan() by the system's compiler (CPU backend; docs/VARIANTS.md).

Tensors are any DLPack producer (numpy, torch CPU/CUDA, cupy) and are never copied; outputs
not given are allocated in the input's framework and on its device. Bad arguments raise
kvattn.Error (a ValueError) or kvattn.DTypeError (also a TypeError) with the C++ message, which
names the argument and the value. Importing kvattn compiles no kernel and touches no GPU.
"""

from ._kvattn import (  # noqa: F401
    BSRMatrix,
    BatchDecode,
    BatchPrefill,
    BlockSparseAttention,
    CascadeAttention,
    CascadeLevel,
    CostModel,
    CustomVariant,
    DType,
    DTypeError,
    Error,
    GraphCapacity,
    KVLayout,
    Llama31Scaling,
    MAX_KV_LEN,
    MAX_TOTAL_TOKENS,
    MergeEntry,
    PageTable,
    Plan,
    Planner,
    RopeConfig,
    SchedulerOptions,
    TileShape,
    Variant,
    WorkItem,
    __version__,
    alibi_slope,
    append_paged_kv_cache,
    apply_rope,
    apply_rope_ragged,
    apply_rope_with_cos_sin_cache,
    cpu_num_threads,
    dtype_size,
    has_cuda_backend,
    make_plan,
    merge_state,
    merge_state_in_place,
    merge_states,
)
from . import variants

__all__ = [
    "BSRMatrix", "BatchDecode", "BatchPrefill", "BlockSparseAttention", "CascadeAttention",
    "CascadeLevel", "CostModel", "CustomVariant", "DType", "DTypeError", "Error",
    "GraphCapacity", "KVLayout", "Llama31Scaling", "MAX_KV_LEN", "MAX_TOTAL_TOKENS",
    "MergeEntry", "PageTable", "Plan", "Planner", "RopeConfig", "SchedulerOptions", "TileShape",
    "Variant", "WorkItem", "__version__", "alibi_slope", "append_paged_kv_cache", "apply_rope",
    "apply_rope_ragged", "apply_rope_with_cos_sin_cache", "cpu_num_threads", "dtype_size",
    "has_cuda_backend", "make_plan", "merge_state", "merge_state_in_place", "merge_states",
    "variants",
]
