// User-written variants on the CPU backend (docs/VARIANTS.md): each example of examples/variants/
// compiled through the public API and checked against the float64 reference (whose hooks are the
// same formulas in double) on decode, paged and ragged prefill and block-sparse, with GQA and the
// dtypes; user variants that equal a built-in against the built-in; composition with the built-in
// masks; the parameter checks; compiler errors with the user's line numbers; the disk cache shared
// by concurrent processes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cpu/variant_compiler.h"
#include "support/attention_case.h"
#include "support/bsr_case.h"
#include "support/expect_error.h"
#include "support/host_tensor.h"
#include "support/paged_kv.h"
#include "support/variant_examples.h"

namespace kvattn_test {
namespace {

using kvattn::CustomValues;
using kvattn::CustomVariant;
using kvattn::DType;

// KVATTN_CXX and KVATTN_CACHE_DIR are settings read from the environment (not kernel overrides):
// set for one scope, the previous value restored.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// The shapes every example runs on: decode and prefill (paged, ragged), GQA, the dtypes.
std::vector<AttnCase> cases_for(const kvattn::Variant& variant, const ref::UserHooks& hooks, Rng& rng,
                                bool causal_prefill = true) {
  std::vector<AttnCase> out;
  const std::pair<DType, DType> dtypes[] = {{DType::f32, DType::f32}, {DType::bf16, DType::bf16},
                                            {DType::f16, DType::e4m3}};
  for (auto [q, kv] : dtypes)
    for (KVStore store : {KVStore::paged, KVStore::ragged})
      for (bool decode : {true, false}) {
        if (decode && store == KVStore::ragged) continue;
        AttnCase c;
        c.q_dtype = q;
        c.kv_dtype = kv;
        c.num_qo_heads = 8;
        c.num_kv_heads = store == KVStore::paged ? 2 : 8;
        c.head_dim_qk = 32;
        c.page_size = 5;
        c.store = store;
        c.variant = variant.with_causal(!decode && causal_prefill);
        c.user = &hooks;
        for (int b = 0; b < 3; ++b) {
          const int64_t kv_len = rng.integer(1, 90);
          c.lens.push_back({decode ? 1 : rng.integer(1, kv_len), kv_len});
        }
        c.scheduler.fixed_split_size = rng.coin(0.5) ? 16 : 0;  // split rows: partial states merged
        out.push_back(c);
      }
  return out;
}

void run_cases(const std::vector<AttnCase>& cases, Rng& rng) {
  for (const AttnCase& c : cases) {
    SCOPED_TRACE(c.describe());
    bool decode = true;
    for (auto [qo, kv] : c.lens) decode = decode && qo == 1 && c.store != KVStore::ragged && !c.variant.causal;
    if (decode)
      run_decode_case(c, rng);
    else
      run_prefill_case(c, rng);
  }
}

TEST(CustomVariant, SoftCapMatchesTheReference) {
  KVATTN_CASE_RNG(rng);
  const float cap = 4.0f;
  ref::UserHooks hooks;
  hooks.logits_transform = [&](double x, int, int64_t, int64_t, int, int) { return cap * std::tanh(x / cap); };
  const auto v = kvattn::Variant{}.with_custom(example("soft_cap", {"cap"}), {.f32 = {{"cap", cap}}});
  run_cases(cases_for(v, hooks, rng), rng);
}

TEST(CustomVariant, AlibiFromATensorMatchesTheReference) {
  KVATTN_CASE_RNG(rng);
  HostTensor slopes(DType::f32, {8});
  std::vector<double> s(8);
  for (int h = 0; h < 8; ++h) slopes.set_at(h, s[size_t(h)] = -0.05 * (h + 1));
  ref::UserHooks hooks;
  hooks.logits_transform = [&](double x, int, int64_t qp, int64_t kp, int h, int) {
    return x + s[size_t(h)] * double(kp - qp);
  };
  const auto v = kvattn::Variant{}.with_custom(example("alibi", {}, {}, {{"slopes", DType::f32, 1}}),
                                               {.tensors = {{"slopes", slopes.view()}}});
  run_cases(cases_for(v, hooks, rng), rng);
}

TEST(CustomVariant, SigmoidWithoutSoftmaxMatchesTheReference) {
  KVATTN_CASE_RNG(rng);
  const float bias = -1.5f;
  ref::UserHooks hooks;
  hooks.use_softmax = false;
  hooks.logits_transform = [&](double x, int, int64_t, int64_t, int, int) { return 1.0 / (1.0 + std::exp(-(x + bias))); };
  const auto v = kvattn::Variant{}.with_custom(example("sigmoid", {"bias"}), {.f32 = {{"bias", bias}}});
  run_cases(cases_for(v, hooks, rng), rng);
}

TEST(CustomVariant, T5RelativeBiasMatchesTheReference) {
  KVATTN_CASE_RNG(rng);
  constexpr int kBuckets = 16, kMaxDistance = 64;
  HostTensor bias(DType::f32, {8, kBuckets});
  std::vector<double> b(8 * kBuckets);
  for (int i = 0; i < 8 * kBuckets; ++i) bias.set_at(i, b[size_t(i)] = rng.uniform(-2, 2));
  auto bucket = [](int64_t d) {
    const int64_t n = d < 0 ? -d : 0;
    const int exact = kBuckets / 2;
    if (n < exact) return int(n);
    const float scaled = logf(float(n) / float(exact)) / logf(float(kMaxDistance) / float(exact));
    return std::min(exact + int(scaled * float(kBuckets - exact)), kBuckets - 1);
  };
  ref::UserHooks hooks;
  hooks.logits_transform = [&](double x, int, int64_t qp, int64_t kp, int h, int) {
    return x + b[size_t(h * kBuckets + bucket(kp - qp))];
  };
  const auto v = kvattn::Variant{}.with_custom(example("t5_bias", {}, {"max_distance"}, {{"bias", DType::f32, 2}}),
                                               {.i32 = {{"max_distance", kMaxDistance}}, .tensors = {{"bias", bias.view()}}});
  run_cases(cases_for(v, hooks, rng), rng);
}

// Packed documents in one ragged request (causal within each document), and the same through a
// paged cache; rows of a document that starts after the query's see nothing of it.
TEST(CustomVariant, DocumentMaskOfPackedSequences) {
  KVATTN_CASE_RNG(rng);
  constexpr int64_t kLen = 120;
  HostTensor docs(DType::i32, {kLen});
  std::vector<int> d(kLen);
  int doc = 0;
  for (int64_t i = 0; i < kLen; ++i) {
    if (i > 0 && rng.coin(0.06)) ++doc;
    docs.set_at(i, d[size_t(i)] = doc);
  }
  ref::UserHooks hooks;
  hooks.logits_mask = [&](int, int64_t qp, int64_t kp, int, int) { return d[size_t(qp)] == d[size_t(kp)]; };
  const auto v = kvattn::variants::causal().with_custom(example("document_mask", {}, {}, {{"doc_ids", DType::i32, 1}}),
                                                        {.tensors = {{"doc_ids", docs.view()}}});
  for (KVStore store : {KVStore::ragged, KVStore::paged}) {
    AttnCase c;
    c.q_dtype = DType::bf16;
    c.num_qo_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim_qk = 32;
    c.store = store;
    c.variant = v;
    c.user = &hooks;
    c.lens = {{kLen, kLen}};
    SCOPED_TRACE(c.describe());
    run_prefill_case(c, rng);
  }
}

TEST(CustomVariant, PrefixLmPerRequest) {
  KVATTN_CASE_RNG(rng);
  HostTensor prefix(DType::i32, {3});
  std::vector<int> pl = {5, 0, 40};
  for (int b = 0; b < 3; ++b) prefix.set_at(b, pl[size_t(b)]);
  ref::UserHooks hooks;
  hooks.logits_mask = [&](int b, int64_t qp, int64_t kp, int, int) { return kp <= qp || kp < pl[size_t(b)]; };
  const auto v = kvattn::Variant{}.with_custom(example("prefix_lm", {}, {}, {{"prefix_len", DType::i32, 1}}),
                                               {.tensors = {{"prefix_len", prefix.view()}}});
  AttnCase c;
  c.num_qo_heads = 4;
  c.num_kv_heads = 1;
  c.head_dim_qk = 16;
  c.variant = v;
  c.user = &hooks;
  c.lens = {{20, 20}, {7, 30}, {64, 64}};
  run_prefill_case(c, rng);
}

TEST(CustomVariant, StreamingSinkMask) {
  KVATTN_CASE_RNG(rng);
  const int sink = 4, window = 16;
  ref::UserHooks hooks;
  hooks.logits_mask = [&](int, int64_t qp, int64_t kp, int, int) {
    return kp <= qp && (kp < sink || kp >= qp - window);
  };
  const auto v = kvattn::Variant{}.with_custom(example("streaming_sink", {}, {"num_sink", "window"}),
                                               {.i32 = {{"num_sink", sink}, {"window", window}}});
  run_cases(cases_for(v, hooks, rng, /*causal_prefill=*/false), rng);
}

// gpt-oss sinks: a per-head logit in the denominator only, also on split rows (merged first).
TEST(CustomVariant, LearnedSinksJoinTheDenominatorOnce) {
  KVATTN_CASE_RNG(rng);
  HostTensor sinks(DType::f32, {8});
  std::vector<double> s(8);
  for (int h = 0; h < 8; ++h) sinks.set_at(h, s[size_t(h)] = rng.uniform(-3, 3));
  ref::UserHooks hooks;
  hooks.sink_logit = [&](int, int h) { return s[size_t(h)]; };
  const auto v = kvattn::Variant{}.with_custom(example("learned_sink", {}, {}, {{"sinks", DType::f32, 1}}),
                                               {.tensors = {{"sinks", sinks.view()}}});
  auto cases = cases_for(v, hooks, rng);
  for (AttnCase& c : cases) c.lens.push_back({1, 0});  // no keys: o = 0, lse = the sink
  for (AttnCase& c : cases)
    if (c.store == KVStore::ragged || c.variant.causal) c.lens.back() = {0, 0};
  run_cases(cases, rng);
}

// kvattn's own sink variants (kvattn::variants::learned_sinks, streaming_sinks): the same
// mechanism as the examples, with their errors.
TEST(CustomVariant, BuiltInSinkVariants) {
  KVATTN_CASE_RNG(rng);
  HostTensor sinks(DType::f32, {8});
  std::vector<double> s(8);
  for (int h = 0; h < 8; ++h) sinks.set_at(h, s[size_t(h)] = rng.uniform(-3, 3));
  ref::UserHooks learned;
  learned.sink_logit = [&](int, int h) { return s[size_t(h)]; };
  auto cases = cases_for(kvattn::variants::learned_sinks(sinks.view()), learned, rng);
  for (AttnCase& c : cases) c.lens.push_back({c.store == KVStore::ragged || c.variant.causal ? 0 : 1, 0});  // no keys: the sink alone
  run_cases(cases, rng);
  const int sink = 3, window = 10;
  ref::UserHooks streaming;
  streaming.logits_mask = [&](int, int64_t qp, int64_t kp, int, int) {
    return kp <= qp && (kp < sink || kp >= qp - window);
  };
  run_cases(cases_for(kvattn::variants::streaming_sinks(sink, window), streaming, rng, /*causal_prefill=*/false), rng);
  EXPECT_KVATTN_ERROR(kvattn::variants::streaming_sinks(-1, 4), "streaming_sinks: num_sink = -1 is negative");
  EXPECT_KVATTN_ERROR(kvattn::variants::streaming_sinks(4, -2), "streaming_sinks: window = -2 is negative");
  EXPECT_EQ(kvattn::variants::learned_sinks(sinks.view()).describe(), "custom(learned_sinks)");
}

TEST(CustomVariant, OutputTransformAndComposition) {
  KVATTN_CASE_RNG(rng);
  CustomVariant v;
  v.name = "scaled_window";
  // Written inline: a mask (every other key of a query's own parity is hidden), a logit shift by
  // the KV head, and an output scale; composed with the built-in window and soft-cap.
  v.source = R"(
struct Variant {
  static bool logits_mask(const Params& p, int, int64_t qo_pos, int64_t kv_pos, int, int) {
    return ((qo_pos + kv_pos) % p.period) != 1;
  }
  static float logits_transform(const Params& p, float logit, int, int64_t, int64_t, int, int kv_head) {
    return logit + p.shift * float(kv_head);
  }
  static float output_transform(const Params& p, float value, int, int64_t, int qo_head, int dim) {
    return value * p.out_scale + 0.01f * float(dim % 3) - 0.001f * float(qo_head);
  }
};
)";
  v.f32_params = {"shift", "out_scale"};
  v.i32_params = {"period"};
  const float shift = 0.25f, out_scale = 1.5f;
  const int period = 3;
  ref::UserHooks hooks;
  hooks.logits_mask = [&](int, int64_t qp, int64_t kp, int, int) { return (qp + kp) % period != 1; };
  hooks.logits_transform = [&](double x, int, int64_t, int64_t, int, int hk) { return x + shift * hk; };
  hooks.output_transform = [&](double o, int, int64_t, int h, int e) {
    return o * out_scale + 0.01 * (e % 3) - 0.001 * h;
  };
  const auto variant = kvattn::Variant{}.with_window(24).with_soft_cap(5.0f).with_custom(
      v, {.f32 = {{"shift", shift}, {"out_scale", out_scale}}, .i32 = {{"period", period}}});
  run_cases(cases_for(variant, hooks, rng), rng);
}

TEST(CustomVariant, BlockSparseSeesOneSequence) {
  KVATTN_CASE_RNG(rng);
  const float cap = 3.0f;
  ref::UserHooks hooks;
  hooks.logits_transform = [&](double x, int batch, int64_t, int64_t, int, int) {
    EXPECT_EQ(batch, 0);
    return cap * std::tanh(x / cap);
  };
  hooks.logits_mask = [&](int, int64_t qp, int64_t kp, int, int) { return (qp + 2 * kp) % 5 != 0; };
  CustomVariant v = example("soft_cap", {"cap"});
  v.source += R"(
struct MaskedVariant : Variant {
  static bool logits_mask(const Params&, int batch, int64_t qo_pos, int64_t kv_pos, int, int) {
    return batch == 0 && (qo_pos + 2 * kv_pos) % 5 != 0;
  }
};
)";
  // The composed struct must be named Variant: rename the example's and derive from it.
  const std::string from = "struct Variant {";
  v.source.replace(v.source.find(from), from.size(), "struct SoftCap {");
  v.source.replace(v.source.find("struct MaskedVariant : Variant {"), std::string("struct MaskedVariant : Variant {").size(),
                   "struct Variant : SoftCap {");
  for (auto [R, C] : {std::pair{1, 1}, {4, 8}, {16, 4}}) {
    BsrCase bc;
    bc.M = 32;
    bc.N = 48;
    bc.R = R;
    bc.C = C;
    bc.base.num_qo_heads = 4;
    bc.base.num_kv_heads = 2;
    bc.base.head_dim_qk = 16;
    bc.base.variant = kvattn::Variant{}.with_custom(v, {.f32 = {{"cap", cap}}});
    bc.base.user = &hooks;
    run_bsr_case(bc, rng);
  }
}

// ---- errors -----------------------------------------------------------------------------------------

// A paged one-request BatchDecode plan of 4/2 heads, head dim 16, for the error tests.
struct SmallDecode {
  HostTensor indptr = int32_tensor({0, 1}), indices = int32_tensor({0}), last = int32_tensor({3});
  kvattn::BatchDecodePlan plan() const {
    kvattn::BatchDecodePlan p;
    p.num_qo_heads = 4;
    p.num_kv_heads = 2;
    p.head_dim_qk = 16;
    p.page_size = 4;
    p.q_dtype = DType::f32;
    p.page_table = {indptr.view(), indices.view(), last.view()};
    return p;
  }
};

TEST(CustomVariant, ParameterErrorsNameTheParameter) {
  SmallDecode d;
  kvattn::BatchDecode op;
  auto p = d.plan();
  CustomVariant v = example("alibi", {}, {}, {{"slopes", DType::f32, 1}});
  HostTensor slopes(DType::f32, {4}), wrong_dtype(DType::i32, {4}), wrong_ndim(DType::f32, {2, 2});
  p.variant = kvattn::Variant{}.with_custom(v, {});
  EXPECT_KVATTN_ERROR(op.plan(p), "custom variant alibi: tensor parameter slopes has no value");
  p.variant = kvattn::Variant{}.with_custom(v, {.tensors = {{"slopes", wrong_dtype.view()}}});
  EXPECT_KVATTN_ERROR(op.plan(p), "tensor parameter slopes has dtype i32 but was declared f32");
  p.variant = kvattn::Variant{}.with_custom(v, {.tensors = {{"slopes", wrong_ndim.view()}}});
  EXPECT_KVATTN_ERROR(op.plan(p), "tensor parameter slopes has 2 dimensions but was declared with 1");
  const kvattn::TensorView on_gpu(slopes.base(), DType::f32, {4}, kvattn::Device::cuda(0));
  p.variant = kvattn::Variant{}.with_custom(v, {.tensors = {{"slopes", on_gpu}}});
  EXPECT_KVATTN_ERROR(op.plan(p), "tensor parameter slopes is on cuda:0 but the plan computes on cpu");
  p.variant = kvattn::Variant{}.with_custom(v, {.f32 = {{"slope", 1.0f}}, .tensors = {{"slopes", slopes.view()}}});
  EXPECT_KVATTN_ERROR(op.plan(p), "a value was given for slope, which is not a declared parameter");
  p.variant = kvattn::Variant{}.with_custom(v, {.tensors = {{"slopes", slopes.view()}, {"slopes", slopes.view()}}});
  EXPECT_KVATTN_ERROR(op.plan(p), "parameter slopes is given twice");
  CustomVariant bad = v;
  bad.name = "not a name";
  p.variant = kvattn::Variant{}.with_custom(bad, {});
  EXPECT_KVATTN_ERROR(op.plan(p), "custom variant name \"not a name\" is not an identifier");
  bad = v;
  bad.f32_params = {"slopes"};
  p.variant = kvattn::Variant{}.with_custom(bad, {});
  EXPECT_KVATTN_ERROR(op.plan(p), "custom variant alibi: parameter slopes is declared twice");
  bad = v;
  bad.tensor_params[0].dtype = DType::bf16;
  p.variant = kvattn::Variant{}.with_custom(bad, {});
  EXPECT_KVATTN_ERROR(op.plan(p), "tensor parameter slopes has dtype bf16 (f32, i32 or u8 are supported)");
  // The failed plans left no plan behind.
  EXPECT_KVATTN_ERROR(op.check_errors(), "BatchDecode.check_errors() was called before plan()");
}

TEST(CustomVariant, CompilerErrorsPointAtTheUsersLines) {
  SmallDecode d;
  kvattn::BatchDecode op;
  auto p = d.plan();
  CustomVariant v;
  v.name = "broken";
  v.source = "struct Variant {\n  static float logits_transform(const Params& p, float logit, int, int64_t, int64_t,\n"
             "                                int, int) {\n    return logit + p.missing;\n  }\n};\n";
  p.variant = kvattn::Variant{}.with_custom(v, {});
  EXPECT_KVATTN_ERROR(op.plan(p), "custom variant broken does not compile");
  EXPECT_KVATTN_ERROR(op.plan(p), "broken.variant:4");
  v.name = "wrong_signature";
  v.source = "struct Variant {\n  static bool logits_mask(const Params&, int batch) { return batch == 0; }\n};\n";
  p.variant = kvattn::Variant{}.with_custom(v, {});
  EXPECT_KVATTN_ERROR(op.plan(p), "logits_mask must be callable as static bool logits_mask(const Params&, int batch");
  v.name = "no_struct";
  v.source = "float f() { return 1; }\n";
  p.variant = kvattn::Variant{}.with_custom(v, {});
  EXPECT_KVATTN_ERROR(op.plan(p), "custom variant no_struct does not compile");
  v.name = "sink_without_softmax";
  v.source = "struct Variant {\n  static constexpr bool use_softmax = false;\n"
             "  static float sink_logit(const Params&, int, int) { return 0; }\n};\n";
  p.variant = kvattn::Variant{}.with_custom(v, {});
  EXPECT_KVATTN_ERROR(op.plan(p), "sink_logit needs the softmax");
}

// use_softmax = false has no LSE: asking for one is an error, as for sigmoid, and writes nothing.
TEST(CustomVariant, NoLseWithoutSoftmax) {
  SmallDecode d;
  kvattn::BatchDecode op;
  auto p = d.plan();
  p.variant = kvattn::Variant{}.with_custom(example("sigmoid", {"bias"}), {.f32 = {{"bias", 0.0f}}});
  op.plan(p);
  HostTensor q(DType::f32, {1, 4, 16}), k(DType::f32, {1, 4, 2, 16}), v(DType::f32, {1, 4, 2, 16});
  HostTensor out(DType::f32, {1, 4, 16}), lse(DType::f32, {1, 4});
  out.poison();
  lse.poison();
  const auto before_out = out.snapshot(), before_lse = lse.snapshot();
  const auto cache = kvattn::PagedKVCache::split(k.view(), v.view(), kvattn::KVLayout::NHD);
  EXPECT_KVATTN_ERROR(op.run(q.view(), cache, out.view(), lse.view()),
                      "lse was requested but the user variant sigmoid has use_softmax = false (no lse)");
  EXPECT_TRUE(out.same_bytes(before_out));
  EXPECT_TRUE(lse.same_bytes(before_lse));
  EXPECT_NO_THROW(op.run(q.view(), cache, out.view(), {}));
}

TEST(CustomVariant, MissingCompilerIsAClearError) {
  ScopedEnv cxx("KVATTN_CXX", "/nonexistent/kvattn-no-such-compiler");
  SmallDecode d;
  kvattn::BatchDecode op;
  auto p = d.plan();
  CustomVariant v = example("soft_cap", {"cap"});
  v.source += "\n// a source no other test compiles (the cache key also covers the compiler)\n";
  p.variant = kvattn::Variant{}.with_custom(v, {.f32 = {{"cap", 2.0f}}});
  EXPECT_KVATTN_ERROR(op.plan(p), "the C++ compiler '/nonexistent/kvattn-no-such-compiler' could not be run");
}

// Two processes compiling one new variant at once both succeed and leave one cache entry.
TEST(CustomVariant, ConcurrentCompilesShareOneCacheEntry) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("kvattn-variant-cache-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ScopedEnv cache("KVATTN_CACHE_DIR", dir.c_str());
  CustomVariant v = example("soft_cap", {"cap"});
  v.source += "\n// unique to this test\n";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int rc = 0;
    try {
      (void)kvattn::cpu::user_variant_kernels(v);
    } catch (...) {
      rc = 1;
    }
    ::_exit(rc);
  }
  EXPECT_NO_THROW((void)kvattn::cpu::user_variant_kernels(v));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child's compile failed";
  int entries = 0, temporaries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    entries += name.starts_with("cpu-variant-");
    temporaries += name.starts_with("tmp-");
  }
  EXPECT_EQ(entries, 1);
  EXPECT_EQ(temporaries, 0);
  // A warm lookup is the same object.
  EXPECT_EQ(&kvattn::cpu::user_variant_kernels(v), &kvattn::cpu::user_variant_kernels(v));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvattn_test
