// Batch attention over the KV-cache formats, with FlashInfer's plan/run split: plan() reads the
// host-side index arrays once; run() computes, allocation-free on the GPU and graph-capturable.
// A plan made without a workspace (or with a host one) runs on the CPU backend, anywhere; a plan
// made with a CUDA workspace runs on that device.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kvattn/dtype.h"
#include "kvattn/formats.h"
#include "kvattn/plan.h"
#include "kvattn/tensor.h"
#include "kvattn/variant.h"

namespace kvattn {

// Rules every plan() and run() enforces (kvattn::Error naming the argument otherwise):
//  - Limits (kvattn/plan.h): a request's kv_len <= kMaxKVLen, a batch's query tokens (and ragged
//    KV tokens) <= kMaxTotalTokens; the planner rejects a batch whose work items would not fit
//    int32 indices or whose cost passes its limit, from the lengths alone (O(batch), before it
//    allocates anything proportional to the work).
//  - Devices: run() computes where the plan was made for: on the host (no workspace, or a host
//    one) or on the CUDA device of the plan's workspace; q elsewhere is the argument named, and
//    every other tensor must be where q is.
//  - Aliasing: out and lse never overlap themselves (no stride of 0 along a dimension of size
//    > 1), each other, q, K, V or the workspace; in-place attention (out = q) is not supported.
//    Overlap is judged from the views' byte ranges (rows of one row stride that interleave without
//    touching, as q, k and v of one fused QKV buffer, do not overlap).

// What every attention plan shares: heads, head dims, dtypes, the variant.
struct AttentionShape {
  int num_qo_heads = 0;
  int num_kv_heads = 0;
  int head_dim_qk = 0;
  int head_dim_vo = 0;  // 0: same as head_dim_qk
  DType q_dtype = DType::bf16;
  std::optional<DType> kv_dtype;  // default: q_dtype
  std::optional<DType> o_dtype;   // default: q_dtype
  Variant variant{};
  // How plan() splits and assigns the work (workers, fixed split size, CUDA-graph capacity).
  SchedulerOptions scheduler{};
};

namespace detail {
struct AttentionPlan;  // src/core/attention_plan.h
}
class CascadeAttention;  // kvattn/cascade.h

// What BatchDecode::plan() does with requests whose page lists begin with the same page ids (a
// shared prefix, as radix-tree servers produce): automatic runs them as a cascade (kvattn/cascade.h:
// the prefix read once for all of them; a nested prefix, such as few-shot blocks under a shared
// system prompt, as a third level when the model says it pays) when its cost model predicts a
// gain, always whenever such requests exist, never: flat decode. Only consecutive requests are
// grouped, by at least 128 shared tokens of full pages; host page ids, position-free variants (no sliding
// window, ALiBi, fused RoPE, custom mask, sigmoid or user variant) and eager plans (no CUDA-graph
// capacity) only: anything else decodes flat.
enum class SharedPrefix : uint8_t { automatic, always, never };

// Decode: one query token per request (q [B, Hq, Dqk], out [B, Hq, Dvo], lse [B, Hq] f32)
// over the paged cache.
struct BatchDecodePlan : AttentionShape {
  PageTable page_table;
  int page_size = 0;
  // Variant::custom_mask: as BatchPrefillPlan's, one query row per request (request b's kv_len
  // bits start at byte mask_indptr[b]). On the GPU, such a plan runs on the prefill kernels.
  TensorView custom_mask;
  TensorView mask_indptr;
  SharedPrefix shared_prefix = SharedPrefix::automatic;
};

class BatchDecode {
 public:
  // The workspace is a byte buffer on the device that runs the kernels (on a GPU: 1-D, contiguous,
  // 16-byte aligned, as cudaMalloc and torch allocations are); the CPU backend needs none.
  explicit BatchDecode(TensorView workspace = {}, KVLayout kv_layout = KVLayout::NHD);
  ~BatchDecode();
  BatchDecode(BatchDecode&&) noexcept;
  BatchDecode& operator=(BatchDecode&&) noexcept;

  // With a CUDA workspace, plan() stages the work list and page table into it on `stream` (a
  // cudaStream_t; null: the default stream) and run() only launches. The page table's indices
  // may then live on the workspace's device (as in FlashInfer): plan() reads only indptr and
  // last_page_len, in O(batch), and the kernels read the ids in place at run time, so the caller
  // may rewrite them between plan() and run() (or graph replays) as long as the lengths hold.
  void plan(const BatchDecodePlan& params, void* stream = nullptr);
  // lse is optional ([B, Hq] f32, base 2). stream: a cudaStream_t for CUDA tensors, else ignored.
  void run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
           const TensorView& lse = {}, void* stream = nullptr) const;
  // Device-resident page ids are checked by the kernels, not on the host: an id outside
  // [0, num_pages) is never read through, the rows of its request come out NaN, and the first
  // one is recorded. check_errors() waits for `stream` and throws kvattn::Error naming it
  // ("kv_indices[17] = 9000 is out of range [0, 4096) ..."), clearing the record; it returns
  // quietly when every run since the last plan() or check was clean (always, on the CPU, where
  // run() validates the ids before computing).
  void check_errors(void* stream = nullptr) const;

  // The schedule run() executes (include/kvattn/plan.h): work items, workers, merge table. For
  // inspection and tests; null before plan(). The GPU decode path's plan stores slice 0 only
  // (Plan::slice_zero_only(): its kernels repeat it for the other slices).
  const Plan* schedule() const;

  // Which GPU kernels the last plan() chose: "decode" (the decode kernels), "prefill" (the batch
  // prefill kernels' decode shape: long GQA batches on sm_90+, every GQA batch before sm_90; see
  // docs/DESIGN.md, "Decode kernels"), "cascade" (a shared-prefix cascade, see cascade()), or
  // "cpu"; empty before plan().
  std::string_view kernel_family() const;
  // The GPU kernel the last plan() chose, by its JIT name (e.g. "decode_mma_bf16_hd128_..."), or
  // "cpu", or "cascade"; empty before plan(). Names spell every choice that specialises a kernel.
  std::string kernel_name() const;

  // The cascade the last plan() chose for shared prefixes (SharedPrefix), or null when it decodes
  // flat: its levels (the shared prefixes, one group per run of requests, then each request's own
  // pages) and their schedules. schedule() is then the last level's.
  const CascadeAttention* cascade() const;

 private:
  TensorView workspace_;
  KVLayout kv_layout_;
  std::unique_ptr<detail::AttentionPlan> plan_;
  std::unique_ptr<CascadeAttention> cascade_;
  bool cascade_active_ = false;
};

// Prefill and append: q [nnz_q, Hq, Dqk] ragged by qo_indptr, KV either ragged (k [nnz_kv, Hkv,
// Dqk], v [nnz_kv, Hkv, Dvo] by kv_indptr) or paged. The causal mask is aligned
// bottom-right (query i sits at position kv_len - qo_len + i; with qo_len > kv_len, as FlashInfer
// takes it, the first rows then see no key under causal: o = 0, lse = -inf).
struct BatchPrefillPlan : AttentionShape {
  TensorView qo_indptr;                 // [B+1] int32, host
  TensorView kv_indptr;                 // ragged KV: [B+1] int32, host
  std::optional<PageTable> page_table;  // paged KV instead of kv_indptr
  int page_size = 0;                    // paged KV only
  // Variant::custom_mask: bits of request b start at byte mask_indptr[b] (little-endian bits,
  // bit i * kv_len + j). u8 [bytes] and int32 [B+1], host.
  TensorView custom_mask;
  TensorView mask_indptr;
};

class BatchPrefill {
 public:
  // The workspace: as BatchDecode's (16-byte aligned on a GPU).
  explicit BatchPrefill(TensorView workspace = {}, KVLayout kv_layout = KVLayout::NHD);
  ~BatchPrefill();
  BatchPrefill(BatchPrefill&&) noexcept;
  BatchPrefill& operator=(BatchPrefill&&) noexcept;

  // With a CUDA workspace, plan() stages the work list, index arrays and custom mask into it on
  // `stream` (a cudaStream_t; null: the default stream) and run() only launches. As with
  // BatchDecode, the page table's indices may live on the workspace's device: plan() then reads
  // only indptr and last_page_len, and the kernels read (and check) the ids in place.
  void plan(const BatchPrefillPlan& params, void* stream = nullptr);
  // Paged KV (the plan must have a page table).
  void run(const TensorView& q, const PagedKVCache& kv, const TensorView& out,
           const TensorView& lse = {}, void* stream = nullptr) const;
  // Ragged KV (the plan must have kv_indptr).
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const TensorView& lse = {}, void* stream = nullptr) const;
  // As BatchDecode::check_errors(): a device-resident page id outside [0, num_pages) is never
  // read through, the rows of every work item whose KV range holds it come out NaN (a request's
  // rows whose keys never reach that page may stay finite), and the first one is named here.
  void check_errors(void* stream = nullptr) const;

  // The schedule run() executes (include/kvattn/plan.h): work items, workers, merge table. For
  // inspection and tests; null before plan().
  const Plan* schedule() const;

  // The GPU kernel the last plan() chose, by its JIT name: "prefill_wgmma_..." for the Hopper tier
  // (sm_90a), "prefill_..." for the mma.sync tier (docs/DESIGN.md); "cpu" on the CPU backend;
  // empty before plan().
  std::string kernel_name() const;

 private:
  TensorView workspace_;
  KVLayout kv_layout_;
  std::unique_ptr<detail::AttentionPlan> plan_;
};

// Block-sparse attention: q [M, Hq, Dqk], k [N, Hkv, Dqk], v [N, Hkv, Dvo]; query row i sees key j
// iff block (i / R, j / C) is present. Positions for masks, ALiBi and RoPE: key j is at j, query i
// at i + N - M (bottom-right alignment, as for a single request of qo_len M and kv_len N).
// On the GPU (a CUDA workspace) it runs on the batch prefill kernels, block row r as a request
// whose pages are its column blocks, C tokens each; the position-dependent variants (causal,
// sliding window, ALiBi, fused RoPE) are rejected there by plan() (the CPU backend runs them).
struct BlockSparsePlan : AttentionShape {
  BSRMatrix bsr;
};

class BlockSparseAttention {
 public:
  // The workspace is a byte buffer on the device that runs the kernels; the CPU backend needs none.
  explicit BlockSparseAttention(TensorView workspace = {});
  ~BlockSparseAttention();
  BlockSparseAttention(BlockSparseAttention&&) noexcept;
  BlockSparseAttention& operator=(BlockSparseAttention&&) noexcept;

  // With a CUDA workspace, plan() stages the work list and the BSR arrays into it on `stream` (a
  // cudaStream_t; null: the default stream) and run() only launches (graph-capturable, as
  // BatchPrefill's; SchedulerOptions::cuda_graph counts block rows as requests, M as tokens).
  void plan(const BlockSparsePlan& params, void* stream = nullptr);
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
           const TensorView& lse = {}, void* stream = nullptr) const;

  // The schedule run() executes (include/kvattn/plan.h): work items, workers, merge table. For
  // inspection and tests; null before plan().
  const Plan* schedule() const;

 private:
  TensorView workspace_;
  std::unique_ptr<detail::AttentionPlan> plan_;
};

}  // namespace kvattn
