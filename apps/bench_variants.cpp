#include "bench_variants.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "kvattn/error.h"

#if KVATTN_WITH_CUDA
#include <cuda_runtime_api.h>

#include "bench_common.h"
#endif

namespace kvattn_cli {

namespace {

constexpr float kBenchSoftCap = 30.0f, kBenchSigmoidBias = -1.0f;

std::string read_example(const std::string& dir, const std::string& name) {
  const std::string path = dir + "/" + name + ".h";
  std::ifstream f(path);
  KVATTN_CHECK(f.good(), "--variant: cannot read the user variant ", path, " (--examples DIR names examples/variants/)");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

kvattn::CustomVariant example(const std::string& dir, const std::string& name) {
  kvattn::CustomVariant v;
  v.name = name;
  v.source = read_example(dir, name);
  return v;
}

// ALiBi's standard slopes (SEMANTICS.md), as the built-in computes them.
float alibi_slope(int h, int n) {
  int pow2 = 1;
  while (pow2 * 2 <= n) pow2 *= 2;
  if (h < pow2) return std::exp2(-8.0f * float(h + 1) / float(pow2));
  return std::exp2(-4.0f * float(2 * (h - pow2) + 1) / float(pow2));
}

}  // namespace

const char* bench_variant_names() {
  return "plain, softcap, alibi, sigmoid (built-in); user-softcap, user-alibi, user-sigmoid (the same as user "
         "variants), user-sink (learned sinks), user-docmask (document ids, prefill), user-t5 (T5 bias), "
         "user-prefixlm (a prefix of a quarter of the longest request; non-causal cases), user-streaming "
         "(4 sink tokens and a window of 1024; causal cases)";
}

BenchVariant make_bench_variant(const std::string& name, const kvattn::Variant& base, int num_qo_heads,
                                int64_t max_len, int64_t batch, const std::string& examples_dir, int64_t doc_len) {
  BenchVariant b;
  b.name = name;
  b.variant = base;
  if (name == "plain") return b;
  if (name == "softcap") {
    b.variant = base.with_soft_cap(kBenchSoftCap);
    return b;
  }
  if (name == "alibi") {
    b.variant = base.with_alibi();
    return b;
  }
  if (name == "sigmoid") {
    b.variant = base.with_sigmoid(kBenchSigmoidBias);
    return b;
  }
  if (name == "user-softcap") {
    auto v = example(examples_dir, "soft_cap");
    v.f32_params = {"cap"};
    kvattn::CustomValues values;
    values.f32 = {{"cap", kBenchSoftCap}};
    b.variant = base.with_custom(v, values);
    return b;
  }
  if (name == "user-sigmoid") {
    auto v = example(examples_dir, "sigmoid");
    v.f32_params = {"bias"};
    kvattn::CustomValues values;
    values.f32 = {{"bias", kBenchSigmoidBias}};
    b.variant = base.with_custom(v, values);
    return b;
  }
#if KVATTN_WITH_CUDA
  // A device copy of `host`, kept alive by the BenchVariant.
  auto upload = [&b](const void* host, size_t bytes) {
    void* p = nullptr;
    cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc (a user variant's tensor)");
    b.device_buffers.emplace_back(p, [](void* q) { cudaFree(q); });
    cuda_ok(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (a user variant's tensor)");
    return p;
  };
  const auto dev = kvattn::Device::cuda(0);
  if (name == "user-alibi" || name == "user-sink") {
    std::vector<float> per_head(static_cast<size_t>(num_qo_heads));
    for (int h = 0; h < num_qo_heads; ++h) per_head[size_t(h)] = name == "user-alibi" ? alibi_slope(h, num_qo_heads) : 0.5f;
    const kvattn::TensorView t(upload(per_head.data(), per_head.size() * 4), kvattn::DType::f32, {num_qo_heads}, dev);
    const std::string param = name == "user-alibi" ? "slopes" : "sinks";
    auto v = example(examples_dir, name == "user-alibi" ? "alibi" : "learned_sink");
    v.tensor_params = {{param, kvattn::DType::f32, 1}};
    kvattn::CustomValues values;
    values.tensors = {{param, t}};
    b.variant = base.with_custom(v, values);
    return b;
  }
  if (name == "user-docmask") {
    std::vector<int32_t> ids(static_cast<size_t>(max_len));
    for (int64_t i = 0; i < max_len; ++i) ids[size_t(i)] = int32_t(i / doc_len);
    const kvattn::TensorView t(upload(ids.data(), ids.size() * 4), kvattn::DType::i32, {max_len}, dev);
    auto v = example(examples_dir, "document_mask");
    v.tensor_params = {{"doc_ids", kvattn::DType::i32, 1}};
    kvattn::CustomValues values;
    values.tensors = {{"doc_ids", t}};
    b.variant = base.with_custom(v, values);
    // Causal within documents of doc_len over a causal max_len: the pairs that stay visible.
    const double docs = double(max_len) / double(doc_len);
    b.visible_fraction = docs * doc_len * (doc_len + 1.0) / (double(max_len) * (max_len + 1.0));
    return b;
  }
  if (name == "user-t5") {  // 32 buckets per head, T5's max_distance of 128
    constexpr int kBuckets = 32;
    std::vector<float> bias(static_cast<size_t>(num_qo_heads) * kBuckets);
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.25f * std::sin(float(i));
    const kvattn::TensorView t(upload(bias.data(), bias.size() * 4), kvattn::DType::f32, {num_qo_heads, kBuckets},
                               dev);
    auto v = example(examples_dir, "t5_bias");
    v.i32_params = {"max_distance"};
    v.tensor_params = {{"bias", kvattn::DType::f32, 2}};
    kvattn::CustomValues values;
    values.i32 = {{"max_distance", 128}};
    values.tensors = {{"bias", t}};
    b.variant = base.with_custom(v, values);
    return b;
  }
  if (name == "user-prefixlm") {  // the fractions below: one request of max_len (the 1 x N cases)
    KVATTN_CHECK(!base.causal, "--variant user-prefixlm: takes a non-causal case (its mask is causal past the "
                               "prefix by itself; the built-in causal mask would hide the prefix's future)");
    const int64_t prefix = max_len / 4;
    std::vector<int32_t> lens(static_cast<size_t>(batch), int32_t(prefix));
    const kvattn::TensorView t(upload(lens.data(), lens.size() * 4), kvattn::DType::i32, {batch}, dev);
    auto v = example(examples_dir, "prefix_lm");
    v.tensor_params = {{"prefix_len", kvattn::DType::i32, 1}};
    kvattn::CustomValues values;
    values.tensors = {{"prefix_len", t}};
    b.variant = base.with_custom(v, values);
    const double L = double(max_len), P = double(prefix);  // of a non-causal case's L^2 pairs
    b.visible_fraction = (P * P + (L * (L + 1) - P * (P + 1)) / 2) / (L * L);
    return b;
  }
  if (name == "user-streaming") {
    KVATTN_CHECK(base.causal, "--variant user-streaming: takes a causal case (its visible fraction counts "
                              "causal pairs)");
    constexpr int kSinks = 4, kWindow = 1024;
    auto v = example(examples_dir, "streaming_sink");
    v.i32_params = {"num_sink", "window"};
    kvattn::CustomValues values;
    values.i32 = {{"num_sink", kSinks}, {"window", kWindow}};
    b.variant = base.with_custom(v, values);
    double visible = 0;  // of a causal case's pairs
    for (int64_t q = 0; q < max_len; ++q)
      visible += double(std::min<int64_t>(q + 1, kWindow + 1) + std::min<int64_t>(kSinks, std::max<int64_t>(0, q - kWindow)));
    b.visible_fraction = visible / (double(max_len) * (max_len + 1.0) / 2);
    return b;
  }
#endif
  throw kvattn::Error("--variant: unknown variant '" + name + "' (known: " + bench_variant_names() + ")");
}

}  // namespace kvattn_cli
