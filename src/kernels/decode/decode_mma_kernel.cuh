// Paged batch decode on tensor cores (mma.sync m16n8k16, sm_80+), for f16/bf16 KV and fp8 (e4m3,
// e5m2) KV. One CTA runs one work item (request, KV head, KV range) for up to 32 query heads of the
// group: the heads are the rows of one or two 16-row MMA A tiles (padded), so each KV byte is read
// once for all of them (two tiles share every K and V fragment: MQA and large groups).
//
// Each warp owns 16 tokens of every tile and keeps its own online-softmax state in registers
//   S = Q K^T   A = Q (registers or shared), B = K rows via ldmatrix
//   P = exp2(S - m) rebuilt as the A fragment of the next MMA in registers (no shared round trip)
//   O += P V    B = V rows via ldmatrix.trans
// The warps' states are merged through shared memory at the end, and the row is written out, or,
// for a split row, its normalised partial state goes to the workspace, folded by split_fold.cuh.
//
// fp8 K/V stay fp8 in shared memory (half the bytes per tile) and become f16 in registers, right
// after their ldmatrix: every e4m3/e5m2 value is exact in f16, so the MMAs run in f16 whatever q's
// dtype, with no rounding of K or V. ldmatrix reads fp8 rows as b16 pairs, which permutes indices:
//   K (ldmatrix): a lane gets dims 4t..4t+3 of token g in a 16-dim chunk, so its B registers hold
//     dims (4t, 4t+1) and (4t+2, 4t+3) where the MMA expects k = (2t, 2t+1) and (2t+8, 2t+9).
//     A dot product does not care about the order of k as long as A agrees: stage_q writes q in
//     that permuted order (q_column).
//   V (ldmatrix.trans): a lane gets tokens 2t, 2t+1 (and +8) of dims 2g, 2g+1: split by byte into
//     an n-tile of the even dims and one of the odd dims, so acc[2c] holds dims 16c + 2n and
//     acc[2c + 1] dims 16c + 2n + 1 (n: the C fragment's column); merge_and_store undoes it.
// q is f16 then: bf16 q rows are scaled by a power of two (per row, exact) so that their largest
// magnitude lies in [2^14, 2^15), within f16's range and above its subnormals; the logits take
// the inverse scale with sm_scale.
#pragma once

#include "kernels/common/mma.cuh"
#include "kernels/decode/params.cuh"
#include "kernels/decode/smem_layout.cuh"
#include "kernels/decode/split_fold.cuh"
#include "kernels/variants/epilogue.cuh"

namespace kvattn::kernels::decode {

// Template order as every kernel family's: q, KV (the MMA type: tensor cores take q == KV), output.
// VARIANT: the built-in variant of FEATURES, or a user variant composed with it
// (variants/custom.cuh).
template <int QDT, int DT, int ODT, int DQK, int DVO, int GH, int PAGE, uint32_t FEATURES,
          int STAGES, int WARPS, class VARIANT = BuiltinVariant<FEATURES>>
struct DecodeMmaKernel {
  using Variant = VARIANT;
  static constexpr bool kFp8 = DT == kE4M3 || DT == kE5M2;
  static_assert(DT == kF16 || DT == kBF16 || kFp8, "the tensor-core decode reads f16, bf16 or fp8 KV");
  static_assert(kFp8 ? (QDT == kF16 || QDT == kBF16) : QDT == DT, "q is the KV dtype, or f16/bf16 over fp8 KV");
  // The MMA operand type: the KV dtype, f16 for fp8 KV.
  static constexpr int MT = kFp8 ? kF16 : DT;
  static constexpr int kKVBytes = kFp8 ? 1 : 2;
  // bf16 q over fp8 KV: rows scaled by powers of two into f16's range (the header).
  static constexpr bool kScaledQ = kFp8 && QDT != kF16;
  static_assert(FEATURES != kDynamicFeatures && !(FEATURES & kRope) && !(FEATURES & kCustomMask),
                "fused RoPE and custom masks run on the CUDA-core decode kernel");
  static_assert(GH >= 1 && GH <= 32 && DQK % 16 == 0 && DVO % 16 == 0, "shape");
  // The group's heads in 16-row M tiles: two for 17-32 heads (each warp then runs both on the same
  // K/V fragments, so the KV head is read once for all of them; q from shared memory).
  static constexpr int kMTiles = (GH + 15) / 16;
  static constexpr int kRows = kMTiles * 16;
  static_assert(kMTiles == 1 || DVO <= 128, "two M tiles hold DVO / 2 accumulators per thread each");
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kTile = WARPS * 16;
  static constexpr int kPitchK = ((DQK * kKVBytes / 16) | 1) * 16;  // bytes; odd 16-byte multiple
  static constexpr int kPitchV = ((DVO * kKVBytes / 16) | 1) * 16;
  static constexpr int kPitchQ = ((DQK * 2 / 16) | 1) * 16;  // q in the MMA type
  static constexpr int kChunksK = DQK * kKVBytes / 16, kChunksV = DVO * kKVBytes / 16;
  // fp8: after q's rows, each row's logit scale (2^-k) and q scale (2^k); q_bytes of smem_layout.
  static constexpr int kQBytes = mma_q_bytes(DQK, kKVBytes, kMTiles);
  static constexpr bool kQInRegisters = DQK <= 128 && kMTiles == 1;
  static constexpr float kLog2e = 1.4426950408889634f;

  static constexpr int kStageBytes = kTile * (kPitchK + kPitchV);
  static constexpr int kPipeBytes = STAGES * kStageBytes;
  static constexpr int kMergeBytes = mma_merge_bytes(DVO, WARPS, kMTiles);
  static constexpr int kBigBytes = kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes;

  // Page ids of a tile live in a shared ring of kRing slots, fetched one tile ahead of the data
  // so that no cp.async waits on a dependent global load of kv_indices.
  static constexpr int kRing = STAGES + 1;
  static constexpr int kIdsPerTile = kTile + 1;  // worst case: page size 1, or an unaligned tile
  static constexpr int kRingBytes = kRing * kIdsPerTile * 4;
  static constexpr int kSmemBytes = kBigBytes + kQBytes + kRingBytes;
  static_assert(kStageBytes == mma_stage_bytes(DQK, DVO, WARPS, kKVBytes), "host and device agree");
  static_assert(kSmemBytes == mma_smem_bytes(DQK, DVO, STAGES, WARPS, kKVBytes, kMTiles), "host and device agree");

  // A warp's online-softmax state: per M tile, the max and weight sum of its two fragment rows
  // (g and g + 8) and the unnormalised O rows.
  struct State {
    float m[kMTiles][2], d[kMTiles][2], acc[kMTiles][DVO / 8][4];
  };

  static __device__ __forceinline__ int page_size(const DecodeParams& p) {
    return PAGE > 0 ? PAGE : p.page_size;
  }
  // Thread i < kIdsPerTile loads the i-th page id of the tile as it is; `pos` gets its position in
  // kv_indices, or -1 past the range (nothing loaded). Nothing here uses the value, so the load
  // stays in flight through the tile's math until check_page_id (a check right after the load
  // made every tile wait for it).
  static __device__ __forceinline__ int32_t load_page_id(const DecodeParams& p, int32_t tile0,
                                                         int32_t kv_end, int32_t page_base, int32_t& pos) {
    const int ps = page_size(p);
    const int32_t first = tile0 / ps;
    const int32_t last = (min(tile0 + kTile, kv_end) - 1) / ps;
    const int32_t i = first + int32_t(threadIdx.x);
    pos = (threadIdx.x >= kIdsPerTile || tile0 >= kv_end || i > last) ? -1 : page_base + i;
    return pos < 0 ? -1 : p.kv_indices[pos];
  }
  // The loaded id, or -1 past the range or out of [0, num_pages) (recorded; `bad` set).
  static __device__ __forceinline__ int32_t check_page_id(const DecodeParams& p, int32_t pos, int32_t id,
                                                          bool& bad) {
    if (pos < 0) return -1;
    if (id >= 0 && id < p.num_pages) return id;
    report_bad_page(p, pos, id);
    bad = true;
    return -1;
  }
  static __device__ __forceinline__ int32_t fetch_page_id(const DecodeParams& p, int32_t tile0,
                                                          int32_t kv_end, int32_t page_base, bool& bad) {
    int32_t pos;
    const int32_t id = load_page_id(p, tile0, kv_end, page_base, pos);
    return check_page_id(p, pos, id, bad);
  }

  static __device__ void load_tile(const DecodeParams& p, char* smem, int stage, int32_t tile0,
                                   int32_t kv_end, const int32_t* ids, int kv_head) {
    const int ps = page_size(p);
    const int32_t first = tile0 / ps;
    const char* kbase = static_cast<const char*>(p.k) + kv_head * p.k_stride_head * kKVBytes;
    const char* vbase = static_cast<const char*>(p.v) + kv_head * p.v_stride_head * kKVBytes;
    char* kdst = smem + stage * kStageBytes;
    char* vdst = kdst + kTile * kPitchK;
    for (int id = threadIdx.x; id < kTile * (kChunksK + kChunksV); id += kThreads) {
      const bool is_k = id < kTile * kChunksK;
      const int local = is_k ? id : id - kTile * kChunksK;
      const int chunks = is_k ? kChunksK : kChunksV;
      const int r = local / chunks, c = local % chunks;
      const int32_t tok = tile0 + r;
      const int64_t page = tok < kv_end ? ids[tok / ps - first] : -1;  // -1: past the range or bad
      const bool valid = page >= 0;
      const char* src = is_k ? kbase : vbase;
      if (valid) {
        src += ((is_k ? p.k_stride_page : p.v_stride_page) * page +
                (is_k ? p.k_stride_token : p.v_stride_token) * int64_t(tok % ps)) * kKVBytes + c * 16;
      }
      cp_async_16((is_k ? kdst + r * kPitchK : vdst + r * kPitchV) + c * 16, src, valid);
    }
  }

  // The dim of q that MMA column `col` holds: the same, or for fp8 K/V the permutation of the
  // header (within each 16-dim chunk, columns 2t, 2t+1 take dims 4t, 4t+1 and 2t+8, 2t+9 take
  // 4t+2, 4t+3). Pairs (col even) stay pairs.
  static __device__ __forceinline__ int q_column(int col) {
    if constexpr (!kFp8) return col;
    const int in_chunk = col % 16;
    return col - in_chunk + 4 * ((in_chunk % 8) / 2) + 2 * (in_chunk / 8) + in_chunk % 2;
  }
  // Each row's scale of the logits: sm_scale, or for fp8 K/V sm_scale times the row's 2^-k.
  static __device__ __forceinline__ const float* row_logit_scales(const char* qs) {
    return reinterpret_cast<const float*>(qs + kRows * kPitchQ);
  }

  // q rows [kRows][DQK] in the MMA type at `qs` (pitch kPitchQ); rows past GH are zero. The caller
  // synchronises before the rows are read. For fp8 K/V also each row's logit scale (bf16 q: the
  // power of two 2^k that puts the row's largest magnitude in [2^14, 2^15) multiplies the row, and
  // 2^-k goes to the logits; a zero or non-finite maximum keeps k = 0).
  static __device__ __forceinline__ void stage_q(const DecodeParams& p, char* qs, const DeviceDecodeItem& item,
                                                 int head0) {
    [[maybe_unused]] float* scales = reinterpret_cast<float*>(qs + kRows * kPitchQ);  // logit [kRows], q [kRows]
    if constexpr (kFp8) {
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
      for (int row = warp; row < kRows; row += WARPS) {
        int k = 0;
        if constexpr (kScaledQ) {
          float mx = 0.0f;
          if (row < GH) {
            const int64_t base = item.request * p.q_stride_n + (head0 + row) * p.q_stride_h;
            for (int e = lane; e < DQK; e += 32) mx = fmaxf(mx, fabsf(load_as_f32<QDT>(p.q, base + e)));
          }
#pragma unroll
          for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
          if (mx > 0.0f && mx <= 3.402823466e38f) {
            const int e = int((__float_as_uint(mx) >> 23) & 0xffu) - 127;  // floor(log2(mx)); -127: subnormal
            k = min(64, max(-126, 14 - e));
          }
        }
        if (lane == 0) {
          scales[row] = p.variant.sm_scale * __int_as_float((127 - k) << 23);
          scales[kRows + row] = __int_as_float((127 + k) << 23);
        }
      }
      __syncthreads();  // the q scales are written before the rows below read them
    }
    for (int i = threadIdx.x; i < kRows * DQK / 2; i += kThreads) {
      const int row = i / (DQK / 2), e = 2 * (i % (DQK / 2));
      float x0 = 0.0f, x1 = 0.0f;
      if (row < GH) {
        const int64_t base = item.request * p.q_stride_n + (head0 + row) * p.q_stride_h + q_column(e);
        x0 = load_as_f32<QDT>(p.q, base);
        x1 = load_as_f32<QDT>(p.q, base + 1);
        if constexpr (kScaledQ) {
          x0 *= scales[kRows + row];
          x1 *= scales[kRows + row];
        }
      }
      *reinterpret_cast<uint32_t*>(qs + row * kPitchQ + e * 2) = pack2<MT>(x0, x1);
    }
  }

  // The warp's q as MMA A fragments (when kQInRegisters), from the rows stage_q wrote at qs.
  static __device__ __forceinline__ void load_q_fragments(const char* qs,
                                                          uint32_t (&qfrag)[kQInRegisters ? DQK / 16 : 1][4]) {
    if constexpr (kQInRegisters) {
      const int lane = threadIdx.x % 32;
      const int q_row = (lane / 8 % 2) * 8 + lane % 8, q_col = (lane / 16) * 8;
#pragma unroll
      for (int ks = 0; ks < DQK / 16; ++ks) ldmatrix_x4(qfrag[ks], qs + q_row * kPitchQ + (ks * 16 + q_col) * 2);
    }
  }
  // The online-softmax state at the start of an item: no max, no weight, a zero accumulator.
  static __device__ __forceinline__ void reset_state(State& st) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      st.m[mt][0] = st.m[mt][1] = -INFINITY;
      st.d[mt][0] = st.d[mt][1] = 0.0f;
#pragma unroll
      for (int n = 0; n < DVO / 8; ++n)
#pragma unroll
        for (int j = 0; j < 4; ++j) st.acc[mt][n][j] = 0.0f;
    }
  }

  // Byte offset of (row, byte column) in a warp's block of 16 rows stored as DecodeTmaKernel's TMA
  // boxes: [columns / 128][16 rows][128 bytes], the 16-byte chunks of each 128-byte row XOR-swizzled
  // by row % 8 (CU_TENSOR_MAP_SWIZZLE_128B on a 1024-byte aligned block), so the 8 rows that one
  // ldmatrix phase reads fall in 8 different bank groups.
  static __device__ __forceinline__ int swizzled_offset(int row, int col_bytes) {
    return (col_bytes / 128) * (16 * 128) + row * 128 + ((((col_bytes / 16) % 8) ^ (row % 8)) * 16) + col_bytes % 16;
  }

  // The math of one warp's 16 tokens of a tile, whose K rows start at ks_base and V rows at
  // vs_base: padded rows of pitch kPitchK / kPitchV, or with SWIZZLED the warp's blocks in the
  // swizzled box layout above; tok0 is the first token. Updates the warp's online-softmax state.
  // Each K and V fragment is loaded (and for fp8 converted) once for all M tiles. Also used by
  // DecodeBulkKernel and DecodeTmaKernel.
  template <bool SWIZZLED = false>
  static __device__ __forceinline__ void tile_math(const DecodeParams& p, const DeviceDecodeItem& item,
                                                   const char* ks_base, const char* vs_base,
                                                   const uint32_t (&qfrag)[kQInRegisters ? DQK / 16 : 1][4],
                                                   const char* qs, int32_t tok0, int head0, int32_t kv_len,
                                                   State& st) {
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;  // fragment row and column pair
    const int q_row = (lane / 8 % 2) * 8 + lane % 8, q_col = (lane / 16) * 8;
    // S = Q K^T for this warp's 16 tokens: two n-tiles of 8 tokens per M tile.
    float s[kMTiles][2][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int j = 0; j < 4; ++j) s[mt][n][j] = 0.0f;
    auto k_offset = [&](int row, int col_bytes) {
      return SWIZZLED ? swizzled_offset(row, col_bytes) : row * kPitchK + col_bytes;
    };
    // S += Q[:, chunk ks] K[16 tokens, chunk ks]^T: B registers (b0, b1) of n-tile 0 and 1.
    auto qk = [&](int ks, uint32_t n0b0, uint32_t n0b1, uint32_t n1b0, uint32_t n1b1) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        if constexpr (kQInRegisters) {
          mma_16816<MT>(s[mt][0], qfrag[ks], n0b0, n0b1);
          mma_16816<MT>(s[mt][1], qfrag[ks], n1b0, n1b1);
        } else {
          uint32_t a[4];
          ldmatrix_x4(a, qs + (mt * 16 + q_row) * kPitchQ + (ks * 16 + q_col) * 2);
          mma_16816<MT>(s[mt][0], a, n0b0, n0b1);
          mma_16816<MT>(s[mt][1], a, n1b0, n1b1);
        }
      }
    };
    // Matrices of an x4 ldmatrix: tokens 0-7 then 8-15 (lane / 16), 16-byte columns 0 and 1 (lane / 8 % 2).
    const int k_row = (lane / 16) * 8 + lane % 8, k_col_bytes = (lane / 8 % 2) * 16;
    if constexpr (!kFp8) {
#pragma unroll
      for (int ks = 0; ks < DQK / 16; ++ks) {
        uint32_t b[4];
        ldmatrix_x4(b, ks_base + k_offset(k_row, ks * 32 + k_col_bytes));
        qk(ks, b[0], b[1], b[2], b[3]);
      }
    } else {
      // Each 16-byte column is a 16-dim chunk: an x4 covers chunks ks and ks + 1 of both n-tiles;
      // a register's bytes 0-1 are B's first register, bytes 2-3 its second (the header).
#define KVATTN_FP8_B(r) fp8_pair_to_f16x2<DT, 0, 1>(r), fp8_pair_to_f16x2<DT, 2, 3>(r)
#pragma unroll
      for (int ks = 0; ks + 1 < DQK / 16; ks += 2) {
        uint32_t r[4];
        ldmatrix_x4(r, ks_base + k_offset(k_row, ks * 16 + k_col_bytes));
        qk(ks, KVATTN_FP8_B(r[0]), KVATTN_FP8_B(r[2]));
        qk(ks + 1, KVATTN_FP8_B(r[1]), KVATTN_FP8_B(r[3]));
      }
      if constexpr (DQK / 16 % 2 == 1) {  // the last chunk alone: tokens 0-7 and 8-15 (lanes 0-15)
        constexpr int ks = DQK / 16 - 1;
        uint32_t r[2];
        ldmatrix_x2(r, ks_base + k_offset(lane % 16, ks * 16));
        qk(ks, KVATTN_FP8_B(r[0]), KVATTN_FP8_B(r[1]));
      }
#undef KVATTN_FP8_B
    }
    const bool softmax_on = Variant::use_softmax(p.variant);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      float logit_scale[2] = {p.variant.sm_scale, p.variant.sm_scale};
      if constexpr (kFp8) {
        logit_scale[0] = row_logit_scales(qs)[mt * 16 + g];
        logit_scale[1] = row_logit_scales(qs)[mt * 16 + g + 8];
      }
      // Variant: mask and logit transform per element; rows past GH are padding.
      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int row = mt * 16 + g + (j >= 2 ? 8 : 0);
          const int32_t tok = tok0 + n * 8 + 2 * t4 + (j & 1);
          float x = -INFINITY;
          if (row < GH && tok < item.kv_end) {
            LogitCoord c{item.request, head0 + row, 0, tok, kv_len - 1, tok, kv_len};
            if (Variant::logits_mask(p.variant, c))
              x = Variant::logits_transform(p.variant, logit_scale[j / 2] * s[mt][n][j], c) * kLog2e;
          }
          s[mt][n][j] = x;
          tile_max[j / 2] = fmaxf(tile_max[j / 2], x);
        }
      if (softmax_on) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
          tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
          const float m_new = fmaxf(st.m[mt][r], tile_max[r]);
          const float scale = m_new == -INFINITY ? 1.0f : exp2f(st.m[mt][r] - m_new);
          st.d[mt][r] *= scale;
          // The running max of a row rarely moves after the first tiles: skip the DVO / 4 multiplies
          // of the accumulator unless some row of the warp moved (scale is exactly 1 otherwise).
          if (__any_sync(0xffffffffu, scale != 1.0f)) {
#pragma unroll
            for (int n = 0; n < DVO / 8; ++n) {
              st.acc[mt][n][2 * r] *= scale;
              st.acc[mt][n][2 * r + 1] *= scale;
            }
          }
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int j = 2 * r; j < 2 * r + 2; ++j) {
              s[mt][n][j] = m_new == -INFINITY ? 0.0f : exp2f(s[mt][n][j] - m_new);
              st.d[mt][r] += s[mt][n][j];
            }
          st.m[mt][r] = m_new;
        }
      } else {
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int j = 0; j < 4; ++j)
            s[mt][n][j] = s[mt][n][j] == -INFINITY ? 0.0f : Variant::weight(p.variant, s[mt][n][j] / kLog2e);
      }
    }
    // O += P V, P as the A fragment (16 heads x 16 tokens) of each M tile.
    uint32_t pa[kMTiles][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      pa[mt][0] = pack2<MT>(s[mt][0][0], s[mt][0][1]);
      pa[mt][1] = pack2<MT>(s[mt][0][2], s[mt][0][3]);
      pa[mt][2] = pack2<MT>(s[mt][1][0], s[mt][1][1]);
      pa[mt][3] = pack2<MT>(s[mt][1][2], s[mt][1][3]);
    }
    // acc[n] += P B for B registers (b0, b1), every M tile.
    auto pv = [&](int n, uint32_t b0, uint32_t b1) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) mma_16816<MT>(st.acc[mt][n], pa[mt], b0, b1);
    };
    auto v_offset = [&](int row, int col_bytes) {
      return SWIZZLED ? swizzled_offset(row, col_bytes) : row * kPitchV + col_bytes;
    };
    // Matrices of an x4 ldmatrix.trans: tokens 0-7 then 8-15 (lane / 8 % 2), 16-byte columns 0 and 1 (lane / 16).
    const int v_row = (lane / 8 % 2) * 8 + lane % 8, v_col_bytes = (lane / 16) * 16;
    if constexpr (!kFp8) {
#pragma unroll
      for (int dn = 0; dn < DVO / 16; ++dn) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vs_base + v_offset(v_row, dn * 32 + v_col_bytes));
        pv(2 * dn, b[0], b[1]);
        pv(2 * dn + 1, b[2], b[3]);
      }
    } else {
      // A register of tokens (2t, 2t+1) x dims (2g, 2g+1): bytes 0 and 2 are the even dim's pair of
      // tokens, bytes 1 and 3 the odd dim's (the header's V permutation): chunk c's n-tiles 2c, 2c + 1.
      auto pv_chunk = [&](int c, uint32_t lo_tokens, uint32_t hi_tokens) {
        pv(2 * c, fp8_pair_to_f16x2<DT, 0, 2>(lo_tokens), fp8_pair_to_f16x2<DT, 0, 2>(hi_tokens));
        pv(2 * c + 1, fp8_pair_to_f16x2<DT, 1, 3>(lo_tokens), fp8_pair_to_f16x2<DT, 1, 3>(hi_tokens));
      };
#pragma unroll
      for (int c = 0; c + 1 < DVO / 16; c += 2) {
        uint32_t r[4];
        ldmatrix_x4_trans(r, vs_base + v_offset(v_row, c * 16 + v_col_bytes));
        pv_chunk(c, r[0], r[1]);
        pv_chunk(c + 1, r[2], r[3]);
      }
      if constexpr (DVO / 16 % 2 == 1) {  // the last chunk alone: tokens 0-7 and 8-15 (lanes 0-15)
        constexpr int c = DVO / 16 - 1;
        uint32_t r[2];
        ldmatrix_x2_trans(r, vs_base + v_offset(lane % 16, c * 16));
        pv_chunk(c, r[0], r[1]);
      }
    }
  }

  // Merges the warps' states through shared memory (aliasing the K/V stages, so every warp must be
  // done with them) and writes the rows out, or a split row's partial state to the workspace.
  static __device__ __forceinline__ void merge_and_store(const DecodeParams& p, char* smem,
                                                         const DeviceDecodeItem& item, int head0, int group,
                                                         State& st, bool poisoned) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;
    // Merge the warps' states: per warp m[kRows], d[kRows], acc[kRows][DVO] in shared memory, of
    // which only the GH real rows are written and read (the M tile's other rows are padding; with a
    // group of 4 that is a quarter of the stores).
    float* mw = reinterpret_cast<float*>(smem);
    float* dw = mw + WARPS * kRows;
    float* aw = dw + WARPS * kRows;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (16 * mt + 8 * r >= GH) break;  // rows that hold no head (a compile-time test)
        float (&d)[2] = st.d[mt];
        const float (&acc)[DVO / 8][4] = st.acc[mt];
        d[r] += __shfl_xor_sync(0xffffffffu, d[r], 1);
        d[r] += __shfl_xor_sync(0xffffffffu, d[r], 2);
        const int row = 16 * mt + g + 8 * r;
        if (row >= GH) continue;
        if (t4 == 0) {
          mw[warp * kRows + row] = st.m[mt][r];
          dw[warp * kRows + row] = d[r];
        }
        float* out_row = aw + (warp * kRows + row) * DVO;
        if constexpr (kFp8) {  // acc[2c] holds dims 16c + 4t and + 2, acc[2c + 1] + 1 and + 3
#pragma unroll
          for (int c = 0; c < DVO / 16; ++c)
            *reinterpret_cast<float4*>(out_row + c * 16 + 4 * t4) =
                make_float4(acc[2 * c][2 * r], acc[2 * c + 1][2 * r], acc[2 * c][2 * r + 1], acc[2 * c + 1][2 * r + 1]);
        } else {
#pragma unroll
          for (int n = 0; n < DVO / 8; ++n)
            *reinterpret_cast<float2*>(out_row + n * 8 + 2 * t4) = make_float2(acc[n][2 * r], acc[n][2 * r + 1]);
        }
      }
    __syncthreads();
    const bool softmax_on = Variant::use_softmax(p.variant);
    // Four consecutive elements of one row per thread: one round for a group of 4 at DVO 128.
    for (int i = threadIdx.x; i < GH * DVO / 4; i += kThreads) {
      const int row = i / (DVO / 4), e = i % (DVO / 4) * 4;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, mw[w * kRows + row]);
      float num[4] = {0.0f, 0.0f, 0.0f, 0.0f}, den = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const float4 x4 = *reinterpret_cast<const float4*>(aw + (w * kRows + row) * DVO + e);
        const float x[4] = {x4.x, x4.y, x4.z, x4.w};
        float wt = 1.0f;  // sigmoid attention: the plain sum
        if (softmax_on) {
          const float mwv = mw[w * kRows + row];
          wt = mwv == -INFINITY ? 0.0f : exp2f(mwv - mx);
          den += wt * dw[w * kRows + row];
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) num[j] += wt * x[j];
      }
      float o[4], lse = -INFINITY;
      if (softmax_on) lse = den > 0.0f ? mx + log2f(den) : -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        o[j] = softmax_on ? (den > 0.0f ? num[j] / den : 0.0f) : num[j];
        o[j] = poisoned ? NAN : o[j] * p.variant.v_scale;
      }
      if (poisoned) lse = NAN;
      const int qo_head = head0 + row;
      if (item.partial_slot < 0) {
        if constexpr (kHasRowEpilogue<Variant>)
          finish_row<Variant>(p.variant, item.request, decode_query_position(item), qo_head, e, o, 4, lse);
        const int64_t at = item.request * p.o_stride_n + qo_head * p.o_stride_h + e;
#pragma unroll
        for (int j = 0; j < 4; ++j) store_from_f32<ODT>(p.o, at + j, o[j]);
        if (p.lse && e == 0) p.lse[item.request * p.lse_stride_n + qo_head * p.lse_stride_h] = lse;
      } else {
        const int gh = qo_head - item.kv_head * group;
        *reinterpret_cast<float4*>(p.partial_o + (int64_t(item.partial_slot) * group + gh) * DVO + e) =
            make_float4(o[0], o[1], o[2], o[3]);
        if (e == 0) p.partial_lse[int64_t(item.partial_slot) * group + gh] = lse;
      }
    }
    fold_split_if_last<ODT, DVO, Variant>(p, item, head0 - item.kv_head * group, GH);
  }

  static __device__ void run_item(const DecodeParams& p, char* smem, const DeviceDecodeItem& item) {
    const int warp = threadIdx.x / 32;
    const int group = p.num_qo_heads / p.num_kv_heads;
    const int head0 = item.kv_head * group + blockIdx.y * GH;
    const int32_t page_base = item.page_base, kv_len = item.kv_len;
    const int32_t n_tiles = (item.kv_end - item.kv_begin + kTile - 1) / kTile;

    int32_t* ring = reinterpret_cast<int32_t*>(smem + kBigBytes + kQBytes);
    auto tile_start = [&](int tile) { return item.kv_begin + tile * kTile; };
    bool bad = false;  // a page id was out of range: the rows come out NaN
    for (int st = 0; st < STAGES && st < n_tiles; ++st) {
      const int32_t id = fetch_page_id(p, tile_start(st), item.kv_end, page_base, bad);
      if (threadIdx.x < kIdsPerTile) ring[st * kIdsPerTile + threadIdx.x] = id;
    }
    __syncthreads();
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
      if (st < n_tiles) load_tile(p, smem, st, tile_start(st), item.kv_end, ring + st * kIdsPerTile, item.kv_head);
      cp_async_commit();
    }
    char* qs = smem + kBigBytes;
    stage_q(p, qs, item, head0);
    __syncthreads();
    uint32_t qfrag[kQInRegisters ? DQK / 16 : 1][4];
    load_q_fragments(qs, qfrag);
    State st;
    reset_state(st);

    for (int tile = 0; tile < n_tiles; ++tile) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // tile `tile` is visible; the stage loaded next was consumed last round
      const int ahead = tile + STAGES - 1;
      if (ahead < n_tiles)
        load_tile(p, smem, ahead % STAGES, tile_start(ahead), item.kv_end,
                  ring + (ahead % kRing) * kIdsPerTile, item.kv_head);
      cp_async_commit();
      // Page ids of the tile after that: loaded now, checked and stored after this tile's math.
      int32_t next_pos = -1;
      const int32_t next_raw = tile + STAGES < n_tiles
          ? load_page_id(p, tile_start(tile + STAGES), item.kv_end, page_base, next_pos) : -1;

      const char* ks_base = smem + (tile % STAGES) * kStageBytes + warp * 16 * kPitchK;
      const char* vs_base = smem + (tile % STAGES) * kStageBytes + kTile * kPitchK + warp * 16 * kPitchV;
      const int32_t tok0 = item.kv_begin + tile * kTile + warp * 16;

      tile_math(p, item, ks_base, vs_base, qfrag, qs, tok0, head0, kv_len, st);
      if (tile + STAGES < n_tiles && threadIdx.x < kIdsPerTile)
        ring[((tile + STAGES) % kRing) * kIdsPerTile + threadIdx.x] = check_page_id(p, next_pos, next_raw, bad);
    }
    cp_async_wait<0>();
    const bool poisoned = __syncthreads_or(bad);

    merge_and_store(p, smem, item, head0, group, st, poisoned);
  }
};

// The kernel of a named configuration (cuda::decode_spec generates one: q_dtype, kv_dtype,
// o_dtype, head_dim_qk, head_dim_vo, heads_per_cta, page_size, features, stages, warps).
template <class C>
using DecodeMmaKernelFor = DecodeMmaKernel<C::q_dtype, C::kv_dtype, C::o_dtype, C::head_dim_qk, C::head_dim_vo, C::heads_per_cta,
                        C::page_size, C::features, C::stages, C::warps, typename C::Variant>;

}  // namespace kvattn::kernels::decode
