// The user variants of examples/variants/ as the tests declare them (docs/VARIANTS.md): each
// example's source with the parameters its hooks read.
#pragma once

#include <string>
#include <vector>

#include "kvattn/variant.h"

namespace kvattn_test {

// examples/variants/<file>
std::string example_source(const std::string& file);

// The example <name>.h declared with these parameters.
kvattn::CustomVariant example(const std::string& name, std::vector<std::string> f32 = {},
                              std::vector<std::string> i32 = {},
                              std::vector<kvattn::CustomVariant::TensorParam> tensors = {});

// Every example, declared as its header comment says.
std::vector<kvattn::CustomVariant> all_examples();

}  // namespace kvattn_test
