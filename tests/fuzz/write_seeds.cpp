// Writes the seed corpus of every fuzz target, made by sorl's own encoders, as
// DIR/<target>/seed-<n> (scripts/fuzz runs it before the harnesses).

#include <filesystem>
#include <fstream>
#include <iostream>

#include "tests/fuzz/fuzz_entry.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " DIR\n";
    return 2;
  }
  namespace fs = std::filesystem;
  for (const auto& t : sorl::fuzz::targets()) {
    const fs::path dir = fs::path(argv[1]) / std::string(t.name);
    fs::create_directories(dir);
    const auto seeds = t.seeds();
    for (size_t i = 0; i < seeds.size(); ++i) {
      std::ofstream out(dir / ("seed-" + std::to_string(i)), std::ios::binary | std::ios::trunc);
      out << seeds[i];
      if (!out) {
        std::cerr << "cannot write " << (dir / ("seed-" + std::to_string(i))) << "\n";
        return 1;
      }
    }
    std::cout << t.name << ": " << seeds.size() << " seeds\n";
  }
  return 0;
}
