// Runs a planner's Plan (include/kvattn/plan.h) on the CPU: each worker's items in its order on
// the global thread pool, partial states of split rows in f32 scratch, then the merge table folds
// each split row's partial states in slot (KV) order into the output. Every item and every merge
// is computed independently of the thread that runs it, so the output is bitwise the same on
// every run of the same plan.
#pragma once

#include <cstdint>
#include <span>

#include "cpu/attention_engine.h"
#include "kvattn/plan.h"

namespace kvattn::cpu {

// Floats of scratch run_plan needs for the plan's partial states (0 when nothing is split).
int64_t plan_scratch_floats(const Plan& plan, int head_dim_vo);

// Executes `plan` for problem `p` (the plan must have been made for p's requests and heads).
// `scratch`: caller memory of at least plan_scratch_floats() floats, or empty to allocate.
void run_plan(const EngineProblem& p, const Plan& plan, std::span<float> scratch = {});

}  // namespace kvattn::cpu
