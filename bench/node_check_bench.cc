// node_check_bench: a deterministic point-read workload for instruction counts under callgrind
// (issue: check a node's crc32c once per process). One thread loads --num keys in a shuffled
// order (running the background work itself, so the level shape is the same on every run),
// then ReadPhase does --reads uniformly random Gets. engine_bench cannot run under valgrind
// (its 256 GiB device reservation is refused there), hence this small program:
//
//   make build
//   valgrind --tool=callgrind --toggle-collect='*ReadPhase*' build/bench/node_check_bench
//       --num=600000 --reads=300000        (one command line)
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "slipstream/engine/engine.h"

namespace ss = slipstream::engine;

namespace {

// Exits with a message unless `s` is OK.
void Check(const ss::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "node_check_bench: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

// The key of number i, fixed width so that keys sort by number.
std::string Key(uint64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "key%012llu", static_cast<unsigned long long>(i));
  return buf;
}

// A 100-byte value derived from the key number.
std::string Value(uint64_t i) {
  std::string v(100, '\0');
  for (size_t j = 0; j < v.size(); j++) v[j] = char('a' + (i * 31 + j * 7) % 26);
  return v;
}

// The measured part: `reads` Gets of uniformly random keys, each of which must be found.
__attribute__((noinline)) uint64_t ReadPhase(ss::Engine* engine, ss::KeyspaceId ks, uint64_t num,
                                             uint64_t reads) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint64_t> pick(0, num - 1);
  std::string value;
  uint64_t found = 0;
  for (uint64_t r = 0; r < reads; r++) {
    uint64_t i = pick(rng);
    ss::Status s = engine->Get(ks, Key(i), &value);
    if (s.ok() && value == Value(i)) found++;
  }
  return found;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t num = 200000, reads = 300000;
  std::string dir = "/tmp/node_check_bench";
  for (int i = 1; i < argc; i++) {
    std::string_view arg = argv[i];
    if (arg.starts_with("--num=")) {
      num = std::strtoull(argv[i] + 6, nullptr, 10);
    } else if (arg.starts_with("--reads=")) {
      reads = std::strtoull(argv[i] + 8, nullptr, 10);
    } else if (arg.starts_with("--dir=")) {
      dir = std::string(arg.substr(6));
    } else {
      std::fprintf(stderr, "usage: node_check_bench [--num=N] [--reads=N] [--dir=PATH]\n");
      return 2;
    }
  }
  std::filesystem::remove_all(dir);
  ss::Options options;
  options.directory = dir;
  options.l0_size = 4u << 20;
  options.max_device_size = 8ull << 30;  // valgrind refuses the default 256 GiB reservation
  options.use_fsync = false;
  size_t arena_size = ss::Engine::ArenaSize(options);
  void* arena =
      mmap(nullptr, arena_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (arena == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  std::unique_ptr<ss::Engine> engine;
  Check(ss::Engine::Open(options, arena, arena_size, &engine), "open");
  ss::KeyspaceId ks;
  Check(engine->CreateKeyspace(1, &ks), "create keyspace");
  std::vector<uint64_t> order(num);
  for (uint64_t i = 0; i < num; i++) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(42));
  for (uint64_t n = 0; n < num; n++) {
    Check(engine->Put(ks, Key(order[n]), Value(order[n])), "put");
    if (n % 1000 == 999) {
      while (engine->DoBackgroundWork()) {
      }
    }
  }
  while (engine->DoBackgroundWork()) {
  }
  ss::Stats st = engine->GetStats();
  std::printf("loaded %llu keys: %llu compactions, levels:", static_cast<unsigned long long>(num),
              static_cast<unsigned long long>(st.compactions));
  for (const ss::LevelStats& l : st.levels) {
    if (l.entries) std::printf(" L%u=%llu", l.level, static_cast<unsigned long long>(l.entries));
  }
  std::printf(" memtable=%llu\n", static_cast<unsigned long long>(st.l0_entries));
  uint64_t found = ReadPhase(engine.get(), ks, num, reads);
  std::printf("%llu reads, %llu found with the right value\n",
              static_cast<unsigned long long>(reads), static_cast<unsigned long long>(found));
  engine.reset();
  munmap(arena, arena_size);
  std::filesystem::remove_all(dir);
  return found == reads ? 0 : 1;
}
