// libFuzzer harness for one parser, chosen at compile time by SORL_FUZZ_TARGET (the target
// names of fuzz_entry.hpp). Built only with SORL_FUZZ=ON (clang); see tests/fuzz/README.md.

#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_entry.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const sorl::fuzz::target& target = sorl::fuzz::find_target(SORL_FUZZ_TARGET);
  (void)target.run(data, size);
  return 0;
}
