// apply_rope and apply_rope_with_cos_sin_cache on the GPU (kvattn/ops.h; SEMANTICS.md, "Rotary
// position embedding"). The CPU backend's arithmetic (src/cpu/rope.cpp): for the pair (x0, x1) of
// frequency t, (x0, x1) <- (x0 c - x1 s, x1 c + x0 s) in f32, each product and the difference
// rounded separately (no FMA, as the CPU computes it), with
//  - computed cos/sin (apply_rope): a = float(pos) * f_t, f_t = rope_frequency (variants/rope.cuh,
//    the code the CPU and the fused RoPE of attention run), c, s = sincosf(a) (CUDA's accurate
//    sincosf: the CPU's cosf/sinf may differ in the last bit or two);
//  - a table (apply_rope_with_cos_sin_cache): c = table[pos][t], s = table[pos][rotary_dim / 2 + t],
//    which makes the result bit for bit the CPU's (NaN payloads aside).
// Elements past rotary_dim are copied (out of place) or left alone (in place).
//
// Work split. A CTA takes `tokens_per_block` consecutive rows. It first fills shared memory with
// their cos/sin (one sincosf or one table read per (row, frequency), shared by every head of the
// row), then its threads stride over the flat list of (row, head, piece) items: a piece is one
// 16-byte vector of the low half and its partner of the high half (rotate-half), one 16-byte vector
// holding whole pairs (interleaved), or one 16-byte vector past rotary_dim (copied); consecutive
// threads take consecutive pieces, so a warp reads whole 32-byte sectors. Each thread loads
// kRopeUnroll items before it computes and stores them (and the first batch before the cos/sin
// prologue), to keep loads in flight. Without 16-byte alignment of every address (the host
// decides) the scalar kernel does the same with pairs of scalar elements.
//
// In place is safe: every element is read and written by one thread only, its reads first.
//
// Positions come from pos_ids (any stride) or from a ragged batch (indptr, offsets: row r of
// request b at offsets[b] + r - indptr[b]), both device arrays the host never reads, so the kernel
// checks what it reads: a row whose request cannot be found (indptr not covering it) or, with a
// table, whose position is outside [0, table rows) is skipped: nothing is written for it.
#pragma once

#include "kernels/common/host_device.cuh"
#include "kernels/variants/params.cuh"
#include "kernels/variants/rope.cuh"
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#include "kernels/common/ptx.cuh"
#endif

namespace kvattn::kernels {

// How a kernel pairs the rotated elements and where its cos/sin come from: the named members of
// the generated KernelConfig (cuda/rope_kernels.cpp), spelled in the kernel's name.
enum class RopePairs : int32_t { rotate_half = 0, interleaved = 1 };
enum class RopeCosSin : int32_t { computed = 0, table = 1 };

// One side (q or k). Strides in elements; each head vector is contiguous.
struct RopeSideParams {
  const void* in = nullptr;  // [num_rows, num_heads, head_dim]
  void* out = nullptr;       // may equal `in` with the same strides (in place)
  int64_t in_row = 0, in_head = 0, out_row = 0, out_head = 0;
  int32_t num_heads = 0;
};

struct RopeParams {
  RopeSideParams q, k;
  int64_t num_rows = 0;
  int32_t head_dim = 0, rotary_dim = 0;  // rotary_dim even, >= 2, <= head_dim
  int32_t copy_rest = 0;                 // nonzero: copy the elements past rotary_dim (out of place)
  int32_t tokens_per_block = 1;          // rows per CTA (the launcher's choice)
  // Positions: pos_ids[r * pos_stride], or (indptr non-null) the ragged batch.
  const int32_t* pos_ids = nullptr;
  int64_t pos_stride = 1;
  const int32_t* indptr = nullptr;   // [batch_size + 1]
  const int32_t* offsets = nullptr;  // [batch_size]
  int32_t batch_size = 0;
  // RopeCosSin::table: row p at cos_sin + p * cos_sin_row, cos_sin_rows rows of rotary_dim floats.
  const float* cos_sin = nullptr;
  int64_t cos_sin_row = 0, cos_sin_rows = 0;
  // RopeCosSin::computed: rope_theta, rope_scale and the Llama 3.1 fields; llama31 nonzero: scaled.
  VariantParams rope;
  int32_t llama31 = 0;
};

// The block size the launchers use, and the items a thread loads before it computes.
constexpr int kRopeThreads = 256;
constexpr int kRopeUnroll = 2;

// Dynamic shared memory of a CTA: the cos/sin rows, then one validity flag per row.
KVATTN_HD int64_t rope_smem_bytes(int tokens_per_block, int rotary_dim) {
  return int64_t(tokens_per_block) * (int64_t(rotary_dim) * 4 + 4);
}

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)

namespace rope_detail {

// The position of row r, false when the device arrays do not give one.
__device__ __forceinline__ bool position(const RopeParams& p, int64_t r, int64_t& pos) {
  if (!p.indptr) {
    pos = p.pos_ids[r * p.pos_stride];
    return true;
  }
  // The last request b with indptr[b] <= r (binary search over a well-formed indptr), then
  // checked: indptr[b] <= r < indptr[b + 1].
  int lo = 0, hi = p.batch_size;  // answer in [lo, hi)
  if (hi <= 0) return false;
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (int64_t(p.indptr[mid]) <= r) lo = mid;
    else hi = mid;
  }
  const int64_t start = p.indptr[lo], end = p.indptr[lo + 1];
  if (r < start || r >= end) return false;
  pos = int64_t(p.offsets[lo]) + (r - start);
  return pos >= -2147483648LL && pos <= 2147483647LL;  // int32 positions, as on the CPU
}

// 16 bytes as f32 (V elements of DT) and back.
template <int DT, int V>
__device__ __forceinline__ void unpack16(const uint4& w, float* x) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  unpack<DT, V>(words, x);
}
// Two f32 values rounded (ptx.cuh's store_from_f32: nearest even) into one f16x2 / bf16x2 word,
// lo in the low half.
template <int DT>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t r;  // one cvt for both (sm_80+), the same rounding as two cvt.rn
  if constexpr (DT == kBF16) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  uint16_t h[2];
  store_from_f32<DT>(h, 0, lo);
  store_from_f32<DT>(h, 1, hi);
  return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
#endif
}
template <int DT, int V>
__device__ __forceinline__ uint4 pack16(const float* x) {
  if constexpr (DT == kF32) {
    return make_uint4(__float_as_uint(x[0]), __float_as_uint(x[1]), __float_as_uint(x[2]), __float_as_uint(x[3]));
  } else {
    return make_uint4(pack2<DT>(x[0], x[1]), pack2<DT>(x[2], x[3]), pack2<DT>(x[4], x[5]), pack2<DT>(x[6], x[7]));
  }
}

// N (2, 4 or 8) cos and sin values from shared memory, 8 or 16 bytes per access (the table rows and
// the offsets the kernel forms keep them aligned: see rope_apply).
template <int N>
__device__ __forceinline__ void load_cos_sin(const float* cs, const float* sn, float* c, float* s) {
  if constexpr (N == 2) {
    const float2 a = *reinterpret_cast<const float2*>(cs), b = *reinterpret_cast<const float2*>(sn);
    c[0] = a.x, c[1] = a.y, s[0] = b.x, s[1] = b.y;
  } else {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 a = *reinterpret_cast<const float4*>(cs + i), b = *reinterpret_cast<const float4*>(sn + i);
      c[i] = a.x, c[i + 1] = a.y, c[i + 2] = a.z, c[i + 3] = a.w;
      s[i] = b.x, s[i + 1] = b.y, s[i + 2] = b.z, s[i + 3] = b.w;
    }
  }
}

// The CPU's rotation of one pair, each operation rounded on its own.
__device__ __forceinline__ void rotate(float& x0, float& x1, float c, float s) {
  const float a = x0, b = x1;
  x0 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  x1 = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// One item of the flat list: where it reads and writes, and what it is.
struct Item {
  const char* in;   // the head vector's start
  char* out;
  int piece;        // index within the head's items
  int row;          // row within the CTA (its cos/sin in shared memory)
  bool live;
};

// Where a thread is in the CTA's flat item list.
struct Cursor {
  int row, head, piece;
};

template <class C>
struct Shape {
  static constexpr int DT = C::dtype;
  static constexpr int kBytes = DTypeInfo<DT>::bytes;
  static constexpr bool kVector = C::vector_bytes == 16;
  static constexpr int V = kVector ? 16 / kBytes : 1;  // elements per access
  static constexpr bool kInterleaved = C::pairs == RopePairs::interleaved;
};

}  // namespace rope_detail

// C: the generated KernelConfig (dtype, pairs, cos_sin, vector_bytes). Grid: one CTA per
// tokens_per_block rows, kRopeThreads threads, rope_smem_bytes() of dynamic shared memory.
template <class C>
__device__ __forceinline__ void rope_apply(const RopeParams& p) {
  using namespace rope_detail;
  using S = Shape<C>;
  constexpr int V = S::V, kBytes = S::kBytes;
  extern __shared__ float4 rope_smem[];
  float* table = reinterpret_cast<float*>(rope_smem);
  const int T = p.tokens_per_block, rd = p.rotary_dim, half = rd / 2, D = p.head_dim;
  int* valid = reinterpret_cast<int*>(table + T * rd);
  const int64_t row0 = int64_t(blockIdx.x) * T;
  const int rows = int(min(int64_t(T), p.num_rows - row0));

  // Pieces per head: rotated ones, then copied ones past rotary_dim.
  const int rot_items = S::kVector ? (S::kInterleaved ? rd / V : half / V) : half;
  const int items_per_head = rot_items + (p.copy_rest ? (D - rd) / V : 0);
  const int Hq = p.q.num_heads, H = Hq + p.k.num_heads;
  const int per_row = H * items_per_head;

  // Item f is (row f / per_row, head (f % per_row) / items_per_head (q heads first), piece). A
  // thread visits f = tid, tid + kRopeThreads, ...: its cursor starts with two divisions and then
  // steps by kRopeThreads items with additions and carries (no division per item).
  const int step_rows = kRopeThreads / per_row, step_rest = kRopeThreads - step_rows * per_row;
  const int step_heads = step_rest / items_per_head, step_pieces = step_rest - step_heads * items_per_head;
  Cursor cur;
  {
    const int f = threadIdx.x;
    cur.row = f / per_row;
    const int rest = f - cur.row * per_row;
    cur.head = rest / items_per_head;
    cur.piece = rest - cur.head * items_per_head;
  }
  auto advance = [&]() {
    cur.piece += step_pieces;
    const bool c = cur.piece >= items_per_head;
    cur.piece -= c ? items_per_head : 0;
    cur.head += step_heads + (c ? 1 : 0);
    const bool c2 = cur.head >= H;
    cur.head -= c2 ? H : 0;
    cur.row += step_rows + (c2 ? 1 : 0);
  };
  // The item under the cursor, then the cursor moves on.
  auto item = [&]() {
    Item it;
    it.live = cur.row < rows;
    const int row = it.live ? cur.row : 0, head = it.live ? cur.head : 0;
    it.piece = it.live ? cur.piece : 0;
    it.row = row;
    advance();
    const int64_t r = row0 + row;
    // q's or k's fields by value (selects, no reference into the parameter space).
    const bool is_q = head < Hq;
    const int64_t h = is_q ? head : head - Hq;
    const char* in = static_cast<const char*>(is_q ? p.q.in : p.k.in);
    char* out = static_cast<char*>(is_q ? p.q.out : p.k.out);
    const int64_t in_row = is_q ? p.q.in_row : p.k.in_row, in_head = is_q ? p.q.in_head : p.k.in_head;
    const int64_t out_row = is_q ? p.q.out_row : p.k.out_row, out_head = is_q ? p.q.out_head : p.k.out_head;
    it.in = in + (r * in_row + h * in_head) * kBytes;
    it.out = out + (r * out_row + h * out_head) * kBytes;
    return it;
  };
  // Element offsets of an item's two accesses (the second only for rotate-half vectors and scalar
  // pairs), and whether it is rotated.
  auto offsets_of = [&](int piece, int& e0, int& e1) {
    if (piece >= rot_items) {  // copied
      e0 = rd + (piece - rot_items) * V;
      e1 = -1;
      return false;
    }
    if constexpr (S::kVector) {
      e0 = piece * V;
      e1 = S::kInterleaved ? -1 : half + piece * V;
    } else {
      e0 = S::kInterleaved ? 2 * piece : piece;
      e1 = S::kInterleaved ? 2 * piece + 1 : piece + half;
    }
    return true;
  };

  // The data of kRopeUnroll items: two 16-byte vectors (or two scalars as f32 bits) each.
  uint4 a[kRopeUnroll], b[kRopeUnroll];
  Item its[kRopeUnroll];
  auto load = [&]() {
#pragma unroll
    for (int u = 0; u < kRopeUnroll; ++u) {
      its[u] = item();
      if (!its[u].live) continue;
      int e0, e1;
      offsets_of(its[u].piece, e0, e1);
      if constexpr (S::kVector) {
        a[u] = *reinterpret_cast<const uint4*>(its[u].in + int64_t(e0) * kBytes);
        if (e1 >= 0) b[u] = *reinterpret_cast<const uint4*>(its[u].in + int64_t(e1) * kBytes);
      } else {
        a[u].x = __float_as_uint(load_as_f32<S::DT>(its[u].in, e0));
        if (e1 >= 0) b[u].x = __float_as_uint(load_as_f32<S::DT>(its[u].in, e1));
      }
    }
  };

  const int tid = threadIdx.x;
  load();  // in flight during the prologue

  // cos/sin of (row, t) for this CTA's rows, and whether each row has a position.
  for (int e = tid; e < rows * half; e += kRopeThreads) {
    const int row = e / half, t = e - row * half;
    int64_t pos = 0;
    bool ok = position(p, row0 + row, pos);
    float c = 0.0f, s = 0.0f;
    if constexpr (C::cos_sin == RopeCosSin::table) {
      ok = ok && pos >= 0 && pos < p.cos_sin_rows;
      if (ok) {
        const float* tr = p.cos_sin + pos * p.cos_sin_row;
        c = tr[t];
        s = tr[half + t];
      }
    } else {
      const float angle = __fmul_rn(float(pos), rope_frequency(p.rope, t, rd, p.llama31 != 0));
      sincosf(angle, &s, &c);
    }
    table[row * rd + t] = c;
    table[row * rd + half + t] = s;
    if (t == 0) valid[row] = ok;
  }
  __syncthreads();

  for (;;) {
#pragma unroll
    for (int u = 0; u < kRopeUnroll; ++u) {
      const Item& it = its[u];
      if (!it.live || !valid[it.row]) continue;
      int e0, e1;
      const bool rotated = offsets_of(it.piece, e0, e1);
      const float* cs = table + it.row * rd;
      const float* sn = cs + half;
      if constexpr (S::kVector) {
        if (!rotated) {
          *reinterpret_cast<uint4*>(it.out + int64_t(e0) * kBytes) = a[u];
          continue;
        }
        float x[V], y[V];
        unpack16<S::DT, V>(a[u], x);
        if constexpr (S::kInterleaved) {
          const int t0 = it.piece * (V / 2);  // the pairs (2t, 2t + 1) of this vector
          float c[V / 2], sv[V / 2];
          load_cos_sin<V / 2>(cs + t0, sn + t0, c, sv);
#pragma unroll
          for (int m = 0; m < V / 2; ++m) rotate(x[2 * m], x[2 * m + 1], c[m], sv[m]);
          *reinterpret_cast<uint4*>(it.out + int64_t(e0) * kBytes) = pack16<S::DT, V>(x);
        } else {
          unpack16<S::DT, V>(b[u], y);
          const int t0 = it.piece * V;  // pairs (t, t + half) for t = t0 .. t0 + V - 1
          float c[V], sv[V];
          load_cos_sin<V>(cs + t0, sn + t0, c, sv);
#pragma unroll
          for (int m = 0; m < V; ++m) rotate(x[m], y[m], c[m], sv[m]);
          *reinterpret_cast<uint4*>(it.out + int64_t(e0) * kBytes) = pack16<S::DT, V>(x);
          *reinterpret_cast<uint4*>(it.out + int64_t(e1) * kBytes) = pack16<S::DT, V>(y);
        }
      } else {
        float x0 = __uint_as_float(a[u].x);
        if (!rotated) {
          store_from_f32<S::DT>(it.out, e0, x0);
          continue;
        }
        float x1 = __uint_as_float(b[u].x);
        rotate(x0, x1, cs[it.piece], sn[it.piece]);
        store_from_f32<S::DT>(it.out, e0, x0);
        store_from_f32<S::DT>(it.out, e1, x1);
      }
    }
    if (cur.row >= rows) break;
    load();
  }
}

#endif  // __CUDACC_RTC__ || __CUDACC__

}  // namespace kvattn::kernels
