// apply_rope_with_cos_sin_cache (kvattn/ops.h): RoPE with precomputed cos/sin, the form vLLM and
// SGLang call every layer (FlashInfer's apply_rope_with_cos_sin_cache). Validation, then the CPU
// kernel (the only backend of this op so far).
//
// The rotation is apply_rope's (src/cpu/rope.cpp): for the pair (x0, x1) of frequency t, (x0, x1)
// <- (x0 c - x1 s, x1 c + x0 s) in f32, with c = cache[pos][t] and s = cache[pos][rotary_dim / 2 +
// t] read from the caller's table instead of cosf/sinf of pos * f_t. The pairs are (x[t],
// x[t + rotary_dim / 2]) (rotate-half, "neox") or (x[2t], x[2t + 1]) (interleaved, "GPT-J"); both
// use cos/sin index t, as FlashInfer's kernel does. Elements past rotary_dim are copied.
//
// (The entry point lives with its kernel here rather than with apply_rope in the API layer's
// ops.cpp, which was being reorganised when this was written; its checks are those of apply_rope.)
#include <cmath>
#include <string>
#include <vector>

#include "core/convert.h"
#include "core/validate.h"
#include "cpu/ops.h"
#include "kvattn/ops.h"

namespace kvattn {

namespace {

void check_data(std::string_view name, const TensorView& t) {
  KVATTN_CHECK(t.numel() == 0 || t.data() != nullptr, name, " has a null data pointer");
}

// q or k: [nnz, H, D] f32/f16/bf16, head dim contiguous, on `dev`.
void check_input(std::string_view name, const TensorView& t, Device dev) {
  validate::ndim(name, t, 3);
  validate::float_dtype(name, t);
  validate::last_dim_contiguous(name, t);
  validate::same_device(name, t, dev, "q");
  check_data(name, t);
}

// q_out or k_out: the dtype and shape of its input.
void check_output(std::string_view name, const TensorView& out, std::string_view in_name,
                  const TensorView& in) {
  validate::ndim(name, out, 3);
  KVATTN_CHECK(out.dtype() == in.dtype(), name, " has dtype ", dtype_name(out.dtype()), " but ",
               in_name, " has dtype ", dtype_name(in.dtype()), "; they must match");
  for (int d = 0; d < 3; ++d)
    validate::dim(name, out, d, in.size(d), std::string(in_name) + ".shape[" + std::to_string(d) + "]");
  validate::last_dim_contiguous(name, out);
  validate::same_device(name, out, in.device(), "q");
  check_data(name, out);
}

struct Side {
  const char* in;
  char* out;
  DType dtype;
  int64_t in_row, in_head, out_row, out_head;  // strides in elements
  int num_heads;
};

Side side_of(const TensorView& in, const TensorView& out) {
  return Side{static_cast<const char*>(in.data()), static_cast<char*>(out.data()), in.dtype(),
              in.stride(0), in.stride(1), out.stride(0), out.stride(1), int(in.size(1))};
}

void rotate(const Side& s, int64_t r, int head_dim, int rotary_dim, bool interleave,
            const float* cs, const float* sn, float* x) {
  const int64_t esz = int64_t(dtype_size(s.dtype));
  const int half = rotary_dim / 2;
  for (int h = 0; h < s.num_heads; ++h) {
    convert::load_row(s.in + (r * s.in_row + h * s.in_head) * esz, s.dtype, head_dim, x);
    for (int t = 0; t < half; ++t) {
      const int i0 = interleave ? 2 * t : t, i1 = interleave ? 2 * t + 1 : t + half;
      const float x0 = x[i0], x1 = x[i1];
      x[i0] = x0 * cs[t] - x1 * sn[t];
      x[i1] = x1 * cs[t] + x0 * sn[t];
    }
    convert::store_row(s.out + (r * s.out_row + h * s.out_head) * esz, s.dtype, head_dim, x);
  }
}

}  // namespace

void apply_rope_with_cos_sin_cache(const TensorView& q, const TensorView& k, const TensorView& q_out,
                                   const TensorView& k_out, const TensorView& pos_ids,
                                   const TensorView& cos_sin_cache, bool interleave, void* stream) {
  (void)stream;
  check_input("q", q, q.device());
  const Device dev = q.device();
  check_input("k", k, dev);
  const int64_t nnz = q.size(0), D = q.size(2);
  validate::dim("k", k, 0, nnz, "q.shape[0] (nnz)");
  validate::dim("k", k, 2, D, "q.shape[2] (head_dim)");
  check_output("q_out", q_out, "q", q);
  check_output("k_out", k_out, "k", k);
  auto pos = validate::int32_array("pos_ids", pos_ids, nnz);

  validate::ndim("cos_sin_cache", cos_sin_cache, 2);
  validate::dtype("cos_sin_cache", cos_sin_cache, DType::f32);
  validate::last_dim_contiguous("cos_sin_cache", cos_sin_cache);
  validate::same_device("cos_sin_cache", cos_sin_cache, dev, "q");
  check_data("cos_sin_cache", cos_sin_cache);
  const int64_t max_pos = cos_sin_cache.size(0), rd = cos_sin_cache.size(1);
  KVATTN_CHECK(rd >= 2 && rd % 2 == 0, "cos_sin_cache.shape[1] = ", rd,
               " (rotary_dim: the cos of rotary_dim / 2 frequencies, then their sin) must be even "
               "and >= 2");
  KVATTN_CHECK(rd <= D, "cos_sin_cache.shape[1] = ", rd, " (rotary_dim) exceeds the head dim ", D);
  for (int64_t r = 0; r < nnz; ++r)
    KVATTN_CHECK(pos[size_t(r)] >= 0 && pos[size_t(r)] < max_pos, "pos_ids[", r, "] = ", pos[size_t(r)],
                 " is out of range [0, ", max_pos, ") (the rows of cos_sin_cache)");

  // q_out may be q and k_out k (in place); nothing else may share memory (as apply_rope).
  const std::pair<std::string_view, const TensorView*> outputs[] = {{"q_out", &q_out}, {"k_out", &k_out}};
  for (auto [name, t] : outputs) validate::no_self_overlap(name, *t);
  validate::no_overlap("q_out", q_out, "k_out", k_out);
  for (auto [name, t] : outputs) {
    validate::no_overlap(name, *t, "q", q, name == std::string_view("q_out"));
    validate::no_overlap(name, *t, "k", k, name == std::string_view("k_out"));
    validate::no_overlap(name, *t, "pos_ids", pos_ids);
    validate::no_overlap(name, *t, "cos_sin_cache", cos_sin_cache);
  }
  KVATTN_CHECK(dev.is_cpu(), "q is on ", dev.str(),
               " but apply_rope_with_cos_sin_cache has no GPU implementation yet; pass host (cpu) "
               "tensors");

  const Side qs = side_of(q, q_out), ks = side_of(k, k_out);
  const auto* cache = static_cast<const float*>(cos_sin_cache.data());
  const int64_t cache_row = cos_sin_cache.stride(0);
  const int half = int(rd / 2), hd = int(D), rot = int(rd);
  const int64_t per_row = int64_t(qs.num_heads + ks.num_heads) * D;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, per_row));
  cpu::parallel_chunks(nnz, grain, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> x;
    x.resize(size_t(hd));
    for (int64_t r = begin; r < end; ++r) {
      const float* row = cache + int64_t(pos[size_t(r)]) * cache_row;
      rotate(qs, r, hd, rot, interleave, row, row + half, x.data());
      rotate(ks, r, hd, rot, interleave, row, row + half, x.data());
    }
  });
}

}  // namespace kvattn
