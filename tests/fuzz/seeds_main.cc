// fuzz_seeds: writes the seed corpus of every fuzz target, corpus/TARGET/NAME, from the writers
// the NAME_seeds.cc files register. `fuzz_seeds DIR` replaces what DIR held for each target.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "seeds.h"

namespace slipstream::fuzz {

// Every registered writer, by target; a function-local static, so order of registration is safe.
static std::map<std::string, SeedWriter>& Writers() {
  static std::map<std::string, SeedWriter> writers;
  return writers;
}

SeedRegistration::SeedRegistration(const char* target, SeedWriter writer) {
  Writers()[target] = writer;
}

}  // namespace slipstream::fuzz

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds CORPUS_DIR\n");
    return 2;
  }
  for (const auto& [target, writer] : slipstream::fuzz::Writers()) {
    fs::path dir = fs::path(argv[1]) / target;
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::vector<slipstream::fuzz::Seed> seeds = writer();
    for (const auto& seed : seeds) {
      std::ofstream out(dir / seed.name, std::ios::binary);
      out.write(seed.bytes.data(), std::streamsize(seed.bytes.size()));
      if (!out) {
        std::fprintf(stderr, "fuzz_seeds: cannot write %s\n", (dir / seed.name).c_str());
        return 1;
      }
    }
    std::printf("%-24s %zu seeds\n", target.c_str(), seeds.size());
  }
  return 0;
}
