// Stand-alone operations: merging attention states, appending to the paged cache, RoPE.
//
// CPU and CUDA tensors. All tensors of one call live on one device; the call runs there. On CUDA
// tensors (builds with the CUDA backend) a call validates on the host what
// it can without reading device memory (shapes, dtypes, devices, strides, and that every pointer is
// aligned to its element size), then only launches a kernel on `stream` (a cudaStream_t; null: the
// legacy default stream) on the tensors' device: it allocates nothing, does not synchronise, and
// may be captured in a CUDA graph. The first call of a kernel on a device compiles or loads it
// (JIT, `kvattn jit precompile`): make one call before capturing. Errors the host cannot see
// (the values of device index arrays) are handled by the kernel as documented per operation.
//
// Aliasing, for every operation: an output never overlaps itself (no stride of 0 along a
// dimension of size > 1) or another output, and shares no memory with an input, except where an
// operation says that it may alias one exactly (the same pointer, dtype, shape and strides: in
// place). Overlap is judged from the views' byte ranges; rows of one row stride that interleave
// without touching (q and k of one fused QKV buffer, K and V of a combined cache) do not overlap.
// A call that breaks a rule throws kvattn::Error before it writes anything.
#pragma once

#include "kvattn/formats.h"
#include "kvattn/tensor.h"
#include "kvattn/variant.h"

namespace kvattn {

// (o, lse) (+) (o_other, lse_other) for states over disjoint KV sets (SEMANTICS.md, "Merging").
// v_*: [n, H, D] f32/f16/bf16; s_*: [n, H] f32, base-2 LSE. v_a and v_b share a dtype; v_out may
// have any of the three. Arithmetic is f32. Any strides are allowed as long as the head dim (the
// last) is contiguous; v_out may alias v_a or v_b exactly, s_out s_a or s_b (in place). A side with
// lse = -inf leaves the other unchanged (its o is not read); both -inf give o = 0, lse = -inf.
// The same on the GPU (the states' f32 fold may differ from the CPU's in the last bits).
// stream: a cudaStream_t for CUDA tensors, else ignored (likewise below).
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                 void* stream = nullptr);
// v <- v (+) v_other in place; rows whose mask byte ([n] u8, any stride; on the device of v) is 0
// are left untouched (v and s). v_other has v's dtype; it may be v itself (and s_other s), nothing
// else may overlap v or s.
void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, const TensorView& mask = {},
                          void* stream = nullptr);
// Folds k states per row in index order: v [n, k, H, D], s [n, k, H] -> v_out [n, H, D], s_out [n, H].
// k = 0 gives o = 0, lse = -inf. Inputs with lse = -inf are skipped. The outputs may be state 0 of
// the inputs exactly (v_out = v[:, 0], s_out = s[:, 0], both), else they overlap no input.
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out, void* stream = nullptr);

// Writes row r of append_k / append_v ([nnz, Hkv, D] and [nnz, Hkv, Dv]) at token positions[r] of
// request batch_indices[r] (both [nnz] int32): page kv_indices[kv_indptr[b] + pos / page_size],
// slot pos % page_size, in either layout, split or combined (5-D) caches. The page table already
// describes the lengths after the append, so positions[r] must lie in [0, kv_len(b)). The append
// dtype may differ from the cache's (e.g. bf16 rows into an e4m3 cache): values are converted with
// round-to-nearest-even, fp8 saturating at its largest finite value and with no scaling (divide by
// k_scale / v_scale before appending if the attention uses them); equal dtypes copy the bits. The
// GPU writes the same bits as the CPU. The cache (its K and V views) overlaps no other argument.
//
// Where the index arrays live, and what is checked:
//  - CPU cache: batch_indices, positions and the page table are host arrays. Everything is
//    validated before the first write (indices in range, kv_indptr monotone, last_page_len in
//    [1, page_size], no two rows targeting the same slot), so a rejected call leaves the cache
//    untouched.
//  - CUDA cache: batch_indices, positions and the three page-table arrays are contiguous int32
//    tensors on the cache's device (host arrays are rejected; nothing is copied). The host checks
//    their shapes, dtypes, devices and alignment, never their values. The kernel checks every
//    index it reads: a row whose request is outside [0, batch_size), whose position is outside
//    [0, kv_len(b)), whose request has inconsistent kv_indptr / kv_last_page_len entries, or whose
//    page id is outside [0, num_pages) is skipped (nothing is written for it; no write ever lands
//    outside the cache), without an error being reported. Two rows targeting one slot are not
//    detected on the GPU: which values land there is unspecified.
void append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                           const TensorView& batch_indices, const TensorView& positions,
                           const PagedKVCache& cache, const PageTable& page_table,
                           void* stream = nullptr);

struct RopeOptions : RopeConfig {
  int rotary_dim = 0;  // leading dims rotated; 0: the whole head dim
};

// q [nnz, Hq, D], k [nnz, Hk, D] (f32/f16/bf16) rotated by pos_ids [nnz] (int32) into q_out,
// k_out (the dtypes and shapes of q and k; q_out may alias q and k_out k exactly, in place, and no
// other pair may overlap: a k_out over q would rotate k from an already rotated q). The
// first rotary_dim (even, <= D) elements of each head are rotated (SEMANTICS.md, with d =
// rotary_dim in the frequency); the rest are copied unchanged. Computed in f32 with the same code
// as the fused RoPE of attention.
//
// Where pos_ids lives, and what is checked (the same for the ragged form and the cos/sin table):
//  - CPU tensors: pos_ids is a contiguous host array, read before anything is written.
//  - CUDA tensors: pos_ids is an int32 tensor on q's device (any stride; host arrays are rejected,
//    nothing is copied); its values are never read by the host. Every position is legal for
//    apply_rope. The GPU computes what the CPU computes, with CUDA's sincosf and powf in place of
//    the C library's cosf, sinf and powf (a last-bit difference of an f32 angle moves a rotated
//    element by up to ~|angle| ulps of it, as on the CPU against exact arithmetic). rotary_dim is at
//    most cuda::kMaxGpuRotaryDim (8192); q and k may have different dtypes (then two launches).
void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                const TensorView& k_out, const TensorView& pos_ids, const RopeOptions& options = {},
                void* stream = nullptr);

// apply_rope of a ragged batch (FlashInfer's apply_rope(q, k, indptr, offsets)): row r of request b
// (indptr[b] <= r < indptr[b + 1]; indptr [B + 1] int32, indptr[0] = 0, non-decreasing) is at
// position offsets[b] + r - indptr[b] (offsets [B] int32). On the CPU both are host arrays,
// checked (indptr[B] = nnz, positions within int32); on the GPU both are contiguous int32 tensors
// on q's device, and a row the kernel cannot place (not inside [indptr[b], indptr[b + 1]) for the
// b its binary search over indptr finds, or a position past int32) is skipped: nothing is written
// for it. Otherwise as apply_rope.
void apply_rope_ragged(const TensorView& q, const TensorView& k, const TensorView& q_out,
                       const TensorView& k_out, const TensorView& indptr, const TensorView& offsets,
                       const RopeOptions& options = {}, void* stream = nullptr);

// RoPE with precomputed cos/sin (vLLM's and SGLang's form; FlashInfer's
// apply_rope_with_cos_sin_cache): row p of cos_sin_cache [max_position, rotary_dim] (f32, any row
// stride, on q's device) holds cos(p f_t) for t < rotary_dim / 2, then sin(p f_t); row r of q and
// k is rotated by row pos_ids[r] (int32, as apply_rope: a host array for CPU tensors, each in
// [0, max_position), checked; a tensor on q's device for CUDA tensors, whose rows with a position
// outside [0, max_position) are skipped by the kernel: nothing is written for them). The pair of t
// is (x[t], x[t + rotary_dim / 2]) or, interleaved, (x[2t], x[2t + 1]); (x0, x1) <- (x0 c - x1 s,
// x1 c + x0 s) in f32; rotary_dim (even, <= the head dim) is the cache's width, and the elements
// past it are copied. Shapes, dtypes, strides and aliasing as apply_rope (q_out may be q and
// k_out k exactly). The GPU writes the CPU's bits (NaN payloads aside).
void apply_rope_with_cos_sin_cache(const TensorView& q, const TensorView& k, const TensorView& q_out,
                                   const TensorView& k_out, const TensorView& pos_ids,
                                   const TensorView& cos_sin_cache, bool interleave = false,
                                   void* stream = nullptr);

}  // namespace kvattn
