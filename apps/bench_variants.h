// The variants `kvattn bench decode|prefill --variant NAME` time, built-in ones and the user
// variants of examples/variants/ that compute the same thing (issue 27's "within 5% of the
// built-in" rows), plus the learned sinks and document masking. A user variant's parameter
// tensors live on the GPU for as long as the BenchVariant does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kvattn/variant.h"

namespace kvattn_cli {

struct BenchVariant {
  std::string name = "plain";
  kvattn::Variant variant;        // on top of the case's own (causal, fp8 scales)
  double visible_fraction = 1.0;  // of the case's visible pairs that the variant leaves visible
  std::vector<std::shared_ptr<void>> device_buffers;
};

// Names --variant takes, for the help text.
const char* bench_variant_names();

// `name` for a case of `num_qo_heads` query heads, `batch` requests and up to `max_len` positions
// (document masking: documents of `doc_len` tokens), on top of `base`; user variants read their source
// from `examples_dir`. Throws kvattn::Error naming an unknown variant or a missing file.
BenchVariant make_bench_variant(const std::string& name, const kvattn::Variant& base, int num_qo_heads,
                                int64_t max_len, int64_t batch, const std::string& examples_dir,
                                int64_t doc_len = 1024);

}  // namespace kvattn_cli
