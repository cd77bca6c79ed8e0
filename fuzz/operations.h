// The per-operation fuzzers behind fuzz_one() (api_fuzz.h). Each builds a small random legal
// problem from ctx.src and then, as ctx.corrupt says, either runs it and checks the result against
// an independent reference, or corrupts it and requires kvattn::Error with every buffer untouched.
// A failed check throws Failure.
#pragma once

#include "fuzz/harness.h"

namespace kvattn_fuzz {

enum class AttentionApi { decode, prefill_ragged, prefill_paged, block_sparse };

void fuzz_attention(Ctx& ctx, AttentionApi api);  // attention_fuzz.cpp
void fuzz_merge_state(Ctx& ctx);                  // ops_fuzz.cpp
void fuzz_merge_state_in_place(Ctx& ctx);
void fuzz_merge_states(Ctx& ctx);
void fuzz_append(Ctx& ctx);
void fuzz_rope(Ctx& ctx);
void fuzz_planner(Ctx& ctx);  // planner_fuzz.cpp
void fuzz_cascade(Ctx& ctx);  // cascade_fuzz.cpp

// Shared by the attention and planner fuzzers: legal scheduler options for a batch of `batch`
// requests and `tokens` query tokens (graph capacity, when on, covers them).
kvattn::SchedulerOptions random_scheduler(Source& src, int64_t batch, int64_t tokens, bool allow_zero_workers);
// Corruptions of SchedulerOptions fields (always illegal: negative or oversized worker counts,
// negative split sizes or cost coefficients, a graph capacity below the batch).
void scheduler_corruptions(Ctx& ctx, std::vector<Corruption>& out, kvattn::SchedulerOptions& opt,
                           int64_t batch, int64_t tokens);

}  // namespace kvattn_fuzz
