// User variants in the GPU decode and prefill kernels against the float64 reference (whose hooks are the same
// formulas in double): every example of examples/variants/ that means something for decode, on
// each decode kernel family (TMA, bulk copies at page 1, CUDA cores for f32 and fused RoPE, fp8
// K/V, two M tiles at group 32), with split rows folded by the merge kernel and in-kernel, device
// page tables and graph-mode re-plans; and on the prefill kernels (mma.sync and the Hopper tier,
// ragged and paged, fp8 KV, splits). The parameter tensors live on the device. Every case skips
// where there is no CUDA device (CI compiles these kernels: cuda_user_variant_jit_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "support/attention_case.h"
#include "support/gpu_skip.h"
#include "support/host_tensor.h"
#include "support/scoped_override.h"
#include "support/variant_examples.h"

#if KVATTN_WITH_CUDA
#include "support/device_mirror.h"
#endif

namespace kvattn_test {
namespace {

using kvattn::CustomVariant;
using kvattn::DType;

#if KVATTN_WITH_CUDA

// One example with its parameter tensors on cuda:0 (host copies kept for the mirrors) and its
// hooks in double for the reference.
struct GpuExample {
  std::string name;
  std::vector<std::unique_ptr<HostTensor>> host;
  std::vector<std::unique_ptr<DeviceMirror>> device;
  kvattn::Variant variant;
  ref::UserHooks hooks;
  double logit_error = 0.0;  // how far the example's fast math may move a logit (nats)

  kvattn::TensorView on_device(HostTensor t) {
    host.push_back(std::make_unique<HostTensor>(std::move(t)));
    device.push_back(std::make_unique<DeviceMirror>(*host.back()));
    return device.back()->view();
  }
};

constexpr int kHeads = 32;     // query heads of every case (the KV heads divide them)
constexpr int64_t kMaxLen = 3000;

std::vector<std::unique_ptr<GpuExample>> decode_examples(Rng& rng) {
  std::vector<std::unique_ptr<GpuExample>> out;
  auto add = [&](const char* name) {
    out.push_back(std::make_unique<GpuExample>());
    out.back()->name = name;
    return out.back().get();
  };
  {
    GpuExample* e = add("soft_cap");
    const float cap = 4.0f;
    e->hooks.logits_transform = [=](double x, int, int64_t, int64_t, int, int) { return cap * std::tanh(x / cap); };
    e->variant = kvattn::Variant{}.with_custom(example("soft_cap", {"cap"}), {.f32 = {{"cap", cap}}});
    e->logit_error = cap * kTanhApproxMeasured;  // fast::tanh is MUFU.TANH
  }
  {
    GpuExample* e = add("alibi");
    HostTensor slopes(DType::f32, {kHeads});
    auto s = std::make_shared<std::vector<double>>(kHeads);
    for (int h = 0; h < kHeads; ++h) slopes.set_at(h, (*s)[size_t(h)] = -0.01 * (h + 1));
    e->hooks.logits_transform = [=](double x, int, int64_t qp, int64_t kp, int h, int) {
      return x + (*s)[size_t(h)] * double(kp - qp);
    };
    e->variant = kvattn::Variant{}.with_custom(example("alibi", {}, {}, {{"slopes", DType::f32, 1}}),
                                               {.tensors = {{"slopes", e->on_device(std::move(slopes))}}});
  }
  {
    GpuExample* e = add("sigmoid");
    const float bias = -1.5f;
    e->hooks.use_softmax = false;
    e->hooks.logits_transform = [=](double x, int, int64_t, int64_t, int, int) { return 1.0 / (1.0 + std::exp(-(x + bias))); };
    e->variant = kvattn::Variant{}.with_custom(example("sigmoid", {"bias"}), {.f32 = {{"bias", bias}}});
  }
  {
    GpuExample* e = add("t5_bias");
    constexpr int kBuckets = 32, kMaxDistance = 1024;
    HostTensor bias(DType::f32, {kHeads, kBuckets});
    auto b = std::make_shared<std::vector<double>>(kHeads * kBuckets);
    for (int i = 0; i < kHeads * kBuckets; ++i) bias.set_at(i, (*b)[size_t(i)] = rng.uniform(-2, 2));
    auto bucket = [](int64_t d) {
      const int64_t n = d < 0 ? -d : 0;
      const int exact = kBuckets / 2;
      if (n < exact) return int(n);
      const float scaled = logf(float(n) / float(exact)) / logf(float(kMaxDistance) / float(exact));
      return std::min(exact + int(scaled * float(kBuckets - exact)), kBuckets - 1);
    };
    e->hooks.logits_transform = [=](double x, int, int64_t qp, int64_t kp, int h, int) {
      return x + (*b)[size_t(h * kBuckets + bucket(kp - qp))];
    };
    e->variant = kvattn::Variant{}.with_custom(
        example("t5_bias", {}, {"max_distance"}, {{"bias", DType::f32, 2}}),
        {.i32 = {{"max_distance", kMaxDistance}}, .tensors = {{"bias", e->on_device(std::move(bias))}}});
  }
  {
    GpuExample* e = add("document_mask");  // positions in documents of about 300 tokens
    HostTensor docs(DType::i32, {kMaxLen});
    auto d = std::make_shared<std::vector<int>>(kMaxLen);
    int doc = 0;
    for (int64_t i = 0; i < kMaxLen; ++i) {
      if (i > 0 && rng.coin(1.0 / 300)) ++doc;
      docs.set_at(i, (*d)[size_t(i)] = doc);
    }
    e->hooks.logits_mask = [=](int, int64_t qp, int64_t kp, int, int) { return (*d)[size_t(qp)] == (*d)[size_t(kp)]; };
    e->variant = kvattn::Variant{}.with_custom(example("document_mask", {}, {}, {{"doc_ids", DType::i32, 1}}),
                                               {.tensors = {{"doc_ids", e->on_device(std::move(docs))}}});
  }
  {
    GpuExample* e = add("prefix_lm");  // per-request prefixes: none, short, past the request
    constexpr int kRequests = 16;        // covers every case's batch
    HostTensor prefix(DType::i32, {kRequests});
    auto pl = std::make_shared<std::vector<int>>(kRequests);
    for (int b = 0; b < kRequests; ++b) prefix.set_at(b, (*pl)[size_t(b)] = b % 4 == 0 ? 0 : int(rng.integer(1, 1500)));
    e->hooks.logits_mask = [=](int b, int64_t qp, int64_t kp, int, int) { return kp <= qp || kp < (*pl)[size_t(b)]; };
    e->variant = kvattn::Variant{}.with_custom(example("prefix_lm", {}, {}, {{"prefix_len", DType::i32, 1}}),
                                               {.tensors = {{"prefix_len", e->on_device(std::move(prefix))}}});
  }
  {
    GpuExample* e = add("streaming_sink");
    const int sink = 4, window = 200;
    e->hooks.logits_mask = [=](int, int64_t qp, int64_t kp, int, int) { return kp <= qp && (kp < sink || kp >= qp - window); };
    e->variant = kvattn::Variant{}.with_custom(example("streaming_sink", {}, {"num_sink", "window"}),
                                               {.i32 = {{"num_sink", sink}, {"window", window}}});
  }
  {
    GpuExample* e = add("learned_sink");
    HostTensor sinks(DType::f32, {kHeads});
    auto s = std::make_shared<std::vector<double>>(kHeads);
    for (int h = 0; h < kHeads; ++h) sinks.set_at(h, (*s)[size_t(h)] = rng.uniform(-3, 6));
    e->hooks.sink_logit = [=](int, int h) { return (*s)[size_t(h)]; };
    e->variant = kvattn::Variant{}.with_custom(example("learned_sink", {}, {}, {{"sinks", DType::f32, 1}}),
                                               {.tensors = {{"sinks", e->on_device(std::move(sinks))}}});
  }
  {
    GpuExample* e = add("builtin_streaming_sinks");  // kvattn::variants::streaming_sinks
    const int sink = 8, window = 300;
    e->hooks.logits_mask = [=](int, int64_t qp, int64_t kp, int, int) { return kp <= qp && (kp < sink || kp >= qp - window); };
    e->variant = kvattn::variants::streaming_sinks(sink, window);
  }
  {
    GpuExample* e = add("scaled_window");  // every hook but the sink, over the built-in window and soft-cap
    CustomVariant v;
    v.name = "scaled_window";
    v.source = R"(
struct Variant {
  static bool logits_mask(const Params& p, int, int64_t qo_pos, int64_t kv_pos, int, int) {
    return ((qo_pos + kv_pos) % p.period) != 1;
  }
  static float logits_transform(const Params& p, float logit, int, int64_t, int64_t, int, int kv_head) {
    return logit + p.shift * float(kv_head);
  }
  static float output_transform(const Params& p, float value, int batch, int64_t qo_pos, int qo_head, int dim) {
    return value * p.out_scale + 0.01f * float(dim % 3) - 0.001f * float(qo_head) + 1e-4f * float((qo_pos + batch) % 7);
  }
};
)";
    v.f32_params = {"shift", "out_scale"};
    v.i32_params = {"period"};
    const float shift = 0.25f, out_scale = 1.5f;
    const int period = 3;
    e->hooks.logits_mask = [=](int, int64_t qp, int64_t kp, int, int) { return (qp + kp) % period != 1; };
    e->hooks.logits_transform = [=](double x, int, int64_t, int64_t, int, int hk) { return x + shift * hk; };
    e->hooks.output_transform = [=](double o, int b, int64_t qp, int h, int d) {
      return o * out_scale + 0.01 * (d % 3) - 0.001 * h + 1e-4 * double((qp + b) % 7);
    };
    e->variant = kvattn::Variant{}.with_window(700).with_soft_cap(5.0f).with_custom(
        v, {.f32 = {{"shift", shift}, {"out_scale", out_scale}}, .i32 = {{"period", period}}});
  }
  return out;
}

// The decode kernel families by (q, KV, head dim, group, page size, built-in extra); the fp8 and
// 2-byte tolerances of gpu_decode_test.cpp (P rounded to the MMA type).
struct Shape {
  DType q, kv;
  int hd, group, page_size;
  bool rope;
  const char* what;
};
const Shape kShapes[] = {
    {DType::bf16, DType::bf16, 128, 4, 16, false, "TMA, bf16"},
    {DType::f16, DType::f16, 64, 8, 1, false, "bulk copies, page 1, f16"},
    {DType::bf16, DType::e4m3, 128, 8, 16, false, "TMA, fp8 e4m3"},
    {DType::bf16, DType::bf16, 128, 32, 16, false, "two M tiles (MQA)"},
    {DType::f32, DType::f32, 64, 4, 16, false, "CUDA cores, f32"},
    {DType::bf16, DType::bf16, 128, 4, 16, true, "CUDA cores, fused RoPE"},
};

AttnCase decode_case(const Shape& s, const GpuExample& e, Rng& rng) {
  AttnCase c;
  c.on_gpu = true;
  c.q_dtype = s.q;
  c.kv_dtype = s.kv;
  if (s.q == DType::bf16 && s.kv == DType::bf16) c.tolerance.accumulation = 0x1p-8;
  if (s.q == DType::f16 || s.kv == DType::e4m3 || s.kv == DType::e5m2) c.tolerance.accumulation = 0x1p-10;
  if (s.rope) c.tolerance.accumulation = 0x1p-8;
  c.num_qo_heads = kHeads;
  c.num_kv_heads = kHeads / s.group;
  c.head_dim_qk = s.hd;
  c.page_size = s.page_size;
  c.variant = s.rope ? e.variant.with_rope(kvattn::RopeConfig{}) : e.variant;
  c.user = &e.hooks;
  // An output_transform evaluates its own terms in f32 (scaled_window's reach 0.03 and cancel to
  // near 0 on empty rows): a few f32 units of them on top of the output's tolerance.
  if (e.hooks.output_transform) c.tolerance.output_abs = 8 * 0x1p-24 * 0.03;
  c.tolerance = allow_logit_error(c.tolerance, e.logit_error);
  for (int b = 0; b < 5; ++b) c.lens.push_back({1, rng.integer(1, 600)});
  c.lens.push_back({1, kMaxLen});  // split over several CTAs: partial states merged
  c.lens.push_back({1, 0});        // no keys (the sink alone)
  return c;
}

TEST(GpuUserVariant, EveryExampleOnEveryDecodeKernelFamily) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  const auto examples = decode_examples(rng);
  for (const auto& e : examples)
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(e->name + " on " + s.what);
      AttnCase c = decode_case(s, *e, rng);
      run_decode_case(c, rng);
    }
}

// Split rows folded in the decode kernel by the last CTA (KVATTN_DECODE_MERGE=fold) instead of
// the merge kernel; forced small splits; a device-resident page table.
TEST(GpuUserVariant, SplitRowsFoldedInKernelAndDevicePageTables) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  const auto examples = decode_examples(rng);
  ScopedOverride fold("KVATTN_DECODE_MERGE", "fold");
  for (const auto& e : examples)
    for (const Shape& s : {kShapes[0], kShapes[2], kShapes[4]}) {
      SCOPED_TRACE(e->name + " on " + s.what + ", folded in the kernel");
      AttnCase c = decode_case(s, *e, rng);
      c.scheduler.fixed_split_size = 256;
      c.device_page_table = true;
      run_decode_case(c, rng);
    }
}

// A graph-mode plan (fixed buffers, padded grids; capture and replay with a user variant are
// python/tests/test_cuda_wrappers.py's), run three times on one plan: bitwise equal outputs.
TEST(GpuUserVariant, GraphModePlansAndRepeatedRunsAreBitwiseEqual) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  const auto examples = decode_examples(rng);
  for (const auto& e : examples) {
    SCOPED_TRACE(e->name);
    AttnCase c = decode_case(kShapes[0], *e, rng);
    c.runs = 3;
    c.scheduler.cuda_graph = kvattn::GraphCapacity{16, 16};
    run_decode_case(c, rng);
  }
}

// Prefill and append on the prefill kernels: ragged and paged, causal (the examples whose masks
// are causal by themselves without the built-in one), bf16 and fp8 KV, query runs long enough for
// the Hopper tier and short appends, forced splits (the merge kernel applies sinks and output
// transforms), a device page table.
TEST(GpuUserVariant, EveryExampleOnThePrefillKernels) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  const auto examples = decode_examples(rng);
  for (const auto& e : examples)
    for (KVStore store : {KVStore::ragged, KVStore::paged})
      for (DType kv : {DType::bf16, DType::e4m3}) {
        if (store == KVStore::ragged && kv != DType::bf16) continue;  // fp8 KV: paged caches
        SCOPED_TRACE(e->name + (store == KVStore::ragged ? " ragged" : " paged") + " " + std::string(kvattn::dtype_name(kv)));
        AttnCase c;
        c.on_gpu = true;
        c.q_dtype = DType::bf16;
        c.kv_dtype = kv;
        c.tolerance.accumulation = 0x1p-8;
        c.num_qo_heads = 8;  // the float64 reference's cost: 8/2 heads keep the suite within minutes
        c.num_kv_heads = 2;
        c.head_dim_qk = 128;
        c.store = store;
        c.page_size = 16;
        const bool own_causal =
            e->name == "streaming_sink" || e->name == "builtin_streaming_sinks" || e->name == "prefix_lm";
        c.variant = own_causal ? e->variant : e->variant.with_causal();
        c.user = &e->hooks;
        if (e->hooks.output_transform) c.tolerance.output_abs = 8 * 0x1p-24 * 0.03;  // as decode_case
        c.tolerance = allow_logit_error(c.tolerance, e->logit_error);
        c.lens = {{300, 500}, {1, 300}, {37, 37}, {130, 1400}};
        c.scheduler.fixed_split_size = rng.coin(0.5) ? 512 : 0;
        c.device_page_table = store == KVStore::paged && rng.coin(0.5);
        run_prefill_case(c, rng);
      }
}

// The range hooks on both prefill tiers, with and without the built-in causal mask: document
// masking (short documents: blocks hold several; long ones: tiles inside kv_full_range) and
// PrefixLM (no prefix, a short one, one past every request), ragged or paged at random, splits at
// random (narrowed items whose chunks see nothing).
const std::vector<std::pair<int64_t, int64_t>> kRangeLens = {{300, 500}, {1, 300},   {37, 37},
                                                             {130, 1400}, {512, 512}, {700, 2000}};

AttnCase range_case(const kvattn::Variant& v, bool causal, const ref::UserHooks& hooks, Rng& rng) {
  AttnCase c;
  c.on_gpu = true;
  c.q_dtype = DType::bf16;
  c.kv_dtype = DType::bf16;
  c.tolerance.accumulation = 0x1p-8;
  c.num_qo_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim_qk = 128;
  c.store = rng.coin(0.5) ? KVStore::paged : KVStore::ragged;
  c.page_size = 16;
  c.lens = kRangeLens;
  c.scheduler.fixed_split_size = rng.coin(0.5) ? 512 : 0;
  c.variant = causal ? v.with_causal() : v;
  c.user = &hooks;
  return c;
}

TEST(GpuUserVariant, RangeHooksWithAndWithoutCausalOnBothTiers) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  for (const char* tier : {"mma_sync", "wgmma"}) {
    ScopedOverride force("KVATTN_PREFILL_TIER", tier);
    for (bool causal : {false, true}) {
      for (double mean_doc : {20.0, 700.0}) {
        SCOPED_TRACE(std::string(tier) + (causal ? " causal" : " non-causal") + ", documents of about " +
                     std::to_string(int(mean_doc)));
        GpuExample e;
        const int64_t n = 2000;
        HostTensor docs(DType::i32, {n});
        auto d = std::make_shared<std::vector<int>>(n);
        int doc = 0;
        for (int64_t i = 0; i < n; ++i) {
          if (i > 0 && rng.coin(1.0 / mean_doc)) ++doc;
          docs.set_at(i, (*d)[size_t(i)] = doc);
        }
        e.hooks.logits_mask = [=](int, int64_t qp, int64_t kp, int, int) { return (*d)[size_t(qp)] == (*d)[size_t(kp)]; };
        const auto v = kvattn::Variant{}.with_custom(example("document_mask", {}, {}, {{"doc_ids", DType::i32, 1}}),
                                                     {.tensors = {{"doc_ids", e.on_device(std::move(docs))}}});
        run_prefill_case(range_case(v, causal, e.hooks, rng), rng);
      }
      for (int prefix : {0, 333, 5000}) {
        SCOPED_TRACE(std::string(tier) + (causal ? " causal" : " non-causal") + ", prefix " + std::to_string(prefix));
        GpuExample e;
        const int batch = int(kRangeLens.size());
        HostTensor lens(DType::i32, {batch});
        auto pl = std::make_shared<std::vector<int>>(batch);
        for (int b = 0; b < batch; ++b) lens.set_at(b, (*pl)[size_t(b)] = b % 2 ? prefix : prefix / 2 + 1);
        e.hooks.logits_mask = [=](int b, int64_t qp, int64_t kp, int, int) { return kp <= qp || kp < (*pl)[size_t(b)]; };
        const auto v = kvattn::Variant{}.with_custom(example("prefix_lm", {}, {}, {{"prefix_len", DType::i32, 1}}),
                                                     {.tensors = {{"prefix_len", e.on_device(std::move(lens))}}});
        run_prefill_case(range_case(v, causal, e.hooks, rng), rng);
      }
    }
  }
}

// The prefill kernels call the hooks unconditionally at clamped coordinates (docs/VARIANTS.md):
// a probe variant (test-only: it writes a flag, which the contract forbids real hooks) records
// any call with a batch, position or head outside the request, and any range hook called with an
// inverted block or a non-empty full range on entry; softmax and use_softmax = false.
const char* kCoordinateProbe = R"(
struct Variant {
  static constexpr bool use_softmax = !SIGMOID;
  static void flag(const Params& p, int bit) {
    int32_t* f = const_cast<int32_t*>(&p.flags(0));
#if defined(__CUDA_ARCH__)
    atomicOr(f, bit);
#else
    *f |= bit;
#endif
  }
  static bool pos_ok(const Params& p, int batch, int64_t x) { return x >= 0 && x < p.kv_lens(batch); }
  static bool logits_mask(const Params& p, int batch, int64_t qo_pos, int64_t kv_pos, int qo_head, int) {
    if (batch < 0 || batch >= p.kv_lens.size(0)) { flag(p, 1); return false; }
    if (!pos_ok(p, batch, qo_pos)) flag(p, 2);
    if (!pos_ok(p, batch, kv_pos)) flag(p, 4);
    if (qo_head < 0 || qo_head >= p.heads) flag(p, 8);
    return kv_pos <= qo_pos || kv_pos < p.prefix;
  }
  static float logits_transform(const Params& p, float logit, int batch, int64_t qo_pos, int64_t kv_pos, int qo_head, int) {
    if (!pos_ok(p, batch, qo_pos) || !pos_ok(p, batch, kv_pos)) flag(p, 16);
    if (qo_head < 0 || qo_head >= p.heads) flag(p, 32);
    const float x = logit + 0.01f * float(qo_head);
    return SIGMOID ? 1.0f / (1.0f + expf(-x)) : x;
  }
  static void kv_range(const Params& p, int batch, int64_t q_first, int64_t q_last, int64_t& kv_first, int64_t& kv_last) {
    if (!pos_ok(p, batch, q_first) || !pos_ok(p, batch, q_last) || q_first > q_last) flag(p, 64);
    if (!pos_ok(p, batch, kv_first) || !pos_ok(p, batch, kv_last) || kv_first > kv_last) flag(p, 128);
    const int64_t last = q_last > p.prefix - 1 ? q_last : p.prefix - 1;
    if (last < kv_last) kv_last = last;
  }
  static void kv_full_range(const Params& p, int batch, int64_t q_first, int64_t q_last, int64_t& kv_first, int64_t& kv_last) {
    if (!pos_ok(p, batch, q_first) || !pos_ok(p, batch, q_last) || q_first > q_last) flag(p, 256);
    if (kv_first <= kv_last) flag(p, 512);
    kv_first = 0;
    kv_last = q_first > p.prefix - 1 ? q_first : p.prefix - 1;
  }
};
)";

TEST(GpuUserVariant, HooksSeeOnlyRealCoordinates) {
  SKIP_WITHOUT_GPU();
  KVATTN_CASE_RNG(rng);
  for (bool sigmoid : {false, true})
    for (const char* tier : {"mma_sync", "wgmma"})
      for (bool causal : {false, true})
        for (int prefix : {0, 700}) {
          SCOPED_TRACE(std::string(tier) + (causal ? " causal" : " non-causal") + ", prefix " + std::to_string(prefix) +
                       (sigmoid ? ", use_softmax = false" : ""));
          ScopedOverride force("KVATTN_PREFILL_TIER", tier);
          GpuExample e;
          const int batch = int(kRangeLens.size());
          HostTensor lens(DType::i32, {batch});
          for (int b = 0; b < batch; ++b) lens.set_at(b, double(kRangeLens[size_t(b)].second));
          HostTensor flags(DType::i32, {1});
          flags.set_at(0, 0.0);
          const kvattn::TensorView lv = e.on_device(std::move(lens));
          const kvattn::TensorView fv = e.on_device(std::move(flags));
          CustomVariant probe;
          probe.name = "coordinate_probe";
          probe.source = std::string("#define SIGMOID ") + (sigmoid ? "1" : "0") + "\n" + kCoordinateProbe;
          probe.i32_params = {"prefix", "heads"};
          probe.tensor_params = {{"kv_lens", DType::i32, 1}, {"flags", DType::i32, 1}};
          e.hooks.use_softmax = !sigmoid;
          e.hooks.logits_mask = [=](int, int64_t qp, int64_t kp, int, int) { return kp <= qp || kp < prefix; };
          e.hooks.logits_transform = [=](double x, int, int64_t, int64_t, int h, int) {
            return sigmoid ? 1.0 / (1.0 + std::exp(-(x + 0.01 * h))) : x + 0.01 * h;
          };
          const auto v = kvattn::Variant{}.with_custom(
              probe, {.i32 = {{"prefix", prefix}, {"heads", 8}}, .tensors = {{"kv_lens", lv}, {"flags", fv}}});
          run_prefill_case(range_case(v, causal, e.hooks, rng), rng);
          device_synchronize();
          e.device[1]->copy_back(*e.host[1]);
          EXPECT_EQ(int(e.host[1]->get_at(0)), 0) << "hook calls out of range (bit flags, see kCoordinateProbe)";
        }
}

#else
TEST(GpuUserVariant, EveryExampleOnEveryDecodeKernelFamily) { SKIP_WITHOUT_GPU(); }
#endif

}  // namespace
}  // namespace kvattn_test
