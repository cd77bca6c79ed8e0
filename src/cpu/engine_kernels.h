// The CPU engine's online-softmax attention of one work unit, and its store, as templates over
// the variant type: the library instantiates them for the built-in variant (attention_engine.cpp)
// and a user variant's shared object for its composed variant (cpu/variant_compiler.cpp compiles
// this header, embedded in the library, with the user's source). Self-contained on purpose: it
// includes only what is embedded with it (cmake/embed_cpu_engine.cmake).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/convert.h"
#include "cpu/attention_engine.h"
#include "kernels/variants/epilogue.cuh"

namespace kvattn::cpu {

inline constexpr float kEngineLog2e = 1.4426950408889634f;
inline constexpr int kEngineKVTile = 32;
inline constexpr float kEngineNegInf = -std::numeric_limits<float>::infinity();

// Dot product with independent partial sums so the compiler can vectorise without fast-math.
inline float engine_dot(const float* a, const float* b, int n) {
  float acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  return s + ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

struct EngineScratch {
  std::vector<float> q, k, v, m, d, scores;
};

template <class Variant>
void compute_unit_with(const EngineProblem& p, const WorkUnit& u, const UnitState& st) {
  thread_local EngineScratch s;
  const EngineRequest& req = p.requests[size_t(u.request)];
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  const int64_t rows = u.q_end - u.q_begin;
  const int64_t nq = rows * group;  // query vectors, ordered [row][group head]
  const auto& vp = p.variant;
  const bool softmax = Variant::use_softmax(vp);
  const bool causal = Variant::has(vp, kernels::kCausal);
  const bool window = Variant::has(vp, kernels::kSlidingWindow);

  s.q.resize(size_t(nq * dqk));
  s.m.assign(size_t(nq), kEngineNegInf);
  s.d.assign(size_t(nq), 0.0f);
  s.k.resize(size_t(kEngineKVTile) * dqk);
  s.v.resize(size_t(kEngineKVTile) * dvo);
  s.scores.resize(kEngineKVTile);
  std::fill(st.o, st.o + nq * dvo, 0.0f);

  // Load and transform the queries.
  const size_t qsz = dtype_size(p.q_dtype);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t row = req.q_row0 + u.q_begin + r;
    for (int g = 0; g < group; ++g) {
      int h = u.kv_head * group + g;
      float* dst = &s.q[size_t((r * group + g) * dqk)];
      convert::load_row(p.q + (row * p.q_row_stride + h * p.q_head_stride) * qsz, p.q_dtype, dqk,
                        dst);
      Variant::query_transform(vp, dst, dqk, req.q_pos0 + u.q_begin + r);
    }
  }
  const int64_t min_q_pos = req.q_pos0 + u.q_begin, max_q_pos = req.q_pos0 + u.q_end - 1;

  const size_t kvsz = dtype_size(p.kv_dtype);
  for (int64_t si = req.seg_begin; si < req.seg_end; ++si) {
    const KVSegment& seg = p.segments[size_t(si)];
    // Clip the segment to the unit's KV range.
    int64_t t0 = std::max<int64_t>(0, u.kv_begin - seg.kv_idx0);
    int64_t t1 = std::min<int64_t>(seg.num_tokens, u.kv_end - seg.kv_idx0);
    if (t0 >= t1) continue;
    // Whole segments that no query of the unit can see (the mask is still checked per logit).
    if (causal && seg.kv_pos0 + t0 > max_q_pos) continue;
    if (window && seg.kv_pos0 + t1 - 1 < min_q_pos - vp.window_left) continue;

    for (int64_t tb = t0; tb < t1; tb += kEngineKVTile) {
      const int nt = int(std::min<int64_t>(kEngineKVTile, t1 - tb));
      for (int t = 0; t < nt; ++t) {
        int64_t tok = tb + t;
        const char* kp = seg.k + (tok * p.k_token_stride + u.kv_head * p.k_head_stride) * kvsz;
        const char* vptr = seg.v + (tok * p.v_token_stride + u.kv_head * p.v_head_stride) * kvsz;
        convert::load_row(kp, p.kv_dtype, dqk, &s.k[size_t(t) * dqk]);
        convert::load_row(vptr, p.kv_dtype, dvo, &s.v[size_t(t) * dvo]);
        Variant::key_transform(vp, &s.k[size_t(t) * dqk], dqk, seg.kv_pos0 + tok);
      }
      for (int64_t qi = 0; qi < nq; ++qi) {
        const int64_t r = qi / group;
        kernels::LogitCoord c{u.request, int32_t(u.kv_head * group + qi % group), u.q_begin + r, 0,
                              req.q_pos0 + u.q_begin + r, 0, req.kv_len};
        float* acc = st.o + qi * dvo;
        const float* qv = &s.q[size_t(qi * dqk)];
        float tile_max = kEngineNegInf;
        for (int t = 0; t < nt; ++t) {
          c.kv_idx = seg.kv_idx0 + tb + t;
          c.kv_pos = seg.kv_pos0 + tb + t;
          float sc = kEngineNegInf;
          if (Variant::logits_mask(vp, c))
            sc = Variant::logits_transform(vp, vp.sm_scale * engine_dot(qv, &s.k[size_t(t) * dqk], dqk), c);
          s.scores[size_t(t)] = sc;
          if (sc > tile_max || sc != sc) tile_max = sc;  // a NaN logit poisons the row, as it should
        }
        if (!softmax) {
          for (int t = 0; t < nt; ++t) {
            if (s.scores[size_t(t)] == kEngineNegInf) continue;
            float w = Variant::weight(vp, s.scores[size_t(t)]);
            const float* vv = &s.v[size_t(t) * dvo];
            for (int e = 0; e < dvo; ++e) acc[e] += w * vv[e];
          }
          continue;
        }
        if (tile_max == kEngineNegInf) continue;  // nothing visible in this tile
        float m_new = std::max(s.m[size_t(qi)], tile_max * kEngineLog2e);
        float rescale = std::exp2(s.m[size_t(qi)] - m_new);  // 0 when m was -inf
        if (rescale != 1.0f)
          for (int e = 0; e < dvo; ++e) acc[e] *= rescale;
        float dsum = s.d[size_t(qi)] * rescale;
        for (int t = 0; t < nt; ++t) {
          if (s.scores[size_t(t)] == kEngineNegInf) continue;
          float w = std::exp2(s.scores[size_t(t)] * kEngineLog2e - m_new);
          dsum += w;
          const float* vv = &s.v[size_t(t) * dvo];
          for (int e = 0; e < dvo; ++e) acc[e] += w * vv[e];
        }
        s.m[size_t(qi)] = m_new;
        s.d[size_t(qi)] = dsum;
      }
    }
  }

  // Normalise.
  for (int64_t qi = 0; qi < nq; ++qi) {
    float* acc = st.o + qi * dvo;
    if (!softmax) {
      st.lse[qi] = kEngineNegInf;
      continue;
    }
    float dsum = s.d[size_t(qi)];
    if (dsum == 0.0f) {
      std::fill(acc, acc + dvo, 0.0f);
      st.lse[qi] = kEngineNegInf;
    } else {
      float inv = 1.0f / dsum;
      for (int e = 0; e < dvo; ++e) acc[e] *= inv;
      st.lse[qi] = s.m[size_t(qi)] + std::log2(dsum);
    }
  }
}

template <class Variant>
void store_unit_with(const EngineProblem& p, const WorkUnit& u, const UnitState& st) {
  const EngineRequest& req = p.requests[size_t(u.request)];
  const auto& vp = p.variant;
  const int group = p.num_qo_heads / p.num_kv_heads;
  const int dvo = p.head_dim_vo;
  const size_t osz = dtype_size(p.o_dtype);
  thread_local std::vector<float> row;
  row.resize(size_t(dvo));
  for (int64_t r = 0; r < u.q_end - u.q_begin; ++r) {
    const int64_t out_row = req.q_row0 + u.q_begin + r;
    for (int g = 0; g < group; ++g) {
      const int h = u.kv_head * group + g;
      const int64_t qi = r * group + g;
      const float* o = st.o + qi * dvo;
      float lse = st.lse[qi];
      for (int e = 0; e < dvo; ++e) row[size_t(e)] = o[e] * vp.v_scale;
      // A user variant's sink and output_transform, as the GPU kernels apply them.
      if constexpr (kernels::kHasRowEpilogue<Variant>)
        kernels::finish_row<Variant>(vp, u.request, req.q_pos0 + u.q_begin + r, h, 0, row.data(), dvo, lse);
      convert::store_row(p.out + (out_row * p.o_row_stride + h * p.o_head_stride) * osz,
                         p.o_dtype, dvo, row.data());
      if (p.lse) p.lse[out_row * p.lse_row_stride + h * p.lse_head_stride] = lse;
    }
  }
}

template <class Variant>
bool use_softmax_of(const kernels::VariantParams& p) { return Variant::use_softmax(p); }

// The engine's entry points for Variant.
template <class Variant>
constexpr VariantKernels variant_kernels() {
  return {kVariantKernelsAbi, &compute_unit_with<Variant>, &store_unit_with<Variant>, &use_softmax_of<Variant>};
}

}  // namespace kvattn::cpu
