// The tensor-core paged decode for sm_90+ where pages hold a multiple of 16 tokens (the default
// there; docs/DESIGN.md, "Decode kernels"): DecodeBulkKernel's per-warp pipeline, with each warp's
// 16 K rows and 16 V rows of a tile brought in by TMA tensor copies instead of one bulk copy per row.
//
// Why: cp.async.bulk takes its operands in uniform registers, so the 32 per-lane row copies of
// DecodeBulkKernel compile to a 32-round loop (ELECT, four R2UR, UBLKCP) per warp and tile: 40% of
// its instructions at 64 x 4096 (ncu on the H200 at 05bdd46; docs/DECISIONS.md, "Decode kernels"),
// in a kernel whose warps were bound by issue latency, not by DRAM. Here a warp's 16 tokens of one
// page are boxes of [16 tokens][128 bytes] (64 dims, or 128 of fp8; 2 KB each), one instruction each:
//   cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// through the 4-D tensor maps of the K and V caches that run() encodes (DecodeParams::k_map/v_map:
// head dim, then token and head in the order of their strides, then page). The boxes land
// 128-byte swizzled (CU_TENSOR_MAP_SWIZZLE_128B), so the rows need no padding for ldmatrix:
// DecodeMmaKernel::tile_math<true> reads them through swizzled_offset.
//
// A warp's tile takes the box copies when its 16 tokens are all in range and in one valid page
// (always, for page sizes that are multiples of 16 with 16-aligned chunks, except a request's last
// partial tile; sliding windows start off that grid and keep DecodeBulkKernel); otherwise (the
// last partial tile, a bad page id, a chunk start that is not 16-aligned, or no tensor map) its lanes copy their rows 16 bytes at a time with cp.async into the
// same swizzled places, zero-filling rows past the range or with bad page ids, and arrive on the
// same mbarrier through cp.async.mbarrier.arrive (which holds the phase open until the copies land).
// Barrier protocol as DecodeBulkKernel: one mbarrier per (stage, warp), arrival count 1 (lane 0),
// the box bytes as its transaction count; all lanes wait with try_wait.parity. After a stage was
// filled by cp.async (generic proxy), every lane runs fence.proxy.async before the next box copy
// into it (write-after-write across proxies).
//
// Shared memory (tma_smem_bytes): 1024 bytes of alignment slack (swizzled boxes need 1024-byte
// aligned blocks), STAGES x WARPS x 16 tokens x (DQK + DVO) x 2 bytes, q [16][pitch], the barriers.
// Head dim 128, 4 warps, 3 stages: 103,776 bytes, two CTAs per SM; 2 stages: 70,976, three.
#pragma once

#include "kernels/decode/decode_bulk_kernel.cuh"

namespace kvattn::kernels::decode {

namespace tma_detail {

// One box of a 4-D tensor map into shared memory, completing its bytes on `bar` (sm_90).
// `map` is the generic address of a __grid_constant__ parameter.
__device__ __forceinline__ void tensor_copy_4d(uint32_t dst, const void* map, int c0, int c1, int c2, int c3,
                                               uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace tma_detail

// Template order as every kernel family's: q, KV (the MMA type: tensor cores take q == KV), output.
template <int QDT, int DT, int ODT, int DQK, int DVO, int GH, int PAGE, uint32_t FEATURES,
          int STAGES, int WARPS, class VARIANT = BuiltinVariant<FEATURES>>
struct DecodeTmaKernel {
  using Base = DecodeMmaKernel<QDT, DT, ODT, DQK, DVO, GH, PAGE, FEATURES, STAGES, WARPS, VARIANT>;
  static_assert(STAGES >= 2 && STAGES <= 8, "2 to 8 stages");
  static constexpr int kKVBytes = Base::kKVBytes;
  static constexpr int kBoxDims = 128 / kKVBytes;  // a box row is 128 bytes: 64 dims, or 128 of fp8
  static_assert(DQK % kBoxDims == 0 && DVO % kBoxDims == 0, "whole 128-byte boxes");
  static constexpr int kThreads = Base::kThreads;
  static constexpr int kTile = Base::kTile;
  static constexpr int kPitchQ = Base::kPitchQ;
  static constexpr int kBoxBytes = 16 * 128;  // 16 tokens x 128 bytes
  static constexpr int kWarpKBytes = 16 * DQK * kKVBytes;  // DQK / kBoxDims boxes
  static constexpr int kWarpVBytes = 16 * DVO * kKVBytes;
  static constexpr int kWarpBytes = kWarpKBytes + kWarpVBytes;  // a warp's block of one stage
  static constexpr int kStageBytes = WARPS * kWarpBytes;
  static constexpr int kPipeBytes = STAGES * kStageBytes;
  static constexpr int kBigBytes = kPipeBytes > Base::kMergeBytes ? kPipeBytes : Base::kMergeBytes;
  static constexpr int kQOffset = kBigBytes;
  static constexpr int kBarOffset = kQOffset + Base::kQBytes;
  static constexpr int kSmemBytes = 1024 + kBarOffset + STAGES * WARPS * 8;
  static_assert(kSmemBytes == tma_smem_bytes(DQK, DVO, STAGES, WARPS, kKVBytes, Base::kMTiles), "host and device agree");
  static_assert(kWarpBytes % 1024 == 0 && kBarOffset % 8 == 0, "1024-byte aligned boxes; aligned barriers");

  static __device__ void run_item(const DecodeParams& p, char* smem_raw, const DeviceDecodeItem& item) {
    using namespace bulk_detail;
    using namespace tma_detail;
    // The swizzle pattern follows address bits 7-9: the boxes start on 1024-byte boundaries.
    char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = p.num_qo_heads / p.num_kv_heads;
    const int head0 = item.kv_head * group + blockIdx.y * GH;
    const int ps = PAGE > 0 ? PAGE : p.page_size;
    const int32_t page_base = item.page_base, kv_len = item.kv_len;
    const int32_t n_tiles = (item.kv_end - item.kv_begin + kTile - 1) / kTile;

    // This lane's row on the cp.async path: token warp * 16 + lane % 16 of every tile, of K (lanes
    // 0-15) or V (16-31).
    const int row = lane % 16;
    const bool is_v = lane >= 16;
    const char* src_head = is_v ? static_cast<const char*>(p.v) + item.kv_head * p.v_stride_head * kKVBytes
                                : static_cast<const char*>(p.k) + item.kv_head * p.k_stride_head * kKVBytes;
    const int64_t stride_page = is_v ? p.v_stride_page : p.k_stride_page;
    const int64_t stride_token = is_v ? p.v_stride_token : p.k_stride_token;
    const int row_chunks = (is_v ? DVO : DQK) * kKVBytes / 16;
    const uint32_t bars = smem_addr(smem + kBarOffset);  // barrier of (stage s, warp w): bars + 8 (s W + w)
    const bool token_dim1 = p.tma_token_dim == 1;
    uint32_t generic_stages = 0;  // bit s: stage s was last filled through the generic proxy

    if (threadIdx.x < STAGES * WARPS) {
      mbar_init(bars + 8 * threadIdx.x, 1);
      fence_mbarrier_init();
    }
    __syncthreads();  // the barriers are initialised before any thread arrives on or waits for them

    bool bad = false;  // a page id was out of range: the rows come out NaN
    // The page id of this lane's row in `tile`, loaded two tiles before it is checked and used.
    using PendingId = PendingPageId;
    auto load = [&](int tile) {
      return load_row_page(p, item.kv_begin + tile * kTile + warp * 16 + row, item.kv_end, page_base, ps);
    };
    auto check = [&](const PendingId& id) { return checked_row_page(p, id, bad); };
    // Starts the copies of this warp's rows of `tile` (its stage was last read by this warp).
    auto issue = [&](int tile, const PendingId& pending) {
      const int32_t page = check(pending);
      const int stage = tile % STAGES;
      const uint32_t bar = bars + 8 * (stage * WARPS + warp);
      char* block = smem + stage * kStageBytes + warp * kWarpBytes;  // K boxes, then V boxes
      const int32_t tok0 = item.kv_begin + tile * kTile + warp * 16;
      const int32_t page0 = __shfl_sync(0xffffffffu, page, 0);
      // Boxes: one logical page holds all 16 tokens (a table may repeat a page id), all of them
      // in range with a valid id, and run() has tensor maps.
      const bool one_page = tok0 / ps == (tok0 + 15) / ps;
      const bool boxes = p.tma_ready && one_page && __all_sync(0xffffffffu, page >= 0 && page == page0);
      __syncwarp();  // every lane is past its reads of this stage (the last tile's ldmatrix)
      if (boxes) {
        if (generic_stages & (1u << stage)) {
          fence_proxy_async_smem();  // the cp.async rows written here before, then these boxes
          generic_stages &= ~(1u << stage);
          __syncwarp();
        }
        if (lane == 0) {
          mbar_arrive_expect_tx(bar, kWarpBytes);
          const int tok_in_page = tok0 % ps;
          const int c1 = token_dim1 ? tok_in_page : item.kv_head, c2 = token_dim1 ? item.kv_head : tok_in_page;
#pragma unroll
          for (int b = 0; b < DQK / kBoxDims; ++b)
            tensor_copy_4d(smem_addr(block + b * kBoxBytes), &p.k_map, b * kBoxDims, c1, c2, page0, bar);
#pragma unroll
          for (int b = 0; b < DVO / kBoxDims; ++b)
            tensor_copy_4d(smem_addr(block + kWarpKBytes + b * kBoxBytes), &p.v_map, b * kBoxDims, c1, c2, page0, bar);
        }
      } else {
        const int32_t tok = tok0 + row;
        const bool valid = page >= 0;
        const char* src = valid ? src_head + (stride_page * page + stride_token * int64_t(tok % ps)) * kKVBytes : src_head;
        char* dst = block + (is_v ? kWarpKBytes : 0);
        for (int c = 0; c < row_chunks; ++c)
          cp_async_16(dst + Base::swizzled_offset(row, c * 16), src + c * 16, valid);
        cp_async_arrive_on(bar);
        generic_stages |= 1u << stage;
        __syncwarp();  // every lane's pending arrival is registered before the phase can complete
        if (lane == 0) mbar_arrive(bar);
      }
    };

    // The descriptors' first use should not wait for their fetch.
    if (threadIdx.x == 0 && p.tma_ready) {
      prefetch_tensor_map(&p.k_map);
      prefetch_tensor_map(&p.v_map);
    }
    // Prologue: tiles 0 .. STAGES-2 in flight, the page ids of tiles STAGES-1 and STAGES loading.
    // Ids are loaded two tiles before their copies are issued: with one, 12% of the warps' stall
    // samples at 64 x 4096 sat on the id's check (ncu on the H200 at 05bdd46).
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t)
      if (t < n_tiles) issue(t, load(t));
    PendingId next = load(STAGES - 1), after = load(STAGES);

    char* qs = smem + kQOffset;
    Base::stage_q(p, qs, item, head0);
    __syncthreads();
    uint32_t qfrag[Base::kQInRegisters ? DQK / 16 : 1][4];
    Base::load_q_fragments(qs, qfrag);
    typename Base::State st;
    Base::reset_state(st);

    for (int tile = 0; tile < n_tiles; ++tile) {
      // Refill the stage read last round with tile + STAGES - 1, then start the ids of the one after next.
      const int ahead = tile + STAGES - 1;
      if (ahead < n_tiles) issue(ahead, next);
      next = after;
      after = load(ahead + 2);

      const int stage = tile % STAGES;
      mbar_wait_parity(bars + 8 * (stage * WARPS + warp), uint32_t(tile / STAGES) & 1u);
      const char* ks_base = smem + stage * kStageBytes + warp * kWarpBytes;
      const int32_t tok0 = item.kv_begin + tile * kTile + warp * 16;
      Base::template tile_math<true>(p, item, ks_base, ks_base + kWarpKBytes, qfrag, qs, tok0, head0, kv_len, st);
    }
    // Every warp has waited for every tile it issued, so no copy is in flight: the stages may be
    // reused as the merge buffers and the barriers invalidated.
    const bool poisoned = __syncthreads_or(bad);
    if (threadIdx.x < STAGES * WARPS) mbar_inval(bars + 8 * threadIdx.x);
    Base::merge_and_store(p, smem, item, head0, group, st, poisoned);
    // The merge buffers were written through the generic proxy; a persistent worker's next item
    // copies boxes into the same bytes (after run_worker's __syncthreads).
    fence_proxy_async_smem();
  }
};

// The kernel of a named configuration (cuda::decode_spec generates one: q_dtype, kv_dtype,
// o_dtype, head_dim_qk, head_dim_vo, heads_per_cta, page_size, features, stages, warps).
template <class C>
using DecodeTmaKernelFor = DecodeTmaKernel<C::q_dtype, C::kv_dtype, C::o_dtype, C::head_dim_qk, C::head_dim_vo, C::heads_per_cta,
                        C::page_size, C::features, C::stages, C::warps, typename C::Variant>;

}  // namespace kvattn::kernels::decode
