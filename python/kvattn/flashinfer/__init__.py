"""FlashInfer-compatible names over kvattn (issue 26's `kvattn.flashinfer`).

The wrappers take FlashInfer 0.3's argument names, order and defaults, so that code written for
`flashinfer` runs with `import kvattn.flashinfer as flashinfer`, at the top level or under FlashInfer's
submodule paths (kvattn.flashinfer.decode, .prefill, .sparse, .cascade, .page, .quantization, .rope):

    BatchDecodeWithPagedKVCacheWrapper (and CUDAGraphBatchDecodeWithPagedKVCacheWrapper, its older
    graph-mode spelling), BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper, BlockSparseAttentionWrapper (and
    VariableBlockSparseAttentionWrapper: block sizes per KV head),
    MultiLevelCascadeAttentionWrapper (and the older two-level
    BatchDecode/BatchPrefillWithSharedPrefixPagedKVCacheWrapper), single_decode_with_kv_cache,
    single_prefill_with_kv_cache (and its _return_lse form), merge_state, merge_state_in_place, merge_states,
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

from kvattn.flashinfer import cascade, decode, page, prefill, quantization, rope, sparse
# The native wrappers' variant of FlashInfer's variant arguments (the tests compare against it).
from kvattn.flashinfer._common import _variant  # noqa: F401
from kvattn.flashinfer.decode import (
    BatchDecodeWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    single_decode_with_kv_cache,
)
from kvattn.flashinfer.prefill import (
    BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache, single_prefill_with_kv_cache_return_lse,
)
from kvattn.flashinfer.sparse import BlockSparseAttentionWrapper, VariableBlockSparseAttentionWrapper
from kvattn.flashinfer.cascade import (
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper, BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
    merge_state, merge_state_in_place, merge_states, MultiLevelCascadeAttentionWrapper,
)
from kvattn.flashinfer.page import append_paged_kv_cache, get_seq_lens, get_batch_indices_positions
from kvattn.flashinfer.quantization import packbits, segment_packbits
from kvattn.flashinfer.rope import (
    apply_rope, apply_rope_inplace, apply_rope_pos_ids, apply_rope_pos_ids_inplace,
    apply_llama31_rope, apply_llama31_rope_inplace, apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace, apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
)

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
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
    "VariableBlockSparseAttentionWrapper",
    "MultiLevelCascadeAttentionWrapper",
    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
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
