// TensorView, DLPack interop, dtype names, the combined paged-cache view, ALiBi slopes and the
// Variant description and validation.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kvattn/dlpack.h"
#include "kvattn/kvattn.h"
#include "support/expect_error.h"

namespace {

using kvattn::Device;
using kvattn::DType;
using kvattn::TensorView;

TEST(TensorView, ContiguousStridesSelectAndDescribe) {
  std::vector<float> buf(2 * 3 * 4);
  TensorView t(buf.data(), DType::f32, {2, 3, 4});
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.stride(1), 4);
  EXPECT_EQ(t.stride(-1), 1);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  TensorView row = t.select(1);
  EXPECT_EQ(row.data(), buf.data() + 12);
  EXPECT_EQ(row.ndim(), 2);
  EXPECT_EQ(t.describe(), "f32[2, 3, 4] on cpu");
  TensorView strided(buf.data(), DType::bf16, {2, 3}, {8, 2}, Device::cuda(1));
  EXPECT_FALSE(strided.is_contiguous());
  EXPECT_EQ(strided.describe(), "bf16[2, 3] strides (8, 2) on cuda:1");
  EXPECT_FALSE(TensorView().defined());
  EXPECT_KVATTN_ERROR(t.select(2), "select(2) is out of range [0, 2)");
  EXPECT_KVATTN_ERROR(TensorView(buf.data(), DType::f32, {1, 1, 1, 1, 1, 1, 1}),
                      "a tensor view has 1 to 6 dimensions, got 7");
}

TEST(TensorView, DTypeNamesRoundTrip) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2, DType::i32, DType::u8})
    EXPECT_EQ(kvattn::parse_dtype(kvattn::dtype_name(t)), t);
  EXPECT_EQ(kvattn::parse_dtype("bfloat16"), DType::bf16);
  EXPECT_KVATTN_ERROR(kvattn::parse_dtype("f64"), "unknown dtype 'f64'");
}

TEST(DLPack, RoundTripEveryDtypeWithStrides) {
  std::vector<uint8_t> buf(4096);
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2, DType::i32, DType::u8}) {
    TensorView v(buf.data() + 64, t, {3, 5}, {10, 2}, Device::cuda(2));
    DLManagedTensor* m = kvattn::to_dlpack(v);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->dl_tensor.device.device_type, kDLCUDA);
    EXPECT_EQ(m->dl_tensor.device.device_id, 2);
    EXPECT_EQ(m->dl_tensor.strides[0], 10);
    TensorView back = kvattn::from_dlpack(m->dl_tensor);
    EXPECT_EQ(back.data(), v.data());
    EXPECT_EQ(back.dtype(), t);
    EXPECT_EQ(back.device(), Device::cuda(2));
    EXPECT_EQ(back.size(1), 5);
    EXPECT_EQ(back.stride(1), 2);
    m->deleter(m);
  }
}

TEST(DLPack, ByteOffsetNullStridesAndErrors) {
  std::vector<float> buf(32);
  int64_t shape[2] = {4, 8};
  DLTensor t{};
  t.data = buf.data();
  t.device = {kDLCPU, 0};
  t.ndim = 2;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  t.strides = nullptr;  // contiguous
  t.byte_offset = 8 * sizeof(float);
  TensorView v = kvattn::from_dlpack(t);
  EXPECT_EQ(v.data(), buf.data() + 8);
  EXPECT_EQ(v.stride(0), 8);
  EXPECT_TRUE(v.is_contiguous());
  t.dtype = {kDLFloat, 64, 1};
  EXPECT_KVATTN_ERROR(kvattn::from_dlpack(t), "DLPack dtype (code 2, bits 64) is not supported");
  t.dtype = {kDLFloat, 32, 4};
  EXPECT_KVATTN_ERROR(kvattn::from_dlpack(t), "DLPack tensors with 4 lanes are not supported");
  t.dtype = {kDLFloat, 32, 1};
  t.device = {kDLOpenCL, 0};
  EXPECT_KVATTN_ERROR(kvattn::from_dlpack(t), "DLPack device type 4 is not supported");
}

TEST(PagedKVCache, CombinedViewSplitsKAndV) {
  std::vector<uint16_t> buf(3 * 2 * 4 * 2 * 8);
  TensorView kv(buf.data(), DType::bf16, {3, 2, 4, 2, 8});
  auto cache = kvattn::PagedKVCache::combined(kv, kvattn::KVLayout::NHD);
  EXPECT_EQ(cache.k.data(), buf.data());
  EXPECT_EQ(cache.v.data(), buf.data() + 4 * 2 * 8);
  EXPECT_EQ(cache.k.stride(0), 2 * 4 * 2 * 8);
  EXPECT_EQ(cache.page_size(), 4);
  EXPECT_EQ(cache.num_heads(), 2);
  EXPECT_EQ(cache.k_token_stride(), 16);
  auto hnd = kvattn::PagedKVCache::combined(kv, kvattn::KVLayout::HND);
  EXPECT_EQ(hnd.page_size(), 2);
  EXPECT_EQ(hnd.num_heads(), 4);
  EXPECT_KVATTN_ERROR(kvattn::PagedKVCache::combined(TensorView(buf.data(), DType::bf16, {3, 3, 4, 2, 8}),
                                                     kvattn::KVLayout::NHD),
                      "combined paged kv must be 5-D [pages, 2, page_size, heads, dim]");
}

TEST(Variant, AlibiSlopesFollowThePaper) {
  // 8 heads: 2^-1 .. 2^-8. 12 heads: the first 8 as for 8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
  for (int h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(kvattn::alibi_slope(h, 8), std::exp2(-(h + 1.0f)));
  const float extra[] = {-0.5f, -1.5f, -2.5f, -3.5f};
  for (int k = 0; k < 4; ++k) EXPECT_FLOAT_EQ(kvattn::alibi_slope(8 + k, 12), std::exp2(extra[k]));
  EXPECT_KVATTN_ERROR(kvattn::alibi_slope(12, 12), "alibi_slope: head = 12 is out of range [0, 12)");
}

TEST(Variant, DescribeAndValidate) {
  EXPECT_EQ(kvattn::variants::plain().describe(), "plain");
  EXPECT_EQ(kvattn::variants::sliding_window(4096).with_soft_cap(30).describe(),
            "causal+window(4096)+soft_cap(30)");
  EXPECT_KVATTN_ERROR(kvattn::Variant{}.with_window(-2).validate(), "variant.window_left = -2 is invalid");
  EXPECT_KVATTN_ERROR(kvattn::Variant{}.with_soft_cap(-1).validate(), "variant.logits_soft_cap = -1");
  EXPECT_KVATTN_ERROR(kvattn::Variant{}.with_sm_scale(NAN).validate(), "variant.sm_scale = nan is not finite");
  kvattn::RopeConfig bad;
  bad.rope_theta = 0;
  EXPECT_KVATTN_ERROR(kvattn::variants::rope(bad).validate(), "variant.rope.rope_theta = 0 must be > 0");
  kvattn::RopeConfig flat;
  flat.llama31 = kvattn::Llama31Scaling{8, 4, 4, 8192};
  EXPECT_KVATTN_ERROR(kvattn::variants::rope(flat).validate(),
                      "high_freq_factor = 4 must be greater than low_freq_factor = 4");
}

}  // namespace
