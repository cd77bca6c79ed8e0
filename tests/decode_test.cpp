// BatchDecode against the float64 reference: every dtype combination, GQA group sizes 1, 4, 7, 8,
// page sizes 1, 3, 16, NHD and HND, split and combined caches, strided views, kv_len 0 and 1,
// empty batches, head dims from 8 to 512, structured inputs. Variants: variants_test.cpp.
#include <gtest/gtest.h>

#include "support/attention_case.h"

namespace kvattn_test {
namespace {

using kvattn::DType;
using kvattn::KVLayout;

// B decode requests with random kv lengths in [lo, hi].
std::vector<std::pair<int64_t, int64_t>> decode_lens(Rng& rng, int B, int64_t lo, int64_t hi) {
  std::vector<std::pair<int64_t, int64_t>> lens;
  for (int b = 0; b < B; ++b) lens.push_back({1, rng.integer(lo, hi)});
  return lens;
}

TEST(Decode, EveryDtypeCombination) {
  const DType computes[] = {DType::f32, DType::f16, DType::bf16};
  for (DType q : computes)
    for (DType kv : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2})
      for (DType o : computes) {
        KVATTN_CASE_RNG(rng);
        AttnCase c;
        c.lens = decode_lens(rng, 3, 1, 40);
        c.num_qo_heads = 8;
        c.num_kv_heads = 2;
        c.head_dim_qk = 64;
        c.q_dtype = q;
        c.kv_dtype = kv;
        c.o_dtype = o;
        c.page_size = 16;
        run_decode_case(c, rng);
      }
}

TEST(Decode, GroupSizes) {
  for (int group : {1, 4, 7, 8})
    for (int hkv : {1, 2}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c;
      c.lens = decode_lens(rng, 4, 0, 50);
      c.num_kv_heads = hkv;
      c.num_qo_heads = group * hkv;
      c.head_dim_qk = 64;
      c.q_dtype = DType::bf16;
      c.page_size = 3;
      run_decode_case(c, rng);
    }
}

TEST(Decode, PageSizesLayoutsAndStorage) {
  for (int ps : {1, 3, 16})
    for (KVLayout layout : {KVLayout::NHD, KVLayout::HND})
      for (KVStore store : {KVStore::paged, KVStore::paged_combined})
        for (bool strided : {false, true}) {
          KVATTN_CASE_RNG(rng);
          AttnCase c;
          c.lens = decode_lens(rng, 3, 0, 3 * ps + 5);
          c.num_qo_heads = 4;
          c.num_kv_heads = 2;
          c.head_dim_qk = 32;
          c.q_dtype = DType::f16;
          c.layout = layout;
          c.page_size = ps;
          c.store = store;
          c.strided = strided;
          run_decode_case(c, rng);
        }
}

TEST(Decode, ShortAndEmptyRequests) {
  // kv_len 0 (no pages: o = 0, lse = -inf) and 1 (o = v), alone and mixed with longer ones.
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> batches = {
      {{1, 0}}, {{1, 1}}, {{1, 0}, {1, 1}, {1, 0}}, {{1, 16}, {1, 0}, {1, 17}, {1, 1}},
      {{1, 15}, {1, 16}, {1, 17}, {1, 32}, {1, 33}}};
  for (const auto& lens : batches)
    for (int ps : {1, 16}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c;
      c.lens = lens;
      c.num_qo_heads = 4;
      c.num_kv_heads = 4;
      c.head_dim_qk = 16;
      c.page_size = ps;
      run_decode_case(c, rng);
    }
}

TEST(Decode, EmptyBatch) {
  for (KVLayout layout : {KVLayout::NHD, KVLayout::HND}) {
    KVATTN_CASE_RNG(rng);
    AttnCase c;
    c.lens = {};
    c.num_qo_heads = 8;
    c.num_kv_heads = 1;
    c.layout = layout;
    run_decode_case(c, rng);
  }
}

TEST(Decode, HeadDims) {
  const std::pair<int, int> dims[] = {{8, 8}, {64, 64}, {96, 96}, {128, 128}, {192, 128},
                                      {128, 64}, {256, 256}, {512, 512}};
  for (auto [dqk, dvo] : dims) {
    KVATTN_CASE_RNG(rng);
    AttnCase c;
    c.lens = decode_lens(rng, 2, 1, dqk >= 256 ? 12 : 30);
    c.num_qo_heads = 4;
    c.num_kv_heads = 1;
    c.head_dim_qk = dqk;
    c.head_dim_vo = dvo;
    c.q_dtype = DType::bf16;
    c.o_dtype = DType::f32;
    c.page_size = 3;
    c.layout = dqk % 3 == 0 ? KVLayout::HND : KVLayout::NHD;
    run_decode_case(c, rng);
  }
}

TEST(Decode, StructuredAndOnesInputs) {
  for (Fill fill : {Fill::structured, Fill::ones})
    for (DType kv : {DType::bf16, DType::e4m3, DType::e5m2}) {
      KVATTN_CASE_RNG(rng);
      AttnCase c;
      c.lens = decode_lens(rng, 5, 0, 40);
      c.num_qo_heads = 8;
      c.num_kv_heads = 8;
      c.head_dim_qk = 64;
      c.q_dtype = DType::f16;
      c.kv_dtype = kv;
      c.page_size = 16;
      c.layout = KVLayout::HND;
      c.fill = fill;
      run_decode_case(c, rng);
    }
}

TEST(Decode, WithoutLse) {
  KVATTN_CASE_RNG(rng);
  AttnCase c;
  c.lens = decode_lens(rng, 4, 0, 30);
  c.num_qo_heads = 7;
  c.num_kv_heads = 1;
  c.want_lse = false;
  c.strided = true;
  run_decode_case(c, rng);
}

// A custom bit mask per request (kv_len bits each), composed with a window and soft-cap.
TEST(Decode, CustomMask) {
  KVATTN_CASE_RNG(rng);
  for (const auto& v : {kvattn::variants::custom_mask(),
                        kvattn::variants::custom_mask().with_window(20).with_soft_cap(6.0f)})
    for (double density : {0.7, 0.05}) {
      AttnCase c;
      c.lens = decode_lens(rng, 5, 0, 90);
      c.num_qo_heads = 8;
      c.num_kv_heads = 2;
      c.variant = v;
      c.mask_density = density;
      c.scheduler.fixed_split_size = 16;  // split rows: masked partial states merged
      SCOPED_TRACE(v.describe());
      run_decode_case(c, rng);
    }
}

TEST(Decode, LongerSequences) {
  // Several KV tiles and many pages per request; one request much longer than the others.
  for (int ps : {1, 16}) {
    KVATTN_CASE_RNG(rng);
    AttnCase c;
    c.lens = {{1, 300}, {1, 5}, {1, rng.integer(60, 140)}};
    c.num_qo_heads = 8;
    c.num_kv_heads = 2;
    c.head_dim_qk = 64;
    c.q_dtype = DType::bf16;
    c.page_size = ps;
    run_decode_case(c, rng);
  }
}

}  // namespace
}  // namespace kvattn_test
