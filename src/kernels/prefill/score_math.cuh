// The per-score work of the prefill kernel between the two MMAs, on one warp's MT x 16 rows and a
// KV tile (S fragments s[mt][n][j]: row g + 8 (j / 2) of m-tile mt, key n * 8 + 2 t4 + j % 2):
//   - logits: the mask only on tiles it can cut; soft-cap / ALiBi / sigmoid weights on every tile
//     when the variant has them (plain softmax variants keep raw scores: the scale is folded into
//     the exponent, one FMA per score);
//   - online softmax in log2 units with ex2.approx, the O rescale skipped when no row max moved
//     (bf16 soft-cap: one fixed shift instead of a row maximum, SoftmaxForm::fixed_shift).
#pragma once

#include "kernels/prefill/tile_io.cuh"

namespace kvattn::kernels::prefill {

__device__ __forceinline__ float fast_exp2(float x) {  // 2^x; -inf -> +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// tanh: tanh.approx.f32 (one MUFU op, relative error about 2^-11) or 1 - 2 / (1 + e^2x) with
// ex2/rcp.approx (two MUFU ops, absolute error about 1e-7).
template <bool kApprox>
__device__ __forceinline__ float fast_tanh(float x) {
  if constexpr (kApprox) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  } else {
    return 1.0f - 2.0f * fast_rcp(1.0f + fast_exp2(x * 2.8853900817779268f));
  }
}

// Where a warp's rows sit: the item-relative token of its first and last real row.
struct WarpRows {
  int row0;                     // first M-tile row of the warp
  int32_t pos_first, pos_last;  // positions of its first and last real query
};

// The lazy rescale's threshold in log2 units; KVATTN_PREFILL_LAZY_LOG2=1..8 sets it for
// experiments (cuda/prefill_kernels.cpp: a compile option). A lower one moves the reference
// maximum more often, so fewer weights are rounded below their fresh-maximum values
// (scripts/lazy-rescale-error; docs/DECISIONS.md, "Prefill accuracy: the lazy rescale").
#ifndef KVATTN_PREFILL_LAZY_LOG2
#define KVATTN_PREFILL_LAZY_LOG2 8.0f
#endif

template <class C>
struct ScoreMath {
  static constexpr int MT = C::MT, kNT = C::kWarpKV / 8;
  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr bool kSoftmax = C::kSoftmax;
  using Variant = typename C::Variant;
  // A user variant: scores go through the variant's hooks (user_logits).
  static constexpr bool kUser = Variant::kUser;
  // Variants whose logits change on every tile; the others need only the mask.
  static constexpr bool kTransform =
      (C::FEATURES & (kSoftCap | kAlibi)) != 0 || !kSoftmax || Variant::kHasUserTransform;
  using Builtin = BuiltinVariant<C::FEATURES>;  // the built-in part (ALiBi's slopes)

  // Soft-cap through tanh.approx under softmax keeps its scores as t = tanh(x scale / c): the
  // cap's c L is folded into the softmax's one FFMA per score (exp_scale), one instruction per
  // score fewer than computing c L t (+8%; H200 at 370aabc). The exact form, computed as
  // c L - 2 c L / (1 + 2^(x u)), measured 2-6% slower with the same fold (-c L t shifted by c L,
  // -1 / (1 + 2^(x u)) in the scores, c L added to the LSE), so it keeps its log2-unit scores.
  static constexpr bool kCapUnits = (C::FEATURES & kSoftCap) != 0 && kSoftmax && C::FAST_TANH && !kUser;

  // Soft-cap's fixed shift (C::kCapShift; smem_layout.cuh says why it is safe): m holds the shift
  // in score units from the start and never moves. The exact form folds it into its last FFMA.
  static __device__ __forceinline__ float cap_shift(const PrefillParams& p) {
    return cap_shift_log2(p.variant.soft_cap * kLog2e);
  }

  // The factor between a score as the softmax sees it and log2 units (raw scores: |sm_scale|
  // log2 e; tanh.approx soft-cap: c L; a user variant's transformed logits: log2 e, folded into
  // the softmax's FFMA; other transformed ones are already in log2 units).
  static __device__ __forceinline__ float exp_scale(const PrefillParams& p) {
    if constexpr (kCapUnits) return p.variant.soft_cap * kLog2e;
    if constexpr (kUser && kTransform) return kLog2e;
    return kTransform ? 1.0f : fmaxf(fabsf(p.variant.sm_scale) * kLog2e, 1e-30f);  // never 0 x inf
  }

  // The built-in masks of one row: its visible keys are one range [lo, hi) (the item's end, cut
  // by the causal diagonal and the window's edge: Variant::logits_mask's rules, compared in 32
  // bits as positions are int32 in the plan), then a custom mask clears keys inside it. Keys are
  // positioned by their index in the request (prefill: position = index).
  struct RowMask {
    int32_t lo, hi;
    int64_t row_bit;     // custom mask: the row's bits start at bit (q_idx x kv_len) of the request's
    const uint8_t* bits;  // the request's custom-mask bits

    __device__ __forceinline__ RowMask(const PrefillParams& p, const ItemInfo& it, int32_t tq, int32_t q_pos,
                                       bool row_ok, const uint8_t* mask)
        : lo(row_ok ? -2147483647 - 1 : 2147483647), hi(it.kv_end), row_bit(0), bits(mask) {
      // a row past the item: none
      if constexpr ((C::FEATURES & kCausal) != 0) hi = min(hi, q_pos + 1);
      if constexpr ((C::FEATURES & kSlidingWindow) != 0)
        if (row_ok) lo = q_pos - p.variant.window_left;
      if constexpr ((C::FEATURES & kCustomMask) != 0) row_bit = int64_t(it.q_begin + tq) * it.kv_len;
    }
    __device__ __forceinline__ bool visible(int32_t kv) const {
      bool v = kv >= lo && kv < hi;
      if constexpr ((C::FEATURES & kCustomMask) != 0)
        if (v) {
          const int64_t bit = row_bit + kv;
          v = (bits[bit >> 3] >> (bit & 7)) & 1;
        }
      return v;
    }
  };
  static __device__ __forceinline__ const uint8_t* request_mask(const PrefillParams& p, const ItemInfo& it) {
    if constexpr ((C::FEATURES & kCustomMask) != 0) return p.variant.custom_mask + p.variant.mask_indptr[it.request];
    return nullptr;
  }

  // The variant's logit transform with its constants folded (one thread, one tile): softmax
  // variants come out in log2 units. Soft-cap c tanh(x scale / c) as c L (1 - 2 / (1 + 2^(x u)))
  // with u = 2 scale log2(e) / c: FMUL, two MUFU, FADD, FFMA (or tanh.approx(x scale / c) in the
  // units above, c tanh.approx(...) under sigmoid); ALiBi adds slope L (key - query) with one
  // FFMA (the slope in the scores' units).
  struct Transform {
    float mul;         // soft-cap: u (exp form) or scale / c (tanh.approx); else scale L
    float cap;         // soft-cap: c L
    float cap_bias;    // the exact soft-cap's constant term: c L, less the fixed shift under kCapShift
    float slope;       // ALiBi: slope L of the thread's rows (kOneHead)
    float slope_unit;  // ALiBi: L, or L / exp_scale in soft-cap's tanh units
    static constexpr float L = kSoftmax ? kLog2e : 1.0f;

    __device__ __forceinline__ explicit Transform(const PrefillParams& p) {
      const float scale = fabsf(p.variant.sm_scale);
      cap = (C::FEATURES & kSoftCap) ? p.variant.soft_cap * L : 1.0f;
      cap_bias = C::kCapShift && !kCapUnits ? cap - cap_shift(p) : cap;
      if constexpr ((C::FEATURES & kSoftCap) != 0)
        mul = C::FAST_TANH ? scale / p.variant.soft_cap : scale * (2.0f * kLog2e) / p.variant.soft_cap;
      else
        mul = scale * L;
      slope = 0.0f;
      slope_unit = kCapUnits ? L / exp_scale(p) : L;
    }
    // x: raw score; dist: key - query position as a float (ALiBi only).
    __device__ __forceinline__ float operator()(float x, float row_slope, float dist) const {
      float y;
      if constexpr (kCapUnits) {
        y = fast_tanh<true>(x * mul);
      } else if constexpr ((C::FEATURES & kSoftCap) != 0) {
        if constexpr (C::FAST_TANH) {
          y = cap * fast_tanh<true>(x * mul);
        } else {
          y = fmaf(-2.0f * cap, fast_rcp(1.0f + fast_exp2(x * mul)), cap_bias);
        }
      } else {
        y = x * mul;
      }
      if constexpr ((C::FEATURES & kAlibi) != 0) y = fmaf(row_slope, dist, y);
      return y;
    }
  };

  // Masks (when `masked`) and transforms the tile's scores. Softmax: masked scores become -inf;
  // sigmoid: scores become weights, 0 where masked.
  // N0, N1: the n-tiles (8 keys each) to transform (one part of a tile under TileSplit::halves or quarters).
  // user_mask: a user variant's logits_mask may cut the tile (false inside its kv_full_range).
  template <int N0 = 0, int N1 = kNT>
  static __device__ __forceinline__ void logits(const PrefillParams& p, const ItemInfo& it, float (&s)[MT][kNT][4],
                                                int32_t tile0, int row0, int g, int t4, bool masked,
                                                bool user_mask = true) {
    if constexpr (kUser) {
      user_logits<N0, N1>(p, it, s, tile0, row0, g, t4, masked, user_mask && Variant::kHasUserMask);
      return;
    }
    if (!kTransform && !masked) return;
    Transform tf(p);
    // ALiBi slope of a row's head. A thread's rows are g + 8 i apart from row0: with GH dividing 8
    // they all have one head, so one slope (an exp2 and a loop) serves all of them.
    constexpr bool kOneHead = 8 % C::GH == 0;
    const uint8_t* mask_bits = request_mask(p, it);  // the item's request's custom-mask bits
    if constexpr ((C::FEATURES & kAlibi) != 0 && kOneHead)
      tf.slope = tf.slope_unit * Builtin::alibi_slope(it.head0 + (row0 + g) % C::GH, p.variant.num_qo_heads);
    // kWholeTileTransform: a tile no mask cuts is transformed in one branch-free block (64
    // independent transforms per thread for ptxas to interleave) instead of one block per row.
    if constexpr (C::kWholeTileTransform && kTransform) {
      if (!masked) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int row = row0 + mt * 16 + g + 8 * (j / 2);
            const int32_t q_pos = it.kv_len - it.qo_len + it.q_begin + row / C::GH;
            float slope = tf.slope;
            if constexpr ((C::FEATURES & kAlibi) != 0 && !kOneHead)
              slope = tf.slope_unit * Builtin::alibi_slope(it.head0 + row % C::GH, p.variant.num_qo_heads);
#pragma unroll
            for (int n = N0; n < N1; ++n) {
              const float y = tf(s[mt][n][j], slope, float(tile0 + n * 8 + 2 * t4 + (j & 1) - q_pos));
              s[mt][n][j] = kSoftmax ? y : Variant::weight(p.variant, y);
            }
          }
        return;
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int row = row0 + mt * 16 + g + 8 * (j / 2);
        const int32_t tq = row / C::GH;
        const int32_t q_pos = it.kv_len - it.qo_len + it.q_begin + tq;
        float slope = tf.slope;
        if constexpr ((C::FEATURES & kAlibi) != 0 && !kOneHead)
          slope = tf.slope_unit * Builtin::alibi_slope(it.head0 + row % C::GH, p.variant.num_qo_heads);
        // Every key visible: the transform only. (With ALiBi this second copy of the loop costs
        // an 8-byte spill at hd 128, group 4, and still measured 7.6% faster: 272 -> 293 TFLOP/s.)
        if (kTransform && !masked) {
#pragma unroll
          for (int n = N0; n < N1; ++n) {
            const float y = tf(s[mt][n][j], slope, float(tile0 + n * 8 + 2 * t4 + (j & 1) - q_pos));
            s[mt][n][j] = kSoftmax ? y : Variant::weight(p.variant, y);
          }
          continue;
        }
        const RowMask row_mask(p, it, tq, q_pos, tq < it.q_tokens, mask_bits);
#pragma unroll
        for (int n = N0; n < N1; ++n) {
          const int32_t kv = tile0 + n * 8 + 2 * t4 + (j & 1);
          bool visible = true;
          if (masked) visible = row_mask.visible(kv);
          float x = s[mt][n][j];
          if constexpr (kTransform) {
            x = tf(x, slope, float(kv - q_pos));
            if constexpr (!kSoftmax) x = visible ? Variant::weight(p.variant, x) : 0.0f;
          }
          if constexpr (kSoftmax) x = visible ? x : -INFINITY;
          s[mt][n][j] = x;
        }
      }
  }

  // A user variant's scores: the built-in masks where they cut the tile (`masked`, as above), the
  // user's logits_mask on every key where it may cut (`user_mask`), and Variant::logits_transform
  // (soft-cap and ALiBi, then the user's) on the logit x |sm_scale| (load_q negated q for a
  // negative sm_scale). Softmax: -inf where hidden, natural units (exp_scale is log2 e); otherwise
  // the variant's weights (Variant::weight), 0 where hidden. Without a transform an uncut tile is
  // left as it is. The hooks run on every key of the tile, unconditionally so that what they read
  // per row is read once, at real coordinates: a row past the item as the item's last query, a key
  // past it as its last key (their results are then discarded).
  template <int N0, int N1>
  static __device__ __forceinline__ void user_logits(const PrefillParams& p, const ItemInfo& it,
                                                     float (&s)[MT][kNT][4], int32_t tile0, int row0, int g, int t4,
                                                     bool masked, bool user_mask) {
    if constexpr (!kTransform)
      if (!masked && !user_mask) return;
    const float scale = fabsf(p.variant.sm_scale);
    const uint8_t* mask_bits = request_mask(p, it);
    const auto up = Variant::user_params(p.variant);
    const int32_t last_kv = it.kv_end - 1;
    auto coord = [&](int row) {  // a row's coordinates (kv_idx, kv_pos: per key)
      const int32_t tq = min(row / C::GH, it.q_tokens - 1);
      LogitCoord c;
      c.request = it.request;
      c.qo_head = it.head0 + row % C::GH;
      c.q_idx = it.q_begin + tq;
      c.q_pos = int64_t(it.kv_len) - it.qo_len + c.q_idx;
      c.kv_len = it.kv_len;
      return c;
    };
    if constexpr (kTransform) {
      if (!masked && !user_mask) {  // every key visible: the transform alone, branch-free
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            LogitCoord c = coord(row0 + mt * 16 + g + 8 * (j / 2));
#pragma unroll
            for (int n = N0; n < N1; ++n) {
              c.kv_idx = c.kv_pos = tile0 + n * 8 + 2 * t4 + (j & 1);
              const float y = Variant::logits_transform(p.variant, up, s[mt][n][j] * scale, c);
              s[mt][n][j] = kSoftmax ? y : y != -INFINITY ? Variant::weight(p.variant, y) : 0.0f;
            }
          }
        return;
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int row = row0 + mt * 16 + g + 8 * (j / 2);
        const int32_t tq = row / C::GH;
        const bool row_ok = tq < it.q_tokens;
        const int32_t q_pos = it.kv_len - it.qo_len + it.q_begin + tq;
        const RowMask row_mask(p, it, tq, q_pos, row_ok, mask_bits);
        LogitCoord c = coord(row);
#pragma unroll
        for (int n = N0; n < N1; ++n) {
          const int32_t kv = tile0 + n * 8 + 2 * t4 + (j & 1);
          c.kv_idx = c.kv_pos = min(kv, last_kv);  // prefill keys sit at their index
          bool visible = masked ? row_mask.visible(kv) : row_ok;
          if (user_mask) visible = Variant::user_mask(p.variant, up, c) && visible;
          float x = s[mt][n][j];
          if constexpr (kTransform) {
            const float y = Variant::logits_transform(p.variant, up, x * scale, c);
            x = visible ? y : -INFINITY;
          }
          if constexpr (kSoftmax)
            s[mt][n][j] = visible ? x : -INFINITY;
          else
            s[mt][n][j] = visible && x != -INFINITY ? Variant::weight(p.variant, x) : 0.0f;  // as the CPU
        }
      }
  }

  // Online softmax over the tile's n-tiles [N0, N1) (a part of it under kHalfTiles, the whole
  // otherwise): new row maxima (reduced over the quad sharing a row), the
  // rescale of d and O (skipped when no row of the warp moved), P = 2^(c s - c m) in place.
  // m is kept in score units; c = exp_scale().
  template <int NACC, int N0 = 0, int N1 = kNT>
  static __device__ __forceinline__ void online_softmax(float (&s)[MT][kNT][4], float (&m)[MT][2], float (&d)[MT][2],
                                                        float (&acc)[MT][NACC][4], float c) {
    float rescale[MT][2];
    if (softmax_weights<N0, N1>(s, m, d, rescale, c)) rescale_acc(acc, rescale);
  }

  // The online softmax without touching O (the Hopper kernel's P V of the previous tile is still
  // in flight): updates m and d, turns the scores into weights and returns whether O must be
  // rescaled (some row of the warp moved), by rescale[mt][r] (rescale_acc, once O is free).
  template <int N0 = 0, int N1 = kNT>
  static __device__ __forceinline__ bool softmax_weights(float (&s)[MT][kNT][4], float (&m)[MT][2],
                                                         float (&d)[MT][2], float (&rescale)[MT][2], float c) {
    if constexpr (C::kCapShift) {  // P = 2^(c s - shift), m = shift / c throughout
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float neg_shift = -m[mt][r] * c;
          rescale[mt][r] = 1.0f;
#pragma unroll
          for (int n = N0; n < N1; ++n)
#pragma unroll
            for (int j = 2 * r; j < 2 * r + 2; ++j) {
              s[mt][n][j] = fast_exp2(kCapUnits ? fmaf(s[mt][n][j], c, neg_shift) : s[mt][n][j]);
              d[mt][r] += s[mt][n][j];
            }
        }
      return false;
    }
    bool moved = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = m[mt][r];
#pragma unroll
        for (int n = N0; n < N1; ++n) mx = fmaxf(mx, fmaxf(s[mt][n][2 * r], s[mt][n][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if constexpr (C::kLazyRescale) {
          // Lazy reference maximum: with a stale m, P = 2^(c s - c m) stays <= 2^kLazyLog2 (no f16
          // overflow, the same relative precision), so m (the reference of d and O, exact LSE)
          // moves only when the row grows by more than that, and O is rescaled less often.
          constexpr float kLazyLog2 = KVATTN_PREFILL_LAZY_LOG2;
          if (m[mt][r] != -INFINITY && (mx - m[mt][r]) * c <= kLazyLog2) mx = m[mt][r];
        }
        const float m_scaled = mx == -INFINITY ? 0.0f : mx * c;  // all masked so far: P = 0
        rescale[mt][r] = m[mt][r] == -INFINITY ? 0.0f : fast_exp2(m[mt][r] * c - m_scaled);  // O, d were 0
        moved = moved || mx != m[mt][r];
        m[mt][r] = mx;
        d[mt][r] *= rescale[mt][r];
#pragma unroll
        for (int n = N0; n < N1; ++n)
#pragma unroll
          for (int j = 2 * r; j < 2 * r + 2; ++j) {
            s[mt][n][j] = fast_exp2(fmaf(s[mt][n][j], c, -m_scaled));
            d[mt][r] += s[mt][n][j];
          }
      }
    return __any_sync(0xffffffffu, moved);
  }

  template <int NACC>
  static __device__ __forceinline__ void rescale_acc(float (&acc)[MT][NACC][4], const float (&rescale)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < NACC; ++n)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[mt][n][j] *= rescale[mt][j / 2];
  }
};

}  // namespace kvattn::kernels::prefill
