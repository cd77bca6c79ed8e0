#include "core/attention_plan.h"

#include <cmath>
#include <utility>

#include "kvattn/error.h"

namespace kvattn::detail {

namespace {
void check_head_dim(const char* name, int d) {
  KVATTN_CHECK(d >= 8 && d <= 512 && d % 8 == 0, name, " = ", d,
               " is not supported (a multiple of 8 from 8 to 512)");
}
bool is_compute_dtype(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }
}  // namespace

ResolvedShape resolve_shape(const AttentionShape& s) {
  ResolvedShape r;
  KVATTN_CHECK(s.num_qo_heads >= 1, "num_qo_heads = ", s.num_qo_heads, " must be >= 1");
  KVATTN_CHECK(s.num_kv_heads >= 1, "num_kv_heads = ", s.num_kv_heads, " must be >= 1");
  KVATTN_CHECK(s.num_qo_heads % s.num_kv_heads == 0, "num_qo_heads = ", s.num_qo_heads,
               " is not a multiple of num_kv_heads = ", s.num_kv_heads);
  check_head_dim("head_dim_qk", s.head_dim_qk);
  int dvo = s.head_dim_vo == 0 ? s.head_dim_qk : s.head_dim_vo;
  check_head_dim("head_dim_vo", dvo);
  KVATTN_CHECK(is_compute_dtype(s.q_dtype), "q_dtype = ", dtype_name(s.q_dtype),
               " is not supported (f32, f16 or bf16)");
  DType kv = s.kv_dtype.value_or(s.q_dtype);
  KVATTN_CHECK(is_compute_dtype(kv) || is_fp8(kv), "kv_dtype = ", dtype_name(kv),
               " is not supported (f32, f16, bf16, e4m3 or e5m2)");
  DType o = s.o_dtype.value_or(s.q_dtype);
  KVATTN_CHECK(is_compute_dtype(o), "o_dtype = ", dtype_name(o),
               " is not supported (f32, f16 or bf16)");
  s.variant.validate();
  if (s.variant.rope)
    KVATTN_CHECK(s.head_dim_qk % 2 == 0, "fused RoPE needs an even head_dim_qk, got ",
                 s.head_dim_qk);
  r.num_qo_heads = s.num_qo_heads;
  r.num_kv_heads = s.num_kv_heads;
  r.head_dim_qk = s.head_dim_qk;
  r.head_dim_vo = dvo;
  r.q_dtype = s.q_dtype;
  r.kv_dtype = kv;
  r.o_dtype = o;
  r.variant = s.variant;
  return r;
}

kernels::VariantParams make_variant_params(const ResolvedShape& s) {
  const Variant& v = s.variant;
  kernels::VariantParams p;
  using namespace kernels;
  if (v.causal) p.features |= kCausal;
  if (v.window_left >= 0) p.features |= kSlidingWindow;
  if (v.logits_soft_cap > 0) p.features |= kSoftCap;
  if (v.alibi) p.features |= kAlibi;
  if (v.custom_mask) p.features |= kCustomMask;
  if (v.sigmoid) p.features |= kSigmoid;
  float sm = v.sm_scale.value_or(1.0f / std::sqrt(float(s.head_dim_qk)));
  p.sm_scale = sm * v.q_scale * v.k_scale;
  p.v_scale = v.v_scale;
  p.soft_cap = v.logits_soft_cap;
  p.window_left = v.window_left;
  p.sigmoid_bias = v.sigmoid_bias;
  p.num_qo_heads = s.num_qo_heads;
  p.num_kv_heads = s.num_kv_heads;
  if (v.rope) {
    p.features |= kRope;
    if (v.rope->interleave) p.features |= kRopeInterleave;
    p.rope_scale = v.rope->rope_scale;
    p.rope_theta = v.rope->rope_theta;
    if (v.rope->llama31) {
      p.features |= kRopeLlama31;
      p.llama31_factor = v.rope->llama31->factor;
      p.llama31_low_freq_factor = v.rope->llama31->low_freq_factor;
      p.llama31_high_freq_factor = v.rope->llama31->high_freq_factor;
      p.llama31_original_max_position = v.rope->llama31->original_max_position;
    }
  }
  return p;
}

void check_graph_replan(const AttentionPlan* previous, const AttentionPlan& next,
                        const SchedulerOptions& scheduler, const char* api) {
  if (!previous || !previous->scheduler.cuda_graph || !scheduler.cuda_graph) return;
  const char* why = " between plans (a captured run() replays what it captured; plan on a new object to change it)";
  auto fail = [&](const char* what, const auto& was, const auto& now) {
    detail::throw_error(api, " in CUDA-graph mode cannot change ", what, " (was ", was, ", now ", now, ")", why);
  };
  auto same = [&](const char* what, const auto& was, const auto& now) {
    if (!(was == now)) fail(what, was, now);
  };
  constexpr const char* kKinds[] = {"paged", "ragged", "block-sparse"};
  if (previous->kind != next.kind) fail("the KV layout", kKinds[int(previous->kind)], kKinds[int(next.kind)]);
  if (next.kind == KVKind::paged) same("page_size", previous->page_size, next.page_size);
  if (next.kind == KVKind::block_sparse) {
    same("the bsr block size R", previous->bsr_R, next.bsr_R);
    same("the bsr block size C", previous->bsr_C, next.bsr_C);
  }
  const GraphCapacity &ga = *previous->scheduler.cuda_graph, &gb = *scheduler.cuda_graph;
  same("cuda_graph.max_batch", ga.max_batch, gb.max_batch);
  same("cuda_graph.max_tokens", ga.max_tokens, gb.max_tokens);
  same("cuda_graph.max_split_items", ga.max_split_items, gb.max_split_items);
  same("num_workers", previous->scheduler.num_workers, scheduler.num_workers);
  const ResolvedShape &a = previous->shape, &b = next.shape;
  same("q_dtype", dtype_name(a.q_dtype), dtype_name(b.q_dtype));
  same("kv_dtype", dtype_name(a.kv_dtype), dtype_name(b.kv_dtype));
  same("o_dtype", dtype_name(a.o_dtype), dtype_name(b.o_dtype));
  same("num_qo_heads", a.num_qo_heads, b.num_qo_heads);
  same("num_kv_heads", a.num_kv_heads, b.num_kv_heads);
  same("head_dim_qk", a.head_dim_qk, b.head_dim_qk);
  same("head_dim_vo", a.head_dim_vo, b.head_dim_vo);
  const kernels::VariantParams &u = previous->variant, &v = next.variant;
  if (u.features != v.features) fail("the variant", a.variant.describe(), b.variant.describe());
  // The values the kernels read (a feature that is off reads none of its own).
  same("sm_scale (with q_scale and k_scale folded in)", u.sm_scale, v.sm_scale);
  same("v_scale", u.v_scale, v.v_scale);
  using namespace kernels;
  if (v.features & kSoftCap) same("logits_soft_cap", u.soft_cap, v.soft_cap);
  if (v.features & kSlidingWindow) same("window_left", u.window_left, v.window_left);
  if (v.features & kSigmoid) same("sigmoid_bias", u.sigmoid_bias, v.sigmoid_bias);
  if (v.features & kRope) {
    same("rope_scale", u.rope_scale, v.rope_scale);
    same("rope_theta", u.rope_theta, v.rope_theta);
  }
  if (v.features & kRopeLlama31) {
    same("llama31.factor", u.llama31_factor, v.llama31_factor);
    same("llama31.low_freq_factor", u.llama31_low_freq_factor, v.llama31_low_freq_factor);
    same("llama31.high_freq_factor", u.llama31_high_freq_factor, v.llama31_high_freq_factor);
    same("llama31.original_max_position", u.llama31_original_max_position, v.llama31_original_max_position);
  }
}

}  // namespace kvattn::detail
