// The tensor-core paged decode for sm_90+ (the default there; docs/DESIGN.md, "Decode kernels"):
// DecodeMmaKernel's work item, math, outputs and page-id checks (its stage_q / tile_math /
// merge_and_store are called as they are) with the K/V rows brought in by the copy engine instead
// of 16-byte cp.async copies from every thread (20-30% more bandwidth on the H200):
//   cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes  one per K row and V row
// (head_dim x 2 bytes, or x 1 for fp8; NHD or HND alike: a token's row of one head is contiguous in both), and a
// pipeline STAGES deep whose tiles are STAGES - 1 ahead of the math.
//
// Each warp reads only its own 16 tokens of a tile (rows warp*16 .. warp*16+15 of K and V), so
// each warp runs its own pipeline and nothing in the main loop synchronises the CTA:
//   - lane l issues the copy of row l % 16 of the warp's tokens, of K for l < 16 and of V above;
//     the row -> lane map is the same for every stage and tile;
//   - one mbarrier per (stage, warp), initialised with an arrival count of 1; per tile, lane 0
//     arrives with expect_tx = the bytes of the rows that are copied; the copies complete_tx on it;
//   - rows past kv_end or with a bad page id are zero-filled by their lane with ordinary stores
//     (V must be finite: P = 0 times NaN is NaN) and are not counted in expect_tx; the lane then
//     runs fence.proxy.async, so the bulk copy it issues to the same row a later round is ordered
//     after its generic stores (write-after-write across proxies);
//   - all 32 lanes wait on the barrier with try_wait.parity (acquire): tile t uses stage t % STAGES
//     and waits for phase parity (t / STAGES) & 1. A stage is refilled only by the warp that read
//     it, after its MMAs consumed the ldmatrix results (program order plus __syncwarp), so no
//     "empty" barrier is needed; a barrier never runs more than one phase ahead of its waiters;
//   - page ids are loaded one tile before their copies are issued and checked only then (a bad id
//     is recorded through checked_page, re-read on that rare path), so the dependent load of
//     kv_indices never stalls the issue.
// The barriers are initialised per item (fence.mbarrier_init makes the init visible to the copy
// engine) and invalidated at its end (mbarrier.inval before the memory is initialised again by the
// next item of a persistent worker).
//
// Shared memory (bytes; bulk_smem_bytes): STAGES x 64 tokens x (272 + 272) padded rows (the odd
// 16-byte pitch keeps ldmatrix free of bank conflicts; each row is a separate copy, so the padding
// costs no extra copies), q [16][272], 8 bytes per (stage, warp) barrier. Head dim 128, 4 warps:
//   STAGES = 3: 3 x 34,816 + 4,352 + 96 = 108,896; 2 CTAs x (108,896 + 1,024 reserved) = 219,840
//               <= 233,472 (228 KB per SM): 2 CTAs per SM, each with 2 tiles (64 KB) in flight
//               while it computes a third (the cp.async kernel: 3 CTAs x 1 tile = 96 KB).
//   STAGES = 2: 74,048; 3 x 75,072 = 225,216: 3 CTAs per SM (the cp.async kernel's shape).
//   STAGES = 4: 143,744: 1 CTA per SM (the host then keeps 4 warps: only when asked for).
#pragma once

#include "kernels/common/mbarrier.cuh"
#include "kernels/common/mma.cuh"
#include "kernels/decode/decode_mma_kernel.cuh"
#include "kernels/decode/params.cuh"
#include "kernels/decode/smem_layout.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "DecodeBulkKernel needs sm_90 or later (cp.async.bulk with mbarrier transaction counts)"
#endif

namespace kvattn::kernels::decode {

namespace bulk_detail {

// global -> shared copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) by the copy
// engine, completing `bytes` transactions on the mbarrier. The shared::cluster destination form is
// the sm_90 one; a CTA launched without a cluster is its own cluster, so its shared::cta addresses
// are valid shared::cluster addresses.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// The page id of one lane's row, in two steps: load_row_page() issues the global load (pos = -1
// for a token past kv_end: nothing loaded), checked_row_page() uses the value when the row's copy
// is issued, tiles later, so the load's latency hides under the math. A bad id is recorded (and
// `bad` set) and comes back as -1, like a row past the range.
struct PendingPageId {
  int32_t pos, raw;
};
__device__ __forceinline__ PendingPageId load_row_page(const DecodeParams& p, int32_t tok, int32_t kv_end,
                                                       int32_t page_base, int ps) {
  PendingPageId id{-1, -1};
  if (tok < kv_end) {
    id.pos = page_base + tok / ps;
    id.raw = p.kv_indices[id.pos];
  }
  return id;
}
__device__ __forceinline__ int32_t checked_row_page(const DecodeParams& p, const PendingPageId& id, bool& bad) {
  if (id.pos < 0) return -1;
  if (id.raw >= 0 && id.raw < p.num_pages) return id.raw;
  const int32_t checked = checked_page(p, id.pos);  // records the error (and re-reads the id)
  bad |= checked < 0;
  return checked;
}

}  // namespace bulk_detail

// Template order as every kernel family's: q, KV (the MMA type: tensor cores take q == KV), output.
template <int QDT, int DT, int ODT, int DQK, int DVO, int GH, int PAGE, uint32_t FEATURES,
          int STAGES, int WARPS, class VARIANT = BuiltinVariant<FEATURES>>
struct DecodeBulkKernel {
  // The math, the q rows and the merge (and its buffers at offset 0) are DecodeMmaKernel's.
  using Base = DecodeMmaKernel<QDT, DT, ODT, DQK, DVO, GH, PAGE, FEATURES, STAGES, WARPS, VARIANT>;
  static_assert(STAGES >= 2 && STAGES <= 8, "2 to 8 stages");
  static constexpr int kThreads = Base::kThreads;
  static constexpr int kTile = Base::kTile;
  static constexpr int kPitchK = Base::kPitchK, kPitchV = Base::kPitchV, kPitchQ = Base::kPitchQ;
  static constexpr int kKVBytes = Base::kKVBytes;
  static constexpr int kRowBytesK = DQK * kKVBytes, kRowBytesV = DVO * kKVBytes;
  static constexpr int kStageBytes = kTile * (kPitchK + kPitchV);  // K rows, then V rows
  static constexpr int kPipeBytes = STAGES * kStageBytes;
  static constexpr int kBigBytes = kPipeBytes > Base::kMergeBytes ? kPipeBytes : Base::kMergeBytes;
  static constexpr int kQOffset = kBigBytes;
  static constexpr int kBarOffset = kQOffset + Base::kQBytes;
  static constexpr int kSmemBytes = kBarOffset + STAGES * WARPS * 8;
  static_assert(kSmemBytes == bulk_smem_bytes(DQK, DVO, STAGES, WARPS, kKVBytes, Base::kMTiles), "host and device agree");
  static_assert(kStageBytes == Base::kStageBytes, "the stage layout is DecodeMmaKernel's");
  static_assert(kPitchK % 16 == 0 && kPitchV % 16 == 0 && kStageBytes % 16 == 0 && kRowBytesK % 16 == 0 &&
                    kRowBytesV % 16 == 0 && kBarOffset % 8 == 0,
                "bulk copies need 16-byte aligned rows of 16-byte multiples; mbarriers 8-byte alignment");
  static_assert(16 * (kRowBytesK + kRowBytesV) < (1 << 20), "a phase's transaction count fits");

  static __device__ void run_item(const DecodeParams& p, char* smem, const DeviceDecodeItem& item) {
    using namespace bulk_detail;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = p.num_qo_heads / p.num_kv_heads;
    const int head0 = item.kv_head * group + blockIdx.y * GH;
    const int ps = PAGE > 0 ? PAGE : p.page_size;
    const int32_t page_base = item.page_base, kv_len = item.kv_len;
    const int32_t n_tiles = (item.kv_end - item.kv_begin + kTile - 1) / kTile;

    // This lane's row: token warp * 16 + lane % 16 of every tile, of K (lanes 0-15) or V (16-31).
    const int row = warp * 16 + lane % 16;
    const bool is_v = lane >= 16;
    const char* src_head = is_v ? static_cast<const char*>(p.v) + item.kv_head * p.v_stride_head * kKVBytes
                                : static_cast<const char*>(p.k) + item.kv_head * p.k_stride_head * kKVBytes;
    const int64_t stride_page = is_v ? p.v_stride_page : p.k_stride_page;
    const int64_t stride_token = is_v ? p.v_stride_token : p.k_stride_token;
    const uint32_t row_bytes = is_v ? kRowBytesV : kRowBytesK;
    const int row_offset = is_v ? kTile * kPitchK + row * kPitchV : row * kPitchK;  // within a stage
    const uint32_t bars = smem_addr(smem + kBarOffset);  // barrier of (stage s, warp w): bars + 8 (s W + w)

    if (threadIdx.x < STAGES * WARPS) {
      mbar_init(bars + 8 * threadIdx.x, 1);
      fence_mbarrier_init();
    }
    __syncthreads();  // the barriers are initialised before any thread arrives on or waits for them

    bool bad = false;  // a page id was out of range: the rows come out NaN
    // The page id of this lane's token in `tile`, in two steps: load() issues the global load (pos =
    // -1 past the range), check() uses the value a tile later, so its latency hides under the math.
    using PendingId = PendingPageId;
    auto load = [&](int tile) {
      return load_row_page(p, item.kv_begin + tile * kTile + row, item.kv_end, page_base, ps);
    };
    auto check = [&](const PendingId& id) { return checked_row_page(p, id, bad); };
    // Starts the copies of this warp's rows of `tile` (its stage was last read by this warp).
    auto issue = [&](int tile, const PendingId& pending) {
      const int32_t page = check(pending);
      const int stage = tile % STAGES;
      const uint32_t bar = bars + 8 * (stage * WARPS + warp);
      char* dst = smem + stage * kStageBytes + row_offset;
      const bool valid = page >= 0;
      __syncwarp();  // every lane is past its reads of this stage (the last tile's ldmatrix)
      if (!valid) {
        for (uint32_t c = 0; c < row_bytes; c += 16) *reinterpret_cast<uint4*>(dst + c) = make_uint4(0, 0, 0, 0);
        fence_proxy_async_smem();  // before this lane's later bulk copies into the same row
      }
      const uint32_t copied = __ballot_sync(0xffffffffu, valid);
      __syncwarp();  // the zero rows are written before the warp reads the stage
      if (lane == 0)
        mbar_arrive_expect_tx(bar, __popc(copied & 0xffffu) * kRowBytesK + __popc(copied >> 16) * kRowBytesV);
      __syncwarp();  // the expectation is raised before any of the copies can complete
      if (valid) {
        const int32_t tok = item.kv_begin + tile * kTile + row;
        const char* src = src_head + (stride_page * page + stride_token * int64_t(tok % ps)) * kKVBytes;
        bulk_copy_g2s(smem_addr(dst), src, row_bytes, bar);
      }
    };

    // Prologue: tiles 0 .. STAGES-2 in flight, the page ids of tile STAGES-1 loading.
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t)
      if (t < n_tiles) issue(t, load(t));
    PendingId next = load(STAGES - 1);

    char* qs = smem + kQOffset;
    Base::stage_q(p, qs, item, head0);
    __syncthreads();
    uint32_t qfrag[Base::kQInRegisters ? DQK / 16 : 1][4];
    Base::load_q_fragments(qs, qfrag);
    typename Base::State st;
    Base::reset_state(st);

    for (int tile = 0; tile < n_tiles; ++tile) {
      // Refill the stage read last round with tile + STAGES - 1, then start the ids of the next one.
      const int ahead = tile + STAGES - 1;
      if (ahead < n_tiles) issue(ahead, next);
      next = load(ahead + 1);

      const int stage = tile % STAGES;
      mbar_wait_parity(bars + 8 * (stage * WARPS + warp), uint32_t(tile / STAGES) & 1u);
      const char* ks_base = smem + stage * kStageBytes + warp * 16 * kPitchK;
      const char* vs_base = smem + stage * kStageBytes + kTile * kPitchK + warp * 16 * kPitchV;
      const int32_t tok0 = item.kv_begin + tile * kTile + warp * 16;
      Base::tile_math(p, item, ks_base, vs_base, qfrag, qs, tok0, head0, kv_len, st);
    }
    // Every warp has waited for every tile it issued, so no copy is in flight: the stages may be
    // reused as the merge buffers and the barriers invalidated.
    const bool poisoned = __syncthreads_or(bad);
    if (threadIdx.x < STAGES * WARPS) mbar_inval(bars + 8 * threadIdx.x);
    Base::merge_and_store(p, smem, item, head0, group, st, poisoned);
    // The merge buffers were written through the generic proxy; a persistent worker's next item
    // bulk-copies into the same bytes (after run_worker's __syncthreads).
    fence_proxy_async_smem();
  }
};

// The kernel of a named configuration (cuda::decode_spec generates one: q_dtype, kv_dtype,
// o_dtype, head_dim_qk, head_dim_vo, heads_per_cta, page_size, features, stages, warps).
template <class C>
using DecodeBulkKernelFor = DecodeBulkKernel<C::q_dtype, C::kv_dtype, C::o_dtype, C::head_dim_qk, C::head_dim_vo, C::heads_per_cta,
                        C::page_size, C::features, C::stages, C::warps, typename C::Variant>;

}  // namespace kvattn::kernels::decode
