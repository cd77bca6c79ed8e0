// append_paged_kv_cache: every appended element must land at the slot SEMANTICS.md ("Paged KV
// cache") gives, computed here independently from the page table, and every other byte of the
// cache must be unchanged. NHD and HND, split and combined (5-D) caches, page sizes 1, 3 and 16,
// strided append views (slices of a fused qkv buffer), dtype conversion, and every validation error
// by its message with the cache left untouched.
//
// Tolerances: none. Equal dtypes must copy bits. A conversion must give exactly the round-to-
// nearest-even code (fp8 saturating), which the test computes by searching every finite value of
// the target format (ops_testing.h), independently of the library's converters.
#include "ops_testing.h"

namespace ops_test {
namespace {

using kvattn::KVLayout;

struct Layout {
  KVLayout layout;
  bool combined;
  int page_size;
};

// A paged cache, its page table and an append batch.
struct AppendCase {
  int64_t num_pages, page_size, heads, D, Dv;
  KVLayout layout;
  bool combined;
  Buf kc, vc;  // cache storage (combined: kc holds both, vc unused)
  int64_t k_base = 0, v_base = 0;  // element offsets of k and v in their buffers
  std::vector<int32_t> indptr, indices, last;
  std::vector<int64_t> len;
  std::vector<int32_t> batch, pos;
  Buf qkv;  // append rows: [nnz, heads (q) + heads (k) + heads (v), max(D, Dv) + 2] when strided
  int64_t row_stride = 0, head_stride = 0, k_off = 0, v_off = 0;

  // Element offset of (page, slot, head, e) in the cache storage.
  int64_t cache_off(bool is_v, int64_t page, int64_t slot, int64_t h, int64_t e) const {
    const int64_t d = is_v ? Dv : D;
    const int64_t tok = layout == KVLayout::NHD ? heads * d : d;
    const int64_t hs = layout == KVLayout::NHD ? d : page_size * d;
    const int64_t page_stride = (combined ? 2 : 1) * page_size * heads * d;
    return (is_v ? v_base : k_base) + page * page_stride + slot * tok + h * hs + e;
  }
  kvattn::PagedKVCache cache() {
    const int64_t P = num_pages, S = page_size, H = heads;
    if (combined) {
      auto kv = layout == KVLayout::NHD ? kc.view({P, 2, S, H, D}) : kc.view({P, 2, H, S, D});
      return kvattn::PagedKVCache::combined(kv, layout);
    }
    auto k = layout == KVLayout::NHD ? kc.view({P, S, H, D}) : kc.view({P, H, S, D});
    auto v = layout == KVLayout::NHD ? vc.view({P, S, H, Dv}) : vc.view({P, H, S, Dv});
    return kvattn::PagedKVCache::split(k, v, layout);
  }
  kvattn::PageTable table() { return {i32_view(indptr), i32_view(indices), i32_view(last)}; }
  kvattn::TensorView ak() { return qkv.view({nnz(), heads, D}, {row_stride, head_stride, 1}, k_off); }
  kvattn::TensorView av() { return qkv.view({nnz(), heads, Dv}, {row_stride, head_stride, 1}, v_off); }
  int64_t nnz() const { return int64_t(batch.size()); }
};

// Random requests over a shuffled subset of the pages (some pages unused), random lengths, and rows
// for a random subset of each request's positions (the newest ones and a few older), shuffled.
AppendCase make_case(std::mt19937_64& g, Layout l, DType cache_t, DType append_t, bool strided) {
  AppendCase c;
  c.page_size = l.page_size;
  c.layout = l.layout;
  c.combined = l.combined;
  c.heads = 2;
  c.D = 16;
  c.Dv = l.combined ? 16 : 8;
  const int B = 4;
  std::vector<int64_t> pages_of(B);
  for (int b = 0; b < B; ++b) {
    c.len.push_back(b == 2 ? 0 : randint(g, 1, 40 / l.page_size + 20));
    pages_of[size_t(b)] = (c.len.back() + l.page_size - 1) / l.page_size;
  }
  int64_t used = 0;
  for (int64_t p : pages_of) used += p;
  c.num_pages = used + 3;
  std::vector<int32_t> perm(size_t(c.num_pages));
  for (int32_t i = 0; i < c.num_pages; ++i) perm[size_t(i)] = i;
  std::shuffle(perm.begin(), perm.end(), g);
  c.indptr.push_back(0);
  for (int b = 0; b < B; ++b) {
    for (int64_t j = 0; j < pages_of[size_t(b)]; ++j) c.indices.push_back(perm[c.indices.size()]);
    c.indptr.push_back(int32_t(c.indices.size()));
    c.last.push_back(int32_t(c.len[size_t(b)] == 0 ? 0 : c.len[size_t(b)] - (pages_of[size_t(b)] - 1) * l.page_size));
  }
  for (int b = 0; b < B; ++b)
    for (int64_t t = 0; t < c.len[size_t(b)]; ++t)
      if (t >= c.len[size_t(b)] - 5 || randint(g, 0, 3) == 0) { c.batch.push_back(b); c.pos.push_back(int32_t(t)); }
  std::vector<size_t> order(c.batch.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), g);
  std::vector<int32_t> b2, p2;
  for (size_t i : order) { b2.push_back(c.batch[i]); p2.push_back(c.pos[i]); }
  c.batch = b2;
  c.pos = p2;
  // Cache: random prior contents (every byte pattern may occur, including NaN codes).
  const int64_t per_page = c.page_size * c.heads;
  c.kc = Buf(cache_t, c.num_pages * per_page * (c.combined ? 2 * c.D : c.D));
  c.vc = Buf(cache_t, c.combined ? 1 : c.num_pages * per_page * c.Dv);
  c.v_base = c.combined ? c.page_size * c.heads * c.D : 0;
  for (Buf* b : {&c.kc, &c.vc})
    for (int64_t i = 0; i < b->size(); ++i) b->set_bits(i, uint32_t(g()));
  // Append rows: contiguous [nnz, H, D] pairs, or slices of a fused buffer with padded heads.
  const int64_t nnz = c.nnz(), dmax = std::max(c.D, c.Dv);
  c.head_stride = strided ? dmax + 2 : c.D;
  c.row_stride = strided ? 3 * c.heads * c.head_stride + 1 : c.heads * c.D;
  c.k_off = strided ? c.heads * c.head_stride : 0;
  c.v_off = strided ? 2 * c.heads * c.head_stride : 0;
  if (!strided) {  // separate k and v tensors: place v after k in one buffer, head stride = Dv
    c.qkv = Buf(append_t, nnz * c.heads * (c.D + c.Dv) + 1);
  } else {
    c.qkv = Buf(append_t, nnz * c.row_stride + 1);
  }
  // Values: mostly small, some large (saturation), some tiny (subnormals).
  for (int64_t i = 0; i < c.qkv.size(); ++i) {
    double v = uniform(g, -4, 4);
    int64_t kind = randint(g, 0, 9);
    if (kind == 0) v *= 3e4;
    if (kind == 1) v *= 1e-5;
    c.qkv.set(i, v);
  }
  return c;
}

kvattn::TensorView contiguous_v(AppendCase& c) {
  return c.qkv.view({c.nnz(), c.heads, c.Dv}, {c.heads * c.Dv, c.Dv, 1}, c.nnz() * c.heads * c.D);
}

// Runs the append and checks every element of the cache.
void run_and_check(AppendCase& c, bool strided) {
  const Buf k_before = c.kc, v_before = c.vc;
  auto ak = c.ak(), av = strided ? c.av() : contiguous_v(c);
  kvattn::append_paged_kv_cache(ak, av, i32_view(c.batch), i32_view(c.pos), c.cache(), c.table());
  const DType ct = c.kc.dtype(), at = c.qkv.dtype();
  const int64_t esz = int64_t(kvattn::dtype_size(at));
  // Expected cache: the old one with the written elements replaced.
  std::vector<int8_t> written_k(size_t(c.kc.size()), 0), written_v(size_t(c.vc.size()), 0);
  Checker chk("appended elements");
  for (int64_t r = 0; r < c.nnz(); ++r) {
    const int b = c.batch[size_t(r)], t = c.pos[size_t(r)];
    const int64_t page = c.indices[size_t(c.indptr[size_t(b)] + t / c.page_size)], slot = t % c.page_size;
    for (bool is_v : {false, true}) {
      const kvattn::TensorView& src = is_v ? av : ak;
      Buf& dst = is_v ? (c.combined ? c.kc : c.vc) : c.kc;
      auto& written = is_v && !c.combined ? written_v : written_k;
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t e = 0; e < src.size(2); ++e) {
          const int64_t si = (static_cast<const char*>(src.data()) - static_cast<const char*>(c.qkv.data())) / esz +
                             r * src.stride(0) + h * src.stride(1) + e;
          const int64_t di = c.cache_off(is_v, page, slot, h, e);
          written[size_t(di)] = 1;
          const uint32_t want = ct == at ? c.qkv.bits(si) : encode_bits(ct, c.qkv.get(si));
          chk.exact(dst.bits(di), want, std::string(is_v ? "v" : "k") + " row " + std::to_string(r) + idx({h, e}));
        }
    }
  }
  EXPECT_TRUE(chk.result());
  Checker rest("untouched cache elements");
  for (int64_t i = 0; i < c.kc.size(); ++i)
    if (!written_k[size_t(i)]) rest.exact(c.kc.bits(i), k_before.bits(i), "kc " + std::to_string(i));
  for (int64_t i = 0; i < c.vc.size(); ++i)
    if (!written_v[size_t(i)]) rest.exact(c.vc.bits(i), v_before.bits(i), "vc " + std::to_string(i));
  EXPECT_TRUE(rest.result());
}

const Layout kLayouts[] = {
    {KVLayout::NHD, false, 1}, {KVLayout::NHD, false, 3}, {KVLayout::NHD, false, 16},
    {KVLayout::HND, false, 1}, {KVLayout::HND, false, 3}, {KVLayout::HND, false, 16},
    {KVLayout::NHD, true, 3},  {KVLayout::HND, true, 16}, {KVLayout::HND, true, 1},
};

std::string describe(const Layout& l, DType ct, DType at, bool strided) {
  return std::string(kvattn::kv_layout_name(l.layout)) + (l.combined ? " combined" : " split") +
         " page_size=" + std::to_string(l.page_size) + " cache " + std::string(kvattn::dtype_name(ct)) +
         " <- " + std::string(kvattn::dtype_name(at)) + (strided ? " strided" : "");
}

TEST(OpsAppendPagedKV, SameDtypeCopiesBitsToTheRightSlots) {
  OPS_TEST_RNG(rng);
  for (const Layout& l : kLayouts)
    for (DType t : {DType::f32, DType::f16, DType::bf16, DType::e4m3})
      for (bool strided : {false, true}) {
        SCOPED_TRACE(describe(l, t, t, strided));
        AppendCase c = make_case(rng, l, t, t, strided);
        ASSERT_GT(c.nnz(), 0);
        run_and_check(c, strided);
      }
}

TEST(OpsAppendPagedKV, ConvertsToTheCacheDtype) {
  OPS_TEST_RNG(rng);
  const std::pair<DType, DType> pairs[] = {
      {DType::e4m3, DType::bf16}, {DType::e4m3, DType::f32}, {DType::e5m2, DType::f16},
      {DType::e5m2, DType::f32},  {DType::bf16, DType::f32}, {DType::f16, DType::f32},
      {DType::f16, DType::bf16},  {DType::f32, DType::bf16}};
  for (auto [ct, at] : pairs)
    for (const Layout& l : {kLayouts[1], kLayouts[5], kLayouts[6]}) {
      SCOPED_TRACE(describe(l, ct, at, true));
      AppendCase c = make_case(rng, l, ct, at, true);
      run_and_check(c, true);
    }
}

TEST(OpsAppendPagedKV, EmptyAppendWritesNothing) {
  OPS_TEST_RNG(rng);
  AppendCase c = make_case(rng, kLayouts[2], DType::bf16, DType::bf16, false);
  c.batch.clear();
  c.pos.clear();
  run_and_check(c, false);
}

// ---- validation ---------------------------------------------------------------------------------
TEST(OpsAppendPagedKVErrors, EachBadArgumentIsNamedAndTheCacheIsUntouched) {
  OPS_TEST_RNG(rng);
  // Fixed page table: page_size 16, request 0: 2 pages, 20 tokens; request 1: 3 pages, 33 tokens.
  AppendCase c = make_case(rng, {KVLayout::NHD, false, 16}, DType::bf16, DType::bf16, false);
  c.num_pages = 8;
  c.kc = Buf(DType::bf16, 8 * 16 * 2 * 16);
  c.vc = Buf(DType::bf16, 8 * 16 * 2 * 8);
  c.indptr = {0, 2, 5};
  c.indices = {4, 0, 7, 1, 2};
  c.last = {4, 1};
  c.batch = {0, 1, 1, 1, 0};
  c.pos = {19, 32, 0, 17, 3};
  c.qkv = Buf(DType::bf16, 5 * 2 * (16 + 8));
  for (int64_t i = 0; i < c.qkv.size(); ++i) c.qkv.set(i, uniform(rng, -2, 2));
  const Buf k_before = c.kc, v_before = c.vc;
  auto ak = c.ak(), av = contiguous_v(c);
  auto cache = c.cache();
  auto table = c.table();
  auto bi = i32_view(c.batch), ps = i32_view(c.pos);
  auto run = [&](auto&&... mutate) {
    return [&, ak, av, cache, table, bi, ps]() mutable {
      (mutate(ak, av, cache, table, bi, ps), ...);
      kvattn::append_paged_kv_cache(ak, av, bi, ps, cache, table);
    };
  };
  auto& b = c.batch;
  auto& p = c.pos;
  b[3] = 2;
  EXPECT_TRUE(throws_with(run(), "batch_indices[3] = 2 is out of range [0, 2)"));
  b[3] = 1;
  p[3] = 40;
  EXPECT_TRUE(throws_with(run(), "positions[3] = 40 is out of range [0, 33) for request 1"));
  p[3] = -1;
  EXPECT_TRUE(throws_with(run(), "positions[3] = -1 is out of range [0, 33) for request 1"));
  p[3] = 32;  // same slot as row 1
  EXPECT_TRUE(throws_with(run(), "rows 1 and 3 of the append both write page 2 slot 0 (request 1 position 32, request 1 position 32)"));
  p[3] = 17;
  c.indices[2] = 9;
  EXPECT_TRUE(throws_with(run(), "kv_indices[2] = 9 is out of range [0, 8)"));
  c.indices[2] = 7;
  c.last[1] = 0;
  EXPECT_TRUE(throws_with(run(), "kv_last_page_len[1] = 0 is out of range [1, 16]"));
  c.last[1] = 1;
  using TV = kvattn::TensorView;
  using Cache = kvattn::PagedKVCache;
  using PT = kvattn::PageTable;
  Buf i32buf(DType::i32, 64), wide(DType::bf16, 5 * 3 * 16), f16buf(DType::f16, 64 * 16);
  EXPECT_TRUE(throws_with(run([&](TV& k, TV&, Cache&, PT&, TV&, TV&) { k = wide.view({5, 3, 16}); }),
                          "append_k.shape[1] = 3 but paged k (NHD).shape[2] (num_kv_heads) = 2"));
  EXPECT_TRUE(throws_with(run([&](TV&, TV& v, Cache&, PT&, TV&, TV&) { v = wide.view({5, 2, 16}); }),
                          "append_v.shape[2] = 16 but paged v.shape[3] (head_dim) = 8"));
  EXPECT_TRUE(throws_with(run([&](TV&, TV& v, Cache&, PT&, TV&, TV&) { v = wide.view({4, 2, 8}); }),
                          "append_v.shape[0] = 4 but append_k.shape[0] (nnz) = 5"));
  EXPECT_TRUE(throws_with(run([&](TV& k, TV&, Cache&, PT&, TV&, TV&) { k = i32buf.view({2, 2, 16}); }),
                          "append_k has dtype i32; expected a float dtype"));
  EXPECT_TRUE(throws_with(run([&](TV&, TV&, Cache&, PT&, TV& bb, TV&) { bb = i32buf.view({4}); }),
                          "batch_indices has 4 elements but 5 are expected"));
  EXPECT_TRUE(throws_with(run([&](TV&, TV&, Cache&, PT&, TV&, TV& pp) { pp = f16buf.view({5}); }),
                          "positions has dtype f16 but i32 is expected"));
  EXPECT_TRUE(throws_with(run([&](TV&, TV&, Cache& kv, PT&, TV&, TV&) { kv.v = f16buf.view({8, 2, 2, 8}); }),
                          "paged v.shape[1] = 2 but paged k (NHD).shape[1] = 16"));
  EXPECT_TRUE(throws_with(run([&](TV&, TV&, Cache& kv, PT&, TV&, TV&) { kv.k = c.kc.view({8, 16, 2, 8}, {512, 32, 16, 2}); }),
                          "paged k must be contiguous in its last (head) dimension"));
  EXPECT_TRUE(throws_with(run([&](TV&, TV&, Cache&, PT& t, TV&, TV&) { t.last_page_len = TV(); }),
                          "kv_last_page_len is required but was not given"));
  EXPECT_TRUE(throws_with(run([&](TV&, TV&, Cache& kv, PT&, TV&, TV&) { kv.v = c.vc.view({8, 16, 2, 8}, kvattn::Device::cuda(0)); }),
                          "paged v is on cuda:0 but append_k is on cpu"));
  EXPECT_TRUE(throws_with(run([&](TV& k, TV&, Cache&, PT&, TV&, TV&) { k = wide.view({5, 96}); }),
                          "append_k must be 3-D, got bf16[5, 96] on cpu"));
  EXPECT_TRUE(throws_with(run([&](TV&, TV& v, Cache&, PT&, TV&, TV&) { v = TV(nullptr, DType::bf16, {5, 2, 8}); }),
                          "append_v has a null data pointer"));
  EXPECT_TRUE(throws_with(run([&](TV&, TV&, Cache& kv, PT&, TV&, TV&) {
                            kv = Cache::split(c.kc.view({8, 0, 2, 16}), c.vc.view({8, 0, 2, 8}), KVLayout::NHD);
                          }),
                          "the page size of paged k (NHD) is 0; it must be >= 1"));
  EXPECT_TRUE(throws_with(run([&](TV&, TV&, Cache&, PT&, TV& bb, TV&) { bb = i32_view(c.batch); bb = TV(bb.data(), DType::i32, {5}, kvattn::Device::cuda(0)); }),
                          "batch_indices must be on the host (cpu), got cuda:0"));
  auto all_cuda = [&](TV& k, TV& v, Cache& kv, PT&, TV&, TV&) {
    k = c.qkv.view({5, 2, 16}, kvattn::Device::cuda(0));
    v = c.qkv.view({5, 2, 8}, kvattn::Device::cuda(0));
    kv = Cache::split(c.kc.view({8, 16, 2, 16}, kvattn::Device::cuda(0)),
                      c.vc.view({8, 16, 2, 8}, kvattn::Device::cuda(0)), KVLayout::NHD);
  };
#if KVATTN_WITH_CUDA
  // A CUDA cache takes its index arrays on the device (checked before anything runs).
  EXPECT_TRUE(throws_with(run(all_cuda), "batch_indices is on cpu but the paged cache is on cuda:0"));
#else
  EXPECT_TRUE(throws_with(run(all_cuda), no_cuda_message("append_k")));
#endif
  Checker chk("cache after rejected calls");
  for (int64_t i = 0; i < c.kc.size(); ++i) chk.exact(c.kc.bits(i), k_before.bits(i), "k " + std::to_string(i));
  for (int64_t i = 0; i < c.vc.size(); ++i) chk.exact(c.vc.bits(i), v_before.bits(i), "v " + std::to_string(i));
  EXPECT_TRUE(chk.result());
  // The same arguments, repaired, are accepted (the errors above were not spurious).
  EXPECT_NO_THROW(run()());
}

}  // namespace
}  // namespace ops_test
