// User variants in the GPU kernels, without a GPU (CI): every example of examples/variants/
// compiles with NVRTC into each decode kernel family (CUDA cores, mma.sync over cp.async, bulk
// copies, TMA boxes; 2-byte and fp8 KV; one and two M tiles), the prefill kernels (mma.sync and
// the Hopper tier, ragged and paged, fp8 KV, the decode shape) and their merge kernels, for sm_90a
// and sm_80; a failing user source is reported at its own lines; names and keys follow the source.
#if KVATTN_WITH_CUDA
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cuda/decode_kernels.h"
#include "cuda/kernel_variant.h"
#include "cuda/prefill_kernels.h"
#include "kernels/variants/params.cuh"
#include "kvattn/error.h"
#include "support/child_process.h"
#include "support/expect_error.h"
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

std::vector<kvattn::CustomVariant> variants_to_compile();

TEST(CudaUserVariant, EveryExampleCompilesIntoEveryDecodeKernelFamily) {
  for (const kvattn::CustomVariant& v : variants_to_compile())
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

struct PrefillShape {
  DType q, kv;
  int hd, group;
  bool paged;
  uint32_t features;
  int64_t max_qo_len;
  const char* arch;
  bool wgmma;           // the Hopper tier (sm_90a, long query runs)
  bool uniform_decode;  // the decode shape (KV warps)
};

const PrefillShape kPrefillShapes[] = {
    {DType::bf16, DType::bf16, 128, 4, false, kvattn::kernels::kCausal, 4096, "sm_90a", true, false},
    {DType::bf16, DType::bf16, 128, 4, true, kvattn::kernels::kCausal, 4096, "sm_80", false, false},
    {DType::f16, DType::e4m3, 64, 1, true, kvattn::kernels::kSoftCap, 300, "sm_90a", false, false},
    {DType::bf16, DType::bf16, 128, 8, true, 0, 1, "sm_90a", false, true},  // decode on the prefill kernels
    // Under built-in ALiBi and a window; under built-in sigmoid and a custom mask (short runs).
    {DType::bf16, DType::bf16, 128, 4, false, kvattn::kernels::kCausal | kvattn::kernels::kAlibi |
                                                kvattn::kernels::kSlidingWindow, 4096, "sm_90a", true, false},
    {DType::f16, DType::f16, 64, 2, true, kvattn::kernels::kSigmoid | kvattn::kernels::kCustomMask, 40, "sm_80", false,
     false},
};

// The examples, and one variant with every hook but the sink (output_transform among them).
std::vector<kvattn::CustomVariant> variants_to_compile() {
  auto v = all_examples();
  kvattn::CustomVariant all;
  all.name = "every_hook";
  all.source = R"(
struct Variant {
  static bool logits_mask(const Params& p, int, int64_t qo_pos, int64_t kv_pos, int, int) { return (qo_pos + kv_pos) % p.period != 1; }
  static float logits_transform(const Params& p, float logit, int, int64_t, int64_t, int, int kv_head) { return logit + p.shift * float(kv_head); }
  static float output_transform(const Params& p, float value, int, int64_t, int qo_head, int dim) { return value * p.scale(qo_head) + 0.01f * float(dim % 3); }
};
)";
  all.f32_params = {"shift"};
  all.i32_params = {"period"};
  all.tensor_params = {{"scale", DType::f32, 1}};
  v.push_back(all);
  return v;
}

TEST(CudaUserVariant, EveryExampleCompilesIntoThePrefillKernels) {
  for (const kvattn::CustomVariant& v : variants_to_compile())
    for (const PrefillShape& s : kPrefillShapes) {
      PrefillProblemKey key;
      key.q_dtype = key.o_dtype = s.q;
      key.kv_dtype = s.kv;
      key.head_dim_qk = key.head_dim_vo = s.hd;
      key.group_size = s.group;
      key.paged = s.paged;
      key.page_size = 16;
      key.features = s.features;
      key.max_qo_len = s.max_qo_len;
      key.uniform_decode = s.uniform_decode;
      key.soft_cap = 30.0f;
      key.user_variant = user_variant_code(v);
      const PrefillKernelConfig c = choose_prefill(key, arch(s.arch), kvattn::detail::active_overrides());
      ASSERT_EQ(c.tier == kvattn::detail::PrefillTier::wgmma, s.wgmma) << c.name();
      ASSERT_EQ(c.kv_warps > 1, s.uniform_decode) << c.name();
      EXPECT_NE(c.tuning.softmax, kvattn::kernels::prefill::SoftmaxForm::fixed_shift) << c.name();
      if ((s.features & kvattn::kernels::kSigmoid) && v.name == "learned_sink") {  // no denominator for a sink
        EXPECT_KVATTN_ERROR(compile_to_cubin(prefill_spec(c, s.arch)),
                            "sink_logit needs the softmax (the built-in sigmoid attention has no denominator)");
        continue;
      }
      for (const KernelSpec& spec : {prefill_spec(c, s.arch), prefill_merge_spec(c, s.arch)}) {
        SCOPED_TRACE(spec.name + " " + s.arch);
        const CompileResult r = compile_to_cubin(spec);
        EXPECT_TRUE(is_elf(r.cubin));
        std::printf("[ compile  ] %-60s %-7s %5.2f s\n", spec.name.c_str(), s.arch, r.seconds);
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

// plan()'s cache of the generated code: the same declaration gives the same code without
// regenerating it, any change a new one, and a bad declaration an error that keeps the last.
TEST(CudaUserVariant, CodeCacheFollowsTheDeclaration) {
  UserVariantCodeCache cache;
  kvattn::CustomVariant v = example("soft_cap", {"cap"});
  const UserVariantCode first = cache.code_of(v);
  EXPECT_EQ(&cache.code_of(v), &cache.code_of(kvattn::CustomVariant(v)));
  EXPECT_EQ(cache.code_of(v), user_variant_code(v));
  kvattn::CustomVariant other = v;
  other.f32_params = {"cap", "unused"};
  EXPECT_NE(cache.code_of(other).digest, first.digest);
  EXPECT_EQ(cache.code_of(other), user_variant_code(other));
  kvattn::CustomVariant bad = v;
  bad.name = "not an identifier";
  EXPECT_THROW(cache.code_of(bad), kvattn::Error);
  EXPECT_EQ(cache.code_of(other), user_variant_code(other));
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


// The child half of the two-process test below: runs only when that test spawns it.
TEST(CudaUserVariantChild, CompileIntoSharedDir) {
  const char* dir = std::getenv("KVATTN_USER_VARIANT_CHILD_DIR");
  if (!dir) GTEST_SKIP() << "helper of CudaUserVariant.TwoProcessesCompilingOneVariantShareOneEntry (spawned by it)";
  const DecodeKernelConfig c = user_choice(kShapes[0], example("learned_sink", {}, {}, {{"sinks", DType::f32, 1}}));
  KernelCache(dir).cubin(decode_merge_spec(c, "sm_90a"));
}

// Two processes compiling the same user variant's kernel at once both succeed and leave one
// cache entry (the JIT's atomic install; the CPU's shared objects: custom_variant_test.cpp).
TEST(CudaUserVariant, TwoProcessesCompilingOneVariantShareOneEntry) {
  namespace fs = std::filesystem;
  const TempDir tmp("kvattn-user-variant");
  const fs::path& dir = tmp.path;
  run_copies_of_this_binary(2, "CudaUserVariantChild.CompileIntoSharedDir", "KVATTN_USER_VARIANT_CHILD_DIR=" + dir.string());
  size_t entries = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) entries += e.is_regular_file();
  EXPECT_EQ(entries, 1u);
  const DecodeKernelConfig c = user_choice(kShapes[0], example("learned_sink", {}, {}, {{"sinks", DType::f32, 1}}));
  const CubinLookup r = KernelCache(dir).cubin(decode_merge_spec(c, "sm_90a"));
  EXPECT_EQ(r.source, CacheSource::disk);
  EXPECT_TRUE(is_elf(*r.cubin));
}
}  // namespace
}  // namespace kvattn_test
#endif
