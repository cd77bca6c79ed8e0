// Paged batch decode on CUDA cores. One CTA runs one work item (request, KV head, KV range) for a
// chunk of GH query heads of the group, so every KV byte is read once per chunk of heads.
//
// Per tile of TILE tokens, multi-stage cp.async pipeline (STAGES deep):
//   phase 1  scores: thread -> (token, heads); K rows from shared memory, q from shared (broadcast)
//   softmax  one warp per head: tile max, exp2, running (m, d), the rescale factor of the tile
//   phase 2  P V: thread -> (token group, 8 output dims) accumulating GH x 8 floats in registers
// Finally the token groups are reduced through shared memory and the row is written out, or, for a
// split row, its normalised partial state goes to the workspace, folded by split_fold.cuh.
#pragma once

#include "kernels/common/ptx.cuh"
#include "kernels/decode/params.cuh"
#include "kernels/decode/smem_layout.cuh"
#include "kernels/decode/split_fold.cuh"
#include "kernels/variants/epilogue.cuh"

namespace kvattn::kernels::decode {

constexpr float kLog2e = 1.4426950408889634f;

// VARIANT: the built-in variant of FEATURES, or a user variant composed with it
// (variants/custom.cuh).
template <int QDT, int KVDT, int ODT, int DQK, int DVO, int GH, int PAGE, uint32_t FEATURES,
          int TILE, int STAGES, int THREADS, class VARIANT = BuiltinVariant<FEATURES>>
struct DecodeKernel {
  using Variant = VARIANT;
  static constexpr int kKVBytes = DTypeInfo<KVDT>::bytes;
  static constexpr int kChunk = 16 / kKVBytes;              // elements per 16-byte chunk
  static constexpr int kChunksK = DQK * kKVBytes / 16;      // 16-byte chunks per K row
  static constexpr int kChunksV = DVO * kKVBytes / 16;
  // Row pitch in chunks made odd, so 16-byte reads of consecutive rows hit distinct banks.
  static constexpr int kPitchK = kChunksK | 1;
  static constexpr int kPitchV = kChunksV | 1;
  static constexpr int kThreadsPerToken = THREADS / TILE;    // phase 1
  static constexpr int kHeadsPerThread = (GH + kThreadsPerToken - 1) / kThreadsPerToken;
  static constexpr int kVecs = DVO / 8;                      // phase 2: 8-element vectors per row
  static constexpr int kTokenGroups = THREADS / kVecs;
  static constexpr int kWarps = THREADS / 32;
  static constexpr bool kUseRope = (FEATURES & kRope) != 0;
  static_assert(FEATURES != kDynamicFeatures, "GPU kernels bake their variant features in");
  static_assert(THREADS % TILE == 0 && TILE % 32 == 0, "tile shape");
  static_assert(DQK % 16 == 0 && DVO % 16 == 0 && kVecs <= THREADS, "head dims");

  // Shared memory, in bytes.
  static constexpr int kStageBytes = TILE * (kPitchK + kPitchV) * 16;
  static constexpr int kPipeBytes = STAGES * kStageBytes;
  static constexpr int kReduceBytes = kTokenGroups * GH * DVO * 4;
  static constexpr int kBigBytes = kPipeBytes > kReduceBytes ? kPipeBytes : kReduceBytes;
  static constexpr int kSmemBytes = kBigBytes + (GH * DQK + GH * TILE + 3 * GH) * 4;
  static_assert(kSmemBytes == simt_smem_bytes(kKVBytes, DQK, DVO, GH, TILE, STAGES, THREADS),
                "host and device agree");

  struct Smem {
    char* k;  // [STAGES][TILE][kPitchK * 16]
    char* v;  // [STAGES][TILE][kPitchV * 16]
    float* reduce;
    float* q;      // [GH][DQK]
    float* score;  // [GH][TILE]
    float* m;      // running max (log2 units)
    float* d;      // running denominator
    float* scale;  // this tile's rescale factor
  };

  static __device__ Smem carve(char* base) {
    Smem s;
    s.k = base;
    s.v = base + STAGES * TILE * kPitchK * 16;
    s.reduce = reinterpret_cast<float*>(base);
    s.q = reinterpret_cast<float*>(base + kBigBytes);
    s.score = s.q + GH * DQK;
    s.m = s.score + GH * TILE;
    s.d = s.m + GH;
    s.scale = s.d + GH;
    return s;
  }

  // Loads a tile's K and V rows; returns true when a page id was out of range (those rows are
  // zero-filled, and the caller poisons the item's output).
  static __device__ bool load_tile(const DecodeParams& p, const Smem& s, int stage, int32_t tile0,
                                   int32_t kv_end, int32_t page_base, int kv_head) {
    const int ps = PAGE > 0 ? PAGE : p.page_size;
    const char* kbase = static_cast<const char*>(p.k) + kv_head * p.k_stride_head * kKVBytes;
    const char* vbase = static_cast<const char*>(p.v) + kv_head * p.v_stride_head * kKVBytes;
    char* kdst = s.k + stage * TILE * kPitchK * 16;
    char* vdst = s.v + stage * TILE * kPitchV * 16;
    bool bad = false;
    for (int id = threadIdx.x; id < TILE * (kChunksK + kChunksV); id += THREADS) {
      const bool is_k = id < TILE * kChunksK;
      const int local = is_k ? id : id - TILE * kChunksK;
      const int chunks = is_k ? kChunksK : kChunksV;
      const int r = local / chunks, c = local % chunks;
      const int32_t tok = tile0 + r;
      bool valid = tok < kv_end;
      const char* src = is_k ? kbase : vbase;
      if (valid) {
        const int32_t page = checked_page(p, page_base + tok / ps);
        valid = page >= 0;
        bad |= !valid;
        src += (int64_t(page) * (is_k ? p.k_stride_page : p.v_stride_page) +
                int64_t(tok % ps) * (is_k ? p.k_stride_token : p.v_stride_token)) * kKVBytes + c * 16;
      }
      char* dst = is_k ? kdst + (r * kPitchK + c) * 16 : vdst + (r * kPitchV + c) * 16;
      cp_async_16(dst, valid ? src : (is_k ? kbase : vbase), valid);
    }
    return bad;
  }

  // Phase 1: the logits of this thread's token for its heads, into s.score (log2 units).
  static __device__ void scores(const DecodeParams& p, const Smem& s, int stage, int32_t tile0,
                                int32_t kv_end, int32_t request, int32_t kv_len, int head0) {
    const int t = threadIdx.x % TILE, hs = threadIdx.x / TILE;
    const char* krow = s.k + (stage * TILE + t) * kPitchK * 16;
    float acc[kHeadsPerThread];
#pragma unroll
    for (int i = 0; i < kHeadsPerThread; ++i) acc[i] = 0.0f;
    const int32_t tok = tile0 + t;
    if constexpr (!kUseRope) {
#pragma unroll 4
      for (int c = 0; c < kChunksK; ++c) {
        uint4 raw = *reinterpret_cast<const uint4*>(krow + c * 16);
        float kf[kChunk];
        unpack<KVDT, kChunk>(reinterpret_cast<const uint32_t*>(&raw), kf);
#pragma unroll
        for (int i = 0; i < kHeadsPerThread; ++i) {
          int h = hs + i * kThreadsPerToken;
          if (h < GH) {
            const float* qv = s.q + h * DQK + c * kChunk;
#pragma unroll
            for (int e = 0; e < kChunk; ++e) acc[i] += qv[e] * kf[e];
          }
        }
      }
    } else {
      // Fused RoPE: rotate each (k[e], k[e + DQK/2]) pair (or (2e, 2e+1)) in f32, then dot.
      const bool interleave = Variant::has(p.variant, kRopeInterleave);
      const bool llama31 = Variant::has(p.variant, kRopeLlama31);
      for (int e = 0; e < DQK / 2; ++e) {
        int i0 = interleave ? 2 * e : e, i1 = interleave ? 2 * e + 1 : e + DQK / 2;
        float k0 = load_as_f32<KVDT>(krow, i0), k1 = load_as_f32<KVDT>(krow, i1);
        float sn, cs;
        sincosf(float(tok) * rope_frequency(p.variant, e, DQK, llama31), &sn, &cs);
        float r0 = k0 * cs - k1 * sn, r1 = k1 * cs + k0 * sn;
#pragma unroll
        for (int i = 0; i < kHeadsPerThread; ++i) {
          int h = hs + i * kThreadsPerToken;
          if (h < GH) acc[i] += s.q[h * DQK + i0] * r0 + s.q[h * DQK + i1] * r1;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kHeadsPerThread; ++i) {
      int h = hs + i * kThreadsPerToken;
      if (h >= GH) continue;
      float logit = -INFINITY;
      if (tok < kv_end) {
        LogitCoord c{request, head0 + h, 0, tok, kv_len - 1, tok, kv_len};
        if (Variant::logits_mask(p.variant, c))
          logit = Variant::logits_transform(p.variant, p.variant.sm_scale * acc[i], c);
      }
      s.score[h * TILE + t] = logit;
    }
  }

  // One warp per head: turn the tile's logits into weights and update the running (m, d).
  static __device__ void softmax(const DecodeParams& p, const Smem& s) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int h = warp; h < GH; h += kWarps) {
      float* sc = s.score + h * TILE;
      if (!Variant::use_softmax(p.variant)) {
        for (int t = lane; t < TILE; t += 32)
          sc[t] = sc[t] == -INFINITY ? 0.0f : Variant::weight(p.variant, sc[t]);
        if (lane == 0) s.scale[h] = 1.0f;
        continue;
      }
      float tmax = -INFINITY;
      for (int t = lane; t < TILE; t += 32) tmax = fmaxf(tmax, sc[t] * kLog2e);
#pragma unroll
      for (int o = 16; o > 0; o /= 2) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      const float m_old = s.m[h];
      const float m_new = fmaxf(m_old, tmax);
      float sum = 0.0f;
      for (int t = lane; t < TILE; t += 32) {
        float w = m_new == -INFINITY ? 0.0f : exp2f(sc[t] * kLog2e - m_new);
        sc[t] = w;
        sum += w;
      }
#pragma unroll
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane == 0) {
        float scale = m_new == -INFINITY ? 1.0f : exp2f(m_old - m_new);
        s.scale[h] = scale;
        s.d[h] = s.d[h] * scale + sum;
        s.m[h] = m_new;
      }
    }
  }

  // Phase 2: acc[h][e] = acc * scale + sum_t w[h][t] * v[t][vec * 8 + e].
  static __device__ void accumulate(const Smem& s, int stage, float (&acc)[GH][8]) {
    const int vec = threadIdx.x % kVecs, group = threadIdx.x / kVecs;
    if (group >= kTokenGroups) return;
#pragma unroll
    for (int h = 0; h < GH; ++h) {
      float sc = s.scale[h];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h][e] *= sc;
    }
    const char* vtile = s.v + stage * TILE * kPitchV * 16;
    constexpr int kVecBytes = 8 * kKVBytes;
    for (int t = group; t < TILE; t += kTokenGroups) {
      const char* src = vtile + t * kPitchV * 16 + vec * kVecBytes;
      uint32_t words[kVecBytes / 4];
#pragma unroll
      for (int w = 0; w < kVecBytes / 4; ++w) words[w] = reinterpret_cast<const uint32_t*>(src)[w];
      float vf[8];
      unpack<KVDT, 8>(words, vf);
#pragma unroll
      for (int h = 0; h < GH; ++h) {
        float w = s.score[h * TILE + t];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][e] += w * vf[e];
      }
    }
  }

  static __device__ void run_item(const DecodeParams& p, char* smem_base, const DeviceDecodeItem& item) {
    const Smem s = carve(smem_base);
    const int group = p.num_qo_heads / p.num_kv_heads;
    const int head0 = item.kv_head * group + blockIdx.y * GH;  // first query head of this CTA
    const int32_t page_base = item.page_base, kv_len = item.kv_len;
    const int32_t n_tiles = (item.kv_end - item.kv_begin + TILE - 1) / TILE;

    // Start the pipeline before touching q, so the loads are in flight while q is prepared.
    bool bad = false;  // a page id was out of range: the rows come out NaN
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
      if (st < n_tiles) bad |= load_tile(p, s, st, item.kv_begin + st * TILE, item.kv_end, page_base, item.kv_head);
      cp_async_commit();
    }
    for (int i = threadIdx.x; i < GH * DQK; i += THREADS) {
      int h = i / DQK, e = i % DQK;
      s.q[i] = load_as_f32<QDT>(p.q, item.request * p.q_stride_n + (head0 + h) * p.q_stride_h + e);
    }
    if (threadIdx.x < GH) {
      s.m[threadIdx.x] = -INFINITY;
      s.d[threadIdx.x] = 0.0f;
    }
    __syncthreads();
    if constexpr (kUseRope) {  // rotate q in place: one thread per (head, pair)
      const bool interleave = Variant::has(p.variant, kRopeInterleave);
      const bool llama31 = Variant::has(p.variant, kRopeLlama31);
      for (int i = threadIdx.x; i < GH * DQK / 2; i += THREADS) {
        int h = i / (DQK / 2), e = i % (DQK / 2);
        int i0 = interleave ? 2 * e : e, i1 = interleave ? 2 * e + 1 : e + DQK / 2;
        float sn, cs;
        sincosf(float(kv_len - 1) * rope_frequency(p.variant, e, DQK, llama31), &sn, &cs);
        float x0 = s.q[h * DQK + i0], x1 = s.q[h * DQK + i1];
        s.q[h * DQK + i0] = x0 * cs - x1 * sn;
        s.q[h * DQK + i1] = x1 * cs + x0 * sn;
      }
      __syncthreads();
    }

    float acc[GH][8];
#pragma unroll
    for (int h = 0; h < GH; ++h)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h][e] = 0.0f;

    for (int tile = 0; tile < n_tiles; ++tile) {
      int ahead = tile + STAGES - 1;
      if (ahead < n_tiles)
        bad |= load_tile(p, s, ahead % STAGES, item.kv_begin + ahead * TILE, item.kv_end, page_base, item.kv_head);
      cp_async_commit();
      cp_async_wait<STAGES - 1>();
      __syncthreads();
      const int stage = tile % STAGES;
      scores(p, s, stage, item.kv_begin + tile * TILE, item.kv_end, item.request, kv_len, head0);
      __syncthreads();
      softmax(p, s);
      __syncthreads();
      accumulate(s, stage, acc);
      __syncthreads();  // the stage is refilled next iteration
    }
    cp_async_wait<0>();
    const bool poisoned = __syncthreads_or(bad);

    // Reduce the token groups through shared memory (reusing the pipeline buffers).
    const int vec = threadIdx.x % kVecs, tgroup = threadIdx.x / kVecs;
    if (tgroup < kTokenGroups)
#pragma unroll
      for (int h = 0; h < GH; ++h)
#pragma unroll
        for (int e = 0; e < 8; ++e) s.reduce[(tgroup * GH + h) * DVO + vec * 8 + e] = acc[h][e];
    __syncthreads();
    const bool softmax_on = Variant::use_softmax(p.variant);
    for (int i = threadIdx.x; i < GH * DVO; i += THREADS) {
      const int h = i / DVO, e = i % DVO;
      float sum = 0.0f;
      for (int g = 0; g < kTokenGroups; ++g) sum += s.reduce[(g * GH + h) * DVO + e];
      const float d = s.d[h];
      float o, lse;
      if (softmax_on) {
        o = d > 0.0f ? sum / d : 0.0f;
        lse = d > 0.0f ? s.m[h] + log2f(d) : -INFINITY;
      } else {
        o = sum;
        lse = -INFINITY;
      }
      o *= p.variant.v_scale;
      if (poisoned) o = lse = NAN;
      const int qo_head = head0 + h;
      if (item.partial_slot < 0) {
        if constexpr (kHasRowEpilogue<Variant>)
          finish_row<Variant>(p.variant, item.request, decode_query_position(item), qo_head, e, &o, 1, lse);
        store_from_f32<ODT>(p.o, item.request * p.o_stride_n + qo_head * p.o_stride_h + e, o);
        if (p.lse && e == 0) p.lse[item.request * p.lse_stride_n + qo_head * p.lse_stride_h] = lse;
      } else {
        const int gh = qo_head - item.kv_head * group;  // head within the group
        p.partial_o[(int64_t(item.partial_slot) * group + gh) * DVO + e] = o;
        if (e == 0) p.partial_lse[int64_t(item.partial_slot) * group + gh] = lse;
      }
    }
    fold_split_if_last<ODT, DVO, Variant>(p, item, head0 - item.kv_head * group, GH);
  }
};

// The kernel of a named configuration (cuda::decode_spec generates one: q_dtype, kv_dtype,
// o_dtype, head_dim_qk, head_dim_vo, heads_per_cta, page_size, features, tile_tokens, stages,
// threads).
template <class C>
using DecodeKernelFor = DecodeKernel<C::q_dtype, C::kv_dtype, C::o_dtype, C::head_dim_qk, C::head_dim_vo,
                                     C::heads_per_cta, C::page_size, C::features, C::tile_tokens, C::stages,
                                     C::threads, typename C::Variant>;

}  // namespace kvattn::kernels::decode
