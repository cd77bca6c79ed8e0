// Argument checks shared by every operation. Each throws kvattn::Error naming the argument and the
// value; none reads memory outside the views it is given.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "kvattn/error.h"
#include "kvattn/formats.h"
#include "kvattn/tensor.h"

namespace kvattn::validate {

void defined(std::string_view name, const TensorView& t);
void ndim(std::string_view name, const TensorView& t, int expected);
void dtype(std::string_view name, const TensorView& t, DType expected);
void float_dtype(std::string_view name, const TensorView& t);  // f32, f16 or bf16
void dim(std::string_view name, const TensorView& t, int d, int64_t expected,
         std::string_view what);  // "q.shape[1] = 7 but num_qo_heads = 8"
void last_dim_contiguous(std::string_view name, const TensorView& t);
void same_device(std::string_view name, const TensorView& t, Device expected,
                 std::string_view expected_from);
void host(std::string_view name, const TensorView& t);
// The workspace of a GPU plan: 1-D, contiguous, non-null and 16-byte aligned (the kernels move
// their partial states and work items in 16-byte pieces; a misaligned address would fault).
void gpu_workspace(const TensorView& workspace);

// A 1-D int32 host array, optionally of an exact length; returns its elements (the view must be
// contiguous).
std::span<const int32_t> int32_array(std::string_view name, const TensorView& t,
                                     int64_t expected_len = -1);

// indptr[0] == 0, non-decreasing; returns its span. `size_hint` names the expected length.
std::span<const int32_t> indptr(std::string_view name, const TensorView& t,
                                int64_t expected_len = -1);

// Every value in [0, bound).
void indices_in_range(std::string_view name, std::span<const int32_t> values, int64_t bound);

// min(0, the smallest of `values`) (so negative only where some value is), the largest (-1 for
// none; page ids are not negative) and where the largest first occurs (-1 for none): one pass at
// memory speed (a page table of a serving batch has 10^4-10^6 ids).
struct IdRange {
  int32_t min = 0, max = -1;
  int64_t max_pos = -1;
};
IdRange id_range(std::span<const int32_t> values);
// id_range of a page table's host ids, throwing kvattn::Error that names the first negative one
// ("kv_indices[i] = -1 is negative").
IdRange page_id_range(std::span<const int32_t> ids);
// Throws kvattn::Error naming request b and qo_indptr[b..b+1] = qo_begin..qo_end unless
// qo_end - qo_begin <= kv_len (the cascade's last level needs it; BatchPrefill does not).
void qo_len_within_kv_len(int64_t b, int64_t qo_begin, int64_t qo_end, int64_t kv_len);

// Request lengths of a page table: page_size * (pages - 1) + last_page_len (0 with no pages).
// Checks indptr, last_page_len in [1, page_size] for requests with pages and [0, page_size]
// without, and (when num_pages >= 0) every index in [0, num_pages).
// With device_indices_ok, kv_indices may be a CUDA tensor: then only its shape is checked and
// device_indices points at it (the kernels check the page ids when they read them).
struct PageTableInfo {
  std::span<const int32_t> indptr, indices, last_page_len;
  const int32_t* device_indices = nullptr;
  Device indices_device;
  int64_t batch_size = 0;
};
PageTableInfo page_table(const PageTable& t, int page_size, int64_t num_pages = -1,
                         bool device_indices_ok = false);
int64_t paged_kv_len(const PageTableInfo& info, int page_size, int64_t request);

// ---- aliasing ---------------------------------------------------------------------------------
// The rules the public headers state: an output never overlaps itself (no stride of 0 along a
// dimension of size > 1, no strides that give two elements the same bytes) and never shares a
// byte with another tensor of the call, except, where an operation allows it, as exactly the same
// view (same pointer, dtype, shape and strides). Checked from the views alone (host and device
// pointers alike; tensors on different devices never overlap), in O(1) per pair.
void no_self_overlap(std::string_view name, const TensorView& t);
// Whether a and b may share a byte: their byte ranges intersect, unless both are row-strided with
// the same row stride and their rows interleave without touching (q and k of one fused QKV
// buffer).
bool may_overlap(const TensorView& a, const TensorView& b);
bool same_view(const TensorView& a, const TensorView& b);
// out must not overlap `other`; allow_exact: unless it is the same view.
void no_overlap(std::string_view out_name, const TensorView& out, std::string_view other_name,
                const TensorView& other, bool allow_exact = false);

}  // namespace kvattn::validate
