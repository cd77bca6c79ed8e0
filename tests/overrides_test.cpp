// The KVATTN_* table (src/core/overrides.cpp): one parser per variable into typed Overrides, errors
// that name the variable and the value, scopes that tests stack, the environment read when a plan
// starts, and the README's list generated from the table.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "core/overrides.h"
#include "kvattn/attention.h"
#include "support/expect_error.h"
#include "support/host_tensor.h"
#include "support/paged_kv.h"

namespace {

using kvattn::detail::Overrides;
using kvattn::detail::set_override;

Overrides parsed(const char* name, const char* value) {
  Overrides o;
  set_override(o, name, value);
  return o;
}

TEST(Overrides, EachVariableParsesIntoItsTypedField) {
  using namespace kvattn::detail;
  EXPECT_EQ(parsed("KVATTN_DECODE_KERNEL", "transposed").decode_kernel, DecodeKernelChoice::transposed);
  EXPECT_EQ(parsed("KVATTN_DECODE_BULK_STAGES", "5").decode_bulk_stages, 5);
  EXPECT_EQ(parsed("KVATTN_DECODE_WARPS", "3").decode_warps, 3);
  EXPECT_EQ(parsed("KVATTN_DECODE_TMA_BOXES", "0").decode_tma_boxes, false);
  EXPECT_EQ(parsed("KVATTN_DECODE_MERGE", "fold").decode_merge, DecodeMerge::fold);
  EXPECT_EQ(parsed("KVATTN_DECODE_GRID", "workers").decode_grid, DecodeGrid::workers);
  EXPECT_EQ(parsed("KVATTN_DECODE_PDL", "1").decode_pdl, true);
  EXPECT_EQ(parsed("KVATTN_DECODE_L2_PREFETCH", "128").decode_l2_prefetch, 128);
  EXPECT_EQ(parsed("KVATTN_PREFILL_VARIANT", "m2k48s3").prefill_long_shape, PrefillLongShape::m2k48s3);
  EXPECT_EQ(parsed("KVATTN_PREFILL_TANH", "exact").prefill_tanh, TanhForm::exact);
  EXPECT_EQ(parsed("KVATTN_PREFILL_LAZY_LOG2", "4").prefill_lazy_log2, 4);
  EXPECT_EQ(parsed("KVATTN_PREFILL_DECODE_SHAPE", "6x16s2b2").prefill_decode_shape, (PrefillDecodeShape{6, 16, 2, 2}));
  EXPECT_TRUE(parsed("KVATTN_PLAN_TRACE", "1").plan_trace);
  const auto t = parsed("KVATTN_PREFILL_TUNING", "shift,swizzle,unroll,packp,lean,wholetile,quarters").prefill_tuning;
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->softmax, kvattn::kernels::prefill::SoftmaxForm::fixed_shift);
  EXPECT_EQ(t->split, kvattn::kernels::prefill::TileSplit::quarters);
  EXPECT_TRUE(t->whole_tile_transform);
  EXPECT_EQ(tuning_name(*t), "shift-swizzle-unroll-packp-lean-wholetile-quarters");
  EXPECT_EQ(tuning_name(*parsed("KVATTN_PREFILL_TUNING", "none").prefill_tuning), "none");
  // Every tuning name parses back to the same tuning ('-' of kernel names as ',').
  for (const char* text : {"lazy", "lazy,unroll", "lazy,swizzle,unroll,packp,lean", "shift,halves", "wholetile"}) {
    const auto back = *parsed("KVATTN_PREFILL_TUNING", text).prefill_tuning;
    std::string name = tuning_name(back);
    for (char& ch : name) ch = ch == '-' ? ',' : ch;
    EXPECT_EQ(name, text);
  }
}

TEST(Overrides, BadValuesNameTheVariableAndTheValue) {
  EXPECT_KVATTN_ERROR(parsed("KVATTN_DECODE_KERNEL", "fast"),
                      "KVATTN_DECODE_KERNEL is one of decode, mma, transposed, bulk, prefill, not 'fast'");
  EXPECT_KVATTN_ERROR(parsed("KVATTN_DECODE_BULK_STAGES", "7"), "KVATTN_DECODE_BULK_STAGES is a number from 2 to 6, not '7'");
  EXPECT_KVATTN_ERROR(parsed("KVATTN_DECODE_WARPS", "-1"), "KVATTN_DECODE_WARPS is a number from 2 to 4, not '-1'");
  EXPECT_KVATTN_ERROR(parsed("KVATTN_DECODE_TMA_BOXES", "yes"), "KVATTN_DECODE_TMA_BOXES is 0 or 1, not 'yes'");
  EXPECT_KVATTN_ERROR(parsed("KVATTN_DECODE_L2_PREFETCH", "100"), "KVATTN_DECODE_L2_PREFETCH is 64, 128 or 256, not '100'");
  EXPECT_KVATTN_ERROR(parsed("KVATTN_PREFILL_VARIANT", "m9"), "KVATTN_PREFILL_VARIANT is one of m2k64");
  EXPECT_KVATTN_ERROR(parsed("KVATTN_PREFILL_TUNING", "31"), "KVATTN_PREFILL_TUNING is 'none' or a list of");
  EXPECT_KVATTN_ERROR(parsed("KVATTN_PREFILL_TUNING", "lazy,shift"), "KVATTN_PREFILL_TUNING names two softmax forms");
  EXPECT_KVATTN_ERROR(parsed("KVATTN_PREFILL_DECODE_SHAPE", "3x16s2"), "KVATTN_PREFILL_DECODE_SHAPE is <kv_warps");
  EXPECT_KVATTN_ERROR(parsed("KVATTN_NUM_THREADS", "0"), "KVATTN_NUM_THREADS is a number from 1 to 4096, not '0'");
  EXPECT_KVATTN_ERROR(parsed("KVATTN_NOT_A_KNOB", "1"), "unknown override KVATTN_NOT_A_KNOB");
}

TEST(Overrides, ClearingAVariableRestoresItsDefault) {
  Overrides o = parsed("KVATTN_DECODE_KERNEL", "mma");
  set_override(o, "KVATTN_DECODE_GRID", "workers");
  set_override(o, "KVATTN_DECODE_KERNEL", nullptr);
  EXPECT_FALSE(o.decode_kernel.has_value());
  EXPECT_TRUE(o.decode_grid.has_value());
  set_override(o, "KVATTN_DECODE_GRID", "");
  EXPECT_EQ(o, Overrides{});
  for (const auto& row : kvattn::detail::override_table()) set_override(o, std::string(row.name).c_str(), nullptr);
  EXPECT_EQ(o, Overrides{});
}

TEST(Overrides, ScopesStackAndRestore) {
  EXPECT_EQ(kvattn::detail::scoped_overrides(), nullptr);
  {
    kvattn::detail::OverridesScope outer(parsed("KVATTN_DECODE_PDL", "0"));
    EXPECT_EQ(kvattn::detail::active_overrides().decode_pdl, false);
    {
      kvattn::detail::OverridesScope inner(parsed("KVATTN_DECODE_PDL", "1"));
      EXPECT_EQ(kvattn::detail::active_overrides().decode_pdl, true);
      kvattn::detail::EnvironmentOverridesScope env;  // a test's scope wins over the environment
      EXPECT_EQ(kvattn::detail::active_overrides().decode_pdl, true);
    }
    EXPECT_EQ(kvattn::detail::active_overrides().decode_pdl, false);
  }
  EXPECT_EQ(kvattn::detail::scoped_overrides(), nullptr);
  EXPECT_EQ(kvattn::detail::active_overrides(), Overrides{});
}

// The environment is read when a plan() starts: a bad value fails that plan, naming the variable,
// and leaves the previous plan in place (the one test that sets a real environment variable).
TEST(Overrides, EnvironmentIsReadWhenAPlanStarts) {
  kvattn_test::HostTensor indptr = kvattn_test::int32_tensor({0, 1}), indices = kvattn_test::int32_tensor({0}),
                          last = kvattn_test::int32_tensor({3});
  kvattn::BatchDecodePlan p;
  p.num_qo_heads = p.num_kv_heads = 1;
  p.head_dim_qk = 16;
  p.page_size = 4;
  p.page_table = {indptr.view(), indices.view(), last.view()};
  kvattn::BatchDecode op;
  op.plan(p);
  const char* saved = std::getenv("KVATTN_DECODE_GRID");
  const std::string keep = saved ? saved : "";
  ::setenv("KVATTN_DECODE_GRID", "sideways", 1);
  EXPECT_KVATTN_ERROR(op.plan(p), "KVATTN_DECODE_GRID is one of items, workers, not 'sideways'");
  EXPECT_NE(op.schedule(), nullptr);  // the earlier plan stays
  ::setenv("KVATTN_DECODE_GRID", "workers", 1);
  EXPECT_EQ(Overrides::from_environment().decode_grid, kvattn::detail::DecodeGrid::workers);
  if (saved) ::setenv("KVATTN_DECODE_GRID", keep.c_str(), 1);
  else ::unsetenv("KVATTN_DECODE_GRID");
}

// README.md's list of variables is the table's (regenerate it with `kvattn info --env`).
TEST(Overrides, ReadmeListsTheTable) {
  std::ifstream in(std::string(KVATTN_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in) << "README.md not found under " << KVATTN_SOURCE_DIR;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string readme = ss.str(), begin = "<!-- env-table:begin -->\n", end = "<!-- env-table:end -->";
  const size_t b = readme.find(begin), e = readme.find(end);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(e, std::string::npos);
  EXPECT_EQ(readme.substr(b + begin.size(), e - b - begin.size()), kvattn::detail::override_table_markdown())
      << "README.md's variable list differs from the table: paste `kvattn info --env` between the markers";
}

}  // namespace
