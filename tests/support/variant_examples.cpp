#include "support/variant_examples.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace kvattn_test {

using kvattn::CustomVariant;
using kvattn::DType;

std::string example_source(const std::string& file) {
  std::ifstream f(std::string(KVATTN_SOURCE_DIR) + "/examples/variants/" + file);
  EXPECT_TRUE(f.good()) << "examples/variants/" << file;
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

CustomVariant example(const std::string& name, std::vector<std::string> f32, std::vector<std::string> i32,
                      std::vector<CustomVariant::TensorParam> tensors) {
  CustomVariant v;
  v.name = name;
  v.source = example_source(name + ".h");
  v.f32_params = std::move(f32);
  v.i32_params = std::move(i32);
  v.tensor_params = std::move(tensors);
  return v;
}

std::vector<CustomVariant> all_examples() {
  return {example("soft_cap", {"cap"}),
          example("alibi", {}, {}, {{"slopes", DType::f32, 1}}),
          example("sigmoid", {"bias"}),
          example("t5_bias", {}, {"max_distance"}, {{"bias", DType::f32, 2}}),
          example("document_mask", {}, {}, {{"doc_ids", DType::i32, 1}}),
          example("prefix_lm", {}, {}, {{"prefix_len", DType::i32, 1}}),
          example("streaming_sink", {}, {"num_sink", "window"}),
          example("learned_sink", {}, {}, {{"sinks", DType::f32, 1}})};
}

}  // namespace kvattn_test
