// Batch prefill/append on tensor cores (mma.sync m16n8k16, sm_80+), FlashAttention-2 style. One
// CTA runs one planner work item: query tokens [q_begin, q_end) of a request for the GH query
// heads of a KV head (GQA packs them into the M tile: row r is token q_begin + r / GH, head
// r % GH), against the item's KV tokens [kv_begin, kv_end), ragged or paged.
//
// Each of the WARPS warps owns MT x 16 rows of the M tile and keeps their online softmax in
// registers; every K/V fragment it reads from shared memory feeds MT MMAs:
//   S = Q K^T   A = Q (registers when MT = 1 and DQK <= 128, else ldmatrix), B = K rows (ldmatrix)
//   mask + logit transform of the variant (score_math.cuh), m/d update in log2 units
//   O += P V    P re-packed as the A fragment in registers, B = V rows via ldmatrix.trans
// K/V tiles stream through a STAGES-deep cp.async pipeline with K and V in separate commit
// groups (Q K^T of a tile waits for its K only); page ids are fetched a tile ahead of the data.
// A warp skips tiles its causal / window mask hides entirely. The item writes o (and lse, base 2)
// or, for a split row, its partial state.
//
// The decode shape (KV_WARPS > 1; one query token, the group in the M tile) has KV_WARPS warps
// per M-row warp, each taking its kWarpKV tokens of every stage, so a CTA streams KV_WARPS times
// the bytes per tile that one warp could; their states are merged in shared memory at the end.
#pragma once

#include "kernels/prefill/score_math.cuh"

namespace kvattn::kernels::prefill {

template <class C>
struct PrefillMmaKernel {
  using IO = TileIO<C>;
  using SM = ScoreMath<C>;
  static constexpr int MT = C::MT, kNT = C::kWarpKV / 8, kND = C::DVO / 8;
  static constexpr int kNAcc = kND;  // accumulator n-tiles: O's
  static constexpr bool kQInRegisters = MT == 1 && C::DQK <= 128;
  // kHalfTiles: the tile in 2 or 4 parts of whole 16-key steps (compute_scores and accumulate_pv
  // step 16 keys), Q K^T part by part first, then each part's softmax (the fixed shift, or the
  // running maximum updated part by part) and P V, so that one part's MUFU work runs beside
  // another's MMAs; V must have landed before the tile starts.
  static constexpr int kParts = C::kHalfTiles ? (C::kQuarterTiles && kNT % 8 == 0 ? 4 : kNT % 4 == 0 ? 2 : 1) : 1;
  static constexpr bool kByParts = kParts > 1;
  static constexpr bool kSplitKV = !C::kTransform && !kByParts;  // a transform needs K and V of a tile at once
  static constexpr bool kSlices = C::KV_WARPS > 1;  // the decode shape repeats slice 0 (entry.cuh)
  static constexpr int kSmemBytes = C::kSmemBytes;
  using QFrag = uint32_t[kQInRegisters ? C::DQK / 16 : 1][4];
  // P packed to the MMA type right after the softmax (kPackP: half the registers stay live until
  // P V); the other kernels pack in accumulate_pv.
  using PPacked = uint32_t[MT][C::kPackP ? kNT : 1][2];

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
    if constexpr (C::Variant::kHasKvRange) narrow_to_hint(p, it);
    return it;
  }

  // A user variant's kv_range hint for all the item's queries (variants/custom.cuh): the CTA
  // loads only the tiles that hold keys in it, from kv_begin in steps of whole tiles (the
  // loaders' alignment). Keys outside are hidden by the variant's mask: no result changes. An
  // item with none visible keeps its first tile (its rows come out as rows without keys).
  static __device__ __forceinline__ void narrow_to_hint(const PrefillParams& p, ItemInfo& it) {
    if (it.q_tokens <= 0 || it.kv_end <= it.kv_begin) return;
    const int64_t q_first = int64_t(it.kv_len) - it.qo_len + it.q_begin, q_last = q_first + it.q_tokens - 1;
    int64_t lo = it.kv_begin, hi = it.kv_end - 1;
    C::Variant::kv_range(p.variant, it.request, q_first, q_last, lo, hi);
    lo = max(lo, int64_t(it.kv_begin));
    hi = min(hi, int64_t(it.kv_end) - 1);
    if (lo > hi) {
      it.kv_end = min(it.kv_end, it.kv_begin + C::KV_TILE);
      return;
    }
    it.kv_begin += int32_t((lo - it.kv_begin) / C::KV_TILE) * C::KV_TILE;
    it.kv_end = int32_t(hi + 1);
  }

  static __device__ void run_item(const PrefillParams& p, char* smem, const DeviceWorkItem& item) {
    // Written so that kernels without KV warps keep their code (no kv_warp terms at all).
    const int warp = C::KV_WARPS > 1 ? threadIdx.x / 32 % C::WARPS : threadIdx.x / 32;
    const int kv_warp = C::KV_WARPS > 1 ? threadIdx.x / 32 / C::WARPS : 0;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;  // fragment row and column pair
    const ItemInfo it = item_info(p, item);
    const int32_t n_tiles = (it.kv_end - it.kv_begin + C::KV_TILE - 1) / C::KV_TILE;
    char* qs = smem + C::kLayout.q;
    char* stages = smem + C::kLayout.stages;
    char* convert = smem + C::kLayout.convert;
    float* freq = reinterpret_cast<float*>(smem + C::kLayout.freq);
    auto* ring = reinterpret_cast<typename IO::RowOffsets*>(smem + C::kLayout.ring);
    auto tile_start = [&](int32_t tile) { return it.kv_begin + tile * C::KV_TILE; };
    auto stage_ptr = [&](int32_t tile) { return stages + (tile % C::STAGES) * C::kLayout.stage_bytes; };
    auto ring_ptr = [&](int32_t tile) { return ring + (tile % (C::STAGES + 1)) * C::KV_TILE; };
    auto issue = [&](int32_t tile) {  // two commit groups: K, then V
      if (tile < n_tiles) IO::template load_kv<false>(p, it, stage_ptr(tile), tile_start(tile), ring_ptr(tile));
      cp_async_commit();
      if (tile < n_tiles) IO::template load_kv<true>(p, it, stage_ptr(tile), tile_start(tile), ring_ptr(tile));
      cp_async_commit();
    };

    if constexpr (C::kHasRope)
      for (int t = threadIdx.x; t < C::DQK / 2; t += C::kThreads)
        freq[t] = rope_frequency(p.variant, t, C::DQK, (C::FEATURES & kRopeLlama31) != 0);
    bool bad_page = false;  // a page id was out of range: the item's rows come out NaN
    if constexpr (C::PAGED)
      for (int32_t st = 0; st < C::STAGES && st < n_tiles; ++st) {
        IO::put_row_offsets(p, ring_ptr(st), tile_start(st), IO::fetch_page_id(p, it, tile_start(st), bad_page));
      }
    __syncthreads();  // frequencies and page ids
    IO::load_q(p, it, qs, freq);
    cp_async_commit();  // Q's own group (empty when it was stored directly)
#pragma unroll
    for (int st = 0; st < C::STAGES - 1; ++st) issue(st);
    cp_async_wait<2 * (C::STAGES - 1)>();
    __syncthreads();  // Q landed

    // This warp's rows: first row, and the positions of its first and last real query.
    const int row0 = warp * 16 * MT;
    const int32_t pos0 = it.kv_len - it.qo_len + it.q_begin;
    const bool warp_active = row0 < it.q_tokens * C::GH;
    const int32_t pos_first = pos0 + row0 / C::GH;
    const int32_t pos_last = pos0 + min((row0 + 16 * MT - 1) / C::GH, it.q_tokens - 1);
    // A user variant's hint of the keys this warp's queries may see (variants/custom.cuh kv_range).
    int64_t hint_lo = it.kv_begin, hint_hi = it.kv_end - 1;
    if constexpr (C::Variant::kHasKvRange)  // only for real queries (the hook may index by position)
      if (warp_active) C::Variant::kv_range(p.variant, it.request, pos_first, pos_last, hint_lo, hint_hi);
    // And of the keys its mask shows every query of the warp (kv_full_range: no logits_mask there).
    int64_t full_lo = 1, full_hi = 0;
    if constexpr (C::Variant::kHasFullRange)
      if (warp_active) C::Variant::kv_full_range(p.variant, it.request, pos_first, pos_last, full_lo, full_hi);

    const int q_row = (lane / 8 % 2) * 8 + lane % 8, q_col = (lane / 16) * 8;  // ldmatrix A
    const char* q_warp = qs + (row0 + q_row) * C::kPitchQ + q_col * 2;
    QFrag qfrag;
    if constexpr (kQInRegisters) {
#pragma unroll
      for (int ks = 0; ks < C::DQK / 16; ++ks) ldmatrix_x4(qfrag[ks], q_warp + ks * 32);
    }

    float m[MT][2], d[MT][2], acc[MT][kNAcc][4];
    const float m_init = C::kCapShift ? SM::cap_shift(p) / SM::exp_scale(p) : -INFINITY;  // the fixed shift
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) m[mt][r] = m_init, d[mt][r] = 0.0f;
#pragma unroll
      for (int n = 0; n < kNAcc; ++n)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[mt][n][j] = 0.0f;
    }
    const float c_exp = SM::exp_scale(p);

    for (int32_t tile = 0; tile < n_tiles; ++tile) {
      // K of `tile` landed (and its V when a transform needs both); the stage refilled next was
      // consumed last round.
      cp_async_wait<kSplitKV ? 2 * C::STAGES - 3 : 2 * C::STAGES - 4>();
      __syncthreads();
      issue(tile + C::STAGES - 1);
      int32_t next_id = 0;
      if constexpr (C::PAGED)
        if (tile + C::STAGES < n_tiles) next_id = IO::fetch_page_id(p, it, tile_start(tile + C::STAGES), bad_page);

      // This warp's tokens: the whole tile, or its KV warp's part (kept in this order: the same
      // statements in another order changed the other kernels' machine code).
      const int32_t tile0 = tile_start(tile) + kv_warp * C::kWarpKV;
      const char* ks_base = stage_ptr(tile);
      if constexpr (C::kTransform) {
        ks_base = IO::transform(stage_ptr(tile), convert, C::KV_WARPS > 1 ? tile_start(tile) : tile0, freq);
        __syncthreads();
      }
      const char* vs_base = ks_base + C::KV_TILE * C::kPitchK;
      if constexpr (C::KV_WARPS > 1) {
        vs_base += kv_warp * C::kWarpKV * C::kPitchV;
        ks_base += kv_warp * C::kWarpKV * C::kPitchK;
      }
      const int32_t tile_last = tile0 + C::kWarpKV - 1;
      bool skip = !warp_active;  // tiles this warp's mask hides entirely
      if (C::KV_WARPS > 1) skip = skip || tile0 >= it.kv_end;  // the item's last tile can end before a KV warp's part
      if (C::FEATURES & kCausal) skip = skip || tile0 > pos_last;
      if (C::FEATURES & kSlidingWindow) skip = skip || tile_last < pos_first - p.variant.window_left;
      if constexpr (C::Variant::kHasKvRange) skip = skip || tile_last < hint_lo || tile0 > hint_hi;
      // Masks only where they can cut: the item's tail, the causal diagonal, the window's edge.
      bool masked = tile_last >= it.kv_end || (C::FEATURES & kCustomMask);
      if (C::FEATURES & kCausal) masked = masked || tile_last > pos_first;
      if (C::FEATURES & kSlidingWindow) masked = masked || tile0 < pos_last - p.variant.window_left;
      const bool user_mask = C::Variant::kHasUserMask && !(tile0 >= full_lo && tile_last <= full_hi);
      float s[MT][kNT][4];
      PPacked pp;
      if constexpr (kByParts) {
        if (!skip) {
          part_scores<0>(s, qfrag, q_warp, ks_base, lane);
          tile_parts<0>(p, it, s, pp, m, d, acc, vs_base, tile0, row0, lane, masked, user_mask, c_exp);
        }
      } else {
        if (!skip) {
          compute_scores(s, qfrag, q_warp, ks_base, lane);
          SM::logits(p, it, s, tile0, row0, g, t4, masked, user_mask);
          if constexpr (SM::kSoftmax) SM::online_softmax(s, m, d, acc, c_exp);
          if constexpr (C::kPackP) pack_p(s, pp);
        }
        if constexpr (kSplitKV) {
          cp_async_wait<2 * C::STAGES - 2>();  // V of `tile`
          __syncthreads();
        }
        if (!skip) accumulate_pv(s, pp, acc, vs_base, lane);
      }
      if constexpr (C::PAGED)
        if (tile + C::STAGES < n_tiles)
          IO::put_row_offsets(p, ring_ptr(tile + C::STAGES), tile_start(tile + C::STAGES), next_id);
    }
    cp_async_wait<0>();
    bool poisoned = false;
    if constexpr (C::CHECK_IDS) {
      poisoned = __syncthreads_or(bad_page);
      if (poisoned) IO::report_first_bad_page(p, it);
    }
    if constexpr (C::KV_WARPS > 1) {
      merge_kv_warps(stages, m, d, acc, warp, kv_warp, lane, c_exp);
      if (kv_warp != 0) return;
    }
    store(p, it, item, m, d, acc, row0, g, t4, c_exp, poisoned);
  }

  // kByParts: Q K^T part by part (each part's scores complete before the next part's MMAs), then
  // each part's logits, weights and P V: parts I of n-tiles [I kNT / kParts, (I + 1) kNT / kParts).
  template <int I>
  static __device__ __forceinline__ void part_scores(float (&s)[MT][kNT][4], const QFrag& qfrag, const char* q_warp,
                                                     const char* ks_base, int lane) {
    compute_scores<I * kNT / kParts, (I + 1) * kNT / kParts>(s, qfrag, q_warp, ks_base, lane);
    if constexpr (I + 1 < kParts) part_scores<I + 1>(s, qfrag, q_warp, ks_base, lane);
  }
  template <int I>
  static __device__ __forceinline__ void tile_parts(const PrefillParams& p, const ItemInfo& it, float (&s)[MT][kNT][4],
                                                    PPacked& pp, float (&m)[MT][2], float (&d)[MT][2],
                                                    float (&acc)[MT][kNAcc][4], const char* vs_base, int32_t tile0,
                                                    int row0, int lane, bool masked, bool user_mask,
                                                    float c_exp) {
    constexpr int N0 = I * kNT / kParts, N1 = (I + 1) * kNT / kParts;
    SM::template logits<N0, N1>(p, it, s, tile0, row0, lane / 4, lane % 4, masked, user_mask);
    SM::template online_softmax<kNAcc, N0, N1>(s, m, d, acc, c_exp);
    if constexpr (C::kPackP) pack_p<N0, N1>(s, pp);
    accumulate_pv<N0, N1>(s, pp, acc, vs_base, lane);
    if constexpr (I + 1 < kParts)
      tile_parts<I + 1>(p, it, s, pp, m, d, acc, vs_base, tile0, row0, lane, masked, user_mask, c_exp);
  }

  // The decode shape's end: KV warps 1.. hand their states (m, the lane's partial d, O fragments)
  // to KV warp 0 of the same rows through shared memory (the stages: every copy has landed), which
  // folds them into its own (SEMANTICS.md merge rule; sigmoid attention: a plain sum). Each lane
  // keeps its fragment positions, so the exchange is lane-major and conflict-free.
  static __device__ __forceinline__ void merge_kv_warps(char* stages, float (&m)[MT][2], float (&d)[MT][2],
                                                        float (&acc)[MT][kNAcc][4], int warp, int kv_warp, int lane,
                                                        float c) {
    constexpr int kFloats = MT * (kNAcc * 4 + 4);  // one lane's state
    static_assert((C::KV_WARPS - 1) * C::WARPS * kFloats * 32 * 4 <= C::kLayout.total - C::kLayout.stages,
                  "the KV warps' states fit behind the stages (smem_layout's kv_warp_merge_bytes)");
    float* base = reinterpret_cast<float*>(stages);
    auto slot = [&](int kw, int i) { return base + ((kw - 1) * C::WARPS + warp) * kFloats * 32 + i * 32 + lane; };
    __syncthreads();  // every warp is done reading the stages
    if (kv_warp != 0) {
      int i = 0;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r) *slot(kv_warp, i++) = m[mt][r], *slot(kv_warp, i++) = d[mt][r];
#pragma unroll
        for (int n = 0; n < kNAcc; ++n)
#pragma unroll
          for (int j = 0; j < 4; ++j) *slot(kv_warp, i++) = acc[mt][n][j];
      }
    }
    __syncthreads();
    if (kv_warp != 0) return;
    for (int kw = 1; kw < C::KV_WARPS; ++kw) {
      int i = 0;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        float own[2], other[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float mo = *slot(kw, i++), dd = *slot(kw, i++);
          own[r] = other[r] = 1.0f;
          if constexpr (SM::kSoftmax) {
            // Both scaled to the larger maximum; a side that saw only masked keys weighs 0.
            const float mx = fmaxf(m[mt][r], mo);
            own[r] = m[mt][r] == -INFINITY ? 0.0f : fast_exp2((m[mt][r] - mx) * c);
            other[r] = mo == -INFINITY ? 0.0f : fast_exp2((mo - mx) * c);
            m[mt][r] = mx;
            d[mt][r] = d[mt][r] * own[r] + dd * other[r];
          }
        }
#pragma unroll
        for (int n = 0; n < kNAcc; ++n)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[mt][n][j] = acc[mt][n][j] * own[j / 2] + *slot(kw, i++) * other[j / 2];
      }
    }
  }

  // S = Q K^T for the warp's MT x 16 rows and its kWarpKV tokens of the tile.
  // N0, N1 (even): the n-tiles to compute, all of them unless the tile goes by parts.
  template <int N0 = 0, int N1 = kNT>
  static __device__ __forceinline__ void compute_scores(float (&s)[MT][kNT][4], const QFrag& qfrag, const char* q_warp,
                                                        const char* ks_base, int lane) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = N0; n < N1; ++n)
#pragma unroll
        for (int j = 0; j < 4; ++j) s[mt][n][j] = 0.0f;
    // ldmatrix x4 over 16 tokens x 16 dims: matrices (tokens 0-7, dims 0-7), (0-7, 8-15),
    // (8-15, 0-7), (8-15, 8-15) = b0, b1 of n-tile 0 and b0, b1 of n-tile 1.
    const int k_row = (lane / 16) * 8 + lane % 8, k_col = (lane / 8 % 2) * 8;
    const char* k_lane = ks_base + k_row * C::kPitchK + k_col * 2;
    // Swizzled K: rows k_row + 16 j all have row % 8 == lane % 8, so k-step ks reads chunk
    // (k_col / 8 + 2 ks) ^ (lane % 8) = ((k_col / 8) ^ (lane % 8)) ^ 2 ks: one XOR per k-step.
    const char* k_row_base = ks_base + k_row * C::kPitchK;
    const int k_swz = ((lane / 8 % 2) ^ (lane % 8)) * 16;
    // Two k-steps at a time when Q comes from shared memory, unless kUnrollQK: fully unrolled, the
    // early ldmatrix loads pushed m2k64 at hd 128 over 255 registers (48-64 bytes of spill with
    // the causal mask; cubin frame size), yet head dims 64 and 256 and soft-cap run faster so.
    // Q fragments in registers need constant indices: unrolled.
#pragma unroll ((kQInRegisters || C::kUnrollQK) ? C::DQK / 16 : 2)
    for (int ks = 0; ks < C::DQK / 16; ++ks) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (kQInRegisters) {
#pragma unroll
          for (int j = 0; j < 4; ++j) a[mt][j] = qfrag[ks][j];
        } else {
          ldmatrix_x4(a[mt], q_warp + mt * 16 * C::kPitchQ + ks * 32);
        }
      }
      // The unswizzled branches keep their original expressions: the same arithmetic written
      // differently compiled to other SASS and cost hd 128 7.5% (H200, 2026-11-30 at 29ac2ce;
      // docs/DECISIONS.md, "Pitfalls met").
      const char* k_step = k_row_base + (k_swz ^ (ks * 32));
#pragma unroll
      for (int j = N0 / 2; j < N1 / 2; ++j) {
        uint32_t b[4];
        if constexpr (C::kSwizzleKV)
          ldmatrix_x4(b, k_step + j * 16 * C::kPitchK);
        else
          ldmatrix_x4(b, k_lane + j * 16 * C::kPitchK + ks * 32);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<C::DT>(s[mt][2 * j], a[mt], b[0], b[1]);
          mma_16816<C::DT>(s[mt][2 * j + 1], a[mt], b[2], b[3]);
        }
      }
    }
  }

  template <int N0 = 0, int N1 = kNT>
  static __device__ __forceinline__ void pack_p(const float (&s)[MT][kNT][4], PPacked& pp) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = N0; n < N1; ++n) {
        pp[mt][n][0] = pack2<C::DT>(s[mt][n][0], s[mt][n][1]);
        pp[mt][n][1] = pack2<C::DT>(s[mt][n][2], s[mt][n][3]);
      }
  }

  // O += P V: P (16 rows x 16 tokens per k-step) as the A fragment, V rows by ldmatrix.trans:
  // matrices (tokens 0-7, dims 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) = b0, b1 of the
  // n-tile of dims 0-7 and b0, b1 of dims 8-15.
  // N0, N1 (even): the n-tiles of P to take, all of them unless the tile goes by parts.
  template <int N0 = 0, int N1 = kNT>
  static __device__ __forceinline__ void accumulate_pv(const float (&s)[MT][kNT][4], const PPacked& pp,
                                                       float (&acc)[MT][kNAcc][4],
                                                       const char* vs_base, int lane) {
    const int v_row = (lane / 8 % 2) * 8 + lane % 8, v_col = (lane / 16) * 8;
    const char* v_lane = vs_base + v_row * C::kPitchV + v_col * 2;
    // Swizzled V (v_row % 8 == lane % 8): chunk (v_col / 8 + 2 dn) ^ (lane % 8).
    const char* v_row_base = vs_base + v_row * C::kPitchV;
    const int v_swz = ((lane / 16) ^ (lane % 8)) * 16;
#pragma unroll
    for (int kk = N0 / 2; kk < N1 / 2; ++kk) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (C::kPackP) {
          pa[mt][0] = pp[mt][2 * kk][0];
          pa[mt][1] = pp[mt][2 * kk][1];
          pa[mt][2] = pp[mt][2 * kk + 1][0];
          pa[mt][3] = pp[mt][2 * kk + 1][1];
          continue;
        }
        pa[mt][0] = pack2<C::DT>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = pack2<C::DT>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = pack2<C::DT>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = pack2<C::DT>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dn = 0; dn < C::DVO / 16; ++dn) {
        uint32_t b[4];
        if constexpr (C::kSwizzleKV)
          ldmatrix_x4_trans(b, v_row_base + kk * 16 * C::kPitchV + (v_swz ^ (dn * 32)));
        else
          ldmatrix_x4_trans(b, v_lane + kk * 16 * C::kPitchV + dn * 32);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<C::DT>(acc[mt][2 * dn], pa[mt], b[0], b[1]);
          mma_16816<C::DT>(acc[mt][2 * dn + 1], pa[mt], b[2], b[3]);
        }
      }
    }
  }

  // Two adjacent output elements: one 4-byte (2-byte dtypes) or 8-byte (f32) store when aligned.
  static __device__ __forceinline__ void store_pair(void* o, int64_t i, float a, float b, bool aligned) {
    if (aligned && C::ODT != kF32) {
      reinterpret_cast<uint32_t*>(o)[i / 2] = pack2<C::ODT == kF32 ? kF16 : C::ODT>(a, b);
    } else if (aligned) {
      reinterpret_cast<float2*>(o)[i / 2] = make_float2(a, b);
    } else {
      store_from_f32<C::ODT>(o, i, a);
      store_from_f32<C::ODT>(o, i + 1, b);
    }
  }

  // Normalises the thread's rows and writes o and lse, or the partial state of a split row
  // (NaN when `poisoned`: the merge then makes the whole row NaN).
  static __device__ __forceinline__ void store(const PrefillParams& p, const ItemInfo& it, const DeviceWorkItem& item,
                                               const float (&m)[MT][2], float (&d)[MT][2],
                                               const float (&acc)[MT][kNAcc][4], int row0, int g, int t4, float c_exp,
                                               bool poisoned) {
    const int group = p.num_qo_heads / p.num_kv_heads;
    const bool aligned = (reinterpret_cast<uint64_t>(p.o) & (C::ODT == kF32 ? 7 : 3)) == 0 &&
                         ((p.o_stride_n | p.o_stride_h) & 1) == 0;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        d[mt][r] += __shfl_xor_sync(0xffffffffu, d[mt][r], 1);
        d[mt][r] += __shfl_xor_sync(0xffffffffu, d[mt][r], 2);
        const int row = row0 + mt * 16 + g + 8 * r;
        const int tq = row / C::GH;
        if (tq >= it.q_tokens) continue;
        float scale = p.variant.v_scale, lse = -INFINITY;
        if constexpr (SM::kSoftmax) {
          scale = d[mt][r] > 0.0f ? p.variant.v_scale / d[mt][r] : 0.0f;
          lse = d[mt][r] > 0.0f ? m[mt][r] * c_exp + log2f(d[mt][r]) : -INFINITY;
        }
        if (poisoned) scale = lse = __int_as_float(0x7fffffff);
        const int qo_head = it.head0 + row % C::GH;
        if (item.partial_slot < 0) {
          const int64_t orow = int64_t(it.q_row0 + it.q_begin + tq);
          const int64_t base = orow * p.o_stride_n + int64_t(qo_head) * p.o_stride_h + 2 * t4;
          if constexpr (kHasRowEpilogue<typename C::Variant>) {  // a user variant's sink and output_transform
            using V = typename C::Variant;
            scale *= apply_sink<V>(p.variant, it.request, qo_head, lse);
            const int64_t q_pos = int64_t(it.kv_len) - it.qo_len + it.q_begin + tq;
#pragma unroll
            for (int n = 0; n < kND; ++n) {
              const int e = n * 8 + 2 * t4;
              store_pair(p.o, base + n * 8, output_of<V>(p.variant, acc[mt][n][2 * r] * scale, it.request, q_pos, qo_head, e),
                         output_of<V>(p.variant, acc[mt][n][2 * r + 1] * scale, it.request, q_pos, qo_head, e + 1),
                         aligned);
            }
          } else {
#pragma unroll
            for (int n = 0; n < kND; ++n)
              store_pair(p.o, base + n * 8, acc[mt][n][2 * r] * scale, acc[mt][n][2 * r + 1] * scale, aligned);
          }
          if (p.lse && t4 == 0) p.lse[orow * p.lse_stride_n + int64_t(qo_head) * p.lse_stride_h] = lse;
        } else {
          const int64_t prow = int64_t(item.partial_slot) * p.partial_rows + int64_t(tq) * group +
                               (qo_head - it.kv_head * group);
          float* po = p.partial_o + prow * C::DVO + 2 * t4;
#pragma unroll
          for (int n = 0; n < kND; ++n)
            *reinterpret_cast<float2*>(po + n * 8) =
                make_float2(acc[mt][n][2 * r] * scale, acc[mt][n][2 * r + 1] * scale);
          if (t4 == 0) p.partial_lse[prow] = lse;
        }
      }
  }
};

}  // namespace kvattn::kernels::prefill
