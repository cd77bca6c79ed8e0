// User variants in the GPU kernels, without a GPU (CI): every example of examples/variants/
// compiles with NVRTC into each decode kernel family (CUDA cores, mma.sync over cp.async, bulk
// copies, TMA boxes; 2-byte and fp8 KV; one and two M tiles) and its merge kernel, for sm_90a and
// sm_80; a failing user source is reported at its own lines; names and keys follow the source.
#if KVATTN_WITH_CUDA
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda/decode_kernels.h"
#include "cuda/kernel_variant.h"
#include "kernels/variants/params.cuh"
#include "kvattn/error.h"
#include "support/kernel_choice.h"
#include "support/variant_examples.h"

namespace kvattn_test {
namespace {

using kvattn::DType;
using namespace kvattn::cuda;

bool is_elf(const std::vector<char>& b) { return b.size() > 4 && b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F'; }

struct DecodeShape {
  DType q, kv;
  int hd, group, page_size;
  uint32_t features;
  bool bulk;  // the sm_90 limits (bulk copies, TMA) or the cp.async kernels
  const char* family;  // what the choice must be, checked
};

const DecodeShape kShapes[] = {
    {DType::bf16, DType::bf16, 128, 4, 16, 0, true, "tma"},
    {DType::bf16, DType::bf16, 128, 8, 1, kvattn::kernels::kSlidingWindow, true, "bulk"},
    {DType::f16, DType::e4m3, 128, 32, 16, 0, true, "tma"},     // fp8, two M tiles
    {DType::bf16, DType::bf16, 64, 4, 16, kvattn::kernels::kSoftCap, false, "mma"},
    {DType::f32, DType::f32, 128, 4, 16, 0, false, "simt"},     // CUDA cores
    {DType::bf16, DType::bf16, 128, 4, 16, kvattn::kernels::kRope, true, "simt"},  // fused RoPE
};

const char* family_of(const DecodeKernelConfig& c) {
  if (!c.tensor_cores) return "simt";
  return c.tma ? "tma" : c.bulk ? "bulk" : "mma";
}

DecodeKernelConfig user_choice(const DecodeShape& s, const kvattn::CustomVariant& v) {
  DecodeProblemKey key;
  key.q_dtype = key.o_dtype = s.q;
  key.kv_dtype = s.kv;
  key.head_dim_qk = key.head_dim_vo = s.hd;
  key.group_size = s.group;
  key.page_size = s.page_size;
  key.features = s.features;
  key.user_variant = user_variant_code(v);
  return choose_decode(key, h200_bulk(s.bulk), kvattn::detail::active_overrides());
}

TEST(CudaUserVariant, EveryExampleCompilesIntoEveryDecodeKernelFamily) {
  for (const kvattn::CustomVariant& v : all_examples())
    for (const DecodeShape& s : kShapes) {
      const DecodeKernelConfig c = user_choice(s, v);
      ASSERT_STREQ(family_of(c), s.family) << c.name();
      ASSERT_TRUE(c.user_variant);
      for (const std::string arch : {"sm_90a", "sm_80"}) {
        if (c.bulk && arch == "sm_80") continue;  // bulk copies and TMA are sm_90 instructions
        for (const KernelSpec& spec : {decode_spec(c, arch), decode_merge_spec(c, arch)}) {
          SCOPED_TRACE(spec.name + " " + arch);
          const CompileResult r = compile_to_cubin(spec);
          EXPECT_TRUE(is_elf(r.cubin));
          std::printf("[ compile  ] %-60s %-7s %5.2f s\n", spec.name.c_str(), arch.c_str(), r.seconds);
        }
      }
    }
}

TEST(CudaUserVariant, NamesAndKeysFollowTheSource) {
  kvattn::CustomVariant a = example("soft_cap", {"cap"});
  kvattn::CustomVariant b = a;
  b.source += "\n// another line\n";
  const DecodeShape& s = kShapes[0];
  const DecodeKernelConfig ca = user_choice(s, a), cb = user_choice(s, b);
  EXPECT_NE(ca.name(), cb.name());
  EXPECT_NE(ca.name().find("_usoft_cap_"), std::string::npos) << ca.name();
  EXPECT_NE(kernel_key(decode_spec(ca, "sm_90a")), kernel_key(decode_spec(cb, "sm_90a")));
  EXPECT_NE(decode_merge_spec(ca, "sm_90a").name, decode_merge_spec(cb, "sm_90a").name);
  // The built-in kernel of the same shape is another kernel.
  DecodeKernelConfig builtin = ca;
  builtin.user_variant.reset();
  EXPECT_EQ(builtin.name() + variant_name_suffix(ca.user_variant), ca.name());
}

TEST(CudaUserVariant, TheTransposedKernelIsNotChosenForUserVariants) {
  kvattn::detail::Overrides ov;
  ov.decode_kernel = kvattn::detail::DecodeKernelChoice::transposed;
  DecodeProblemKey key;
  key.user_variant = user_variant_code(example("soft_cap", {"cap"}));
  EXPECT_FALSE(choose_decode(key, h200_bulk(false), ov).transposed);
  key.user_variant.reset();
  EXPECT_TRUE(choose_decode(key, h200_bulk(false), ov).transposed);
}

// NVRTC's messages for the user's lines come first, cited as <name>.variant(LINE).
TEST(CudaUserVariant, ACompileErrorCitesTheUsersOwnLines) {
  kvattn::CustomVariant v;
  v.name = "broken";
  v.f32_params = {"cap"};
  v.source =
      "struct Variant {\n"
      "  static float logits_transform(const Params& p, float logit, int, int64_t, int64_t, int, int) {\n"
      "    return logit * p.capp;\n"
      "  }\n"
      "};\n";
  const DecodeKernelConfig c = user_choice(kShapes[0], v);
  try {
    compile_to_cubin(decode_spec(c, "sm_90a"));
    FAIL() << "expected a compile error";
  } catch (const kvattn::Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("custom variant broken does not compile for the GPU", 0), 0u) << m.substr(0, 400);
    EXPECT_NE(m.find("broken.variant(3)"), std::string::npos) << m.substr(0, 2000);
    EXPECT_NE(m.find("capp"), std::string::npos);
  }
  // A hook of the right name with the wrong signature: the contract's signature is quoted.
  v.source = "struct Variant {\n  static bool logits_mask(const Params&, int) { return true; }\n};\n";
  try {
    compile_to_cubin(decode_spec(user_choice(kShapes[0], v), "sm_90a"));
    FAIL() << "expected a compile error";
  } catch (const kvattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("logits_mask must be callable as static bool logits_mask(const Params&"),
              std::string::npos)
        << std::string(e.what()).substr(0, 2000);
  }
}

}  // namespace
}  // namespace kvattn_test
#endif
