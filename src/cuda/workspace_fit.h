// The plan a runner stages into the caller's workspace: the planner's choice, or, when its split
// KV's partial states do not fit (FlashInfer's callers size workspaces themselves: its tests give
// a two-level cascade 32 MiB, 16 MiB a level), the unsplit plan of the same batch (the same
// attention, slower on skewed batches). Graph mode keeps its fixed sizes and fails instead.
#pragma once

#include <cstdint>
#include <utility>

#include "kvattn/error.h"
#include "kvattn/plan.h"

namespace kvattn::cuda {

// lay_out(plan) returns the runner's workspace layout of that plan (its `end` the bytes it needs).
// opts.disable_split_kv is set when the unsplit plan was taken.
template <class LayOut>
auto plan_within_workspace(Planner& planner, const PlannerInputs& in, SchedulerOptions& opts,
                           int64_t workspace_bytes, LayOut&& lay_out) {
  const Plan* plan = &planner.plan(in, opts);
  auto layout = lay_out(*plan);
  if (layout.end > workspace_bytes && plan->slot_capacity() > 0 && !opts.disable_split_kv && !opts.cuda_graph) {
    opts.disable_split_kv = true;
    plan = &planner.plan(in, opts);
    layout = lay_out(*plan);
  }
  KVATTN_CHECK(layout.end <= workspace_bytes, "the workspace is too small: this plan needs ", layout.end,
               " bytes, the workspace has ", workspace_bytes);
  return std::pair<const Plan*, decltype(layout)>(plan, layout);
}

}  // namespace kvattn::cuda
