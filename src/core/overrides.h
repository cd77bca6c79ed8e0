// Overrides of kvattn's kernel choices, for measurements and tests, as typed values. The KVATTN_*
// environment variables are parsed at one place (overrides.cpp, one table of {name, values, help,
// parser}) into an Overrides value; nothing else reads the environment. A plan() takes the
// Overrides of its scope: a test's OverridesScope, else those parsed from the environment when
// plan() starts. The kernel-choice functions take them as an argument (pure functions of the
// problem, the device limits and the overrides); `kvattn jit precompile` ignores them unless asked.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/prefill/smem_layout.cuh"  // PrefillTuning, SoftmaxForm, TileSplit

namespace kvattn::detail {

// Which decode kernel BatchDecode runs: the decode kernels' own choice (decode), one of them
// (mma: the cp.async tensor-core kernel, transposed: its tokens-as-rows twin, bulk: the bulk-copy
// kernel without TMA boxes), or the prefill kernels' decode shape (prefill).
enum class DecodeKernelChoice : uint8_t { decode, mma, transposed, bulk, prefill };
// How split decode rows are merged: by the merge kernel, or folded by the last CTA of each row.
enum class DecodeMerge : uint8_t { kernel, fold };
// One CTA per work item, or one persistent CTA per planner worker.
enum class DecodeGrid : uint8_t { items, workers };
// The long prefill tile shapes (cuda::prefill_long_shape has the table).
enum class PrefillLongShape : uint8_t { m2k64, m2k48, m2k48s3, m2k32, m1k64, m2w8 };
// Soft-cap's tanh: exact (ex2 + rcp) or tanh.approx.f32.
enum class TanhForm : uint8_t { exact, approx };
// The prefill kernel tier: mma.sync (portable, sm_80+) or the Hopper wgmma tier (sm_90a only;
// cuda::choose_prefill says where it applies).
enum class PrefillTier : uint8_t { mma_sync, wgmma };

// The prefill kernels' decode shape: KV warps, tokens per warp, stages, CTAs per SM.
struct PrefillDecodeShape {
  int kv_warps, warp_tokens, stages, min_blocks;
  bool operator==(const PrefillDecodeShape&) const = default;
};

struct Overrides {
  std::optional<DecodeKernelChoice> decode_kernel;      // KVATTN_DECODE_KERNEL
  std::optional<int> decode_bulk_stages;                // KVATTN_DECODE_BULK_STAGES, 2..6
  std::optional<int> decode_warps;                      // KVATTN_DECODE_WARPS, 2..4
  std::optional<bool> decode_tma_boxes;                 // KVATTN_DECODE_TMA_BOXES
  std::optional<DecodeMerge> decode_merge;              // KVATTN_DECODE_MERGE
  std::optional<DecodeGrid> decode_grid;                // KVATTN_DECODE_GRID
  std::optional<bool> decode_pdl;                       // KVATTN_DECODE_PDL
  std::optional<int> decode_l2_prefetch;                // KVATTN_DECODE_L2_PREFETCH, 64|128|256 bytes
  std::optional<PrefillLongShape> prefill_long_shape;   // KVATTN_PREFILL_VARIANT
  std::optional<TanhForm> prefill_tanh;                 // KVATTN_PREFILL_TANH
  std::optional<PrefillTier> prefill_tier;              // KVATTN_PREFILL_TIER
  std::optional<kernels::prefill::PrefillTuning> prefill_tuning;  // KVATTN_PREFILL_TUNING
  std::optional<int> prefill_lazy_log2;                 // KVATTN_PREFILL_LAZY_LOG2, 1..8
  std::optional<PrefillDecodeShape> prefill_decode_shape;  // KVATTN_PREFILL_DECODE_SHAPE
  bool plan_trace = false;                              // KVATTN_PLAN_TRACE

  bool operator==(const Overrides&) const = default;
  // Parses the KVATTN_* variables of the environment (kvattn::Error naming the variable and the
  // value for a bad one).
  static Overrides from_environment();
};

// Sets one variable's override in `o` from its text, as the environment would (kvattn::Error
// naming the variable and the value for a bad one, or for a name the table does not have);
// value nullptr or "" clears it. Tests build their Overrides this way (kvattn_test::ScopedOverride)
// or field by field.
void set_override(Overrides& o, std::string_view name, const char* value);

// Settings that are not kernel choices, read through the same table (kvattn::Error for bad values).
std::optional<int> num_threads_setting();        // KVATTN_NUM_THREADS
std::optional<std::string> cache_dir_setting();  // KVATTN_CACHE_DIR
std::optional<std::string> cxx_setting();        // KVATTN_CXX
// A plain environment variable outside kvattn's (XDG_CACHE_HOME, HOME), for the cache directory.
std::optional<std::string> system_environment(const char* name);

// One row of the table, for documentation (`kvattn info --env`, the README list).
struct OverrideDoc {
  std::string_view name, values, help;
};
const std::vector<OverrideDoc>& override_table();
// The README's list of variables, generated from the table (tests compare the README with it).
std::string override_table_markdown();

// The overrides a plan() uses: the innermost OverridesScope's on this thread, else the ones an
// EnvironmentOverridesScope parsed, else none.
const Overrides& active_overrides();
// The innermost OverridesScope's overrides on this thread, or null.
const Overrides* scoped_overrides();

// Makes `o` the active overrides for a scope (tests; nested scopes replace, then restore).
class OverridesScope {
 public:
  explicit OverridesScope(Overrides o);
  ~OverridesScope();
  OverridesScope(const OverridesScope&) = delete;
  OverridesScope& operator=(const OverridesScope&) = delete;
  const Overrides& get() const { return value_; }

 private:
  Overrides value_;
  const OverridesScope* outer_;
};

// What plan() opens: the environment's overrides for its duration, unless a scope is active
// already (a test's OverridesScope wins).
class EnvironmentOverridesScope {
 public:
  EnvironmentOverridesScope();
  EnvironmentOverridesScope(const EnvironmentOverridesScope&) = delete;
  EnvironmentOverridesScope& operator=(const EnvironmentOverridesScope&) = delete;

 private:
  std::optional<OverridesScope> scope_;
};

// Tuning names, as KVATTN_PREFILL_TUNING and kernel names spell them.
std::string tuning_name(const kernels::prefill::PrefillTuning& t);
std::string_view name_of(PrefillLongShape s);
std::string_view name_of(TanhForm t);
std::string_view name_of(PrefillTier t);

}  // namespace kvattn::detail
