// BatchPrefill against the float64 reference, ragged and paged KV: every dtype combination, GQA
// group sizes 1, 4, 7, 8, page sizes 1, 3, 16, NHD and HND, split and combined caches, strided
// views, appends (qo_len > 1 well below kv_len), full prefill (qo_len == kv_len), requests with
// no queries or no keys, empty batches, head dims from 8 to 512. Variants: variants_test.cpp.
#include <gtest/gtest.h>

#include "support/attention_case.h"

namespace kvattn_test {
namespace {

using kvattn::DType;
using kvattn::KVLayout;

// B requests: kv_len in [kv_lo, kv_hi], qo_len in [1, min(kv_len, qo_hi)] (0 when kv_len is 0).
std::vector<std::pair<int64_t, int64_t>> prefill_lens(Rng& rng, int B, int64_t kv_lo,
                                                      int64_t kv_hi, int64_t qo_hi) {
  std::vector<std::pair<int64_t, int64_t>> lens;
  for (int b = 0; b < B; ++b) {
    int64_t kv = rng.integer(kv_lo, kv_hi);
    lens.push_back({kv == 0 ? 0 : rng.integer(1, std::min(kv, qo_hi)), kv});
  }
  return lens;
}

const KVStore kStores[] = {KVStore::ragged, KVStore::paged, KVStore::paged_combined};

TEST(Prefill, EveryDtypeCombination) {
  const DType computes[] = {DType::f32, DType::f16, DType::bf16};
  for (DType q : computes)
    for (DType kv : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2})
      for (DType o : computes) {
        KVATTN_CASE_RNG(rng);
        AttnCase c;
        c.lens = prefill_lens(rng, 2, 1, 24, 24);
        c.num_qo_heads = 4;
        c.num_kv_heads = 2;
        c.head_dim_qk = 32;
        c.q_dtype = q;
        c.kv_dtype = kv;
        c.o_dtype = o;
        c.variant = kvattn::variants::causal();
        c.store = (int(q) + int(kv) + int(o)) % 2 ? KVStore::ragged : KVStore::paged;
        c.page_size = 3;
        run_prefill_case(c, rng);
      }
}

TEST(Prefill, GroupSizesRaggedAndPaged) {
  for (int group : {1, 4, 7, 8})
    for (KVStore store : kStores)
      for (bool causal : {false, true}) {
        KVATTN_CASE_RNG(rng);
        AttnCase c;
        c.lens = prefill_lens(rng, 3, 1, 40, 20);
        c.num_kv_heads = group == 8 ? 1 : 2;
        c.num_qo_heads = group * c.num_kv_heads;
        c.head_dim_qk = 32;
        c.q_dtype = DType::bf16;
        c.variant.causal = causal;
        c.store = store;
        c.page_size = 16;
        run_prefill_case(c, rng);
      }
}

TEST(Prefill, PageSizesLayoutsAndStorage) {
  for (int ps : {1, 3, 16})
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND})
      for (KVStore store : {KVStore::paged, KVStore::paged_combined})
        for (bool strided : {false, true}) {
          KVATTN_CASE_RNG(rng);
          AttnCase c;
          c.lens = prefill_lens(rng, 3, 0, 2 * ps + 9, 8);
          c.num_qo_heads = 4;
          c.num_kv_heads = 2;
          c.head_dim_qk = 16;
          c.q_dtype = DType::f16;
          c.variant = kvattn::variants::causal();
          c.layout = layout;
          c.page_size = ps;
          c.store = store;
          c.strided = strided;
          run_prefill_case(c, rng);
        }
}

TEST(Prefill, RaggedStrided) {
  for (DType q : {DType::f32, DType::bf16}) {
    KVATTN_CASE_RNG(rng);
    AttnCase c;
    c.lens = prefill_lens(rng, 4, 0, 30, 30);
    c.num_qo_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim_qk = 64;
    c.head_dim_vo = 32;
    c.q_dtype = q;
    c.variant = kvattn::variants::causal();
    c.store = KVStore::ragged;
    c.strided = true;
    run_prefill_case(c, rng);
  }
}

TEST(Prefill, DecodeLikeAppends) {
  // A few new tokens on a long cached prefix: with the causal mask aligned bottom-right, query i
  // sees the whole prefix plus the first i + 1 new tokens.
  for (int64_t qo : {2, 3, 5, 8})
    for (KVStore store : kStores) {
      KVATTN_CASE_RNG(rng);
      AttnCase c;
      c.lens = {{qo, qo + rng.integer(0, 70)}, {1, rng.integer(1, 50)}, {qo, qo + 40}};
      c.num_qo_heads = 8;
      c.num_kv_heads = 2;
      c.head_dim_qk = 64;
      c.q_dtype = DType::bf16;
      c.variant = kvattn::variants::causal();
      c.store = store;
      c.page_size = 16;
      c.layout = qo % 2 ? KVLayout::HND : KVLayout::NHD;
      run_prefill_case(c, rng);
    }
}

TEST(Prefill, FullPrefillSeveralTiles) {
  // qo_len == kv_len beyond one 16-row query tile and one 32-token KV tile.
  for (KVStore store : kStores)
    for (bool causal : {false, true}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c;
      c.lens = {{70, 70}, {17, 17}, {33, 33}};
      c.num_qo_heads = 4;
      c.num_kv_heads = 1;
      c.head_dim_qk = 32;
      c.q_dtype = DType::f16;
      c.o_dtype = DType::f32;
      c.variant.causal = causal;
      c.store = store;
      c.page_size = 3;
      run_prefill_case(c, rng);
    }
}

TEST(Prefill, EmptyRequestsAndBatches) {
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> batches = {
      {},                                        // empty batch
      {{0, 0}},                                  // one request with nothing
      {{0, 0}, {1, 1}, {0, 5}, {0, 0}},          // no queries, or no keys
      {{1, 1}, {2, 2}, {0, 3}},
      {{5, 2}, {3, 0}, {17, 16}, {40, 9}},       // more queries than keys (causal: the first rows see none)
      {{7, 1}, {2, 5}, {33, 12}},
      {{0, 7}, {3, 3}, {0, 0}, {16, 16}}};
  for (const auto& lens : batches)
    for (KVStore store : kStores) {
      KVATTN_CASE_RNG(rng);
      AttnCase c;
      c.lens = lens;
      c.num_qo_heads = 4;
      c.num_kv_heads = 2;
      c.head_dim_qk = 16;
      c.variant.causal = lens.size() % 2 == 0;
      c.store = store;
      c.page_size = 3;
      run_prefill_case(c, rng);
    }
}

TEST(Prefill, HeadDims) {
  const std::pair<int, int> dims[] = {{8, 8}, {64, 64}, {96, 96}, {128, 128}, {192, 128},
                                      {64, 128}, {256, 256}, {512, 512}};
  for (auto [dqk, dvo] : dims)
    for (KVStore store : {KVStore::ragged, KVStore::paged}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c;
      c.lens = prefill_lens(rng, 2, 1, dqk >= 256 ? 10 : 20, 6);
      c.num_qo_heads = 2;
      c.num_kv_heads = 1;
      c.head_dim_qk = dqk;
      c.head_dim_vo = dvo;
      c.q_dtype = DType::bf16;
      c.variant = kvattn::variants::causal();
      c.store = store;
      c.page_size = 3;
      c.layout = dqk % 3 == 0 ? KVLayout::HND : KVLayout::NHD;
      run_prefill_case(c, rng);
    }
}

TEST(Prefill, StructuredAndOnesInputs) {
  for (Fill fill : {Fill::structured, Fill::ones})
    for (KVStore store : kStores) {
      KVATTN_CASE_RNG(rng);
      AttnCase c;
      c.lens = prefill_lens(rng, 3, 1, 30, 10);
      c.num_qo_heads = 8;
      c.num_kv_heads = 2;
      c.head_dim_qk = 32;
      c.q_dtype = DType::bf16;
      c.kv_dtype = store == KVStore::ragged ? DType::e4m3 : DType::e5m2;
      c.variant = kvattn::variants::causal();
      c.store = store;
      c.layout = KVLayout::HND;
      c.page_size = 3;
      c.fill = fill;
      run_prefill_case(c, rng);
    }
}

TEST(Prefill, WithoutLse) {
  for (KVStore store : kStores) {
    KVATTN_CASE_RNG(rng);
    AttnCase c;
    c.lens = prefill_lens(rng, 3, 0, 20, 20);
    c.num_qo_heads = 4;
    c.num_kv_heads = 4;
    c.head_dim_qk = 16;
    c.want_lse = false;
    c.variant = kvattn::variants::causal();
    c.store = store;
    run_prefill_case(c, rng);
  }
}

}  // namespace
}  // namespace kvattn_test
