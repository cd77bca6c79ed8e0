// Batch prefill/append on Hopper (sm_90a): warp-specialized, asynchronous warpgroup MMAs. One CTA
// runs one planner work item, as the mma.sync kernel does (prefill_mma_kernel.cuh: same items,
// same GQA-packed M tile of 128 rows, same variant math and epilogue), with three warpgroups:
//
//   warpgroup 0, the producer (registers given back): copies the Q tile once and the K and V tiles
//     of the item's KV range with cp.async into a STAGES-deep ring of 128-byte-swizzled tiles
//     (wgmma_layout.cuh), ragged or paged (the page ids one tile ahead, row offsets in a double
//     buffer); each copy completes on the stage's K-full or V-full mbarrier
//     (cp.async.mbarrier.arrive.noinc, one arrival per producer thread);
//   warpgroups 1 and 2, the consumers (registers taken): 64 query rows each,
//     S = Q K^T   wgmma m64 n KV_TILE k16, Q and K from shared memory (K-major)
//     mask / transform / online softmax in registers (score_math.cuh), P packed to 16 bits
//     O += P V    wgmma m64 n DVO k16, P from registers, V from shared memory (MN-major)
//   releasing each K and V stage on its empty mbarrier (one arrival per consumer warp) as soon as
//   the MMA that read it has completed.
//
// A consumer warpgroup skips the tiles its causal / window mask hides entirely (the producer
// still copies them for the other one). cp.async writes through the generic proxy and wgmma reads
// through the async proxy: each consumer thread runs fence.proxy.async after the full barrier's
// acquire and before its MMAs read the stage.
#pragma once

#include "kernels/common/mbarrier.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/prefill/prefill_mma_kernel.cuh"
#include "kernels/prefill/wgmma_layout.cuh"

namespace kvattn::kernels::prefill {

template <class C>
struct PrefillWgmmaKernel {
  using IO = TileIO<C>;
  using SM = ScoreMath<C>;
  // The mma.sync kernel's item bookkeeping and epilogue serve as they are: the consumers hold
  // their rows in the same fragment order.
  using Common = PrefillMmaKernel<C>;
  static constexpr int kNT = C::KV_TILE / 8, kND = C::DVO / 8;
  static constexpr int kProducerThreads = 128, kThreads = 3 * 128;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128 x 40 + 256 x 232 <= 65536
  static constexpr bool kSlices = false;
  static_assert(C::kM == 128 && C::MT == 1 && C::KV_WARPS == 1, "two consumer warpgroups of 64 rows");
  static_assert(C::KVDT == C::DT && !C::kHasRope, "2-byte K/V as they are (fp8 and RoPE stay on mma.sync)");
  static_assert(C::DQK % 64 == 0 && C::DVO % 64 == 0 && C::DVO <= 256, "whole 64-column swizzle blocks");
  static_assert(C::KV_TILE == 64 || C::KV_TILE == 128, "wgmma N of Q K^T");
  static_assert(C::KV_TILE <= kProducerThreads, "one producer thread per row fetches the page ids");
  static constexpr WgmmaSmemLayout kLayout =
      wgmma_smem_layout(C::DQK, C::DVO, C::kM, C::KV_TILE, C::STAGES, C::PAGED);
  static constexpr int kSmemBytes = kLayout.total;
  // Named barriers: 1 hands the bad-page flag to the consumers, 2 orders the producer's ring, 3
  // and 4 are the consumers' turns.
  static constexpr int kFlagBarrier = 1, kRingBarrier = 2, kTurnBarrier = 3;  // 3 and 4

  // mbarrier addresses: Q full; per stage K full, V full, K empty, V empty.
  struct Barriers {
    uint32_t base;
    __device__ uint32_t q_full() const { return base; }
    __device__ uint32_t k_full(int s) const { return base + 8 * (1 + s); }
    __device__ uint32_t v_full(int s) const { return base + 8 * (1 + C::STAGES + s); }
    __device__ uint32_t k_empty(int s) const { return base + 8 * (1 + 2 * C::STAGES + s); }
    __device__ uint32_t v_empty(int s) const { return base + 8 * (1 + 3 * C::STAGES + s); }
  };

  static __device__ void run_item(const PrefillParams& p, char* smem, const DeviceWorkItem& item) {
    const ItemInfo it = Common::item_info(p, item);
    const int32_t n_tiles = (it.kv_end - it.kv_begin + C::KV_TILE - 1) / C::KV_TILE;
    const Barriers bars{smem_addr(smem + kLayout.barriers)};
    int* bad_flag = reinterpret_cast<int*>(smem + kLayout.flag);
    if (threadIdx.x == 0) {
      mbar_init(bars.q_full(), kProducerThreads);
      for (int s = 0; s < C::STAGES; ++s) {
        mbar_init(bars.k_full(s), kProducerThreads);
        mbar_init(bars.v_full(s), kProducerThreads);
        mbar_init(bars.k_empty(s), 8);  // one arrival per consumer warp
        mbar_init(bars.v_empty(s), 8);
      }
      *bad_flag = 0;
      fence_mbarrier_init();
    }
    __syncthreads();
    if (threadIdx.x < kProducerThreads) {
      warpgroup_release_registers<kProducerRegs>();
      produce(p, it, smem, n_tiles, bars, bad_flag);
    } else {
      warpgroup_take_registers<kConsumerRegs>();
      consume(p, it, item, smem, n_tiles, bars, bad_flag);
    }
  }

  // ---- producer -------------------------------------------------------------------------------

  // Byte offset of 16-byte chunk c of row r in a swizzled tile of `rows` rows.
  static __device__ __forceinline__ int chunk_offset(int rows, int r, int c) {
    return (c / 8) * rows * 128 + r * 128 + ((c % 8) ^ (r % 8)) * 16;
  }

  // The Q tile (rows past the item zero), negated when sm_scale < 0 as the mma.sync kernel does;
  // copied with cp.async when rows are 16-byte aligned, else converted through registers.
  static __device__ void load_q(const PrefillParams& p, const ItemInfo& it, char* qs, const Barriers& bars) {
    const int t = threadIdx.x;
    const float sign = p.variant.sm_scale < 0.0f ? -1.0f : 1.0f;
    const bool aligned =
        ((reinterpret_cast<uint64_t>(p.q) | uint64_t(p.q_stride_n * 2) | uint64_t(p.q_stride_h * 2)) & 15) == 0;
    auto row_src = [&](int row) -> int64_t {  // element offset of a valid row's first element
      const int tq = row / C::GH, hh = row % C::GH;
      return int64_t(it.q_row0 + it.q_begin + tq) * p.q_stride_n + int64_t(it.head0 + hh) * p.q_stride_h;
    };
    if (aligned && sign > 0.0f) {
      constexpr int kChunks = C::DQK / 8;
#pragma unroll 4
      for (int i = t; i < C::kM * kChunks; i += kProducerThreads) {
        const int row = i / kChunks, c = i % kChunks;
        const bool valid = row / C::GH < it.q_tokens;
        const char* src = static_cast<const char*>(p.q);
        if (valid) src += row_src(row) * 2 + c * 16;
        cp_async_16(qs + chunk_offset(C::kM, row, c), src, valid);
      }
      cp_async_arrive_noinc(bars.q_full());
      return;
    }
    for (int i = t; i < C::kM * (C::DQK / 2); i += kProducerThreads) {
      const int row = i / (C::DQK / 2), e = 2 * (i % (C::DQK / 2));
      float x0 = 0.0f, x1 = 0.0f;
      if (row / C::GH < it.q_tokens) {
        const int64_t base = row_src(row);
        x0 = sign * load_as_f32<C::DT>(p.q, base + e);
        x1 = sign * load_as_f32<C::DT>(p.q, base + e + 1);
      }
      *reinterpret_cast<uint32_t*>(qs + swizzled_offset(C::kM, row, e)) = pack2<C::DT>(x0, x1);
    }
    fence_proxy_async_smem();  // ordinary stores that wgmma reads next
    mbar_arrive(bars.q_full());
  }

  // Issues the copies of the K (V = false) or V rows of tokens [tile0, tile0 + KV_TILE) (zero
  // past kv_end) into a stage; `rows` are the tile's row offsets (paged). Thread t copies chunk
  // t % kChunks of rows t / kChunks + kStep i: one source pointer stepped by kStep rows (ragged) and
  // constant shared-memory steps, so that the producer's few registers hold no address table.
  template <bool V>
  static __device__ __forceinline__ void load_kv(const PrefillParams& p, const ItemInfo& it, char* dst, int32_t tile0,
                                                 const typename IO::RowOffsets* rows) {
    constexpr int kChunks = (V ? C::DVO : C::DQK) / 8;
    static_assert(C::KV_TILE * kChunks % kProducerThreads == 0, "whole passes");
    constexpr int kPasses = C::KV_TILE * kChunks / kProducerThreads;
    const int64_t stride_token = (V ? p.v_stride_token : p.k_stride_token) * 2;
    const char* base =
        static_cast<const char*>(V ? p.v : p.k) + int64_t(it.kv_head) * (V ? p.v_stride_head : p.k_stride_head) * 2;
    if constexpr (kProducerThreads % kChunks == 0) {
      constexpr int kStep = kProducerThreads / kChunks;
      const int c = int(threadIdx.x) % kChunks, r0 = int(threadIdx.x) / kChunks;
      const uint32_t dst0 = smem_addr(dst);
      const char* src = base + c * 16;
      if constexpr (!C::PAGED) src += int64_t(it.kv_row0 + tile0 + r0) * stride_token;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int r = r0 + pass * kStep;
        const bool valid = tile0 + r < it.kv_end;
        const char* row = src;
        if constexpr (C::PAGED) row += V ? rows[r].v : rows[r].k;
        cp_async_16(dst0 + chunk_offset(C::KV_TILE, r, c), valid ? row : base, valid);
        if constexpr (!C::PAGED) src += kStep * stride_token;
      }
    } else {
#pragma unroll 2
      for (int pass = 0; pass < kPasses; ++pass) {
        const int i = int(threadIdx.x) + pass * kProducerThreads;
        const int r = i / kChunks, c = i % kChunks;
        const bool valid = tile0 + r < it.kv_end;
        const int64_t offset = C::PAGED ? (V ? rows[r].v : rows[r].k) : int64_t(it.kv_row0 + tile0 + r) * stride_token;
        cp_async_16(smem_addr(dst) + chunk_offset(C::KV_TILE, r, c), valid ? base + offset + c * 16 : base, valid);
      }
    }
  }

  static __device__ void produce(const PrefillParams& p, const ItemInfo& it, char* smem, int32_t n_tiles,
                                 const Barriers& bars, int* bad_flag) {
    load_q(p, it, smem + kLayout.q, bars);
    auto* ring = reinterpret_cast<typename IO::RowOffsets*>(smem + kLayout.ring);
    bool bad_page = false;
    int32_t next_id = 0;  // paged: the page id of this thread's row of the next tile
    if constexpr (C::PAGED)
      if (n_tiles > 0) next_id = IO::fetch_page_id(p, it, it.kv_begin, bad_page);
    for (int32_t tile = 0; tile < n_tiles; ++tile) {
      const int s = tile % C::STAGES;
      const uint32_t parity = uint32_t(tile / C::STAGES - 1) & 1u;  // the consumers' release of the last round
      const int32_t tile0 = it.kv_begin + tile * C::KV_TILE;
      char* stage = smem + kLayout.stages + s * kLayout.stage_bytes;
      typename IO::RowOffsets* rows = ring + (tile % 2) * C::KV_TILE;
      if constexpr (C::PAGED) {
        IO::put_row_offsets(p, rows, tile0, next_id);
        if (tile + 1 < n_tiles) next_id = IO::fetch_page_id(p, it, tile0 + C::KV_TILE, bad_page);
        named_barrier_sync(kRingBarrier, kProducerThreads);
      }
      if (tile >= C::STAGES) mbar_wait_parity(bars.k_empty(s), parity);
      load_kv<false>(p, it, stage, tile0, rows);
      cp_async_arrive_noinc(bars.k_full(s));
      if (tile >= C::STAGES) mbar_wait_parity(bars.v_empty(s), parity);
      load_kv<true>(p, it, stage + kLayout.v_in_stage, tile0, rows);
      cp_async_arrive_noinc(bars.v_full(s));
    }
    if constexpr (C::CHECK_IDS) {
      if (named_barrier_or(kRingBarrier, kProducerThreads, bad_page)) {
        if (threadIdx.x == 0) *bad_flag = 1;
        IO::report_first_bad_page(p, it);
      }
      named_barrier_arrive(kFlagBarrier, kThreads);
    }
    cp_async_wait<0>();  // the CTA's shared memory stays until every copy has landed
  }

  // ---- consumers ------------------------------------------------------------------------------

  static __device__ void consume(const PrefillParams& p, const ItemInfo& it, const DeviceWorkItem& item, char* smem,
                                 int32_t n_tiles, const Barriers& bars, const int* bad_flag) {
    // The warpgroup's first M row, broadcast from lane 0 so that the compiler knows it (and every
    // branch on it) is warp-uniform: a wgmma under a branch it cannot prove uniform is serialized.
    const int group_row0 = (__shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0) - 1) * 64;
    const int warp = int(threadIdx.x) / 32 % 4, lane = int(threadIdx.x) % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int row0 = group_row0 + 16 * warp;  // this warp's first row (ScoreMath, the epilogue)
    const int32_t pos0 = it.kv_len - it.qo_len + it.q_begin;
    auto last_pos = [&](int first_row, int rows) { return pos0 + min((first_row + rows - 1) / C::GH, it.q_tokens - 1); };
    // Tiles are skipped per warpgroup (its MMAs are collective) and masked per warp.
    const int32_t pos_first = pos0 + row0 / C::GH, pos_last = last_pos(row0, 16);
    // The keys a user variant's mask shows every query of the warp (kv_full_range: no logits_mask).
    int64_t full_lo = 1, full_hi = 0;
    if constexpr (C::Variant::kHasFullRange)
      if (row0 < it.q_tokens * C::GH)
        C::Variant::kv_full_range(p.variant, it.request, pos_first, pos_last, full_lo, full_hi);
    // The tiles a warpgroup computes: one range [begin, end) (its causal mask hides the tiles
    // after it entirely, its window the tiles before it); both warpgroups' ranges are known to
    // both, for the turns below.
    struct Range {
      int32_t begin, end;
    };
    auto range_of = [&](int first_row) {
      Range r{0, first_row < it.q_tokens * C::GH ? n_tiles : 0};
      const int32_t first = pos0 + first_row / C::GH, last = last_pos(first_row, 64);
      if (C::FEATURES & kCausal)  // tiles whose first key is past the group's last query
        r.end = last < it.kv_begin ? 0 : min(r.end, (last - it.kv_begin) / C::KV_TILE + 1);
      if (C::FEATURES & kSlidingWindow) {  // tiles whose last key is before the group's first window
        const int32_t lo = first - p.variant.window_left - it.kv_begin;  // first visible key, item-relative
        r.begin = lo <= 0 ? 0 : min(r.end, lo / C::KV_TILE);
      }
      // A user variant's hint (variants/custom.cuh kv_range), asked for real queries only.
      if constexpr (C::Variant::kHasKvRange) {
        if (r.end > 0) {
          int64_t lo = it.kv_begin, hi = it.kv_end - 1;
          C::Variant::kv_range(p.variant, it.request, first, last, lo, hi);
          if (hi < it.kv_begin || lo > hi) {
            r.end = 0;
          } else {
            r.end = int32_t(min(int64_t(r.end), (hi - it.kv_begin) / C::KV_TILE + 1));
            if (lo > it.kv_begin)
              r.begin = int32_t(max(int64_t(r.begin), min(int64_t(r.end), (lo - it.kv_begin) / C::KV_TILE)));
          }
        }
      }
      if (r.begin >= r.end) r = {0, 0};
      return r;
    };
    const Range mine = range_of(group_row0), other = range_of(64 - group_row0);
    const int32_t t_begin = mine.begin, t_end = mine.end;

    float m[1][2], d[1][2], acc[1][kND][4];
    const float m_init = C::kCapShift ? SM::cap_shift(p) / SM::exp_scale(p) : -INFINITY;
#pragma unroll
    for (int r = 0; r < 2; ++r) m[0][r] = m_init, d[0][r] = 0.0f;
#pragma unroll
    for (int n = 0; n < kND; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[0][n][j] = 0.0f;
    const float c_exp = SM::exp_scale(p);
    auto& acc_flat = reinterpret_cast<float(&)[kND * 4]>(acc);

    const uint32_t q_rows = smem_addr(smem + kLayout.q) + group_row0 * 128;
    auto stage_addr = [&](int32_t tile) {
      return smem_addr(smem + kLayout.stages + (tile % C::STAGES) * kLayout.stage_bytes);
    };
    auto parity = [](int32_t tile) { return uint32_t(tile / C::STAGES) & 1u; };
    // S = Q K^T of a tile, issued (not waited for).
    auto issue_qk = [&](float (&s_flat)[kNT * 4], int32_t tile) {
      const uint32_t k_tile = stage_addr(tile);
#pragma unroll
      for (int ks = 0; ks < C::DQK / 16; ++ks) {
        const uint32_t in_block = (ks % 4) * 32;  // 16 columns of a 64-column block: 32 bytes
        const uint64_t a = wgmma_desc_k_major(q_rows + (ks / 4) * C::kM * 128 + in_block);
        const uint64_t b = wgmma_desc_k_major(k_tile + (ks / 4) * C::KV_TILE * 128 + in_block);
        wgmma_ss<C::DT, C::KV_TILE>(s_flat, a, b, ks > 0);
      }
      wgmma_commit();
    };
    // O += P V of a tile, issued (not waited for).
    auto issue_pv = [&](const uint32_t (&pp)[kNT][2], int32_t tile) {
      const uint32_t v_tile = stage_addr(tile) + kLayout.v_in_stage;
#pragma unroll
      for (int kk = 0; kk < C::KV_TILE / 16; ++kk) {
        const uint32_t a[4] = {pp[2 * kk][0], pp[2 * kk][1], pp[2 * kk + 1][0], pp[2 * kk + 1][1]};
        wgmma_rs_mn<C::DT, C::DVO>(acc_flat, a, wgmma_desc_mn_major(v_tile + kk * 16 * 128, C::KV_TILE), 1);
      }
      wgmma_commit();
    };
    // The tile's mask, transform and softmax weights on S (per warp: masks only where they can
    // cut); returns whether O needs `rescale` once the previous tile's P V has completed.
    auto weigh = [&](float (&sc)[1][kNT][4], int32_t tile, float (&rescale)[1][2]) {
      const int32_t tile0 = it.kv_begin + tile * C::KV_TILE, tile_last = tile0 + C::KV_TILE - 1;
      bool masked = tile_last >= it.kv_end || (C::FEATURES & kCustomMask);
      if (C::FEATURES & kCausal) masked = masked || tile_last > pos_first;
      if (C::FEATURES & kSlidingWindow) masked = masked || tile0 < pos_last - p.variant.window_left;
      const bool user_mask = C::Variant::kHasUserMask && !(tile0 >= full_lo && tile_last <= full_hi);
      SM::logits(p, it, sc, tile0, row0, g, t4, masked, user_mask);
      if constexpr (SM::kSoftmax) return SM::softmax_weights(sc, m, d, rescale, c_exp);
      return false;
    };
    auto pack = [&](const float (&sc)[1][kNT][4], uint32_t (&pp)[kNT][2]) {
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        pp[n][0] = pack2<C::DT>(sc[0][n][0], sc[0][n][1]);
        pp[n][1] = pack2<C::DT>(sc[0][n][2], sc[0][n][3]);
      }
    };
    auto release = [&](uint32_t bar) {
      __syncwarp();
      if (lane == 0) mbar_arrive(bar);
    };

    // Ping-pong (FA3's warpgroup schedule): the two warpgroups take turns to issue their MMAs
    // (named barriers 3 and 4: a warpgroup's turn begins when the other has issued), so that one
    // warpgroup's softmax runs while the other's MMAs keep the tensor cores busy. Turn j issues
    // tile j's Q K^T and tile j-1's P V (turn `end` the last P V alone); both warpgroups take one
    // turn for every j of the union of their ranges, issuing nothing where they compute nothing,
    // so that the turns alternate strictly. The first warpgroup goes first.
    const int me = group_row0 / 64;
    const bool i_compute = t_begin < t_end, other_computes = other.begin < other.end;
    const int32_t turns_begin = other_computes ? (i_compute ? min(t_begin, other.begin) : other.begin) : t_begin;
    // Turns turns_begin .. max(ends) inclusive (the last one issues the last P V).
    const int32_t n_turns = i_compute || other_computes ? max(t_end, other.end) + 1 - turns_begin : 0;
    int32_t turns_taken = 0;
    auto turn_begin = [&] { named_barrier_sync(kTurnBarrier + me, 256); };
    auto turn_end = [&] {  // the second warpgroup's last turn hands over to no one
      if (me == 0 || ++turns_taken < n_turns) named_barrier_arrive(kTurnBarrier + (1 - me), 256);
    };
    auto idle_turn = [&](int32_t j) {
      if (j >= turns_begin && j < turns_begin + n_turns) {
        turn_begin();
        turn_end();
      }
    };
    if (me == 1 && n_turns > 0) named_barrier_arrive(kTurnBarrier, 256);  // the first warpgroup's first turn

    // Waits for a stage's K (and the previous tile's V) and releases them, computing nothing:
    // every stage is waited for before it is released, computed or not (a release ahead of its
    // fill could complete the other warpgroup's phase of the stage's previous round).
    auto pass_over = [&](int32_t tile) {
      mbar_wait_parity(bars.k_full(tile % C::STAGES), parity(tile));
      release(bars.k_empty(tile % C::STAGES));
      if (tile > 0) {
        mbar_wait_parity(bars.v_full((tile - 1) % C::STAGES), parity(tile - 1));
        release(bars.v_empty((tile - 1) % C::STAGES));
      }
    };

    // Software-pipelined by one tile inside the warpgroup: tile j's Q K^T and tile j-1's P V are
    // in flight together, and tile j's softmax runs under the P V; O is rescaled for tile j once
    // that P V has completed, before tile j's own P V is issued. The loop over the computed
    // range has no branch around an MMA (ptxas serializes wgmma on paths it cannot prove).
    float sc[1][kNT][4];
    auto& s_flat = reinterpret_cast<float(&)[kNT * 4]>(sc);
    uint32_t pp[kNT][2];  // the previous tile's P in the MMA type: the A fragments of its P V
    float rescale[1][2];
    mbar_wait_parity(bars.q_full(), 0);
    for (int32_t tile = 0; tile < t_begin; ++tile) {
      pass_over(tile);
      idle_turn(tile);
    }
    if (t_begin < t_end) {
      mbar_wait_parity(bars.k_full(t_begin % C::STAGES), parity(t_begin));
      fence_proxy_async_smem();
      turn_begin();
      wgmma_fence();
      issue_qk(s_flat, t_begin);
      turn_end();
      wgmma_wait<0>(s_flat);
      release(bars.k_empty(t_begin % C::STAGES));
      if (t_begin > 0) {
        mbar_wait_parity(bars.v_full((t_begin - 1) % C::STAGES), parity(t_begin - 1));
        release(bars.v_empty((t_begin - 1) % C::STAGES));
      }
      if (weigh(sc, t_begin, rescale)) SM::rescale_acc(acc, rescale);
      pack(sc, pp);
    }
    for (int32_t tile = t_begin + 1; tile < t_end; ++tile) {
      const int s = tile % C::STAGES, s_prev = (tile - 1) % C::STAGES;
      mbar_wait_parity(bars.k_full(s), parity(tile));
      mbar_wait_parity(bars.v_full(s_prev), parity(tile - 1));
      fence_proxy_async_smem();
      turn_begin();
      wgmma_fence();
      issue_qk(s_flat, tile);
      issue_pv(pp, tile - 1);
      turn_end();
      wgmma_wait<1>(s_flat);
      release(bars.k_empty(s));
      const bool moved = weigh(sc, tile, rescale);
      wgmma_wait<0>(acc_flat);
      release(bars.v_empty(s_prev));
      if (moved) SM::rescale_acc(acc, rescale);
      pack(sc, pp);
    }
    if (t_begin < t_end) {  // the last computed tile's P V
      const int s = (t_end - 1) % C::STAGES;
      mbar_wait_parity(bars.v_full(s), parity(t_end - 1));
      fence_proxy_async_smem();
      turn_begin();
      wgmma_fence();
      issue_pv(pp, t_end - 1);
      turn_end();
      wgmma_wait<0>(acc_flat);
      release(bars.v_empty(s));
    }
    // The tiles after the range (all of them for a warpgroup that computes nothing, which takes
    // its turns in tile order too: taking them ahead of its releases would stall the producer).
    for (int32_t tile = t_end; tile < n_tiles; ++tile) {
      if (i_compute) idle_turn(tile + 1);  // turn t_end was the last P V
      mbar_wait_parity(bars.k_full(tile % C::STAGES), parity(tile));
      release(bars.k_empty(tile % C::STAGES));
      // The previous tile's V: released above when it was computed (t_end - 1).
      if (tile > 0 && tile - 1 != t_end - 1) {
        mbar_wait_parity(bars.v_full((tile - 1) % C::STAGES), parity(tile - 1));
        release(bars.v_empty((tile - 1) % C::STAGES));
      }
      if (!i_compute) idle_turn(tile);
    }
    if (!i_compute) idle_turn(n_tiles);
    if (n_tiles > 0 && !(t_begin < t_end && t_end == n_tiles)) {  // the last tile's V, if not computed
      mbar_wait_parity(bars.v_full((n_tiles - 1) % C::STAGES), parity(n_tiles - 1));
      release(bars.v_empty((n_tiles - 1) % C::STAGES));
    }
    bool poisoned = false;
    if constexpr (C::CHECK_IDS) {
      named_barrier_sync(kFlagBarrier, kThreads);
      poisoned = *static_cast<const volatile int*>(bad_flag) != 0;
    }
    Common::store(p, it, item, m, d, acc, row0, g, t4, c_exp, poisoned);
  }
};

}  // namespace kvattn::kernels::prefill
