// append_paged_kv_cache (kvattn/ops.h) on a CPU cache.
//
// Legal problems: 0-5 requests of 0-40 tokens (the lengths after the append) over a shuffled page
// pool, page sizes 1-16, 1-3 heads, NHD/HND, split or combined (5-D) caches with padded strides,
// up to 12 rows at distinct random (request, position) slots, append rows in any float dtype
// (also rows of one fused buffer), any cache dtype. Reference: the cache's bytes as they were,
// with each appended element written at the slot SEMANTICS.md ("Paged KV cache") gives, as its
// own bits (equal dtypes) or as the round-to-nearest-even code of its value (fp8 saturating),
// found by search over every finite value of the format with the tests' independent decoders.
// No tolerance: every byte of the cache buffers must be as expected.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "fuzz/operations.h"
#include "support/dtype_codec.h"
#include "support/paged_kv.h"

namespace kvattn_fuzz {
namespace {

using kvattn::KVLayout;

// The code of the value of `t` nearest to x, ties to the even code; fp8 saturates at its largest
// finite value, f16/bf16 overflow to infinity past max + half an ulp (IEEE).
uint32_t rne_code(DType t, double x) {
  if (t == DType::f32) {
    const float f = float(x);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  }
  static std::map<DType, std::vector<std::pair<double, uint32_t>>> tables;
  const int bits = t == DType::f16 || t == DType::bf16 ? 16 : 8;
  auto& tb = tables[t];
  if (tb.empty())
    for (uint32_t c = 0; c < (1u << (bits - 1)); ++c) {  // non-negative codes ascend with value
      const double v = t == DType::f16    ? kvattn_test::decode_f16(uint16_t(c))
                       : t == DType::bf16 ? kvattn_test::decode_bf16(uint16_t(c))
                       : t == DType::e4m3 ? kvattn_test::decode_e4m3(uint8_t(c))
                                          : kvattn_test::decode_e5m2(uint8_t(c));
      if (std::isfinite(v)) tb.push_back({v, c});
    }
  const uint32_t sign = std::signbit(x) ? 1u << (bits - 1) : 0u;
  const double a = std::fabs(x);
  const double top = tb.back().first, ulp = top - tb[tb.size() - 2].first;
  if (a >= top) {
    if (kvattn::is_fp8(t) || a < top + ulp / 2) return sign | tb.back().second;
    return sign | (t == DType::f16 ? 0x7c00u : 0x7f80u);  // infinity
  }
  auto it = std::upper_bound(tb.begin(), tb.end(), std::pair<double, uint32_t>{a, UINT32_MAX});
  const size_t hi = size_t(it - tb.begin()), lo = hi - 1;
  const double dl = a - tb[lo].first, dh = tb[hi].first - a;
  const size_t pick = dl < dh ? lo : dh < dl ? hi : ((tb[lo].second & 1u) ? hi : lo);
  return sign | tb[pick].second;
}

// Element access through a view (any strides).
int64_t elem_offset(const TensorView& v, std::initializer_list<int64_t> idx) {
  int64_t off = 0, d = 0;
  for (int64_t i : idx) off += i * v.stride(int(d++));
  return off;
}

struct AppendProblem {
  std::optional<kvattn_test::PagedKV> paged;
  HostTensor ak, av, fused, batch, pos;
  std::vector<int32_t> rows_b, rows_t;
  KVLayout layout = KVLayout::NHD;
  int page_size = 1, hkv = 1, D = 8, Dv = 8;
  bool combined = false;
  struct Args {
    TensorView ak, av, batch, pos;
    kvattn::PagedKVCache cache;
    kvattn::PageTable table;
  } legal;
};

void call(const AppendProblem::Args& a) {
  kvattn::append_paged_kv_cache(a.ak, a.av, a.batch, a.pos, a.cache, a.table);
}

}  // namespace

void fuzz_append(Ctx& ctx) {
  Source& s = ctx.src;
  auto owned = std::make_unique<AppendProblem>();
  AppendProblem& p = *owned;
  p.layout = s.coin() ? KVLayout::NHD : KVLayout::HND;
  p.page_size = int(s.range(1, 16));
  p.hkv = int(s.range(1, 3));
  p.D = int(s.pick<int64_t>({4, 8, 16, 40, 64}));
  p.combined = s.chance(30);
  p.Dv = p.combined || s.chance(60) ? p.D : int(s.pick<int64_t>({4, 8, 16, 40, 64}));
  const DType ct = s.pick(kKVDtypes);
  const bool fused = s.chance(25);
  const DType kt = s.chance(40) ? ct : s.pick(kKVDtypes);
  const DType vt = fused ? kt : s.chance(40) ? ct : s.pick(kKVDtypes);
  const int64_t B = s.range(0, 5);
  std::vector<int64_t> lens;
  std::vector<std::pair<int32_t, int32_t>> slots;
  for (int64_t b = 0; b < B; ++b) {
    lens.push_back(s.chance(15) ? 0 : s.range(1, 40));
    for (int64_t t = 0; t < lens.back(); ++t) slots.push_back({int32_t(b), int32_t(t)});
  }
  const int64_t nnz = s.range(0, std::min<int64_t>(12, int64_t(slots.size())));
  for (int64_t r = 0; r < nnz; ++r) {  // a random sample without repeats, in random order
    const size_t j = size_t(s.range(r, int64_t(slots.size()) - 1));
    std::swap(slots[size_t(r)], slots[j]);
    p.rows_b.push_back(slots[size_t(r)].first);
    p.rows_t.push_back(slots[size_t(r)].second);
  }
  kvattn_test::PagedKVSpec spec{lens, p.page_size, p.hkv, p.D, p.Dv, ct, p.layout, p.combined, s.chance(40), false,
                                int(s.range(0, 3))};
  p.paged.emplace(spec, ctx.values);
  // Some existing contents in the cache (the bytes around the appended slots must be kept).
  for (HostTensor* t : {&p.paged->k, &p.paged->v, &p.paged->kv})
    for (size_t i = 0; i < t->raw_bytes().size(); ++i)
      if (ctx.values.coin(0.3)) t->raw_bytes()[i] = uint8_t(ctx.values.integer(0, 255));

  // Append rows: separate tensors, or the k and v heads of one fused [nnz, 1 + 2 Hkv, max(D, Dv) + pad] buffer.
  if (fused) {
    const int64_t width = std::max(p.D, p.Dv) + s.range(0, 3);
    p.fused = make_tensor(ctx, kt, {nnz, 1 + 2 * p.hkv, width});
    const auto& st = p.fused.strides();
    p.legal.ak = TensorView(p.fused.base() + st[1] * int64_t(kvattn::dtype_size(kt)), kt, {nnz, p.hkv, p.D},
                            {st[0], st[1], 1});
    p.legal.av = TensorView(p.fused.base() + st[1] * (1 + p.hkv) * int64_t(kvattn::dtype_size(kt)), kt,
                            {nnz, p.hkv, p.Dv}, {st[0], st[1], 1});
  } else {
    p.ak = make_tensor(ctx, kt, {nnz, p.hkv, p.D});
    p.av = make_tensor(ctx, vt, {nnz, p.hkv, p.Dv});
    p.legal.ak = p.ak.view();
    p.legal.av = p.av.view();
  }
  const bool big = s.chance(10);  // values past fp8's range: saturation
  for (const TensorView* v : {&p.legal.ak, &p.legal.av})
    for (int64_t r = 0; r < nnz; ++r)
      for (int64_t h = 0; h < p.hkv; ++h)
        for (int64_t e = 0; e < v->size(2); ++e)
          kvattn_test::encode(v->data(), v->dtype(), elem_offset(*v, {r, h, e}),
                              big ? ctx.values.uniform(-1000, 1000) : ctx.values.uniform(-2, 2));
  p.batch = int32_host(p.rows_b);
  p.pos = int32_host(p.rows_t);
  p.legal.batch = p.batch.view();
  p.legal.pos = p.pos.view();
  p.legal.cache = p.paged->cache();
  p.legal.table = p.paged->table();
  for (const HostTensor* t : {&p.paged->k, &p.paged->v, &p.paged->kv, &p.paged->indptr, &p.paged->indices,
                              &p.paged->last_page_len, &p.ak, &p.av, &p.fused, &p.batch, &p.pos})
    ctx.track(*t);
  {
    std::ostringstream os;
    os << "append: lens [";
    for (int64_t l : lens) os << l << " ";
    os << "] page " << p.page_size << " heads " << p.hkv << " dims " << p.D << "/" << p.Dv << " cache "
       << dtype_str(ct) << " k " << dtype_str(kt) << " v " << dtype_str(vt) << " "
       << kvattn::kv_layout_name(p.layout) << (p.combined ? " combined" : " split") << (fused ? " fused rows" : "")
       << " rows (b,t) [";
    for (int64_t r = 0; r < nnz; ++r) os << "(" << p.rows_b[size_t(r)] << "," << p.rows_t[size_t(r)] << ")";
    os << "]";
    ctx.note(os.str());
  }

  if (!ctx.corrupt) {
    // The expected bytes of the cache buffers.
    HostTensor& kbuf = p.combined ? p.paged->kv : p.paged->k;
    HostTensor& vbuf = p.combined ? p.paged->kv : p.paged->v;
    std::vector<uint8_t> want_k = kbuf.snapshot(), want_v_split = vbuf.snapshot();
    std::vector<uint8_t>& want_v = p.combined ? want_k : want_v_split;
    const size_t cs = kvattn::dtype_size(ct);
    const bool nhd = p.layout == KVLayout::NHD;
    for (int64_t r = 0; r < nnz; ++r) {
      const size_t b = size_t(p.rows_b[size_t(r)]);
      const int64_t t = p.rows_t[size_t(r)];
      const int64_t page = p.paged->pages_of(b)[size_t(t / p.page_size)], slot = t % p.page_size;
      for (int side = 0; side < 2; ++side) {
        const TensorView& src = side ? p.legal.av : p.legal.ak;
        HostTensor& buf = side ? vbuf : kbuf;
        std::vector<uint8_t>& want = side ? want_v : want_k;
        for (int64_t h = 0; h < p.hkv; ++h)
          for (int64_t e = 0; e < src.size(2); ++e) {
            const int64_t a = nhd ? slot : h, c = nhd ? h : slot;
            const int64_t off = p.combined ? buf.offset({page, side, a, c, e}) : buf.offset({page, a, c, e});
            const size_t at = size_t(buf.view_byte_offset() + off * int64_t(cs));
            const int64_t soff = elem_offset(src, {r, h, e});
            if (src.dtype() == ct) {
              std::memcpy(&want[at], static_cast<const char*>(src.data()) + soff * int64_t(cs), cs);
            } else {
              const uint32_t code = rne_code(ct, kvattn_test::decode(src.data(), src.dtype(), soff));
              std::memcpy(&want[at], &code, cs);  // little-endian: the low bytes
            }
          }
      }
    }
    std::vector<const HostTensor*> inputs = {&p.ak, &p.av, &p.fused, &p.batch, &p.pos, &p.paged->indptr,
                                             &p.paged->indices, &p.paged->last_page_len};
    std::vector<std::vector<uint8_t>> before;
    for (const HostTensor* t : inputs) before.push_back(t->snapshot());
    expect_success(ctx, "append_paged_kv_cache", [&] { call(p.legal); });
    for (size_t i = 0; i < inputs.size(); ++i)
      if (!inputs[i]->same_bytes(before[i])) fail("append_paged_kv_cache changed input buffer #", i);
    auto first_diff = [](const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
      for (size_t i = 0; i < a.size(); ++i)
        if (a[i] != b[i]) return int64_t(i);
      return int64_t(-1);
    };
    if (int64_t i = first_diff(kbuf.raw_bytes(), want_k); i >= 0)
      fail("the cache's ", p.combined ? "kv" : "k", " buffer differs from the expected bytes at byte ", i, ": got ",
           int(kbuf.raw_bytes()[size_t(i)]), ", expected ", int(want_k[size_t(i)]));
    if (!p.combined)
      if (int64_t i = first_diff(vbuf.raw_bytes(), want_v); i >= 0)
        fail("the cache's v buffer differs from the expected bytes at byte ", i, ": got ",
             int(vbuf.raw_bytes()[size_t(i)]), ", expected ", int(want_v[size_t(i)]));
    return;
  }

  AppendProblem::Args bad = p.legal;
  AppendProblem::Args* A = &bad;
  Ctx* cx = &ctx;
  std::vector<Corruption> c;
  const int tok = p.layout == KVLayout::NHD ? 1 : 2, head = p.layout == KVLayout::NHD ? 2 : 1;
  // The four tensors' sizes are legal relative to each other (append_k's head dim to the cache's,
  // k's pages to v's): one target, or two corruptions could agree again.
  tensor_corruptions(ctx, c, "append_k", bad.ak, {kKVDtypes, true, {0, 1, 2}, false, "tensors"});
  tensor_corruptions(ctx, c, "append_v", bad.av, {kKVDtypes, true, {0, 1, 2}, false, "tensors"});
  tensor_corruptions(ctx, c, "paged k", bad.cache.k, {kKVDtypes, true, {0, tok, head, 3}, true, "tensors"});
  tensor_corruptions(ctx, c, "paged v", bad.cache.v, {kKVDtypes, true, {0, tok, head, 3}, true, "tensors"});
  index_array_corruptions(ctx, c, "batch_indices", bad.batch, true);
  index_array_corruptions(ctx, c, "positions", bad.pos, true);
  if (nnz > 0) {
    const int64_t r = s.range(0, nnz - 1);
    const int32_t bb = int32_t(s.pick<int64_t>({B, B + 2, -1, std::numeric_limits<int32_t>::min()}));
    c.push_back({cat("batch_indices[", r, "] = ", bb), "batch_indices", [cx, A, r, bb] {
                   auto v = int32_values(A->batch);
                   v[size_t(r)] = bb;
                   replace_int32(*cx, A->batch, v);
                 }});
    const int64_t len = lens[size_t(p.rows_b[size_t(r)])];
    const int32_t bt = int32_t(s.pick<int64_t>({len, len + 5, -1, std::numeric_limits<int32_t>::max()}));
    c.push_back({cat("positions[", r, "] = ", bt, " (kv_len ", len, ")"), "positions", [cx, A, r, bt] {
                   auto v = int32_values(A->pos);
                   v[size_t(r)] = bt;
                   replace_int32(*cx, A->pos, v);
                 }});
  }
  if (nnz > 1) {
    const int64_t r1 = s.range(0, nnz - 1), r2 = (r1 + s.range(1, nnz - 1)) % nnz;
    c.push_back({cat("rows ", r1, " and ", r2, " on one slot"), "batch_indices+positions", [cx, A, r1, r2] {
                   auto vb = int32_values(A->batch), vt = int32_values(A->pos);
                   vb[size_t(r2)] = vb[size_t(r1)];
                   vt[size_t(r2)] = vt[size_t(r1)];
                   replace_int32(*cx, A->batch, vb);
                   replace_int32(*cx, A->pos, vt);
                 }});
  }
  // The page table.
  const std::vector<int32_t> ind = kvattn_test::as_int32(p.paged->indptr);
  const int32_t used = ind.back();
  // kv_indptr's and kv_last_page_len's lengths are legal relative to each other (one more request
  // in both is a valid table): one target "page table".
  indptr_corruptions(ctx, c, "kv_indptr", bad.table.indptr, "page table");
  index_array_corruptions(ctx, c, "kv_indptr", bad.table.indptr, true, "page table");
  {
    const int64_t nidx = p.paged->indices.numel();
    c.push_back({"kv_indptr[-1] past the end of kv_indices", "page table", [cx, A, nidx] {
                   auto v = int32_values(A->table.indptr);
                   v.back() = int32_t(nidx + 1);
                   replace_int32(*cx, A->table.indptr, v);
                 }});
  }
  index_array_corruptions(ctx, c, "kv_indices", bad.table.indices, false);
  if (used > 0) {
    const int64_t j = s.range(0, used - 1), np = p.paged->num_pages();
    const int32_t bi = int32_t(s.pick<int64_t>({np, np + 9, -1, std::numeric_limits<int32_t>::max()}));
    c.push_back({cat("kv_indices[", j, "] = ", bi), "kv_indices", [cx, A, j, bi] {
                   auto v = int32_values(A->table.indices);
                   v[size_t(j)] = bi;
                   replace_int32(*cx, A->table.indices, v);
                 }});
    c.push_back({"kv_indices shorter than kv_indptr[-1]", "kv_indices",
                 [A, used] { A->table.indices = with_size(A->table.indices, 0, used - 1); }});
  }
  index_array_corruptions(ctx, c, "kv_last_page_len", bad.table.last_page_len, true, "page table");
  if (B > 0) {
    const int64_t b = s.range(0, B - 1);
    const bool has = ind[size_t(b) + 1] > ind[size_t(b)];
    const int32_t bl = int32_t(has ? s.pick<int64_t>({0, -1, p.page_size + 1}) : s.pick<int64_t>({-1, p.page_size + 1}));
    c.push_back({cat("kv_last_page_len[", b, "] = ", bl), "page table", [cx, A, b, bl] {
                   auto v = int32_values(A->table.last_page_len);
                   v[size_t(b)] = bl;
                   replace_int32(*cx, A->table.last_page_len, v);
                 }});
  }
  // Aliasing: the cache shares no byte with an input, nor (split) k with v.
  if (nnz > 0 && bad.cache.k.numel() > 0)
    c.push_back({"append_k overlaps paged k", "tensors", [A] { A->ak = with_data(A->ak, A->cache.k.data()); }});
  if (bad.cache.v.numel() > 0) {
    c.push_back({"kv_indptr inside paged v", "page table", [A] {
                   A->table.indptr = with_data(A->table.indptr, A->cache.v.data());
                 }});
    if (!p.combined)
      c.push_back({"paged v overlaps paged k", "tensors", [A] { A->cache.v = with_data(A->cache.v, A->cache.k.data()); }});
  }
  expect_rejection(ctx, [&] {
    ctx.apply_corruptions(c);
    call(bad);
  });
}

}  // namespace kvattn_fuzz
