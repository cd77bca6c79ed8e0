// Paged batch decode on tensor cores, transposed ("_t", KVATTN_DECODE_KERNEL=transposed): the
// same work item, pipeline, page-id ring and outputs as DecodeMmaKernel, but the MMAs run with the
// KV tokens as the 16 rows of the A tile and the query heads as the 8 columns of the B tile, so a
// group of <= 8 heads wastes no MMA rows on padding and each KV byte costs half the math:
//   S^T = K Q^T    A = K [16 tokens][16 dims] by ldmatrix, B = Q^T fragments kept in registers
//   P^T            the S^T accumulator packed to f16x2/bf16x2 and transposed per 8x8 block with
//                  movmatrix: rows tokens 0-7 give B's first register, tokens 8-15 the second
//   O^T += V^T P^T A = V^T by ldmatrix.trans of V [token][dim], B = P^T
// Groups of 9-16 heads per CTA run two n-tiles of 8 heads on the same K/V fragments (so a group of
// 16 still reads its KV once); smaller groups run one, with the heads past GH as zero rows of Q.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 f16/bf16; g = lane / 4, t = lane % 4):
//   A  a0 (row g, k 2t..2t+1)  a1 (row g+8, k 2t..)  a2 (row g, k 2t+8..)  a3 (row g+8, k 2t+8..)
//   B  b0 (k 2t..2t+1, col g)  b1 (k 2t+8..2t+9, col g)
//   C  c0, c1 (row g, cols 2t, 2t+1)   c2, c3 (row g+8, cols 2t, 2t+1)
// ldmatrix (and movmatrix's input and output) hold an 8x8 matrix as row g, cols 2t..2t+1 per
// lane; ldmatrix.trans hands out the transpose of the stored block. So each thread owns the scores
// of tokens g and g+8 for heads 2t and 2t+1 (of each n-tile), and the output O^T[dim][head] of
// dims g, g+8 (of each 16-dim m-tile) for the same two heads: the online-softmax state of a head
// is shared by the 8 lanes with the same t and reduced with shfl_xor 4, 8, 16.
#pragma once

#include "kernels/common/mma.cuh"
#include "kernels/decode/decode_mma_kernel.cuh"
#include "kernels/decode/params.cuh"
#include "kernels/decode/smem_layout.cuh"
#include "kernels/variants/builtin.cuh"

namespace kvattn::kernels::decode {

namespace mma_t_detail {

__device__ __forceinline__ void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_addr(smem)));
}
// The transpose of an 8x8 b16 matrix held in the ldmatrix fragment layout (sm_75+).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}
// 2^x; ex2(-inf) = +0.
__device__ __forceinline__ float ex2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

}  // namespace mma_t_detail

// Template order as every kernel family's: q, KV (the MMA type: tensor cores take q == KV), output.
template <int QDT, int DT, int ODT, int DQK, int DVO, int GH, int PAGE, uint32_t FEATURES,
          int STAGES, int WARPS>
struct DecodeMmaTKernel {
  using Variant = BuiltinVariant<FEATURES>;
  // The K/V stages and the page-id ring are laid out as in DecodeMmaKernel: its tile loads and
  // page-id fetches are used as they are.
  using Base = DecodeMmaKernel<QDT, DT, ODT, DQK, DVO, GH, PAGE, FEATURES, STAGES, WARPS>;
  static_assert(DT == kF16 || DT == kBF16, "the tensor-core decode reads f16 or bf16 KV");
  static_assert(FEATURES != kDynamicFeatures && !(FEATURES & kRope) && !(FEATURES & kCustomMask),
                "fused RoPE and custom masks run on the CUDA-core decode kernel");
  static_assert(GH >= 1 && GH <= 16 && DQK % 16 == 0 && DVO % 16 == 0 && STAGES >= 2, "shape");
  static constexpr int kThreads = WARPS * 32;
  static constexpr int kTile = WARPS * 16;
  static constexpr int kNT = (GH + 7) / 8;  // n-tiles of 8 heads
  static constexpr int kPitchK = Base::kPitchK, kPitchV = Base::kPitchV, kPitchQ = Base::kPitchQ;
  static constexpr bool kQInRegisters = DQK * kNT <= 256;  // 2 registers per 16 dims and n-tile
  static constexpr float kLog2e = 1.4426950408889634f;
  static constexpr bool kSoftmax = !(FEATURES & kSigmoid);
  // Per-element work only where it can change a score: transforms, masks, sigmoid weights.
  static constexpr bool kPerElement =
      (FEATURES & (kSoftCap | kAlibi | kCausal | kSlidingWindow | kSigmoid)) != 0;

  static constexpr int kStageBytes = Base::kStageBytes;
  static constexpr int kPipeBytes = STAGES * kStageBytes;
  // Merge buffers per warp: m[16], d[16], O [16 heads][kMergePitch] (pitch DVO + 4 floats: the
  // fragment stores of one instruction hit 32 different banks).
  static constexpr int kMergePitch = DVO + 4;
  static constexpr int kMergeBytes = WARPS * 16 * (kMergePitch + 2) * 4;
  static constexpr int kBigBytes = kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes;
  static constexpr int kRing = Base::kRing;
  static constexpr int kIdsPerTile = Base::kIdsPerTile;
  static constexpr int kRingBytes = kRing * kIdsPerTile * 4;
  static constexpr int kSmemBytes = kBigBytes + 16 * kPitchQ + kRingBytes;
  static_assert(kSmemBytes == mma_t_smem_bytes(DQK, DVO, STAGES, WARPS), "host and device agree");

  static __device__ void run_item(const DecodeParams& p, char* smem, const DeviceDecodeItem& item) {
    using namespace mma_t_detail;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int group = p.num_qo_heads / p.num_kv_heads;
    const int head0 = item.kv_head * group + blockIdx.y * GH;
    const int32_t page_base = item.page_base, kv_len = item.kv_len;
    const int32_t n_tiles = (item.kv_end - item.kv_begin + kTile - 1) / kTile;

    int32_t* ring = reinterpret_cast<int32_t*>(smem + kBigBytes + 16 * kPitchQ);
    auto tile_start = [&](int tile) { return item.kv_begin + tile * kTile; };
    bool bad = false;  // a page id was out of range: the rows come out NaN
    for (int st = 0; st < STAGES && st < n_tiles; ++st) {
      const int32_t id = Base::fetch_page_id(p, tile_start(st), item.kv_end, page_base, bad);
      if (threadIdx.x < kIdsPerTile) ring[st * kIdsPerTile + threadIdx.x] = id;
    }
    __syncthreads();
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
      if (st < n_tiles)
        Base::load_tile(p, smem, st, tile_start(st), item.kv_end, ring + st * kIdsPerTile, item.kv_head);
      cp_async_commit();
    }
    // q rows [16][DQK] in the MMA type; rows past GH are zero.
    char* qs = smem + kBigBytes;
    for (int i = threadIdx.x; i < 16 * DQK / 2; i += kThreads) {
      const int row = i / (DQK / 2), e = 2 * (i % (DQK / 2));
      float x0 = 0.0f, x1 = 0.0f;
      if (row < GH) {
        const int64_t base = item.request * p.q_stride_n + (head0 + row) * p.q_stride_h + e;
        x0 = load_as_f32<QDT>(p.q, base);
        x1 = load_as_f32<QDT>(p.q, base + 1);
      }
      *reinterpret_cast<uint32_t*>(qs + row * kPitchQ + e * 2) = pack2<DT>(x0, x1);
    }
    __syncthreads();
    // B = Q^T (16 dims x 8 heads): the [head][dim] rows of q give b0 (dims 0-7) and b1 (dims
    // 8-15) by plain ldmatrix; lanes 0-7 address the first matrix, 8-15 the second.
    const int qb_row = lane % 8, qb_col = (lane / 8 % 2) * 8;
    uint32_t qb[kQInRegisters ? DQK / 16 : 1][kNT][2];
    if constexpr (kQInRegisters) {
#pragma unroll
      for (int ks = 0; ks < DQK / 16; ++ks)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
          ldmatrix_x2(qb[ks][nt][0], qb[ks][nt][1],
                      qs + (nt * 8 + qb_row) * kPitchQ + (ks * 16 + qb_col) * 2);
    }

    float m[kNT][2], d[kNT][2];  // per head 2t + h of n-tile nt, log2 domain
    float acc[DVO / 16][kNT][4];  // O^T[dim][head]
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      m[nt][0] = m[nt][1] = -INFINITY;
      d[nt][0] = d[nt][1] = 0.0f;
    }
#pragma unroll
    for (int dm = 0; dm < DVO / 16; ++dm)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[dm][nt][j] = 0.0f;
    const float scale_log2 = p.variant.sm_scale * kLog2e;
    // ldmatrix lane addresses. K (A, non-trans): matrix i = lane / 8 is tokens (i % 2) * 8, dims
    // (i / 2) * 8. V^T (A, trans): matrix i is tokens (i / 2) * 8, dims (i % 2) * 8.
    const int k_row = (lane / 8 % 2) * 8 + lane % 8, k_col = (lane / 16) * 8;
    const int v_row = (lane / 16) * 8 + lane % 8, v_col = (lane / 8 % 2) * 8;

    for (int tile = 0; tile < n_tiles; ++tile) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // tile `tile` is visible; the stage loaded next was consumed last round
      const int ahead = tile + STAGES - 1;
      if (ahead < n_tiles)
        Base::load_tile(p, smem, ahead % STAGES, tile_start(ahead), item.kv_end,
                        ring + (ahead % kRing) * kIdsPerTile, item.kv_head);
      cp_async_commit();
      // Page ids of the tile after that: loaded now, checked and stored after this tile's math.
      int32_t next_pos = -1;
      const int32_t next_raw = tile + STAGES < n_tiles
          ? Base::load_page_id(p, tile_start(tile + STAGES), item.kv_end, page_base, next_pos) : -1;

      const char* ks_base = smem + (tile % STAGES) * kStageBytes + warp * 16 * kPitchK;
      const char* vs_base = smem + (tile % STAGES) * kStageBytes + kTile * kPitchK + warp * 16 * kPitchV;
      const int32_t tok0 = item.kv_begin + tile * kTile + warp * 16;

      // S^T = K Q^T: 16 tokens x 8 heads per n-tile.
      float s[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < DQK / 16; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, ks_base + k_row * kPitchK + (ks * 16 + k_col) * 2);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          if constexpr (kQInRegisters) {
            mma_16816<DT>(s[nt], a, qb[ks][nt][0], qb[ks][nt][1]);
          } else {
            uint32_t b0, b1;
            ldmatrix_x2(b0, b1, qs + (nt * 8 + qb_row) * kPitchQ + (ks * 16 + qb_col) * 2);
            mma_16816<DT>(s[nt], a, b0, b1);
          }
        }
      }
      // Scores in the log2 domain (softmax) or sigmoid weights; element j is token g + 8 * (j / 2)
      // and head nt * 8 + 2t + j % 2. Heads past GH (zero q rows) are computed and never written.
      if constexpr (kPerElement) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const int32_t tok = tok0 + g + (j & 2 ? 8 : 0);
            const LogitCoord c{item.request, head0 + nt * 8 + 2 * t + (j & 1), 0, tok, kv_len - 1, tok, kv_len};
            const bool keep = tok < item.kv_end && Variant::logits_mask(p.variant, c);
            const float y = Variant::logits_transform(p.variant, p.variant.sm_scale * s[nt][j], c);
            if constexpr (kSoftmax)
              s[nt][j] = keep ? y * kLog2e : -INFINITY;
            else
              s[nt][j] = keep ? Variant::sigmoid_weight(p.variant, y) : 0.0f;
          }
      } else {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int j = 0; j < 4; ++j) s[nt][j] *= scale_log2;
        if (tok0 + 16 > item.kv_end) {  // the warp's tokens run past the range: mask those
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j)
              if (tok0 + g + (j & 2 ? 8 : 0) >= item.kv_end) s[nt][j] = -INFINITY;
        }
      }
      if constexpr (kSoftmax) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          float scale[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float mx = fmaxf(s[nt][h], s[nt][h + 2]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
            const float m_new = fmaxf(m[nt][h], mx);
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // all masked so far: p = 0
            scale[h] = ex2(m[nt][h] - m_use);
            m[nt][h] = m_new;
            s[nt][h] = ex2(s[nt][h] - m_use);
            s[nt][h + 2] = ex2(s[nt][h + 2] - m_use);
            d[nt][h] = d[nt][h] * scale[h] + (s[nt][h] + s[nt][h + 2]);
          }
#pragma unroll
          for (int dm = 0; dm < DVO / 16; ++dm) {
            acc[dm][nt][0] *= scale[0];
            acc[dm][nt][1] *= scale[1];
            acc[dm][nt][2] *= scale[0];
            acc[dm][nt][3] *= scale[1];
          }
        }
      }
      // P^T (16 tokens x 8 heads) as the B fragment: [token][head] blocks transposed.
      uint32_t pb[kNT][2];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        pb[nt][0] = movmatrix_trans(pack2<DT>(s[nt][0], s[nt][1]));  // tokens 0-7
        pb[nt][1] = movmatrix_trans(pack2<DT>(s[nt][2], s[nt][3]));  // tokens 8-15
      }
      // O^T += V^T P^T, 16 dims per MMA.
#pragma unroll
      for (int dm = 0; dm < DVO / 16; ++dm) {
        uint32_t a[4];
        ldmatrix_x4_trans(a, vs_base + v_row * kPitchV + (dm * 16 + v_col) * 2);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) mma_16816<DT>(acc[dm][nt], a, pb[nt][0], pb[nt][1]);
      }
      if (tile + STAGES < n_tiles && threadIdx.x < kIdsPerTile)
        ring[((tile + STAGES) % kRing) * kIdsPerTile + threadIdx.x] =
            Base::check_page_id(p, next_pos, next_raw, bad);
    }
    cp_async_wait<0>();
    const bool poisoned = __syncthreads_or(bad);

    // Merge the warps' states: per warp m[16], d[16], O[16 heads][kMergePitch] in shared memory
    // (aliasing the drained K/V stages).
    float* mw = reinterpret_cast<float*>(smem);
    float* dw = mw + WARPS * 16;
    float* aw = dw + WARPS * 16;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float dd = d[nt][h];
        dd += __shfl_xor_sync(0xffffffffu, dd, 4);
        dd += __shfl_xor_sync(0xffffffffu, dd, 8);
        dd += __shfl_xor_sync(0xffffffffu, dd, 16);
        if (g == 0) {
          mw[warp * 16 + nt * 8 + 2 * t + h] = m[nt][h];
          dw[warp * 16 + nt * 8 + 2 * t + h] = dd;
        }
      }
#pragma unroll
    for (int dm = 0; dm < DVO / 16; ++dm)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int head = nt * 8 + 2 * t + (j & 1), dim = dm * 16 + g + (j & 2 ? 8 : 0);
          aw[(warp * 16 + head) * kMergePitch + dim] = acc[dm][nt][j];
        }
    __syncthreads();
    for (int i = threadIdx.x; i < GH * DVO; i += kThreads) {
      const int row = i / DVO, e = i % DVO;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, mw[w * 16 + row]);
      float num = 0.0f, den = 0.0f;
#pragma unroll
      for (int w = 0; w < WARPS; ++w) {
        const float x = aw[(w * 16 + row) * kMergePitch + e];
        if constexpr (!kSoftmax) {
          num += x;
        } else {
          const float mwv = mw[w * 16 + row];
          const float wt = mwv == -INFINITY ? 0.0f : exp2f(mwv - mx);
          num += wt * x;
          den += wt * dw[w * 16 + row];
        }
      }
      float o = num, lse = -INFINITY;
      if constexpr (kSoftmax) {
        o = den > 0.0f ? num / den : 0.0f;
        lse = den > 0.0f ? mx + log2f(den) : -INFINITY;
      }
      o *= p.variant.v_scale;
      if (poisoned) o = lse = NAN;
      const int qo_head = head0 + row;
      if (item.partial_slot < 0) {
        store_from_f32<ODT>(p.o, item.request * p.o_stride_n + qo_head * p.o_stride_h + e, o);
        if (p.lse && e == 0) p.lse[item.request * p.lse_stride_n + qo_head * p.lse_stride_h] = lse;
      } else {
        const int gh = qo_head - item.kv_head * group;
        p.partial_o[(int64_t(item.partial_slot) * group + gh) * DVO + e] = o;
        if (e == 0) p.partial_lse[int64_t(item.partial_slot) * group + gh] = lse;
      }
    }
    fold_split_if_last<ODT, DVO, Variant>(p, item, head0 - item.kv_head * group, GH);
  }
};

// The kernel of a named configuration (cuda::decode_spec generates one: q_dtype, kv_dtype,
// o_dtype, head_dim_qk, head_dim_vo, heads_per_cta, page_size, features, stages, warps).
template <class C>
using DecodeMmaTKernelFor = DecodeMmaTKernel<C::q_dtype, C::kv_dtype, C::o_dtype, C::head_dim_qk, C::head_dim_vo, C::heads_per_cta,
                        C::page_size, C::features, C::stages, C::warps>;

}  // namespace kvattn::kernels::decode
