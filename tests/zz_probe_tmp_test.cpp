#include <gtest/gtest.h>
#include "support/attention_case.h"
namespace kvattn_test {
TEST(ProbeTmp, QoLongerThanKv) {
  for (bool causal : {false, true}) for (auto st : {KVStore::ragged, KVStore::paged}) {
    KVATTN_CASE_RNG(rng);
    AttnCase c; c.lens = {{5, 2}, {3, 0}, {2, 2}}; c.num_qo_heads = 2; c.head_dim_qk = 16;
    c.variant.causal = causal; c.store = st; c.page_size = 1;
    run_prefill_case(c, rng);
  }
}
}
