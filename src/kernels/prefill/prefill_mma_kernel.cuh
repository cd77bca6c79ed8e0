// Batch prefill/append on tensor cores (mma.sync m16n8k16, sm_80+), FlashAttention-2 style. One
// CTA runs one planner work item: query tokens [q_begin, q_end) of a request for the GH query
// heads of a KV head (GQA packs them into the M tile: row r is token q_begin + r / GH, head
// r % GH), against the item's KV tokens [kv_begin, kv_end), ragged or paged.
//
// Each of the WARPS warps owns 16 rows of the M tile and keeps their online softmax in registers:
//   S = Q K^T   A = Q (registers for DQK <= 128, else ldmatrix from shared), B = K rows (ldmatrix)
//   mask + logit transform of the variant (only on tiles a mask can cut), m/d update in log2 units
//   O += P V    P re-packed as the A fragment in registers, B = V rows via ldmatrix.trans
// K/V tiles stream through a STAGES-deep cp.async pipeline; page ids are fetched a tile ahead of
// the data. The item writes o (and lse, base 2) or, for a split row, its partial state.
#pragma once

#include "kernels/prefill/tile_io.cuh"

namespace kvattn::kernels::prefill {

template <class C>
struct PrefillMmaKernel {
  using Variant = BuiltinVariant<C::FEATURES>;
  using IO = TileIO<C>;
  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr bool kQInRegisters = C::DQK <= 128;
  static constexpr int kNT = C::KV_TILE / 8;  // 8-token n-tiles of S per tile
  static constexpr int kSmemBytes = C::kSmemBytes;

  static __device__ ItemInfo item_info(const PrefillParams& p, const DeviceWorkItem& item) {
    ItemInfo it;
    const int group = p.num_qo_heads / p.num_kv_heads;
    it.request = item.request;
    it.kv_head = item.kv_head;
    it.head0 = item.kv_head * group + int(blockIdx.y) * C::GH;
    it.q_row0 = p.qo_indptr[item.request];
    it.qo_len = p.qo_indptr[item.request + 1] - it.q_row0;
    it.kv_row0 = p.kv_indptr[item.request];
    const int32_t n = p.kv_indptr[item.request + 1] - it.kv_row0;
    if constexpr (C::PAGED)
      it.kv_len = n == 0 ? 0 : (n - 1) * IO::page_size(p) + p.kv_last_page_len[item.request];
    else
      it.kv_len = n;
    it.q_begin = item.q_begin;
    it.q_tokens = item.q_end - item.q_begin;
    it.kv_begin = item.kv_begin;
    it.kv_end = item.kv_end;
    return it;
  }

  static __device__ void run_item(const PrefillParams& p, char* smem, const DeviceWorkItem& item) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;  // fragment row and column pair
    const ItemInfo it = item_info(p, item);
    const int32_t n_tiles = (it.kv_end - it.kv_begin + C::KV_TILE - 1) / C::KV_TILE;
    char* qs = smem + C::kLayout.q;
    char* stages = smem + C::kLayout.stages;
    char* convert = smem + C::kLayout.convert;
    float* freq = reinterpret_cast<float*>(smem + C::kLayout.freq);
    int32_t* ring = reinterpret_cast<int32_t*>(smem + C::kLayout.ring);
    auto tile_start = [&](int32_t tile) { return it.kv_begin + tile * C::KV_TILE; };
    auto stage_ptr = [&](int32_t tile) { return stages + (tile % C::STAGES) * C::kLayout.stage_bytes; };
    auto ring_ptr = [&](int32_t tile) { return ring + (tile % (C::STAGES + 1)) * C::KV_TILE; };

    if constexpr (C::kHasRope)
      for (int t = threadIdx.x; t < C::DQK / 2; t += C::kThreads)
        freq[t] = rope_frequency(p.variant, t, C::DQK, (C::FEATURES & kRopeLlama31) != 0);
    if constexpr (C::PAGED)
      for (int32_t st = 0; st < C::STAGES && st < n_tiles; ++st) {
        const int32_t id = IO::fetch_page_id(p, it, tile_start(st));
        if (threadIdx.x < C::KV_TILE) ring_ptr(st)[threadIdx.x] = id;
      }
    __syncthreads();
#pragma unroll
    for (int st = 0; st < C::STAGES - 1; ++st) {
      if (st < n_tiles) IO::load_kv(p, it, stage_ptr(st), tile_start(st), ring_ptr(st));
      cp_async_commit();
    }
    IO::load_q(p, it, qs, freq);
    __syncthreads();

    const int q_row = (lane / 8 % 2) * 8 + lane % 8, q_col = (lane / 16) * 8;  // ldmatrix A
    const char* q_warp = qs + (warp * 16 + q_row) * C::kPitchQ + q_col * 2;
    uint32_t qfrag[kQInRegisters ? C::DQK / 16 : 1][4];
    if constexpr (kQInRegisters) {
#pragma unroll
      for (int ks = 0; ks < C::DQK / 16; ++ks) ldmatrix_x4(qfrag[ks], q_warp + ks * 32);
    }

    // This thread's two rows (g and g + 8 of the warp's 16).
    int32_t q_idx[2], q_pos[2], head[2];
    bool row_ok[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + g + 8 * r;
      row_ok[r] = row / C::GH < it.q_tokens;
      q_idx[r] = it.q_begin + row / C::GH;
      q_pos[r] = it.kv_len - it.qo_len + q_idx[r];
      head[r] = it.head0 + row % C::GH;
    }
    const bool warp_active = warp * 16 < it.q_tokens * C::GH;  // some row of this warp is real
    const int32_t pos_first = it.kv_len - it.qo_len + it.q_begin;
    const int32_t pos_last = pos_first + it.q_tokens - 1;

    float m[2] = {-INFINITY, -INFINITY}, d[2] = {0.0f, 0.0f};
    float acc[C::DVO / 8][4];
#pragma unroll
    for (int n = 0; n < C::DVO / 8; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[n][j] = 0.0f;

    for (int32_t tile = 0; tile < n_tiles; ++tile) {
      cp_async_wait<C::STAGES - 2>();
      __syncthreads();  // tile `tile` landed; the stage loaded next was consumed last round
      const int32_t ahead = tile + C::STAGES - 1;
      if (ahead < n_tiles) IO::load_kv(p, it, stage_ptr(ahead), tile_start(ahead), ring_ptr(ahead));
      cp_async_commit();
      int32_t next_id = 0;
      if constexpr (C::PAGED)
        if (tile + C::STAGES < n_tiles) next_id = IO::fetch_page_id(p, it, tile_start(tile + C::STAGES));

      const int32_t tile0 = tile_start(tile);
      const char* ks_base = stage_ptr(tile);
      if constexpr (C::kTransform) {
        ks_base = IO::transform(stage_ptr(tile), convert, tile0, freq);
        __syncthreads();
      }
      const char* vs_base = ks_base + C::KV_TILE * C::kPitchK;
      if (warp_active) {
        float s[kNT][4];
        compute_scores(s, qfrag, q_warp, ks_base, lane);
        // Masks only where they can cut: the tile's tail, the causal diagonal, the window's edge.
        bool masked = tile0 + C::KV_TILE > it.kv_end || (C::FEATURES & kCustomMask);
        if (C::FEATURES & kCausal) masked = masked || tile0 + C::KV_TILE - 1 > pos_first;
        if (C::FEATURES & kSlidingWindow) masked = masked || tile0 < pos_last - p.variant.window_left;
        apply_variant(p, it, s, tile0, t4, masked, row_ok, q_idx, q_pos, head);
        if (Variant::use_softmax(p.variant)) online_softmax(s, m, d, acc);
        accumulate_pv(s, acc, vs_base, lane);
      }
      if constexpr (C::PAGED)
        if (tile + C::STAGES < n_tiles && threadIdx.x < C::KV_TILE)
          ring_ptr(tile + C::STAGES)[threadIdx.x] = next_id;
    }
    cp_async_wait<0>();
    store(p, it, item, m, d, acc, warp, g, t4);
  }

  // S = Q K^T for the warp's 16 rows and the tile's KV_TILE tokens.
  static __device__ __forceinline__ void compute_scores(float (&s)[kNT][4], const uint32_t (&qfrag)[kQInRegisters ? C::DQK / 16 : 1][4],
                                                        const char* q_warp, const char* ks_base, int lane) {
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[n][j] = 0.0f;
    // ldmatrix x4 over 16 tokens x 16 dims: matrices (tokens 0-7, dims 0-7), (0-7, 8-15),
    // (8-15, 0-7), (8-15, 8-15) = b0, b1 of n-tile 0 and b0, b1 of n-tile 1.
    const int k_row = (lane / 16) * 8 + lane % 8, k_col = (lane / 8 % 2) * 8;
    const char* k_lane = ks_base + k_row * C::kPitchK + k_col * 2;
#pragma unroll
    for (int ks = 0; ks < C::DQK / 16; ++ks) {
      uint32_t a[4];
      if constexpr (kQInRegisters) {
#pragma unroll
        for (int j = 0; j < 4; ++j) a[j] = qfrag[ks][j];
      } else {
        ldmatrix_x4(a, q_warp + ks * 32);
      }
#pragma unroll
      for (int j = 0; j < C::KV_TILE / 16; ++j) {
        uint32_t b[4];
        ldmatrix_x4(b, k_lane + j * 16 * C::kPitchK + ks * 32);
        mma_16816<C::DT>(s[2 * j], a, b[0], b[1]);
        mma_16816<C::DT>(s[2 * j + 1], a, b[2], b[3]);
      }
    }
  }

  // Scaled logits through the variant: softmax rows get log2-unit logits (-inf where masked),
  // sigmoid rows get their weights (0 where masked).
  static __device__ __forceinline__ void apply_variant(const PrefillParams& p, const ItemInfo& it, float (&s)[kNT][4],
                                                       int32_t tile0, int t4, bool masked, const bool (&row_ok)[2],
                                                       const int32_t (&q_idx)[2], const int32_t (&q_pos)[2],
                                                       const int32_t (&head)[2]) {
    const bool softmax_on = Variant::use_softmax(p.variant);
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = j / 2;
        const int32_t kv = tile0 + n * 8 + 2 * t4 + (j & 1);
        const LogitCoord c{it.request, head[r], q_idx[r], kv, q_pos[r], kv, it.kv_len};
        bool visible = true;
        if (masked) visible = row_ok[r] && kv < it.kv_end && Variant::logits_mask(p.variant, c);
        const float x = Variant::logits_transform(p.variant, p.variant.sm_scale * s[n][j], c);
        if (softmax_on)
          s[n][j] = visible ? x * kLog2e : -INFINITY;
        else
          s[n][j] = visible ? Variant::sigmoid_weight(p.variant, x) : 0.0f;
      }
  }

  // Online softmax over the tile: new row maxima (reduced over the quad that shares a row),
  // rescale of d and O, and P = 2^(s - m) in place.
  static __device__ __forceinline__ void online_softmax(float (&s)[kNT][4], float (&m)[2], float (&d)[2],
                                                        float (&acc)[C::DVO / 8][4]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kNT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[r], mx);
      const float scale = m_new == -INFINITY ? 1.0f : exp2f(m[r] - m_new);
      d[r] *= scale;
#pragma unroll
      for (int n = 0; n < C::DVO / 8; ++n) {
        acc[n][2 * r] *= scale;
        acc[n][2 * r + 1] *= scale;
      }
#pragma unroll
      for (int n = 0; n < kNT; ++n)
#pragma unroll
        for (int j = 2 * r; j < 2 * r + 2; ++j) {
          s[n][j] = m_new == -INFINITY ? 0.0f : exp2f(s[n][j] - m_new);
          d[r] += s[n][j];
        }
      m[r] = m_new;
    }
  }

  // O += P V: P (16 rows x 16 tokens per k-step) as the A fragment, V rows by ldmatrix.trans:
  // matrices (tokens 0-7, dims 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) = b0, b1 of the
  // n-tile of dims 0-7 and b0, b1 of dims 8-15.
  static __device__ __forceinline__ void accumulate_pv(const float (&s)[kNT][4], float (&acc)[C::DVO / 8][4],
                                                       const char* vs_base, int lane) {
    const int v_row = (lane / 8 % 2) * 8 + lane % 8, v_col = (lane / 16) * 8;
    const char* v_lane = vs_base + v_row * C::kPitchV + v_col * 2;
#pragma unroll
    for (int kk = 0; kk < C::KV_TILE / 16; ++kk) {
      const uint32_t pa[4] = {pack2<C::DT>(s[2 * kk][0], s[2 * kk][1]), pack2<C::DT>(s[2 * kk][2], s[2 * kk][3]),
                              pack2<C::DT>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack2<C::DT>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dn = 0; dn < C::DVO / 16; ++dn) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_lane + kk * 16 * C::kPitchV + dn * 32);
        mma_16816<C::DT>(acc[2 * dn], pa, b[0], b[1]);
        mma_16816<C::DT>(acc[2 * dn + 1], pa, b[2], b[3]);
      }
    }
  }

  // Normalises the thread's two rows and writes o and lse, or the partial state of a split row.
  static __device__ __forceinline__ void store(const PrefillParams& p, const ItemInfo& it, const DeviceWorkItem& item,
                                               const float (&m)[2], float (&d)[2], const float (&acc)[C::DVO / 8][4],
                                               int warp, int g, int t4) {
    const bool softmax_on = Variant::use_softmax(p.variant);
    const int group = p.num_qo_heads / p.num_kv_heads;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      d[r] += __shfl_xor_sync(0xffffffffu, d[r], 1);
      d[r] += __shfl_xor_sync(0xffffffffu, d[r], 2);
      const int row = warp * 16 + g + 8 * r;
      const int tq = row / C::GH;
      if (tq >= it.q_tokens) continue;
      float scale = p.variant.v_scale, lse = -INFINITY;
      if (softmax_on) {
        scale = d[r] > 0.0f ? p.variant.v_scale / d[r] : 0.0f;
        lse = d[r] > 0.0f ? m[r] + log2f(d[r]) : -INFINITY;
      }
      const int qo_head = it.head0 + row % C::GH;
      if (item.partial_slot < 0) {
        const int64_t orow = int64_t(it.q_row0 + it.q_begin + tq);
        const int64_t base = orow * p.o_stride_n + int64_t(qo_head) * p.o_stride_h + 2 * t4;
#pragma unroll
        for (int n = 0; n < C::DVO / 8; ++n) {
          store_from_f32<C::ODT>(p.o, base + n * 8, acc[n][2 * r] * scale);
          store_from_f32<C::ODT>(p.o, base + n * 8 + 1, acc[n][2 * r + 1] * scale);
        }
        if (p.lse && t4 == 0) p.lse[orow * p.lse_stride_n + int64_t(qo_head) * p.lse_stride_h] = lse;
      } else {
        const int64_t prow = int64_t(item.partial_slot) * p.partial_rows + int64_t(tq) * group +
                             (qo_head - it.kv_head * group);
        float* po = p.partial_o + prow * C::DVO + 2 * t4;
#pragma unroll
        for (int n = 0; n < C::DVO / 8; ++n)
          *reinterpret_cast<float2*>(po + n * 8) = make_float2(acc[n][2 * r] * scale, acc[n][2 * r + 1] * scale);
        if (t4 == 0) p.partial_lse[prow] = lse;
      }
    }
  }
};

}  // namespace kvattn::kernels::prefill
