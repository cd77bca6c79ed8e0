#include "fuzz/harness.h"

#include <algorithm>
#include <cstring>

#include "kvattn/dtype.h"

namespace kvattn_fuzz {

Ctx::Ctx(Source& s, bool force_legal, bool force_corrupt)
    : src(s), values(s.u64()), corrupt(force_corrupt || (!force_legal && s.coin())) {}

HostTensor& Ctx::keep(HostTensor t) {
  pool_.push_back(std::move(t));
  track(pool_.back());
  return pool_.back();
}

std::vector<std::vector<uint8_t>> Ctx::snapshot() const {
  std::vector<std::vector<uint8_t>> s;
  s.reserve(buffers_.size());
  for (const HostTensor* t : buffers_) s.push_back(t->snapshot());
  return s;
}

int64_t Ctx::first_changed(const std::vector<std::vector<uint8_t>>& snap) const {
  for (size_t i = 0; i < snap.size() && i < buffers_.size(); ++i)
    if (!buffers_[i]->same_bytes(snap[i])) return int64_t(i);
  return -1;
}

void Ctx::apply_corruptions(std::vector<Corruption>& options) {
  if (options.empty()) fail("internal: no corruption applies to this problem");
  const int64_t want = src.range(1, 3);
  std::vector<Corruption*> chosen;
  std::vector<std::string> targets;
  auto split = [](const std::string& t) {  // "a+b": a corruption that changes two arguments
    std::vector<std::string> parts;
    for (size_t i = 0, j; i <= t.size(); i = j + 1) {
      j = t.find('+', i);
      if (j == std::string::npos) j = t.size();
      parts.push_back(t.substr(i, j - i));
    }
    return parts;
  };
  for (int attempt = 0; attempt < 12 && int64_t(chosen.size()) < want; ++attempt) {
    Corruption& c = options[size_t(src.range(0, int64_t(options.size()) - 1))];
    const auto parts = split(c.target);
    bool clash = false;
    for (const std::string& t : parts) clash |= std::find(targets.begin(), targets.end(), t) != targets.end();
    if (clash) continue;
    targets.insert(targets.end(), parts.begin(), parts.end());
    chosen.push_back(&c);
  }
  corruption_names.clear();
  for (Corruption* c : chosen) corruption_names += (corruption_names.empty() ? "" : "; ") + c->name;
  note("corruptions: ", corruption_names);
  for (Corruption* c : chosen) c->apply();
}

// ---- tensors ------------------------------------------------------------------------------------
HostTensor make_tensor(Ctx& ctx, DType t, std::vector<int64_t> shape, bool allow_strided) {
  std::vector<int64_t> pad;
  if (allow_strided && ctx.src.chance(40)) {
    pad.assign(shape.size(), 0);
    for (size_t d = 0; d + 1 < shape.size(); ++d) pad[d] = ctx.src.range(0, 3);
  }
  HostTensor x(t, std::move(shape), std::move(pad));
  x.poison();
  return x;
}

HostTensor int32_host(const std::vector<int32_t>& values) {
  HostTensor t(DType::i32, {int64_t(values.size())});
  if (!values.empty()) std::memcpy(t.base(), values.data(), values.size() * 4);
  return t;
}

std::vector<int32_t> int32_values(const TensorView& v) {
  std::vector<int32_t> out(size_t(v.size(0)));
  for (int64_t i = 0; i < v.size(0); ++i) out[size_t(i)] = v.data_as<const int32_t>()[i * v.stride(0)];
  return out;
}

const char* dtype_str(DType t) { return kvattn::dtype_name(t).data(); }

std::string shape_str(const TensorView& v) { return v.defined() ? v.describe() : std::string("(none)"); }

TensorView view_with(const TensorView&, const void* data, DType dtype, std::vector<int64_t> shape,
                     std::vector<int64_t> strides, kvattn::Device dev) {
  return TensorView(data, dtype, int(shape.size()), shape.data(), strides.data(), dev);
}

namespace {
std::vector<int64_t> shape_of(const TensorView& v) { return {v.shape(), v.shape() + v.ndim()}; }
std::vector<int64_t> strides_of(const TensorView& v) { return {v.strides(), v.strides() + v.ndim()}; }
}  // namespace

TensorView with_dtype(const TensorView& v, DType t) {
  return view_with(v, v.data(), t, shape_of(v), strides_of(v), v.device());
}
TensorView with_device(const TensorView& v, kvattn::Device d) {
  return view_with(v, v.data(), v.dtype(), shape_of(v), strides_of(v), d);
}
TensorView with_data(const TensorView& v, const void* data) {
  return view_with(v, data, v.dtype(), shape_of(v), strides_of(v), v.device());
}
TensorView with_size(const TensorView& v, int dim, int64_t size) {
  auto s = shape_of(v);
  s[size_t(dim)] = size;
  return view_with(v, v.data(), v.dtype(), s, strides_of(v), v.device());
}
TensorView with_stride(const TensorView& v, int dim, int64_t stride) {
  auto s = strides_of(v);
  s[size_t(dim)] = stride;
  return view_with(v, v.data(), v.dtype(), shape_of(v), s, v.device());
}
TensorView with_extra_dim(const TensorView& v) {
  auto s = shape_of(v), st = strides_of(v);
  s.push_back(1);
  st.push_back(1);
  return view_with(v, v.data(), v.dtype(), s, st, v.device());
}

bool exact_alias(const TensorView& a, const TensorView& b) {
  if (a.data() != b.data() || a.dtype() != b.dtype() || a.ndim() != b.ndim() || !(a.device() == b.device()))
    return false;
  for (int d = 0; d < a.ndim(); ++d)
    if (a.size(d) != b.size(d) || (a.size(d) > 1 && a.stride(d) != b.stride(d))) return false;
  return true;
}

void tensor_corruptions(Ctx& ctx, std::vector<Corruption>& out, const std::string& name, TensorView& slot,
                        const TensorRules& rules) {
  if (!slot.defined()) return;
  Source& src = ctx.src;
  TensorView* t = &slot;
  const std::string target = rules.target.empty() ? name : rules.target;
  const std::string dims_target = rules.dims_target.empty() ? target : rules.dims_target;
  const std::string dtype_target = rules.dtype_target.empty() ? target : rules.dtype_target;
  if (slot.ndim() < TensorView::kMaxDims)
    out.push_back({name + ": one more dimension", target, [t] { *t = with_extra_dim(*t); }});
  std::vector<DType> bad;
  for (DType d : kAllDtypes)
    if (std::find(rules.dtypes.begin(), rules.dtypes.end(), d) == rules.dtypes.end()) bad.push_back(d);
  if (!bad.empty()) {
    const DType d = src.pick(bad);
    out.push_back({cat(name, ": dtype ", dtype_str(d)), dtype_target, [t, d] { *t = with_dtype(*t, d); }});
  }
  if (rules.head_contiguous && slot.size(-1) > 1) {
    const int64_t s = src.pick<int64_t>({0, 2, 3});
    out.push_back({cat(name, ": head-dim stride ", s), target,
                   [t, s] { *t = with_stride(*t, t->ndim() - 1, s); }});
  }
  if (!rules.exact_dims.empty()) {
    const int d = src.pick(rules.exact_dims);
    const int64_t delta = src.coin() ? 1 : -1;
    out.push_back({cat(name, ".shape[", d, "] ", delta > 0 ? "+ 1" : "- 1"), dims_target,
                   [t, d, delta] { *t = with_size(*t, d, t->size(d) + delta); }});
  }
  if (slot.numel() > 0)
    out.push_back({name + ": null data", target, [t] { *t = with_data(*t, nullptr); }});
  out.push_back({name + ": on cuda:0", target, [t] { *t = with_device(*t, kvattn::Device::cuda(0)); }});
  if (rules.output) {
    std::vector<int> dims;
    for (int d = 0; d < slot.ndim(); ++d)
      if (slot.size(d) > 1) dims.push_back(d);
    if (!dims.empty() && slot.numel() > 0) {  // an empty view has no memory to share
      const int d = src.pick(dims);
      out.push_back({cat(name, ": stride 0 along dim ", d), target, [t, d] { *t = with_stride(*t, d, 0); }});
    }
  }
}

void index_array_corruptions(Ctx& ctx, std::vector<Corruption>& out, const std::string& name,
                             TensorView& slot, bool exact_length, std::string target) {
  if (!slot.defined()) return;
  if (target.empty()) target = name;
  Source& src = ctx.src;
  TensorView* t = &slot;
  const DType d = src.pick({DType::f32, DType::u8, DType::f16, DType::e4m3});
  out.push_back({cat(name, ": dtype ", dtype_str(d)), target, [t, d] { *t = with_dtype(*t, d); }});
  out.push_back({name + ": 2-D", target, [t] { *t = with_extra_dim(*t); }});
  if (slot.size(0) > 1)
    out.push_back({name + ": stride 2", target, [t] { *t = with_stride(*t, 0, 2); }});
  if (slot.size(0) > 0) out.push_back({name + ": null data", target, [t] { *t = with_data(*t, nullptr); }});
  out.push_back({name + ": on cuda:0", target, [t] { *t = with_device(*t, kvattn::Device::cuda(0)); }});
  if (exact_length) {
    if (slot.size(0) > 0)
      out.push_back({name + ": one element short", target, [t] { *t = with_size(*t, 0, t->size(0) - 1); }});
    Ctx* c = &ctx;
    out.push_back({name + ": one element more", target, [c, t] {
                     auto v = int32_values(*t);
                     v.push_back(v.empty() ? 0 : v.back());
                     replace_int32(*c, *t, v);
                   }});
  }
}

void indptr_corruptions(Ctx& ctx, std::vector<Corruption>& out, const std::string& name, TensorView& slot,
                        std::string target) {
  if (!slot.defined()) return;
  if (target.empty()) target = name;
  Source& src = ctx.src;
  Ctx* c = &ctx;
  TensorView* t = &slot;
  const int64_t n = slot.size(0);
  if (n >= 1) {
    const int32_t first = src.pick<int32_t>({1, -1, 7, std::numeric_limits<int32_t>::min()});
    out.push_back({cat(name, "[0] = ", first), target, [c, t, first] {
                     auto v = int32_values(*t);
                     v[0] = first;
                     replace_int32(*c, *t, v);
                   }});
  } else {
    return;
  }
  if (n >= 2) {
    const int64_t i = src.range(1, n - 1);
    const int64_t drop = src.range(1, 5);
    out.push_back({cat(name, " decreasing at ", i), target, [c, t, i, drop] {
                     auto v = int32_values(*t);
                     v[size_t(i)] = int32_t(int64_t(v[size_t(i - 1)]) - drop);
                     replace_int32(*c, *t, v);
                   }});
  }
  out.push_back({name + ": empty", target, [c, t] { replace_int32(*c, *t, {}); }});
}

void replace_int32(Ctx& ctx, TensorView& slot, const std::vector<int32_t>& values) {
  const kvattn::Device dev = slot.defined() ? slot.device() : kvattn::Device::cpu();
  slot = with_device(ctx.keep(int32_host(values)).view(), dev);
}

}  // namespace kvattn_fuzz
