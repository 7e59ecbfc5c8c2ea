// Helpers shared by the engine tests: a private directory, a shared arena, small options.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "slipstream/engine/engine.h"

namespace slipstream::engine::test {

// A fresh directory under $TMPDIR (or /tmp), removed at the end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/slipstream-test-XXXXXX";
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An anonymous MAP_SHARED arena: zeroed, inherited by fork()ed children.
class Arena {
 public:
  explicit Arena(size_t size) : size_(size) {
    base_ = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (base_ == MAP_FAILED) base_ = nullptr;
  }
  ~Arena() {
    if (base_) munmap(base_, size_);
  }
  // Back to all zeroes: the next Engine::Open recovers from the directory.
  void Reset() {
    munmap(base_, size_);
    base_ = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  }
  void* base() const { return base_; }
  size_t size() const { return size_; }

 private:
  void* base_;
  size_t size_;
};

// Small sizes so that tests reach compactions, several levels and GC quickly.
inline Options SmallOptions(const std::string& dir) {
  Options o;
  o.directory = dir;
  o.segment_size = 256u << 10;
  o.node_size = 4096;
  o.l0_size = 1u << 20;
  o.growth_factor = 4;
  o.max_levels = 5;
  o.max_key_size = 256;
  o.max_value_size = 32u << 10;
  o.max_device_size = 4ull << 30;
  o.gc_threshold = 0.3;
  o.use_fsync = false;
  return o;
}

// A deterministic value of `size` letters for `seed` (compressible, like text).
inline std::string Value(size_t size, int seed) {
  std::string v(size, '\0');
  for (size_t i = 0; i < size; i++) v[i] = char('a' + (seed * 7 + i * 13 + (i / 7)) % 26);
  return v;
}

// Every (key, value) of keyspace `ks`, read by an iterator.
inline std::map<std::string, std::string> Contents(Engine* e, KeyspaceId ks) {
  std::map<std::string, std::string> out;
  auto it = e->NewIterator(ks);
  for (it->SeekToFirst(); it->Valid(); it->Next()) out[std::string(it->key())] = it->value();
  EXPECT_TRUE(it->status().ok()) << it->status().ToString();
  return out;
}

// An engine with its arena and directory.
struct TestEngine {
  explicit TestEngine(Options (*make)(const std::string&) = SmallOptions)
      : options(make(dir.path())), arena(Engine::ArenaSize(options)) {
    Open();
  }
  void Open() {
    Status s = Engine::Open(options, arena.base(), arena.size(), &engine);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Simulates a restart: drops the handle, zeroes shared memory, recovers from files.
  void Reopen() {
    engine.reset();
    arena.Reset();
    Open();
  }
  Engine* operator->() { return engine.get(); }

  TempDir dir;
  Options options;
  Arena arena;
  std::unique_ptr<Engine> engine;
};

}  // namespace slipstream::engine::test
