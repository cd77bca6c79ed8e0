// The work one request gives the planner, in closed form: its query tiles and the sum of their
// visible KV lengths (causal mask and sliding window aligned bottom-right, as the planner cuts
// them). O(1) per request, so plan() checks a batch's limits before it builds anything.
#pragma once

#include <cstdint>

namespace kvattn {

struct RequestWork {
  int64_t tiles = 0;     // ceil(qo / query_tile)
  __int128 visible = 0;  // sum over the tiles of their visible KV tokens
};

RequestWork request_work(int64_t qo, int64_t kv, int query_tile, bool causal, int window_left);

}  // namespace kvattn
