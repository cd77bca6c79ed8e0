#include "core/overrides.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <utility>

#include "kvattn/error.h"

extern char** environ;  // POSIX

namespace kvattn::detail {

using kernels::prefill::PrefillTuning;
using kernels::prefill::SoftmaxForm;
using kernels::prefill::TileSplit;

namespace {

// A value among fixed names; the error lists them.
template <class E, size_t N>
E parse_enum(std::string_view var, std::string_view v, const std::pair<std::string_view, E> (&names)[N]) {
  std::string known;
  for (const auto& [name, e] : names) {
    if (v == name) return e;
    known += (known.empty() ? "" : ", ") + std::string(name);
  }
  throw_error(var, " is one of ", known, ", not '", v, "'");
}

int parse_int(std::string_view var, std::string_view v, int lo, int hi) {
  int x = 0;
  bool ok = !v.empty() && v.size() <= 9;
  for (char ch : v) ok = ok && ch >= '0' && ch <= '9';
  if (ok)
    for (char ch : v) x = x * 10 + (ch - '0');
  KVATTN_CHECK(ok && x >= lo && x <= hi, var, " is a number from ", lo, " to ", hi, ", not '", v, "'");
  return x;
}

bool parse_bool(std::string_view var, std::string_view v) {
  KVATTN_CHECK(v == "0" || v == "1", var, " is 0 or 1, not '", v, "'");
  return v == "1";
}

constexpr std::pair<std::string_view, PrefillLongShape> kLongShapes[] = {
    {"m2k64", PrefillLongShape::m2k64}, {"m2k48", PrefillLongShape::m2k48}, {"m2k48s3", PrefillLongShape::m2k48s3},
    {"m2k32", PrefillLongShape::m2k32}, {"m1k64", PrefillLongShape::m1k64}, {"m2w8", PrefillLongShape::m2w8}};
constexpr std::pair<std::string_view, TanhForm> kTanhForms[] = {{"exact", TanhForm::exact},
                                                               {"approx", TanhForm::approx}};
constexpr std::pair<std::string_view, PrefillTier> kPrefillTiers[] = {{"mma_sync", PrefillTier::mma_sync},
                                                                     {"wgmma", PrefillTier::wgmma}};

// "lazy,swizzle,unroll,packp,lean" (',' or '+' between names; "none": every choice off).
PrefillTuning parse_tuning(std::string_view var, std::string_view v) {
  PrefillTuning t;
  if (v == "none") return t;
  bool softmax_set = false, split_set = false;
  size_t at = 0;
  while (at <= v.size()) {
    const size_t end = v.find_first_of(",+", at);
    const std::string_view name = v.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
    auto softmax = [&](SoftmaxForm f) {
      KVATTN_CHECK(!softmax_set, var, " names two softmax forms in '", v, "'");
      t.softmax = f, softmax_set = true;
    };
    auto split = [&](TileSplit s) {
      KVATTN_CHECK(!split_set, var, " names two tile splits in '", v, "'");
      t.split = s, split_set = true;
    };
    if (name == "lazy") softmax(SoftmaxForm::lazy_rescale);
    else if (name == "shift") softmax(SoftmaxForm::fixed_shift);
    else if (name == "swizzle") t.swizzle_kv = true;
    else if (name == "unroll") t.unroll_qk = true;
    else if (name == "packp") t.pack_p = true;
    else if (name == "lean") t.lean_copies = true;
    else if (name == "wholetile") t.whole_tile_transform = true;
    else if (name == "halves") split(TileSplit::halves);
    else if (name == "quarters") split(TileSplit::quarters);
    else
      throw_error(var, " is 'none' or a list of lazy|shift, swizzle, unroll, packp, lean, wholetile, "
                       "halves|quarters joined by ',' (e.g. lazy,swizzle,unroll,packp,lean), not '", v, "'");
    if (end == std::string_view::npos) break;
    at = end + 1;
  }
  return t;
}

// "<kv_warps>x<tokens>s<stages>[b<ctas>]".
PrefillDecodeShape parse_decode_shape(std::string_view var, std::string_view v) {
  PrefillDecodeShape s{0, 0, 0, 1};
  const std::string text(v);
  int used = 0, used_b = 0;
  bool parsed = std::sscanf(text.c_str(), "%dx%ds%d%n", &s.kv_warps, &s.warp_tokens, &s.stages, &used) == 3;
  if (parsed && size_t(used) < text.size())  // "b<ctas>", and nothing after it
    parsed = std::sscanf(text.c_str() + used, "b%d%n", &s.min_blocks, &used_b) == 1 &&
             size_t(used + used_b) == text.size();
  const bool warps_ok = s.kv_warps == 1 || s.kv_warps == 2 || s.kv_warps == 4 || s.kv_warps == 6 || s.kv_warps == 8;
  const bool valid = parsed && warps_ok && (s.warp_tokens == 16 || s.warp_tokens == 32 || s.warp_tokens == 64) &&
                     s.stages >= 2 && s.stages <= 4 && s.kv_warps * s.warp_tokens <= 128 && s.min_blocks >= 1 &&
                     s.min_blocks <= 8;
  KVATTN_CHECK(valid, var, " is <kv_warps 1|2|4|6|8>x<tokens 16|32|64>s<stages 2-4>",
               "[b<CTAs per SM 1-8>] with at most 128 tokens per tile (e.g. 4x16s2), not '", v, "'");
  return s;
}

struct Entry {
  OverrideDoc doc;
  void (*parse)(std::string_view var, std::string_view value, Overrides& o);
  void (*clear)(Overrides& o);  // back to the default (unset)
};

// The table: every KVATTN_* variable kvattn reads. Kernel-choice overrides are for measurements;
// each bad value is an error of the plan() that reads it.
const std::vector<Entry>& entries() {
  static const std::vector<Entry> table = {
      {{"KVATTN_NUM_THREADS", "1-4096", "CPU backend threads (default: the hardware's)"},
       [](std::string_view var, std::string_view v, Overrides&) { parse_int(var, v, 1, 4096); },
       [](Overrides&) {}},
      {{"KVATTN_CACHE_DIR", "a directory", "JIT cache (default: $XDG_CACHE_HOME/kvattn or ~/.cache/kvattn)"},
       [](std::string_view, std::string_view, Overrides&) {},
       [](Overrides&) {}},
      {{"KVATTN_CXX", "a command", "C++ compiler of user variants for the CPU backend (default: c++)"},
       [](std::string_view, std::string_view, Overrides&) {},
       [](Overrides&) {}},
      {{"KVATTN_TEST_SEED", "an unsigned integer", "replays a test run (the test binaries read it)"},
       [](std::string_view, std::string_view, Overrides&) {},
       [](Overrides&) {}},
      {{"KVATTN_PLAN_TRACE", "1", "prints each GPU plan()'s phases and their times"},
       [](std::string_view var, std::string_view v, Overrides& o) {
         KVATTN_CHECK(v == "1" || v == "0", var, " is 0 or 1, not '", v, "'");
         o.plan_trace = v == "1";
       },
       [](Overrides& o) { o.plan_trace = false; }},
      {{"KVATTN_DECODE_KERNEL", "decode|mma|transposed|bulk|prefill",
        "forces BatchDecode's GPU kernel (decode: the decode kernels' own choice)"},
       [](std::string_view var, std::string_view v, Overrides& o) {
         static constexpr std::pair<std::string_view, DecodeKernelChoice> kNames[] = {
             {"decode", DecodeKernelChoice::decode}, {"mma", DecodeKernelChoice::mma},
             {"transposed", DecodeKernelChoice::transposed}, {"bulk", DecodeKernelChoice::bulk},
             {"prefill", DecodeKernelChoice::prefill}};
         o.decode_kernel = parse_enum(var, v, kNames);
       },
       [](Overrides& o) { o.decode_kernel.reset(); }},
      {{"KVATTN_DECODE_BULK_STAGES", "2-6", "pipeline stages of the bulk-copy decode kernels"},
       [](std::string_view var, std::string_view v, Overrides& o) { o.decode_bulk_stages = parse_int(var, v, 2, 6); },
       [](Overrides& o) { o.decode_bulk_stages.reset(); }},
      {{"KVATTN_DECODE_WARPS", "2-4", "warps of the bulk-copy decode kernels (16 tokens each)"},
       [](std::string_view var, std::string_view v, Overrides& o) { o.decode_warps = parse_int(var, v, 2, 4); },
       [](Overrides& o) { o.decode_warps.reset(); }},
      {{"KVATTN_DECODE_TMA_BOXES", "0|1", "TMA boxes for the decode kernels' K/V pages (sm_90+)"},
       [](std::string_view var, std::string_view v, Overrides& o) { o.decode_tma_boxes = parse_bool(var, v); },
       [](Overrides& o) { o.decode_tma_boxes.reset(); }},
      {{"KVATTN_DECODE_MERGE", "kernel|fold", "split decode rows merged by the merge kernel or folded in-kernel"},
       [](std::string_view var, std::string_view v, Overrides& o) {
         static constexpr std::pair<std::string_view, DecodeMerge> kNames[] = {{"kernel", DecodeMerge::kernel},
                                                                             {"fold", DecodeMerge::fold}};
         o.decode_merge = parse_enum(var, v, kNames);
       },
       [](Overrides& o) { o.decode_merge.reset(); }},
      {{"KVATTN_DECODE_GRID", "items|workers", "one CTA per work item, or persistent CTAs per planner worker"},
       [](std::string_view var, std::string_view v, Overrides& o) {
         static constexpr std::pair<std::string_view, DecodeGrid> kNames[] = {{"items", DecodeGrid::items},
                                                                            {"workers", DecodeGrid::workers}};
         o.decode_grid = parse_enum(var, v, kNames);
       },
       [](Overrides& o) { o.decode_grid.reset(); }},
      {{"KVATTN_DECODE_PDL", "0|1", "programmatic dependent launch of the decode merge"},
       [](std::string_view var, std::string_view v, Overrides& o) { o.decode_pdl = parse_bool(var, v); },
       [](Overrides& o) { o.decode_pdl.reset(); }},
      {{"KVATTN_DECODE_L2_PREFETCH", "64|128|256", "L2 prefetch hint on the decode kernels' K/V copies (bytes)"},
       [](std::string_view var, std::string_view v, Overrides& o) {
         KVATTN_CHECK(v == "64" || v == "128" || v == "256", var, " is 64, 128 or 256, not '", v, "'");
         o.decode_l2_prefetch = parse_int(var, v, 64, 256);
       },
       [](Overrides& o) { o.decode_l2_prefetch.reset(); }},
      {{"KVATTN_PREFILL_VARIANT", "m2k64|m2k48|m2k48s3|m2k32|m1k64|m2w8",
        "the long prefill tile shape (cuda::prefill_long_shape)"},
       [](std::string_view var, std::string_view v, Overrides& o) { o.prefill_long_shape = parse_enum(var, v, kLongShapes); },
       [](Overrides& o) { o.prefill_long_shape.reset(); }},
      {{"KVATTN_PREFILL_TANH", "exact|approx",
        "soft-cap's tanh on every prefill shape (default: tanh.approx on the long shape, exact elsewhere)"},
       [](std::string_view var, std::string_view v, Overrides& o) { o.prefill_tanh = parse_enum(var, v, kTanhForms); },
       [](Overrides& o) { o.prefill_tanh.reset(); }},
      {{"KVATTN_PREFILL_TIER", "mma_sync|wgmma",
        "the prefill kernel tier where both apply (default: wgmma on sm_90a, cuda::choose_prefill)"},
       [](std::string_view var, std::string_view v, Overrides& o) {
         o.prefill_tier = parse_enum(var, v, kPrefillTiers);
       },
       [](Overrides& o) { o.prefill_tier.reset(); }},
      {{"KVATTN_PREFILL_TUNING", "none | lazy|shift,swizzle,unroll,packp,lean,wholetile,halves|quarters",
        "the prefill kernels' code-generation choices (kernels/prefill/smem_layout.cuh)"},
       [](std::string_view var, std::string_view v, Overrides& o) { o.prefill_tuning = parse_tuning(var, v); },
       [](Overrides& o) { o.prefill_tuning.reset(); }},
      {{"KVATTN_PREFILL_LAZY_LOG2", "1-8", "the lazy rescale's threshold (log2; default 8)"},
       [](std::string_view var, std::string_view v, Overrides& o) { o.prefill_lazy_log2 = parse_int(var, v, 1, 8); },
       [](Overrides& o) { o.prefill_lazy_log2.reset(); }},
      {{"KVATTN_PREFILL_DECODE_SHAPE", "<kv_warps>x<tokens>s<stages>[b<ctas>]",
        "the prefill kernels' decode shape (e.g. 4x16s2b3)"},
       [](std::string_view var, std::string_view v, Overrides& o) {
         o.prefill_decode_shape = parse_decode_shape(var, v);
       },
       [](Overrides& o) { o.prefill_decode_shape.reset(); }},
  };
  return table;
}

const Entry* find(std::string_view name) {
  for (const Entry& e : entries())
    if (e.doc.name == name) return &e;
  return nullptr;
}

// The one place the environment is read.
std::optional<std::string> read_env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

std::optional<std::string> checked_setting(const char* name) {
  auto v = read_env(name);
  if (!v || v->empty()) return std::nullopt;
  Overrides ignored;
  find(name)->parse(name, *v, ignored);
  return v;
}

thread_local const OverridesScope* active_scope = nullptr;
const Overrides kNoOverrides{};

}  // namespace

Overrides Overrides::from_environment() {
  Overrides o;
  constexpr char kPrefix[] = "KVATTN_";
  for (char** e = environ; e && *e; ++e) {
    if ((*e)[0] != 'K' || std::strncmp(*e, kPrefix, sizeof(kPrefix) - 1) != 0) continue;
    const std::string_view entry(*e);
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = entry.substr(0, eq), value = entry.substr(eq + 1);
    if (value.empty()) continue;  // set but empty: as unset
    // Variables the library does not read (KVATTN_SKIP_ASAN of scripts/test, say) are not its business.
    const Entry* row = find(name);
    if (!row) continue;
    row->parse(name, value, o);
  }
  return o;
}

void set_override(Overrides& o, std::string_view name, const char* value) {
  const Entry* row = find(name);
  KVATTN_CHECK(row != nullptr, "unknown override ", name);
  if (value && *value)
    row->parse(name, value, o);
  else
    row->clear(o);
}

std::optional<int> num_threads_setting() {
  const auto v = checked_setting("KVATTN_NUM_THREADS");
  if (!v) return std::nullopt;
  return std::atoi(v->c_str());
}

std::optional<std::string> cache_dir_setting() { return checked_setting("KVATTN_CACHE_DIR"); }
std::optional<std::string> cxx_setting() { return checked_setting("KVATTN_CXX"); }

std::optional<std::string> system_environment(const char* name) {
  auto v = read_env(name);
  if (v && v->empty()) return std::nullopt;
  return v;
}

const std::vector<OverrideDoc>& override_table() {
  static const std::vector<OverrideDoc> docs = [] {
    std::vector<OverrideDoc> d;
    for (const Entry& e : entries()) d.push_back(e.doc);
    return d;
  }();
  return docs;
}

std::string override_table_markdown() {
  std::ostringstream os;
  os << "| variable | values | what it sets |\n|---|---|---|\n";
  for (const OverrideDoc& d : override_table()) {
    std::string values(d.values);
    for (size_t at = 0; (at = values.find('|', at)) != std::string::npos; at += 2) values.replace(at, 1, "\\|");
    os << "| `" << d.name << "` | " << values << " | " << d.help << " |\n";
  }
  return os.str();
}

const Overrides& active_overrides() { return active_scope ? active_scope->get() : kNoOverrides; }
const Overrides* scoped_overrides() { return active_scope ? &active_scope->get() : nullptr; }

OverridesScope::OverridesScope(Overrides o) : value_(std::move(o)), outer_(active_scope) { active_scope = this; }
OverridesScope::~OverridesScope() { active_scope = outer_; }

EnvironmentOverridesScope::EnvironmentOverridesScope() {
  if (!active_scope) scope_.emplace(Overrides::from_environment());
}

std::string tuning_name(const PrefillTuning& t) {
  std::string n;
  auto add = [&n](const char* part) { n.append(n.empty() ? "" : "-").append(part); };
  if (t.softmax == SoftmaxForm::lazy_rescale) add("lazy");
  if (t.softmax == SoftmaxForm::fixed_shift) add("shift");
  if (t.swizzle_kv) add("swizzle");
  if (t.unroll_qk) add("unroll");
  if (t.pack_p) add("packp");
  if (t.lean_copies) add("lean");
  if (t.whole_tile_transform) add("wholetile");
  if (t.split == TileSplit::halves) add("halves");
  if (t.split == TileSplit::quarters) add("quarters");
  return n.empty() ? "none" : n;
}

std::string_view name_of(PrefillLongShape s) {
  for (const auto& [name, e] : kLongShapes)
    if (e == s) return name;
  return "?";
}

std::string_view name_of(TanhForm t) { return t == TanhForm::exact ? "exact" : "approx"; }
std::string_view name_of(PrefillTier t) { return t == PrefillTier::wgmma ? "wgmma" : "mma_sync"; }

}  // namespace kvattn::detail
