// Stand-alone operations (kvattn/ops.h): argument validation, then lowering to the backend. Every
// check runs before anything is written, so a bad argument leaves every output untouched.
//
// Choices made here (documented in kvattn/ops.h):
// - merge: the input states of one call share a dtype (f32, f16 or bf16); the output o may be any
//   of the three; LSEs are f32. Arithmetic is f32. The output may alias an input exactly.
// - append_paged_kv_cache: append_k/append_v may have a dtype other than the cache's; values are
//   converted (round to nearest even; fp8 saturates at its largest finite value, no scaling).
//   Same dtypes copy bits. Two rows may not write the same cache slot.
// - apply_rope, apply_rope_with_cos_sin_cache: q_out/k_out have the dtypes of q/k; out may alias in
//   (same pointer and strides).
// - CUDA tensors (merge ops, append): the host checks what it can without reading device memory
//   (shapes, dtypes, devices, strides, element alignment); the append kernel guards the index
//   arrays it reads (a row with an out-of-range index is skipped). Launches only: no allocation,
//   no synchronisation, on the caller's stream.
#include "kvattn/ops.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "core/validate.h"
#include "cpu/ops.h"

#if KVATTN_WITH_CUDA
#include "cuda/append_kernels.h"
#include "cuda/merge_kernels.h"
#include "cuda/rope_kernels.h"
#include "cuda/runtime.h"
#endif

namespace kvattn {

namespace {

// A backend for t's device: the CPU, or (CUDA builds) an existing CUDA device.
void check_backend(std::string_view name, const TensorView& t) {
  if (t.device().is_cpu()) return;
#if KVATTN_WITH_CUDA
  const std::string what = std::string(name) + " on " + t.device().str();
  cuda::require_cuda(what.c_str());
  (void)cuda::device_info(t.device().index);  // "cuda:N does not exist (M CUDA devices)"
#else
  detail::throw_error(name, " is on ", t.device().str(),
                      " but this build of kvattn has no CUDA backend; pass host (cpu) tensors");
#endif
}

void check_data(std::string_view name, const TensorView& t) {
  KVATTN_CHECK(t.numel() == 0 || t.data() != nullptr, name, " has a null data pointer");
}

// An n-D f32/f16/bf16 tensor with a contiguous last dim, on `dev`.
void check_float_tensor(std::string_view name, const TensorView& t, int ndim, Device dev,
                        std::string_view dev_from) {
  validate::ndim(name, t, ndim);
  validate::float_dtype(name, t);
  validate::last_dim_contiguous(name, t);
  validate::same_device(name, t, dev, dev_from);
  check_data(name, t);
}

void check_lse_tensor(std::string_view name, const TensorView& t, int ndim, Device dev,
                      std::string_view dev_from) {
  validate::ndim(name, t, ndim);
  validate::dtype(name, t, DType::f32);
  validate::same_device(name, t, dev, dev_from);
  check_data(name, t);
}

// t.shape[d] == ref.shape[rd] for each listed pair; "v_b.shape[1] = 7 but v_a.shape[1] = 8".
void check_same_dims(std::string_view name, const TensorView& t, std::string_view ref_name,
                     const TensorView& ref, std::initializer_list<std::pair<int, int>> dims) {
  for (auto [d, rd] : dims) {
    std::string what = std::string(ref_name) + ".shape[" + std::to_string(rd) + "]";
    validate::dim(name, t, d, ref.size(rd), what);
  }
}

void check_same_dtype(std::string_view name, const TensorView& t, std::string_view ref_name,
                      const TensorView& ref) {
  KVATTN_CHECK(t.dtype() == ref.dtype(), name, " has dtype ", dtype_name(t.dtype()), " but ",
               ref_name, " has dtype ", dtype_name(ref.dtype()), "; they must match");
}

// The aliasing rules of kvattn/ops.h: each output is free of self-overlap and shares no memory
// with another output or with an input, except an input that names it as its exact alias (the
// same view: in-place operation).
struct Output { std::string_view name; const TensorView* t; };
struct Input { std::string_view name; const TensorView* t; std::string_view exact_alias_of; };
void check_outputs(std::initializer_list<Output> outputs, std::initializer_list<Input> inputs) {
  for (const Output& o : outputs) validate::no_self_overlap(o.name, *o.t);
  for (auto a = outputs.begin(); a != outputs.end(); ++a)
    for (auto b = a + 1; b != outputs.end(); ++b) validate::no_overlap(a->name, *a->t, b->name, *b->t);
  for (const Output& o : outputs)
    for (const Input& i : inputs) {
      if (!i.t->defined()) continue;
      validate::no_overlap(o.name, *o.t, i.name, *i.t, i.exact_alias_of == o.name);
    }
}

cpu::MergeInput merge_input(const TensorView& v, const TensorView& s) {
  return {static_cast<const char*>(v.data()), v.stride(0), v.stride(1), s.data_as<const float>(),
          s.stride(0), s.stride(1)};
}

void set_merge_output(cpu::MergeProblem& p, const TensorView& v, const TensorView& s) {
  p.num_rows = v.size(0);
  p.num_heads = int(v.size(1));
  p.head_dim = int(v.size(2));
  p.v_out = static_cast<char*>(v.data());
  p.out_dtype = v.dtype();
  p.vo_row = v.stride(0);
  p.vo_head = v.stride(1);
  p.s_out = s.data_as<float>();
  p.so_row = s.stride(0);
  p.so_head = s.stride(1);
}

// The GPU kernels access whole elements (a misaligned access is a sticky CUDA error).
void check_element_aligned(std::string_view name, const TensorView& t) {
  const size_t esz = dtype_size(t.dtype());
  KVATTN_CHECK(reinterpret_cast<uintptr_t>(t.data()) % esz == 0, name, " starts at address ",
               t.data(), ", which is not a multiple of its element size (", esz, " bytes, ",
               t.describe(), "); the GPU kernels access whole elements");
}

#if KVATTN_WITH_CUDA

// Whether every head vector of t starts on a multiple of 4 elements (the merge kernels then move
// 4 elements per access): the start and every stride but the last.
bool vec4_aligned(const TensorView& t) {
  const int64_t esz = int64_t(dtype_size(t.dtype()));
  if (reinterpret_cast<uintptr_t>(t.data()) % uintptr_t(4 * esz) != 0) return false;
  for (int d = 0; d + 1 < t.ndim(); ++d)
    if (t.size(d) > 1 && t.stride(d) % 4 != 0) return false;
  return true;
}

// The kernels take heads, states and head dims as 32-bit ints.
void check_small_dims(std::string_view name, const TensorView& t) {
  for (int d = 1; d < t.ndim(); ++d)
    KVATTN_CHECK(t.size(d) <= INT32_MAX, name, " = ", t.describe(), " is too large for the GPU kernels (dim ",
                 d, " exceeds 2^31 - 1)");
}

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }
#endif

}  // namespace

// ---- merge --------------------------------------------------------------------------------------
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                 void* stream) {
  check_float_tensor("v_a", v_a, 3, v_a.device(), "v_a");
  const Device dev = v_a.device();
  check_float_tensor("v_b", v_b, 3, dev, "v_a");
  check_same_dtype("v_b", v_b, "v_a", v_a);
  check_same_dims("v_b", v_b, "v_a", v_a, {{0, 0}, {1, 1}, {2, 2}});
  check_float_tensor("v_out", v_out, 3, dev, "v_a");
  check_same_dims("v_out", v_out, "v_a", v_a, {{0, 0}, {1, 1}, {2, 2}});
  for (auto [name, s] : {std::pair{"s_a", &s_a}, std::pair{"s_b", &s_b}, std::pair{"s_out", &s_out}}) {
    check_lse_tensor(name, *s, 2, dev, "v_a");
    check_same_dims(name, *s, "v_a", v_a, {{0, 0}, {1, 1}});
  }
  check_outputs({{"v_out", &v_out}, {"s_out", &s_out}},
                {{"v_a", &v_a, "v_out"}, {"s_a", &s_a, "s_out"}, {"v_b", &v_b, "v_out"}, {"s_b", &s_b, "s_out"}});
  if (!dev.is_cpu()) {
#if KVATTN_WITH_CUDA
    for (auto [name, t] : {std::pair{"v_a", &v_a}, std::pair{"s_a", &s_a}, std::pair{"v_b", &v_b},
                           std::pair{"s_b", &s_b}, std::pair{"v_out", &v_out}, std::pair{"s_out", &s_out}})
      check_element_aligned(name, *t);
    check_small_dims("v_a", v_a);
#endif
    check_backend("v_a", v_a);
#if KVATTN_WITH_CUDA
    kernels::MergePairParams p;
    p.v_a = v_a.data(), p.va_row = v_a.stride(0), p.va_head = v_a.stride(1);
    p.s_a = s_a.data_as<const float>(), p.sa_row = s_a.stride(0), p.sa_head = s_a.stride(1);
    p.v_b = v_b.data(), p.vb_row = v_b.stride(0), p.vb_head = v_b.stride(1);
    p.s_b = s_b.data_as<const float>(), p.sb_row = s_b.stride(0), p.sb_head = s_b.stride(1);
    p.v_out = v_out.data(), p.vo_row = v_out.stride(0), p.vo_head = v_out.stride(1);
    p.s_out = s_out.data_as<float>(), p.so_row = s_out.stride(0), p.so_head = s_out.stride(1);
    p.num_rows = v_a.size(0);
    p.num_heads = int32_t(v_a.size(1));
    p.head_dim = int32_t(v_a.size(2));
    p.vec4 = v_a.size(2) % 4 == 0 && vec4_aligned(v_a) && vec4_aligned(v_b) && vec4_aligned(v_out);
    cuda::DeviceGuard guard(dev.index);
    cuda::launch_merge_pair(p, v_a.dtype(), v_out.dtype(), as_stream(stream));
#endif
    return;
  }
  cpu::MergeProblem p;
  p.in_dtype = v_a.dtype();
  p.inputs = {merge_input(v_a, s_a), merge_input(v_b, s_b)};
  set_merge_output(p, v_out, s_out);
  cpu::merge(p);
}

void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, const TensorView& mask, void* stream) {
  check_float_tensor("v", v, 3, v.device(), "v");
  const Device dev = v.device();
  check_float_tensor("v_other", v_other, 3, dev, "v");
  check_same_dtype("v_other", v_other, "v", v);
  check_same_dims("v_other", v_other, "v", v, {{0, 0}, {1, 1}, {2, 2}});
  check_lse_tensor("s", s, 2, dev, "v");
  check_same_dims("s", s, "v", v, {{0, 0}, {1, 1}});
  check_lse_tensor("s_other", s_other, 2, dev, "v");
  check_same_dims("s_other", s_other, "v", v, {{0, 0}, {1, 1}});
  if (mask.defined()) {
    validate::ndim("mask", mask, 1);
    validate::dtype("mask", mask, DType::u8);
    validate::same_device("mask", mask, dev, "v");
    check_same_dims("mask", mask, "v", v, {{0, 0}});
    check_data("mask", mask);
  }
  check_outputs({{"v", &v}, {"s", &s}}, {{"v_other", &v_other, "v"}, {"s_other", &s_other, "s"}, {"mask", &mask, ""}});
  if (!dev.is_cpu()) {
#if KVATTN_WITH_CUDA
    for (auto [name, t] : {std::pair{"v", &v}, std::pair{"s", &s}, std::pair{"v_other", &v_other},
                           std::pair{"s_other", &s_other}})
      check_element_aligned(name, *t);
    check_small_dims("v", v);
#endif
    check_backend("v", v);
#if KVATTN_WITH_CUDA
    kernels::MergePairParams p;
    p.v_a = v.data(), p.va_row = v.stride(0), p.va_head = v.stride(1);
    p.s_a = s.data_as<const float>(), p.sa_row = s.stride(0), p.sa_head = s.stride(1);
    p.v_b = v_other.data(), p.vb_row = v_other.stride(0), p.vb_head = v_other.stride(1);
    p.s_b = s_other.data_as<const float>(), p.sb_row = s_other.stride(0), p.sb_head = s_other.stride(1);
    p.v_out = v.data(), p.vo_row = v.stride(0), p.vo_head = v.stride(1);
    p.s_out = s.data_as<float>(), p.so_row = s.stride(0), p.so_head = s.stride(1);
    if (mask.defined()) {
      p.mask = mask.data_as<const uint8_t>();
      p.mask_stride = mask.stride(0);
    }
    p.num_rows = v.size(0);
    p.num_heads = int32_t(v.size(1));
    p.head_dim = int32_t(v.size(2));
    p.vec4 = v.size(2) % 4 == 0 && vec4_aligned(v) && vec4_aligned(v_other);
    cuda::DeviceGuard guard(dev.index);
    cuda::launch_merge_pair(p, v.dtype(), v.dtype(), as_stream(stream));
#endif
    return;
  }
  cpu::MergeProblem p;
  p.in_dtype = v.dtype();
  p.inputs = {merge_input(v, s), merge_input(v_other, s_other)};
  set_merge_output(p, v, s);
  if (mask.defined()) {
    p.mask = mask.data_as<const uint8_t>();
    p.mask_stride = mask.stride(0);
  }
  cpu::merge(p);
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out, void* stream) {
  check_float_tensor("v", v, 4, v.device(), "v");
  const Device dev = v.device();
  check_lse_tensor("s", s, 3, dev, "v");
  check_same_dims("s", s, "v", v, {{0, 0}, {1, 1}, {2, 2}});
  check_float_tensor("v_out", v_out, 3, dev, "v");
  check_same_dims("v_out", v_out, "v", v, {{0, 0}, {1, 2}, {2, 3}});
  check_lse_tensor("s_out", s_out, 2, dev, "v");
  check_same_dims("s_out", s_out, "v", v, {{0, 0}, {1, 2}});
  // The outputs may be state 0 of the inputs exactly (each row reads its states before it writes).
  const bool has_states = v.size(1) > 0;  // k = 0: no state 0 to alias (and v, s hold nothing)
  const TensorView v0 = has_states ? TensorView(v.data(), v.dtype(), {v.size(0), v.size(2), v.size(3)},
                                                {v.stride(0), v.stride(2), v.stride(3)}, v.device())
                                   : TensorView();
  const TensorView s0 = has_states ? TensorView(s.data(), s.dtype(), {s.size(0), s.size(2)},
                                                {s.stride(0), s.stride(2)}, s.device())
                                   : TensorView();
  if (has_states && validate::same_view(v_out, v0) && validate::same_view(s_out, s0)) {
    validate::no_self_overlap("v_out", v_out);
    validate::no_self_overlap("s_out", s_out);
    validate::no_overlap("v_out", v_out, "s_out", s_out);
  } else {
    check_outputs({{"v_out", &v_out}, {"s_out", &s_out}},
                  {{"v", &v, ""}, {"s", &s, ""}, {"v (state 0)", &v0, "v_out"}, {"s (state 0)", &s0, "s_out"}});
  }
  if (!dev.is_cpu()) {
#if KVATTN_WITH_CUDA
    for (auto [name, t] : {std::pair{"v", &v}, std::pair{"s", &s}, std::pair{"v_out", &v_out},
                           std::pair{"s_out", &s_out}})
      check_element_aligned(name, *t);
    check_small_dims("v", v);
#endif
    check_backend("v", v);
#if KVATTN_WITH_CUDA
    kernels::MergeStatesParams p;
    p.v = v.data(), p.v_row = v.stride(0), p.v_state = v.stride(1), p.v_head = v.stride(2);
    p.s = s.data_as<const float>(), p.s_row = s.stride(0), p.s_state = s.stride(1), p.s_head = s.stride(2);
    p.v_out = v_out.data(), p.vo_row = v_out.stride(0), p.vo_head = v_out.stride(1);
    p.s_out = s_out.data_as<float>(), p.so_row = s_out.stride(0), p.so_head = s_out.stride(1);
    p.num_rows = v.size(0);
    p.num_states = int32_t(v.size(1));
    p.num_heads = int32_t(v.size(2));
    p.head_dim = int32_t(v.size(3));
    p.vec4 = v.size(3) % 4 == 0 && vec4_aligned(v) && vec4_aligned(v_out);
    cuda::DeviceGuard guard(dev.index);
    cuda::launch_merge_states(p, v.dtype(), v_out.dtype(), as_stream(stream));
#endif
    return;
  }
  cpu::MergeProblem p;
  p.in_dtype = v.dtype();
  const size_t esz = dtype_size(v.dtype());
  for (int64_t i = 0; i < v.size(1); ++i)
    p.inputs.push_back({static_cast<const char*>(v.data()) + i * v.stride(1) * int64_t(esz),
                        v.stride(0), v.stride(2), s.data_as<const float>() + i * s.stride(1),
                        s.stride(0), s.stride(2)});
  set_merge_output(p, v_out, s_out);
  cpu::merge(p);
}

// ---- paged append -------------------------------------------------------------------------------
namespace {

// The CUDA path of append_paged_kv_cache, after the checks common to both backends (shapes,
// dtypes, devices and strides of the K/V tensors and of the cache). The index arrays live on the
// cache's device: their shapes, dtypes and alignment are checked here, their values by the kernel.
void append_paged_gpu(const TensorView& append_k, const TensorView& append_v,
                      const TensorView& batch_indices, const TensorView& positions,
                      const PagedKVCache& cache, const PageTable& page_table, void* stream) {
#if KVATTN_WITH_CUDA
  const Device dev = append_k.device();
  const int64_t nnz = append_k.size(0);
  auto index_array = [&](std::string_view name, const TensorView& t, int64_t len) {
    validate::ndim(name, t, 1);
    validate::dtype(name, t, DType::i32);
    KVATTN_CHECK(t.device() == dev, name, " is on ", t.device().str(), " but the paged cache is on ",
                 dev.str(), "; with a CUDA cache, batch_indices, positions and the page table are "
                 "int32 tensors on the cache's device");
    KVATTN_CHECK(t.size(0) <= 1 || t.stride(0) == 1, name, " must be contiguous, got ", t.describe());
    if (len >= 0)
      KVATTN_CHECK(t.size(0) == len, name, " has ", t.size(0), " elements but ", len, " are expected");
    check_data(name, t);
    check_element_aligned(name, t);
  };
  index_array("batch_indices", batch_indices, nnz);
  index_array("positions", positions, nnz);
  index_array("kv_indptr", page_table.indptr, -1);
  KVATTN_CHECK(page_table.indptr.size(0) >= 1,
               "kv_indptr must have at least one element (batch_size + 1)");
  const int64_t batch_size = page_table.indptr.size(0) - 1;
  index_array("kv_indices", page_table.indices, -1);
  index_array("kv_last_page_len", page_table.last_page_len, batch_size);
  const std::string cache_k = std::string("paged k (") + kv_layout_name(cache.layout) + ")";
  KVATTN_CHECK(cache.page_size() >= 1 && cache.page_size() <= INT32_MAX, "the page size of ",
               cache_k, " is ", cache.page_size(), "; it must be >= 1");
  KVATTN_CHECK(batch_size < INT32_MAX && cache.num_heads() <= INT32_MAX &&
                   cache.head_dim_qk() <= INT32_MAX && cache.head_dim_vo() <= INT32_MAX,
               "the append is too large for the GPU kernel (", batch_size, " requests, ",
               cache.k.describe(), ")");
  for (auto [name, t] : {std::pair{"append_k", &append_k}, std::pair{"append_v", &append_v},
                         std::pair{"paged k", &cache.k}, std::pair{"paged v", &cache.v}})
    check_element_aligned(name, *t);
  check_backend("append_k", append_k);

  kernels::AppendParams p;
  auto side = [](const TensorView& src, const TensorView& dst, int64_t tok_stride, int64_t head_stride) {
    kernels::AppendSideParams s;
    s.src = src.data();
    s.src_row = src.stride(0);
    s.src_head = src.stride(1);
    s.dst = dst.data();
    s.dst_page = dst.stride(0);
    s.dst_token = tok_stride;
    s.dst_head = head_stride;
    s.src_dtype = int32_t(src.dtype());  // kernels number dtypes as kvattn::DType
    s.dst_dtype = int32_t(dst.dtype());
    s.head_dim = int32_t(src.size(2));
    if (src.dtype() == dst.dtype()) {
      const int64_t esz = int64_t(dtype_size(src.dtype()));
      s.copy_bytes = cuda::copy_width(
          {int64_t(reinterpret_cast<uintptr_t>(src.data())), int64_t(reinterpret_cast<uintptr_t>(dst.data())),
           s.head_dim * esz, s.src_row * esz, s.src_head * esz, s.dst_page * esz, s.dst_token * esz,
           s.dst_head * esz});
    }
    return s;
  };
  p.k = side(append_k, cache.k, cache.k_token_stride(), cache.k_head_stride());
  p.v = side(append_v, cache.v, cache.v_token_stride(), cache.v_head_stride());
  p.batch_indices = batch_indices.data_as<const int32_t>();
  p.positions = positions.data_as<const int32_t>();
  p.kv_indptr = page_table.indptr.data_as<const int32_t>();
  p.kv_indices = page_table.indices.data_as<const int32_t>();
  p.kv_last_page_len = page_table.last_page_len.data_as<const int32_t>();
  p.num_rows = nnz;
  p.num_pages = cache.num_pages();
  p.num_heads = int32_t(cache.num_heads());
  p.page_size = int32_t(cache.page_size());
  p.batch_size = int32_t(batch_size);
  // indptr values are int32, so no index past INT32_MAX is ever reachable.
  p.num_indices = int32_t(std::min<int64_t>(page_table.indices.size(0), INT32_MAX));
  cuda::DeviceGuard guard(dev.index);
  cuda::launch_append_paged(p, as_stream(stream));
#else
  (void)append_v, (void)batch_indices, (void)positions, (void)cache, (void)page_table, (void)stream;
  check_backend("append_k", append_k);
#endif
}

}  // namespace

void append_paged_kv_cache(const TensorView& append_k, const TensorView& append_v,
                           const TensorView& batch_indices, const TensorView& positions,
                           const PagedKVCache& cache, const PageTable& page_table, void* stream) {
  validate::ndim("append_k", append_k, 3);
  const Device dev = append_k.device();
  validate::ndim("append_v", append_v, 3);
  validate::ndim("paged k", cache.k, 4);
  validate::ndim("paged v", cache.v, 4);
  const char* layout = kv_layout_name(cache.layout);
  for (auto [name, t] : {std::pair{"append_k", &append_k}, std::pair{"append_v", &append_v},
                         std::pair{"paged k", &cache.k}, std::pair{"paged v", &cache.v}}) {
    KVATTN_CHECK(is_float(t->dtype()), name, " has dtype ", dtype_name(t->dtype()),
                 "; expected a float dtype (f32, f16, bf16, e4m3 or e5m2)");
    validate::last_dim_contiguous(name, *t);
    validate::same_device(name, *t, dev, "append_k");
    check_data(name, *t);
  }
  const int tok_dim = cache.layout == KVLayout::NHD ? 1 : 2;
  const int head_dim = cache.layout == KVLayout::NHD ? 2 : 1;
  const std::string cache_k = std::string("paged k (") + layout + ")";
  // The cache's own consistency: v has k's pages, page size and heads.
  check_same_dims("paged v", cache.v, cache_k, cache.k, {{0, 0}, {tok_dim, tok_dim}, {head_dim, head_dim}});
  const int64_t nnz = append_k.size(0), heads = cache.num_heads();
  validate::dim("append_k", append_k, 1, heads, cache_k + ".shape[" + std::to_string(head_dim) + "] (num_kv_heads)");
  validate::dim("append_k", append_k, 2, cache.head_dim_qk(), cache_k + ".shape[3] (head_dim)");
  validate::dim("append_v", append_v, 0, nnz, "append_k.shape[0] (nnz)");
  validate::dim("append_v", append_v, 1, heads, cache_k + ".shape[" + std::to_string(head_dim) + "] (num_kv_heads)");
  validate::dim("append_v", append_v, 2, cache.head_dim_vo(), "paged v.shape[3] (head_dim)");
  check_outputs({{"paged k", &cache.k}, {"paged v", &cache.v}},
                {{"append_k", &append_k, ""}, {"append_v", &append_v, ""}, {"batch_indices", &batch_indices, ""},
                 {"positions", &positions, ""}, {"kv_indptr", &page_table.indptr, ""},
                 {"kv_indices", &page_table.indices, ""}, {"kv_last_page_len", &page_table.last_page_len, ""}});
  if (!dev.is_cpu()) {
    append_paged_gpu(append_k, append_v, batch_indices, positions, cache, page_table, stream);
    return;
  }
  auto batch = validate::int32_array("batch_indices", batch_indices, nnz);
  auto pos = validate::int32_array("positions", positions, nnz);
  KVATTN_CHECK(cache.page_size() >= 1 && cache.page_size() <= INT32_MAX, "the page size of ",
               cache_k, " is ", cache.page_size(), "; it must be >= 1");
  const int page_size = int(cache.page_size());
  auto info = validate::page_table(page_table, page_size, cache.num_pages());
  cpu::AppendProblem p;
  p.num_rows = nnz;
  p.num_heads = int(heads);
  p.page.resize(size_t(nnz));
  p.slot.resize(size_t(nnz));
  for (int64_t r = 0; r < nnz; ++r) {
    const int32_t b = batch[size_t(r)], t = pos[size_t(r)];
    KVATTN_CHECK(b >= 0 && b < info.batch_size, "batch_indices[", r, "] = ", b,
                 " is out of range [0, ", info.batch_size, ")");
    const int64_t len = validate::paged_kv_len(info, page_size, b);
    KVATTN_CHECK(t >= 0 && t < len, "positions[", r, "] = ", t, " is out of range [0, ", len,
                 ") for request ", b);
    p.page[size_t(r)] = info.indices[size_t(info.indptr[b] + t / page_size)];
    p.slot[size_t(r)] = t % page_size;
  }
  // No two rows may write one slot (the result would depend on the order of the writes).
  std::vector<int64_t> order(static_cast<size_t>(nnz));
  for (int64_t r = 0; r < nnz; ++r) order[size_t(r)] = r;
  auto key = [&](int64_t r) { return p.page[size_t(r)] * page_size + p.slot[size_t(r)]; };
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return key(a) != key(b) ? key(a) < key(b) : a < b;
  });
  for (size_t i = 1; i < order.size(); ++i) {
    const int64_t a = order[i - 1], b = order[i];
    KVATTN_CHECK(key(a) != key(b), "rows ", a, " and ", b, " of the append both write page ",
                 p.page[size_t(a)], " slot ", p.slot[size_t(a)], " (request ", batch[size_t(a)],
                 " position ", pos[size_t(a)], ", request ", batch[size_t(b)], " position ",
                 pos[size_t(b)], ")");
  }

  auto side = [&](const TensorView& src, const TensorView& dst, int64_t tok_stride,
                  int64_t head_stride) {
    return cpu::AppendSide{static_cast<const char*>(src.data()), src.dtype(), src.stride(0),
                           src.stride(1), static_cast<char*>(dst.data()), dst.dtype(),
                           dst.stride(0), tok_stride, head_stride, int(src.size(2))};
  };
  p.k = side(append_k, cache.k, cache.k_token_stride(), cache.k_head_stride());
  p.v = side(append_v, cache.v, cache.v_token_stride(), cache.v_head_stride());
  cpu::append_paged(p);
}

// ---- RoPE ---------------------------------------------------------------------------------------
namespace {

// q [nnz, Hq, D], k [nnz, Hk, D] (f32/f16/bf16, head dim contiguous, on q's device) and q_out,
// k_out (the dtypes and shapes of q and k). Returns q's device.
Device check_rope_tensors(const TensorView& q, const TensorView& k, const TensorView& q_out,
                          const TensorView& k_out) {
  check_float_tensor("q", q, 3, q.device(), "q");
  const Device dev = q.device();
  check_float_tensor("k", k, 3, dev, "q");
  validate::dim("k", k, 0, q.size(0), "q.shape[0] (nnz)");
  validate::dim("k", k, 2, q.size(2), "q.shape[2] (head_dim)");
  for (auto [name, out, in_name, in] : {std::tuple{"q_out", &q_out, "q", &q},
                                        std::tuple{"k_out", &k_out, "k", &k}}) {
    validate::ndim(name, *out, 3);
    check_same_dtype(name, *out, in_name, *in);
    check_same_dims(name, *out, in_name, *in, {{0, 0}, {1, 1}, {2, 2}});
    validate::last_dim_contiguous(name, *out);
    validate::same_device(name, *out, dev, "q");
    check_data(name, *out);
  }
  return dev;
}

// An index array of a CUDA call (pos_ids, indptr, offsets): 1-D int32 on q's device, element-aligned,
// of `len` elements when len >= 0, contiguous if asked. Its values are the kernel's to check.
void check_device_index_array(std::string_view name, const TensorView& t, Device dev, int64_t len,
                              bool contiguous) {
  validate::ndim(name, t, 1);
  validate::dtype(name, t, DType::i32);
  KVATTN_CHECK(t.device() == dev, name, " is on ", t.device().str(), " but q is on ", dev.str(),
               "; with CUDA tensors, ", name, " is an int32 tensor on q's device");
  if (contiguous) KVATTN_CHECK(t.size(0) <= 1 || t.stride(0) == 1, name, " must be contiguous, got ", t.describe());
  if (len >= 0) KVATTN_CHECK(t.size(0) == len, name, " has ", t.size(0), " elements but ", len, " are expected");
  check_data(name, t);
  check_element_aligned(name, t);
}

// Everything a RoPE call resolved before it runs.
struct RopeCall {
  Device dev;
  int64_t nnz = 0;
  int head_dim = 0, rotary_dim = 0;
  bool interleave = false, llama31 = false;
  kernels::VariantParams vp;         // computed cos/sin
  const TensorView* table = nullptr;  // apply_rope_with_cos_sin_cache
  // CPU: the positions, validated (and for a ragged batch computed here).
  const int32_t* host_pos = nullptr;
  std::vector<int32_t> host_pos_storage;
  // CUDA: the device arrays (pos_ids, or indptr + offsets).
  const TensorView* pos_ids = nullptr;
  const TensorView* indptr = nullptr;
  const TensorView* offsets = nullptr;
};

// rotary_dim and the frequencies of RopeOptions (apply_rope and its ragged form).
void resolve_rope_options(RopeCall& c, const RopeOptions& options) {
  const int64_t D = c.head_dim;
  const int rd = options.rotary_dim == 0 ? int(D) : options.rotary_dim;
  KVATTN_CHECK(options.rotary_dim >= 0, "rotary_dim = ", options.rotary_dim,
               " must be >= 0 (0: the whole head dim)");
  KVATTN_CHECK(rd <= D, "rotary_dim = ", options.rotary_dim, " exceeds the head dim ", D);
  KVATTN_CHECK(rd % 2 == 0, "rotary_dim = ", rd,
               options.rotary_dim == 0 ? " (the whole head dim)" : "",
               " must be even: RoPE rotates pairs of elements");
  KVATTN_CHECK(std::isfinite(options.rope_theta) && options.rope_theta > 0, "rope_theta = ",
               options.rope_theta, " must be finite and > 0");
  KVATTN_CHECK(std::isfinite(options.rope_scale) && options.rope_scale > 0, "rope_scale = ",
               options.rope_scale, " must be finite and > 0");
  c.vp.rope_theta = options.rope_theta;
  c.vp.rope_scale = options.rope_scale;
  if (options.llama31) {
    const Llama31Scaling& l = *options.llama31;
    KVATTN_CHECK(std::isfinite(l.factor) && l.factor > 0, "llama31.factor = ", l.factor,
                 " must be finite and > 0");
    KVATTN_CHECK(std::isfinite(l.original_max_position) && l.original_max_position > 0,
                 "llama31.original_max_position = ", l.original_max_position,
                 " must be finite and > 0");
    KVATTN_CHECK(std::isfinite(l.low_freq_factor) && l.low_freq_factor > 0 &&
                     std::isfinite(l.high_freq_factor) && l.high_freq_factor > l.low_freq_factor,
                 "llama31 needs 0 < low_freq_factor < high_freq_factor, got low_freq_factor = ",
                 l.low_freq_factor, ", high_freq_factor = ", l.high_freq_factor);
    c.vp.llama31_factor = l.factor;
    c.vp.llama31_low_freq_factor = l.low_freq_factor;
    c.vp.llama31_high_freq_factor = l.high_freq_factor;
    c.vp.llama31_original_max_position = l.original_max_position;
  }
  c.rotary_dim = rd;
  c.interleave = options.interleave;
  c.llama31 = options.llama31.has_value();
}

// q_out may be q itself and k_out k itself (in place); nothing else may share memory, so k_out
// never overwrites q (or q_out k, or either the positions or the table) before it is read.
void check_rope_outputs(const TensorView& q, const TensorView& k, const TensorView& q_out,
                        const TensorView& k_out, std::initializer_list<Input> others) {
  std::vector<Input> inputs = {{"q", &q, "q_out"}, {"k", &k, "k_out"}};
  inputs.insert(inputs.end(), others.begin(), others.end());
  for (const Output& o : {Output{"q_out", &q_out}, Output{"k_out", &k_out}}) validate::no_self_overlap(o.name, *o.t);
  validate::no_overlap("q_out", q_out, "k_out", k_out);
  for (const Output& o : {Output{"q_out", &q_out}, Output{"k_out", &k_out}})
    for (const Input& i : inputs) {
      if (!i.t->defined()) continue;
      validate::no_overlap(o.name, *o.t, i.name, *i.t, i.exact_alias_of == o.name);
    }
}

cpu::RopeSide cpu_rope_side(const TensorView& in, const TensorView& out) {
  return cpu::RopeSide{static_cast<const char*>(in.data()), static_cast<char*>(out.data()),
                       in.dtype(), in.stride(0), in.stride(1), out.stride(0), out.stride(1),
                       int(in.size(1))};
}

void rope_cpu(const RopeCall& c, const TensorView& q, const TensorView& k, const TensorView& q_out,
              const TensorView& k_out) {
  cpu::RopeProblem p;
  p.num_rows = c.nnz;
  p.head_dim = c.head_dim;
  p.rotary_dim = c.rotary_dim;
  p.interleave = c.interleave;
  p.llama31 = c.llama31;
  p.params = c.vp;
  p.pos_ids = c.host_pos;
  if (c.table) {
    p.cos_sin = c.table->data_as<const float>();
    p.cos_sin_row = c.table->stride(0);
  }
  p.q = cpu_rope_side(q, q_out);
  p.k = cpu_rope_side(k, k_out);
  cpu::rope(p);
}

// The CUDA path, after every check both backends share: the kernels' own requirements, then one
// launch (two when q and k have different dtypes) on `stream`.
void rope_gpu(const RopeCall& c, const TensorView& q, const TensorView& k, const TensorView& q_out,
              const TensorView& k_out, void* stream) {
#if KVATTN_WITH_CUDA
  for (auto [name, t] : {std::pair{"q", &q}, std::pair{"k", &k}, std::pair{"q_out", &q_out}, std::pair{"k_out", &k_out}}) {
    check_element_aligned(name, *t);
    check_small_dims(name, *t);
  }
  if (c.table) check_element_aligned("cos_sin_cache", *c.table);
  KVATTN_CHECK(c.rotary_dim <= cuda::kMaxGpuRotaryDim, "rotary_dim = ", c.rotary_dim, " exceeds ",
               cuda::kMaxGpuRotaryDim, ", the most the GPU kernels rotate (a CTA keeps its rows' cos/sin "
               "in shared memory)");
  check_backend("q", q);

  kernels::RopeParams p;
  p.num_rows = c.nnz;
  p.head_dim = c.head_dim;
  p.rotary_dim = c.rotary_dim;
  // In place on both sides, the elements past rotary_dim are left as they are; else copied.
  p.copy_rest = !(validate::same_view(q, q_out) && validate::same_view(k, k_out));
  if (c.indptr) {
    p.indptr = c.indptr->data_as<const int32_t>();
    p.offsets = c.offsets->data_as<const int32_t>();
    p.batch_size = int32_t(c.indptr->size(0) - 1);
  } else {
    p.pos_ids = c.pos_ids->data_as<const int32_t>();
    p.pos_stride = c.pos_ids->stride(0);
  }
  if (c.table) {
    p.cos_sin = c.table->data_as<const float>();
    p.cos_sin_row = c.table->stride(0);
    p.cos_sin_rows = c.table->size(0);
  }
  p.rope = c.vp;
  p.llama31 = c.llama31;
  auto side = [](const TensorView& in, const TensorView& out) {
    kernels::RopeSideParams s;
    s.in = in.data(), s.out = out.data();
    s.in_row = in.stride(0), s.in_head = in.stride(1), s.out_row = out.stride(0), s.out_head = out.stride(1);
    s.num_heads = int32_t(in.size(1));
    return s;
  };
  // 16-byte accesses when every address and stride allows them.
  auto config = [&](DType t, std::initializer_list<const TensorView*> views) {
    const int64_t esz = int64_t(dtype_size(t));
    std::vector<int64_t> bytes;
    for (const TensorView* v : views) {
      bytes.push_back(int64_t(reinterpret_cast<uintptr_t>(v->data())));
      for (int d = 0; d < 2; ++d)
        if (v->size(d) > 1) bytes.push_back(v->stride(d) * esz);
    }
    cuda::RopeKernelConfig cfg;
    cfg.dtype = t;
    cfg.pairs = c.interleave ? kernels::RopePairs::interleaved : kernels::RopePairs::rotate_half;
    cfg.cos_sin = c.table ? kernels::RopeCosSin::table : kernels::RopeCosSin::computed;
    bool vec = true;
    for (int64_t b : bytes) vec = vec && b % 16 == 0;
    cfg.vector_bytes = vec && cuda::rope_vectorizable(cfg.pairs, c.head_dim, c.rotary_dim, int(16 / esz)) ? 16 : 0;
    return cfg;
  };
  cuda::DeviceGuard guard(c.dev.index);
  if (q.dtype() == k.dtype()) {
    p.q = side(q, q_out);
    p.k = side(k, k_out);
    cuda::launch_rope(p, config(q.dtype(), {&q, &k, &q_out, &k_out}), as_stream(stream));
    return;
  }
  kernels::RopeParams one = p;  // one launch per dtype
  one.q = side(q, q_out);
  cuda::launch_rope(one, config(q.dtype(), {&q, &q_out}), as_stream(stream));
  one.q = side(k, k_out);
  cuda::launch_rope(one, config(k.dtype(), {&k, &k_out}), as_stream(stream));
#else
  (void)c, (void)k, (void)q_out, (void)k_out, (void)stream;
  check_backend("q", q);
#endif
}

void run_rope(const RopeCall& c, const TensorView& q, const TensorView& k, const TensorView& q_out,
              const TensorView& k_out, void* stream) {
  if (c.dev.is_cpu()) rope_cpu(c, q, k, q_out, k_out);
  else rope_gpu(c, q, k, q_out, k_out, stream);
}

}  // namespace

void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                const TensorView& k_out, const TensorView& pos_ids, const RopeOptions& options,
                void* stream) {
  RopeCall c;
  c.dev = check_rope_tensors(q, k, q_out, k_out);
  c.nnz = q.size(0);
  c.head_dim = int(q.size(2));
  if (c.dev.is_cpu()) {
    c.host_pos = validate::int32_array("pos_ids", pos_ids, c.nnz).data();
  } else {
    check_device_index_array("pos_ids", pos_ids, c.dev, c.nnz, false);
    c.pos_ids = &pos_ids;
  }
  resolve_rope_options(c, options);
  check_rope_outputs(q, k, q_out, k_out, {{"pos_ids", &pos_ids, ""}});
  run_rope(c, q, k, q_out, k_out, stream);
}

void apply_rope_ragged(const TensorView& q, const TensorView& k, const TensorView& q_out,
                       const TensorView& k_out, const TensorView& indptr, const TensorView& offsets,
                       const RopeOptions& options, void* stream) {
  RopeCall c;
  c.dev = check_rope_tensors(q, k, q_out, k_out);
  c.nnz = q.size(0);
  c.head_dim = int(q.size(2));
  if (c.dev.is_cpu()) {
    auto ind = validate::indptr("indptr", indptr);
    const int64_t batch = int64_t(ind.size()) - 1;
    KVATTN_CHECK(ind.back() == c.nnz, "indptr[", batch, "] = ", ind.back(), " but q has ", c.nnz,
                 " rows (q.shape[0]); the requests must cover every row");
    auto off = validate::int32_array("offsets", offsets, batch);
    c.host_pos_storage.resize(size_t(c.nnz));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t r = ind[b]; r < ind[b + 1]; ++r) {
        const int64_t pos = int64_t(off[size_t(b)]) + (r - ind[b]);
        KVATTN_CHECK(pos <= INT32_MAX, "row ", r, " of request ", b, " is at position offsets[", b, "] + ",
                     r - ind[b], " = ", pos, ", past int32");
        c.host_pos_storage[size_t(r)] = int32_t(pos);
      }
    c.host_pos = c.host_pos_storage.data();
  } else {
    check_device_index_array("indptr", indptr, c.dev, -1, true);
    KVATTN_CHECK(indptr.size(0) >= 1, "indptr must have at least one element (batch_size + 1)");
    KVATTN_CHECK(indptr.size(0) - 1 <= INT32_MAX, "indptr has ", indptr.size(0), " elements, too many requests");
    check_device_index_array("offsets", offsets, c.dev, indptr.size(0) - 1, true);
    c.indptr = &indptr;
    c.offsets = &offsets;
  }
  resolve_rope_options(c, options);
  check_rope_outputs(q, k, q_out, k_out, {{"indptr", &indptr, ""}, {"offsets", &offsets, ""}});
  run_rope(c, q, k, q_out, k_out, stream);
}

void apply_rope_with_cos_sin_cache(const TensorView& q, const TensorView& k, const TensorView& q_out,
                                   const TensorView& k_out, const TensorView& pos_ids,
                                   const TensorView& cos_sin_cache, bool interleave, void* stream) {
  RopeCall c;
  c.dev = check_rope_tensors(q, k, q_out, k_out);
  c.nnz = q.size(0);
  c.head_dim = int(q.size(2));
  std::span<const int32_t> pos;
  if (c.dev.is_cpu()) {
    pos = validate::int32_array("pos_ids", pos_ids, c.nnz);
    c.host_pos = pos.data();
  } else {
    check_device_index_array("pos_ids", pos_ids, c.dev, c.nnz, false);
    c.pos_ids = &pos_ids;
  }
  validate::ndim("cos_sin_cache", cos_sin_cache, 2);
  validate::dtype("cos_sin_cache", cos_sin_cache, DType::f32);
  validate::last_dim_contiguous("cos_sin_cache", cos_sin_cache);
  validate::same_device("cos_sin_cache", cos_sin_cache, c.dev, "q");
  check_data("cos_sin_cache", cos_sin_cache);
  const int64_t max_pos = cos_sin_cache.size(0), rd = cos_sin_cache.size(1);
  KVATTN_CHECK(rd >= 2 && rd % 2 == 0, "cos_sin_cache.shape[1] = ", rd,
               " (rotary_dim: the cos of rotary_dim / 2 frequencies, then their sin) must be even "
               "and >= 2");
  KVATTN_CHECK(rd <= c.head_dim, "cos_sin_cache.shape[1] = ", rd, " (rotary_dim) exceeds the head dim ", c.head_dim);
  for (size_t r = 0; r < pos.size(); ++r)
    KVATTN_CHECK(pos[r] >= 0 && pos[r] < max_pos, "pos_ids[", r, "] = ", pos[r],
                 " is out of range [0, ", max_pos, ") (the rows of cos_sin_cache)");
  c.rotary_dim = int(rd);
  c.interleave = interleave;
  c.table = &cos_sin_cache;
  check_rope_outputs(q, k, q_out, k_out, {{"pos_ids", &pos_ids, ""}, {"cos_sin_cache", &cos_sin_cache, ""}});
  run_rope(c, q, k, q_out, k_out, stream);
}

}  // namespace kvattn
