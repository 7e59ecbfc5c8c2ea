// seeds.h: how each fuzz target names the valid encodings its fuzzing starts from. A target's
// NAME_seeds.cc registers a writer; fuzz_seeds (seeds_main.cc) runs every writer and stores
// the result as the checked-in corpus, so the seeds always come from the real encoders.
#pragma once

#include <string>
#include <vector>

namespace slipstream::fuzz {

// One seed: a file name inside corpus/TARGET/ and its bytes.
struct Seed {
  std::string name;
  std::string bytes;
};

using SeedWriter = std::vector<Seed> (*)();

// Registers the seed writer of one target; used at static initialisation.
struct SeedRegistration {
  SeedRegistration(const char* target, SeedWriter writer);
};

}  // namespace slipstream::fuzz

// Registers FUNCTION as the seed writer of the fuzz target TARGET (its NAME without _fuzz).
#define SLIPSTREAM_FUZZ_SEEDS(target, function) \
  static ::slipstream::fuzz::SeedRegistration target##_seed_registration(#target, function)
