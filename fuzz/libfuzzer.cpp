// kvattn_libfuzzer: libFuzzer's entry point over the API fuzzer (api_fuzz.h). The input's bytes
// are the iteration's choices (Source's byte mode: operation, sizes, dtypes, variant,
// corruptions, the seed of the tensor values); an input that runs out gives the smallest
// choices. A failed check prints the failure and its trace and aborts, which libFuzzer reports
// as a crash and saves as crash-<hash>; run the binary on that file to replay it.
#include <cstdio>
#include <cstdlib>

#include "fuzz/api_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvattn_fuzz::Source src(data, size);
  try {
    (void)kvattn_fuzz::fuzz_one(src);
  } catch (const kvattn_fuzz::Failure& f) {
    std::fprintf(stderr, "kvattn_libfuzzer: FAILED: %s\n", f.what());
    std::abort();
  }
  return 0;
}
