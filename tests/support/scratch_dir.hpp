#pragma once
// A scratch directory under the tests' data directory, one per process (test runners may run
// cases of one binary concurrently), removed with everything in it when the test ends.

#include <filesystem>
#include <string>

#include <unistd.h>

namespace sorl::test {

struct scratch_dir {
  std::filesystem::path path;

  /// SORL_TEST_DATA_DIR/NAME_PID, emptied first.
  explicit scratch_dir(const std::string& name)
    : path(std::filesystem::path{SORL_TEST_DATA_DIR} / (name + "_" + std::to_string(getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~scratch_dir() {
    // A test may have locked a directory; remove_all needs to enter it.
    std::error_code ec;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(path, ec))
      if (entry.is_directory(ec) && !entry.is_symlink(ec))
        std::filesystem::permissions(entry.path(), std::filesystem::perms::owner_all,
                                     std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(path, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
};

} // namespace sorl::test
