#include "fuzz/api_fuzz.h"

#include <cstdio>
#include <sstream>

#include "fuzz/operations.h"

namespace kvattn_fuzz {

namespace {
const char* const kNames[kNumOps] = {"decode",       "prefill_ragged",       "prefill_paged", "block_sparse",
                                     "merge_state",  "merge_state_in_place", "merge_states",  "append",
                                     "rope",         "planner",              "cascade"};
const Ctx* g_current = nullptr;

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += "    " + l + "\n";
  return s;
}

struct CurrentGuard {
  explicit CurrentGuard(const Ctx* c) { g_current = c; }
  ~CurrentGuard() { g_current = nullptr; }
};
}  // namespace

const char* op_name(Op op) { return kNames[int(op)]; }

std::optional<Op> parse_op(std::string_view name) {
  for (int i = 0; i < kNumOps; ++i)
    if (name == kNames[i]) return Op(i);
  return std::nullopt;
}

std::string current_trace() { return g_current ? join(g_current->trace) : std::string(); }

Outcome fuzz_one(Source& src, const FuzzOptions& options) {
  const Op op = options.only ? *options.only : Op(src.range(0, kNumOps - 1));
  Ctx ctx(src, options.legal_only, options.corrupt_only);
  CurrentGuard guard(&ctx);
  ctx.note("op ", op_name(op), ctx.corrupt ? " (corrupted)" : " (legal)");
  try {
    switch (op) {
      case Op::decode: fuzz_attention(ctx, AttentionApi::decode); break;
      case Op::prefill_ragged: fuzz_attention(ctx, AttentionApi::prefill_ragged); break;
      case Op::prefill_paged: fuzz_attention(ctx, AttentionApi::prefill_paged); break;
      case Op::block_sparse: fuzz_attention(ctx, AttentionApi::block_sparse); break;
      case Op::merge_state: fuzz_merge_state(ctx); break;
      case Op::merge_state_in_place: fuzz_merge_state_in_place(ctx); break;
      case Op::merge_states: fuzz_merge_states(ctx); break;
      case Op::append: fuzz_append(ctx); break;
      case Op::rope: fuzz_rope(ctx); break;
      case Op::planner: fuzz_planner(ctx); break;
      case Op::cascade: fuzz_cascade(ctx); break;
    }
  } catch (const Failure& f) {
    throw Failure(cat(f.what(), "\n  trace:\n", join(ctx.trace)));
  } catch (const kvattn::Error& e) {
    // Outside expect_success/expect_rejection: the harness built something the API rejects.
    throw Failure(cat("kvattn::Error while building the problem (a harness bug): ", e.what(), "\n  trace:\n", join(ctx.trace)));
  } catch (const std::exception& e) {
    throw Failure(cat("exception outside the checked calls: ", e.what(), "\n  trace:\n", join(ctx.trace)));
  }
  if (options.verbose) std::printf("%s", join(ctx.trace).c_str());
  return {op, ctx.corrupt};
}

int64_t Stats::total() const {
  int64_t n = 0;
  for (int i = 0; i < kNumOps; ++i) n += checked[i] + rejected[i];
  return n;
}

std::string Stats::report() const {
  std::ostringstream os;
  for (int i = 0; i < kNumOps; ++i)
    os << "  " << kNames[i] << ": " << checked[i] << " legal calls checked against the reference, " << rejected[i]
       << " corrupted calls rejected\n";
  return os.str();
}

}  // namespace kvattn_fuzz
