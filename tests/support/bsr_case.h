// One BlockSparseAttention case on the CPU backend against the float64 reference: a random R x C
// block pattern (columns listed in random order), inputs from the case's fill, every output and lse
// checked.
#pragma once

#include "support/attention_case.h"
#include "support/random.h"

namespace kvattn_test {

struct BsrCase {
  int64_t M = 16, N = 16, R = 4, C = 4;
  double density = 0.5;  // probability that a block is present
  AttnCase base;         // heads, dims, dtypes, variant, strided, want_lse, fill (lens unused)
};

void run_bsr_case(const BsrCase& bc, Rng& rng);

}  // namespace kvattn_test
