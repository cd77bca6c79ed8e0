// The prefill kernel's compile-time configuration and its data movement: the Q tile (GQA-packed
// rows, fused RoPE applied on load), the page-id ring, the cp.async K/V tile copies (ragged or
// paged, NHD or HND through strides) and the in-shared-memory transform of a landed tile (fp8 to
// the MMA type, RoPE on K).
#pragma once

#include "kernels/common/mma.cuh"
#include "kernels/prefill/params.cuh"
#include "kernels/prefill/smem_layout.cuh"
#include "kernels/variants/epilogue.cuh"

namespace kvattn::kernels::prefill {

// The kernel's configuration, from a named one that the host generates for each kernel
// (cuda::prefill_spec): struct N { q_dtype, kv_dtype, o_dtype (kernels::DTypeCode numbers),
// head_dim_qk, head_dim_vo, heads_per_cta, warps, m_tiles, kv_warps, kv_tile, stages, paged,
// page_size, checked_ids, features, fast_tanh, tuning }, each a static constexpr member.
//  - q_dtype: q and MMA type (f16/bf16); kv_dtype: KV storage (q_dtype, e4m3 or e5m2);
//  - heads_per_cta (GH): query heads per CTA (rows r of the M tile: token r / GH, head r % GH);
//  - m_tiles (MT): 16-row MMA tiles per warp (each K/V fragment read from shared memory feeds MT
//    MMAs); page_size (PAGE): baked page size, 0 = read at run time;
//  - fast_tanh: soft-cap through tanh.approx.f32 instead of 1 - 2 / (1 + 2^(2x log2 e));
//  - checked_ids: paged ids from a device-resident table, checked here (host ids were checked on
//    the host);
//  - tuning: a PrefillTuning (smem_layout.cuh);
//  - kv_warps: warps that split each KV tile (the decode shape: every such warp takes kv_tile /
//    kv_warps tokens of a stage for the same M rows, and the warps' states are merged in shared
//    memory at the end); the CTA has warps x kv_warps.
template <class N>
struct PrefillConfig {
  static constexpr int DT = N::q_dtype, KVDT = N::kv_dtype, ODT = N::o_dtype;
  static constexpr int DQK = N::head_dim_qk, DVO = N::head_dim_vo, GH = N::heads_per_cta;
  static constexpr int WARPS = N::warps, MT = N::m_tiles, KV_TILE = N::kv_tile, STAGES = N::stages;
  static constexpr int PAGE = N::page_size;
  static constexpr int KV_WARPS = N::kv_warps, kWarpKV = KV_TILE / KV_WARPS;  // kWarpKV: one warp's tokens
  static constexpr bool PAGED = N::paged, FAST_TANH = N::fast_tanh, CHECK_IDS = N::paged && N::checked_ids;
  static constexpr uint32_t FEATURES = N::features;
  // The built-in variant of FEATURES, or a user variant composed with it (variants/custom.cuh):
  // user variants take ScoreMath's per-key hook path on every tile.
  using Variant = typename N::Variant;
  static_assert(DT == kF16 || DT == kBF16, "the tensor-core prefill computes in f16 or bf16");
  static_assert(KVDT == DT || KVDT == kE4M3 || KVDT == kE5M2, "KV is the q dtype or fp8");
  static_assert(DQK % 16 == 0 && DVO % 16 == 0 && DQK <= 256 && DVO <= 256, "head dims");
  static_assert(KV_TILE % 16 == 0 && STAGES >= 2 && (MT == 1 || MT == 2) && GH >= 1 && GH <= WARPS * 16 * MT,
                "tile shape");
  static_assert(FEATURES != kDynamicFeatures, "the JIT bakes the variant's features in");
  static_assert(KV_WARPS >= 1 && KV_TILE % (16 * KV_WARPS) == 0, "each KV warp takes a multiple of 16 tokens");
  static_assert(!PAGED || WARPS * KV_WARPS * 32 >= KV_TILE, "one thread per token fetches a tile's page ids");

  static constexpr int kThreads = WARPS * KV_WARPS * 32;
  static constexpr int kM = WARPS * 16 * MT;
  static constexpr int kKVBytes = DTypeInfo<KVDT>::bytes;
  static constexpr bool kConvert = KVDT != DT;
  static constexpr bool kHasRope = (FEATURES & kRope) != 0;
  static constexpr bool kTransform = kConvert || kHasRope;
  static constexpr int kPitchQ = pitch_bytes(DQK * 2);
  static constexpr PrefillTuning kTuning = N::tuning;
  static constexpr bool kLazyRescale = kTuning.softmax == SoftmaxForm::lazy_rescale;
  static constexpr bool kUnrollQK = kTuning.unroll_qk;
  static constexpr bool kPackP = kTuning.pack_p;
  static constexpr bool kLeanCopies = kTuning.lean_copies;
  static constexpr bool kWholeTileTransform = kTuning.whole_tile_transform;
  static constexpr bool kCapShift = kTuning.softmax == SoftmaxForm::fixed_shift && (FEATURES & kSoftCap) != 0 &&
                                    (FEATURES & (kSigmoid | kAlibi)) == 0 && DT == kBF16 && !Variant::kUser;
  // Whether the weights are a softmax (not sigmoid, not a user variant's use_softmax = false).
  static constexpr bool kSoftmax = (FEATURES & kSigmoid) == 0 && Variant::kUserSoftmax;
  // By parts: softmax variants only (sigmoid's weights by parts are unmeasured and untested).
  static constexpr bool kHalfTiles = kTuning.split != TileSplit::whole && kSoftmax;
  static constexpr bool kQuarterTiles = kTuning.split == TileSplit::quarters && kHalfTiles;
  static constexpr bool kSwizzleKV = swizzles_kv(kTuning.swizzle_kv, DQK, DVO, kKVBytes, kHasRope);
  static_assert(!kSwizzleKV || !kTransform, "swizzled K/V tiles are read as they landed");
  static constexpr int kPitchK = kv_pitch_bytes(DQK * 2, kSwizzleKV), kPitchV = kv_pitch_bytes(DVO * 2, kSwizzleKV);
  static constexpr int kRawPitchK = kv_pitch_bytes(DQK * kKVBytes, kSwizzleKV);
  static constexpr int kRawPitchV = kv_pitch_bytes(DVO * kKVBytes, kSwizzleKV);
  // Byte offset of 16-byte chunk c in K/V row r.
  static __device__ __forceinline__ int kv_chunk(int r, int c) { return (kSwizzleKV ? c ^ (r & 7) : c) * 16; }
  static constexpr int kRawChunksK = DQK * kKVBytes / 16, kRawChunksV = DVO * kKVBytes / 16;
  static constexpr SmemLayout kLayout =
      smem_layout(DQK, DVO, kKVBytes, kM, KV_TILE, STAGES, PAGED, kHasRope, kSwizzleKV, KV_WARPS);
  static constexpr int kSmemBytes = kLayout.total;
};

// Per-item facts every stage of the kernel needs.
struct ItemInfo {
  int32_t request, kv_head, head0;  // head0: first query head of this CTA
  int32_t q_row0, qo_len;           // request's first query row (global) and query count
  int32_t kv_len, kv_row0;          // ragged: first KV row; paged: first index into kv_indices
  int32_t q_begin, q_tokens;        // the item's query tokens [q_begin, q_begin + q_tokens)
  int32_t kv_begin, kv_end;
};

template <class C>
struct TileIO {
  static __device__ __forceinline__ int page_size(const PrefillParams& p) {
    return C::PAGE > 0 ? C::PAGE : p.page_size;
  }

  // Loads the M x DQK query tile (rows past the item are zero) in the MMA type, rotating it
  // first when RoPE is fused (query i at position kv_len - qo_len + i) and negating it when
  // sm_scale < 0 (the kernel scales logits by |sm_scale|, so row maxima stay maxima). Without
  // either, 16-byte aligned rows are copied with cp.async (the caller commits and waits).
  static __device__ void load_q(const PrefillParams& p, const ItemInfo& it, char* qs, const float* freq) {
    constexpr int kHalf = C::DQK / 2;
    const float sign = p.variant.sm_scale < 0.0f ? -1.0f : 1.0f;
    if constexpr (!C::kHasRope) {
      const bool aligned = ((reinterpret_cast<uint64_t>(p.q) | uint64_t(p.q_stride_n * 2) |
                             uint64_t(p.q_stride_h * 2)) & 15) == 0;
      if (aligned && sign > 0.0f) {
        constexpr int kChunks = C::DQK * 2 / 16;
        for (int i = threadIdx.x; i < C::kM * kChunks; i += C::kThreads) {
          const int row = i / kChunks, c = i % kChunks;
          const int tq = row / C::GH, hh = row % C::GH;
          const bool valid = tq < it.q_tokens;
          const char* src = static_cast<const char*>(p.q);
          if (valid)
            src += (int64_t(it.q_row0 + it.q_begin + tq) * p.q_stride_n + int64_t(it.head0 + hh) * p.q_stride_h) * 2 +
                   c * 16;
          cp_async_16(qs + row * C::kPitchQ + c * 16, src, valid);
        }
        return;
      }
    }
    for (int i = threadIdx.x; i < C::kM * kHalf; i += C::kThreads) {
      const int row = i / kHalf, t = i % kHalf;
      const int tq = row / C::GH, hh = row % C::GH;
      const bool interleave = (C::FEATURES & kRopeInterleave) != 0;
      const int i0 = (!C::kHasRope || interleave) ? 2 * t : t;
      const int i1 = (!C::kHasRope || interleave) ? 2 * t + 1 : t + kHalf;
      float x0 = 0.0f, x1 = 0.0f;
      if (tq < it.q_tokens) {
        const int64_t base = int64_t(it.q_row0 + it.q_begin + tq) * p.q_stride_n +
                             int64_t(it.head0 + hh) * p.q_stride_h;
        x0 = sign * load_as_f32<C::DT>(p.q, base + i0);
        x1 = sign * load_as_f32<C::DT>(p.q, base + i1);
        if constexpr (C::kHasRope) {
          const int64_t pos = int64_t(it.kv_len) - it.qo_len + it.q_begin + tq;
          const float a = float(pos) * freq[t];
          const float c = cosf(a), s = sinf(a);
          const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
          x0 = y0;
          x1 = y1;
        }
      }
      char* row_ptr = qs + row * C::kPitchQ;
      if constexpr (!C::kHasRope) {
        *reinterpret_cast<uint32_t*>(row_ptr + i0 * 2) = pack2<C::DT>(x0, x1);
      } else {
        const uint32_t both = pack2<C::DT>(x0, x1);
        *reinterpret_cast<uint16_t*>(row_ptr + i0 * 2) = uint16_t(both & 0xffffu);
        *reinterpret_cast<uint16_t*>(row_ptr + i1 * 2) = uint16_t(both >> 16);
      }
    }
  }

  // Paged KV: where token tile0 + i's K and V rows start, in bytes from the head's base. Thread
  // i < KV_TILE computes them once per tile (put_row_offsets) from the page id it fetched a tile
  // ahead, so the copies of the row's chunks each read one 8-byte word instead of redoing the
  // page-table arithmetic (it made page 16 run 22% more instructions than ragged KV).
  struct RowOffsets {
    int64_t k, v;
  };
  static __device__ __forceinline__ void put_row_offsets(const PrefillParams& p, RowOffsets* ring_slot,
                                                         int32_t tile0, int32_t page_id) {
    if (threadIdx.x >= C::KV_TILE) return;
    const int64_t in_page = (tile0 + int32_t(threadIdx.x)) % page_size(p);
    ring_slot[threadIdx.x] = {(int64_t(page_id) * p.k_stride_page + in_page * p.k_stride_token) * C::kKVBytes,
                              (int64_t(page_id) * p.v_stride_page + in_page * p.v_stride_token) * C::kKVBytes};
  }

  // Thread i < KV_TILE returns the page of token tile0 + i (0 past the range). With CHECK_IDS an
  // id outside [0, num_pages) (a device-resident table is checked only here) sets `bad` (the
  // item's rows then come out NaN; report_first_bad_page names it) and is replaced by page 0,
  // which run() made sure exists.
  static __device__ __forceinline__ int32_t fetch_page_id(const PrefillParams& p, const ItemInfo& it,
                                                          int32_t tile0, bool& bad) {
    const int32_t tok = tile0 + int32_t(threadIdx.x);
    if (threadIdx.x >= C::KV_TILE || tok >= it.kv_end) return 0;
    const int32_t id = p.kv_indices[it.kv_row0 + tok / page_size(p)];
    if constexpr (!C::CHECK_IDS) return id;
    const bool out_of_range = uint32_t(id) >= uint32_t(p.num_pages);
    bad |= out_of_range;
    return out_of_range ? 0 : id;
  }
  // The cold path after an item met a bad id: thread 0 records the first one of the item's pages.
  static __device__ __noinline__ void report_first_bad_page(const PrefillParams& p, const ItemInfo& it) {
    if (threadIdx.x != 0 || it.kv_end <= it.kv_begin) return;
    const int32_t first = it.kv_row0 + it.kv_begin / page_size(p), last = it.kv_row0 + (it.kv_end - 1) / page_size(p);
    for (int32_t pos = first; pos <= last; ++pos) {
      const int32_t id = p.kv_indices[pos];
      if (uint32_t(id) >= uint32_t(p.num_pages)) {
        report_bad_page(p, pos, id);
        return;
      }
    }
  }

  // Issues the cp.async copies of the K (V = false) or V rows of tokens [tile0, tile0 + KV_TILE)
  // (zero past kv_end) into a stage; the caller commits K and V as separate groups so that Q K^T
  // starts before V lands. rows: the tile's row offsets (paged).
  template <bool V>
  static __device__ __forceinline__ void load_kv(const PrefillParams& p, const ItemInfo& it, char* stage,
                                                 int32_t tile0, const RowOffsets* rows) {
    constexpr int kChunks = V ? C::kRawChunksV : C::kRawChunksK;
    constexpr int kPitch = V ? C::kRawPitchV : C::kRawPitchK;
    const int64_t stride_token = V ? p.v_stride_token : p.k_stride_token;
    const int64_t stride_head = V ? p.v_stride_head : p.k_stride_head;
    const char* base = static_cast<const char*>(V ? p.v : p.k) + int64_t(it.kv_head) * stride_head * C::kKVBytes;
    char* dst = V ? stage + C::KV_TILE * C::kRawPitchK : stage;
    // A row's byte offset from base.
    auto row_bytes = [&](int r, int32_t tok) -> int64_t {
      if constexpr (C::PAGED)
        return V ? rows[r].v : rows[r].k;
      else
        return int64_t(it.kv_row0 + tok) * stride_token * C::kKVBytes;
    };
    constexpr bool kEvenRows = C::kThreads % kChunks == 0 && C::KV_TILE % (C::kThreads / kChunks) == 0;
    if constexpr (C::kLeanCopies && C::PAGED && kEvenRows) {
      // Paged: the tile's row offsets sit in the ring; a full tile reads them at constant
      // addresses and copies to constant shared-memory offsets, with no bounds checks.
      constexpr int kStep = C::kThreads / kChunks, kCopies = C::KV_TILE / kStep;
      const int c = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
      auto dst_of = [&](int i) {
        const int r = r0 + i * kStep;
        return dst + r * kPitch + (kStep % 8 == 0 ? C::kv_chunk(r0, c) : C::kv_chunk(r, c));
      };
      const char* src = base + c * 16;
      // Rows r0 + 16 j and r0 + 16 j + 8 (r0 < 8) share a page when pages are multiples of 16
      // tokens and the item starts on a 16-token boundary (all but sliding-window items): the
      // second row is the first plus 8 rows, so only every other ring offset is read.
      constexpr bool kPairRows = C::PAGE >= 16 && kStep == 8 && kCopies % 2 == 0;
      if (kPairRows && tile0 + C::KV_TILE <= it.kv_end && it.kv_begin % 16 == 0) {
        const uint32_t s0 = smem_addr(dst_of(0));
        const int64_t eight_rows = 8 * stride_token * C::kKVBytes;
#pragma unroll
        for (int i = 0; i < kCopies; i += 2) {
          const char* row = src + row_bytes(r0 + i * kStep, 0);
          cp_async_16_to(s0 + i * kStep * kPitch, row);
          cp_async_16_to(s0 + (i + 1) * kStep * kPitch, row + eight_rows);
        }
      } else if (tile0 + C::KV_TILE <= it.kv_end && kStep % 8 == 0) {
        const uint32_t s0 = smem_addr(dst_of(0));
#pragma unroll
        for (int i = 0; i < kCopies; ++i) cp_async_16_to(s0 + i * kStep * kPitch, src + row_bytes(r0 + i * kStep, 0));
      } else {
#pragma unroll
        for (int i = 0; i < kCopies; ++i) {
          const int r = r0 + i * kStep;
          const bool valid = tile0 + r < it.kv_end;
          cp_async_16(dst_of(i), valid ? src + row_bytes(r, 0) : base, valid);
        }
      }
    } else if constexpr (C::kLeanCopies && kEvenRows) {
      // Ragged rows are evenly spaced: one source pointer per thread, advanced kStep rows per
      // copy; bounds (and the zero fill past kv_end) only on a tile that crosses the item's end.
      constexpr int kStep = C::kThreads / kChunks, kCopies = C::KV_TILE / kStep;
      const int c = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
      const int64_t step = int64_t(kStep) * stride_token * C::kKVBytes;
      const char* src = base + int64_t(it.kv_row0 + tile0 + r0) * stride_token * C::kKVBytes + c * 16;
      auto dst_of = [&](int i) {
        const int r = r0 + i * kStep;
        return dst + r * kPitch + (kStep % 8 == 0 ? C::kv_chunk(r0, c) : C::kv_chunk(r, c));
      };
      if (tile0 + C::KV_TILE <= it.kv_end && kStep % 8 == 0) {
        const uint32_t s0 = smem_addr(dst_of(0));  // rows kStep apart: constant offsets
#pragma unroll
        for (int i = 0; i < kCopies; ++i, src += step) cp_async_16_to(s0 + i * kStep * kPitch, src);
      } else {
#pragma unroll
        for (int i = 0; i < kCopies; ++i, src += step) {
          const bool valid = tile0 + r0 + i * kStep < it.kv_end;
          cp_async_16(dst_of(i), valid ? src : base, valid);
        }
      }
    } else if constexpr (C::kThreads % kChunks == 0) {
      // Each thread copies chunk c of rows r0, r0 + kStep, ...: one row pointer per pass.
      constexpr int kStep = C::kThreads / kChunks;
      const int c = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
      const int c_fixed = C::kv_chunk(r0, c);  // the swizzled chunk, when every row r has r % 8 == r0 % 8
#pragma unroll
      for (int r = r0, i = 0; i < (C::KV_TILE + kStep - 1) / kStep; ++i, r += kStep) {
        if (C::KV_TILE % kStep != 0 && r >= C::KV_TILE) break;
        const int32_t tok = tile0 + r;
        const bool valid = tok < it.kv_end;
        if constexpr (C::kSwizzleKV)
          cp_async_16(dst + r * kPitch + (kStep % 8 == 0 ? c_fixed : C::kv_chunk(r, c)),
                      valid ? base + row_bytes(r, tok) + c * 16 : base, valid);
        else
          cp_async_16(dst + r * kPitch + c * 16, valid ? base + row_bytes(r, tok) + c * 16 : base, valid);
      }
    } else {
      for (int id = threadIdx.x; id < C::KV_TILE * kChunks; id += C::kThreads) {
        const int r = id / kChunks, c = id % kChunks;
        const int32_t tok = tile0 + r;
        const bool valid = tok < it.kv_end;
        if constexpr (C::kSwizzleKV)
          cp_async_16(dst + r * kPitch + C::kv_chunk(r, c), valid ? base + row_bytes(r, tok) + c * 16 : base, valid);
        else
          cp_async_16(dst + r * kPitch + c * 16, valid ? base + row_bytes(r, tok) + c * 16 : base, valid);
      }
    }
  }

  // Reads element e of a raw row as f32.
  static __device__ __forceinline__ float raw_at(const char* row, int e) {
    if constexpr (C::kKVBytes == 1) {
      const uint8_t x = reinterpret_cast<const uint8_t*>(row)[e];
      return C::KVDT == kE4M3 ? e4m3_to_f32(x) : e5m2_to_f32(x);
    } else {
      const uint16_t x = reinterpret_cast<const uint16_t*>(row)[e];
      return C::KVDT == kBF16 ? bf16_bits_to_f32(x) : f16_bits_to_f32(x);
    }
  }

  // Makes a landed stage MMA-ready: fp8 rows converted into the conversion buffer (K and V), K
  // rotated by RoPE (key j at position j; in place when no conversion). Returns the K | V tile the
  // MMAs read. The caller synchronises before and after.
  static __device__ char* transform(char* stage, char* convert, int32_t tile0, const float* freq) {
    const char* kraw = stage;
    const char* vraw = stage + C::KV_TILE * C::kRawPitchK;
    char* kout = C::kConvert ? convert : stage;
    char* vout = C::kConvert ? convert + C::KV_TILE * C::kPitchK : stage + C::KV_TILE * C::kRawPitchK;
    constexpr int kHalf = C::DQK / 2;
    if constexpr (C::kTransform) {
      for (int i = threadIdx.x; i < C::KV_TILE * kHalf; i += C::kThreads) {
        const int r = i / kHalf, t = i % kHalf;
        const bool interleave = (C::FEATURES & kRopeInterleave) != 0;
        const int i0 = (!C::kHasRope || interleave) ? 2 * t : t;
        const int i1 = (!C::kHasRope || interleave) ? 2 * t + 1 : t + kHalf;
        float x0 = raw_at(kraw + r * C::kRawPitchK, i0), x1 = raw_at(kraw + r * C::kRawPitchK, i1);
        if constexpr (C::kHasRope) {
          const float a = float(int64_t(tile0) + r) * freq[t];
          const float c = cosf(a), s = sinf(a);
          const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
          x0 = y0;
          x1 = y1;
        }
        const uint32_t both = pack2<C::DT>(x0, x1);
        *reinterpret_cast<uint16_t*>(kout + r * C::kPitchK + i0 * 2) = uint16_t(both & 0xffffu);
        *reinterpret_cast<uint16_t*>(kout + r * C::kPitchK + i1 * 2) = uint16_t(both >> 16);
      }
    }
    if constexpr (C::kConvert) {
      for (int i = threadIdx.x; i < C::KV_TILE * (C::DVO / 2); i += C::kThreads) {
        const int r = i / (C::DVO / 2), e = 2 * (i % (C::DVO / 2));
        const char* row = vraw + r * C::kRawPitchV;
        *reinterpret_cast<uint32_t*>(vout + r * C::kPitchV + e * 2) =
            pack2<C::DT>(raw_at(row, e), raw_at(row, e + 1));
      }
    }
    return kout;
  }
};

}  // namespace kvattn::kernels::prefill
