#include "core/validate.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

namespace kvattn::validate {

void defined(std::string_view name, const TensorView& t) {
  KVATTN_CHECK(t.defined(), name, " is required but was not given");
}

void ndim(std::string_view name, const TensorView& t, int expected) {
  defined(name, t);
  KVATTN_CHECK(t.ndim() == expected, name, " must be ", expected, "-D, got ", t.describe());
}

void dtype(std::string_view name, const TensorView& t, DType expected) {
  KVATTN_CHECK(t.dtype() == expected, name, " has dtype ", dtype_name(t.dtype()), " but ",
               dtype_name(expected), " is expected");
}

void float_dtype(std::string_view name, const TensorView& t) {
  KVATTN_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f16 || t.dtype() == DType::bf16,
               name, " has dtype ", dtype_name(t.dtype()), "; expected f32, f16 or bf16");
}

void dim(std::string_view name, const TensorView& t, int d, int64_t expected,
         std::string_view what) {
  KVATTN_CHECK(t.size(d) == expected, name, ".shape[", d, "] = ", t.size(d), " but ", what, " = ",
               expected);
}

void last_dim_contiguous(std::string_view name, const TensorView& t) {
  KVATTN_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, name,
               " must be contiguous in its last (head) dimension, got ", t.describe());
}

void same_device(std::string_view name, const TensorView& t, Device expected,
                 std::string_view expected_from) {
  KVATTN_CHECK(t.device() == expected, name, " is on ", t.device().str(), " but ", expected_from,
               " is on ", expected.str());
}

void host(std::string_view name, const TensorView& t) {
  KVATTN_CHECK(t.device().is_cpu(), name, " must be on the host (cpu), got ", t.device().str());
}

void gpu_workspace(const TensorView& workspace) {
  ndim("workspace", workspace, 1);
  KVATTN_CHECK(workspace.is_contiguous() && workspace.data() != nullptr,
               "workspace must be a contiguous, non-null buffer, got ", workspace.describe());
  const auto address = reinterpret_cast<uintptr_t>(workspace.data());
  KVATTN_CHECK(address % 16 == 0, "workspace must be 16-byte aligned on the GPU, got address 0x", std::hex,
               address, std::dec, " (", workspace.describe(), ")");
}

std::span<const int32_t> int32_array(std::string_view name, const TensorView& t,
                                     int64_t expected_len) {
  ndim(name, t, 1);
  dtype(name, t, DType::i32);
  host(name, t);
  KVATTN_CHECK(t.size(0) <= 1 || t.stride(0) == 1, name, " must be contiguous, got ", t.describe());
  if (expected_len >= 0)
    KVATTN_CHECK(t.size(0) == expected_len, name, " has ", t.size(0), " elements but ",
                 expected_len, " are expected");
  KVATTN_CHECK(t.size(0) == 0 || t.data() != nullptr, name, " has a null data pointer");
  return {t.data_as<const int32_t>(), size_t(t.size(0))};
}

std::span<const int32_t> indptr(std::string_view name, const TensorView& t, int64_t expected_len) {
  auto v = int32_array(name, t, expected_len);
  KVATTN_CHECK(!v.empty(), name, " must have at least one element (batch_size + 1)");
  KVATTN_CHECK(v[0] == 0, name, "[0] = ", v[0], " but an indptr starts at 0");
  for (size_t i = 1; i < v.size(); ++i)
    KVATTN_CHECK(v[i] >= v[i - 1], name, " is not non-decreasing at ", i, ": ", name, "[", i - 1,
                 "] = ", v[i - 1], ", ", name, "[", i, "] = ", v[i]);
  return v;
}

void indices_in_range(std::string_view name, std::span<const int32_t> values, int64_t bound) {
  for (size_t i = 0; i < values.size(); ++i)
    KVATTN_CHECK(values[i] >= 0 && values[i] < bound, name, "[", i, "] = ", values[i],
                 " is out of range [0, ", bound, ")");
}

namespace {
// Blocks of ids whose minimum and maximum loops vectorise (AVX2's pminsd / pmaxsd where the
// processor has them: SSE2 alone emulates each with four instructions), remembering the first
// block to reach a new maximum, so that only it is searched for the maximum's position.
struct BlockScan {
  int32_t min = 0, max = -1;
  size_t max_block = 0;
};
constexpr size_t kIdBlock = 1024;
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && defined(__GLIBC__)  // ifunc dispatch
__attribute__((target_clones("avx2", "default")))
#endif
BlockScan scan_blocks(const int32_t* ids, size_t n) {
  BlockScan r;
  for (size_t b0 = 0; b0 < n; b0 += kIdBlock) {
    const size_t b1 = std::min(n, b0 + kIdBlock);
    int32_t lo = 0, hi = -1;
    for (size_t i = b0; i < b1; ++i) {
      lo = std::min(lo, ids[i]);
      hi = std::max(hi, ids[i]);
    }
    r.min = std::min(r.min, lo);
    if (hi > r.max) r.max = hi, r.max_block = b0;
  }
  return r;
}
}  // namespace

IdRange id_range(std::span<const int32_t> values) {
  const BlockScan s = scan_blocks(values.data(), values.size());
  IdRange r{s.min, s.max, -1};
  if (s.max >= 0)
    r.max_pos = std::find(values.begin() + int64_t(s.max_block), values.end(), s.max) - values.begin();
  return r;
}

IdRange page_id_range(std::span<const int32_t> ids) {
  const IdRange range = id_range(ids);
  if (range.min < 0) {
    const auto neg = std::find_if(ids.begin(), ids.end(), [](int32_t id) { return id < 0; });
    KVATTN_CHECK(false, "kv_indices[", neg - ids.begin(), "] = ", *neg, " is negative; page ids are in [0, num_pages)");
  }
  return range;
}

void qo_len_within_kv_len(int64_t b, int64_t qo_begin, int64_t qo_end, int64_t kv_len) {
  KVATTN_CHECK(qo_end - qo_begin <= kv_len, "request ", b, " has qo_len = ", qo_end - qo_begin, " > kv_len = ", kv_len,
               " (qo_indptr[", b, "..", b + 1, "] = ", qo_begin, "..", qo_end,
               "); the cascade's last level needs qo_len <= kv_len (its first queries would sit inside the shared prefix)");
}

// ---- aliasing ---------------------------------------------------------------------------------
namespace {
uintptr_t address(const TensorView& t) { return reinterpret_cast<uintptr_t>(t.data()); }
bool empty(const TensorView& t) { return !t.defined() || t.numel() == 0; }
}  // namespace

void no_self_overlap(std::string_view name, const TensorView& t) {
  if (empty(t)) return;
  std::array<std::pair<int64_t, int64_t>, TensorView::kMaxDims> dims{};  // (stride, size)
  int n = 0;
  for (int d = 0; d < t.ndim(); ++d)
    if (t.size(d) > 1) dims[size_t(n++)] = {t.stride(d), t.size(d)};
  std::sort(dims.begin(), dims.begin() + n);
  int64_t reach = 0;  // farthest element offset the smaller strides reach
  for (int i = 0; i < n; ++i) {
    const auto [stride, size] = dims[size_t(i)];
    KVATTN_CHECK(stride > reach, name, " = ", t.describe(),
                 " has elements that share memory (a stride of ", stride,
                 " along a dimension of ", size, "); an output needs distinct memory per element");
    reach += (size - 1) * stride;
  }
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data() != b.data() || a.dtype() != b.dtype() || a.ndim() != b.ndim() || a.device() != b.device())
    return false;
  for (int d = 0; d < a.ndim(); ++d)
    if (a.size(d) != b.size(d) || (a.size(d) > 1 && a.stride(d) != b.stride(d))) return false;
  return true;
}

bool may_overlap(const TensorView& a, const TensorView& b) {
  if (empty(a) || empty(b) || a.device() != b.device()) return false;
  const uintptr_t a0 = address(a), a1 = a0 + uintptr_t(a.extent_bytes());
  const uintptr_t b0 = address(b), b1 = b0 + uintptr_t(b.extent_bytes());
  if (a1 <= b0 || b1 <= a0) return false;
  // Rows of one row stride S that interleave: a's bytes sit at [0, ra) and b's at [d, d + rb)
  // modulo S, where d is the distance of their starts.
  if (a.ndim() >= 2 && b.ndim() >= 2 && a.size(0) > 1 && b.size(0) > 1) {
    const int64_t S = a.stride(0) * int64_t(dtype_size(a.dtype()));
    if (S > 0 && S == b.stride(0) * int64_t(dtype_size(b.dtype()))) {
      const int64_t ra = a.select(0).extent_bytes(), rb = b.select(0).extent_bytes();
      if (ra <= S && rb <= S) {
        const int64_t d = (int64_t(b0 - a0) % S + S) % S;
        return d < ra || d + rb > S;
      }
    }
  }
  return true;
}

void no_overlap(std::string_view out_name, const TensorView& out, std::string_view other_name,
                const TensorView& other, bool allow_exact) {
  if (allow_exact && same_view(out, other)) return;
  KVATTN_CHECK(!allow_exact || out.data() != other.data() || empty(out) || empty(other), out_name,
               " aliases ", other_name, " with other strides or shape (", out.describe(), " vs ",
               other.describe(), "); in place, the two must be identical views");
  KVATTN_CHECK(!may_overlap(out, other), out_name, " (", out.describe(), " at ", out.data(),
               ") overlaps ", other_name, " (", other.describe(), " at ", other.data(), ")",
               allow_exact ? "; it may only alias it exactly (the same pointer, shape and strides)"
                           : "; they must not share memory");
}

PageTableInfo page_table(const PageTable& t, int page_size, int64_t num_pages,
                         bool device_indices_ok) {
  KVATTN_CHECK(page_size >= 1, "page_size = ", page_size, " must be >= 1");
  PageTableInfo info;
  info.indptr = indptr("kv_indptr", t.indptr);
  info.batch_size = int64_t(info.indptr.size()) - 1;
  info.indices_device = t.indices.device();
  int64_t num_indices = 0;
  if (t.indices.defined() && !t.indices.device().is_cpu()) {
    KVATTN_CHECK(device_indices_ok, "kv_indices is on ", t.indices.device().str(),
                 "; only BatchDecode and BatchPrefill with a CUDA workspace read a device-resident page "
                 "table, pass a host (cpu) array here");
    ndim("kv_indices", t.indices, 1);
    dtype("kv_indices", t.indices, DType::i32);
    KVATTN_CHECK(t.indices.size(0) <= 1 || t.indices.stride(0) == 1,
                 "kv_indices must be contiguous, got ", t.indices.describe());
    KVATTN_CHECK(t.indices.size(0) == 0 || t.indices.data() != nullptr,
                 "kv_indices has a null data pointer");
    info.device_indices = t.indices.data_as<const int32_t>();
    num_indices = t.indices.size(0);
  } else {
    info.indices = int32_array("kv_indices", t.indices);
    num_indices = int64_t(info.indices.size());
  }
  ndim("kv_last_page_len", t.last_page_len, 1);
  KVATTN_CHECK(t.last_page_len.size(0) == info.batch_size, "kv_indptr has ", info.indptr.size(),
               " elements (batch_size ", info.batch_size, ") but kv_last_page_len has ",
               t.last_page_len.size(0), " (batch_size ", t.last_page_len.size(0),
               "): kv_indptr needs batch_size + 1 elements, kv_last_page_len batch_size");
  info.last_page_len = int32_array("kv_last_page_len", t.last_page_len, info.batch_size);
  KVATTN_CHECK(num_indices >= info.indptr.back(), "kv_indptr[", info.batch_size, "] = ",
               info.indptr.back(), " exceeds the length of kv_indices (", num_indices, ")");
  for (int64_t b = 0; b < info.batch_size; ++b) {
    int32_t last = info.last_page_len[b];
    bool has_pages = info.indptr[b + 1] > info.indptr[b];
    KVATTN_CHECK(last >= (has_pages ? 1 : 0) && last <= page_size, "kv_last_page_len[", b,
                 "] = ", last, " is out of range [", has_pages ? 1 : 0, ", ", page_size, "]",
                 has_pages ? "" : " (request has no pages)");
  }
  if (num_pages >= 0 && !info.device_indices)
    indices_in_range("kv_indices", info.indices.first(size_t(info.indptr.back())), num_pages);
  return info;
}

int64_t paged_kv_len(const PageTableInfo& info, int page_size, int64_t b) {
  int64_t pages = info.indptr[b + 1] - info.indptr[b];
  return pages == 0 ? 0 : int64_t(page_size) * (pages - 1) + info.last_page_len[b];
}

}  // namespace kvattn::validate
