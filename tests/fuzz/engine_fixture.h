// engine_fixture.h: what the engine's fuzz targets and their seed writers build the same way:
// private directories and device files, the arena parts a manifest describes, and engines with
// recovery_fuzz's options. One copy, so that a target reads its seeds with the options and the
// layout they were written with.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "arena_layout.h"
#include "device.h"
#include "fuzz_input.h"
#include "keyspace_table.h"
#include "level_set.h"
#include "log_set.h"
#include "segment_table.h"
#include "shared_state.h"
#include "slipstream/engine/engine.h"

namespace slipstream::fuzz {

// Makes a fresh directory STEM-XXXXXX under `base` for this process's files (several fuzzing
// processes may run at once); stops the run, reported for `target`, when it cannot.
inline std::string PrivateDirectory(const char* target, const std::filesystem::path& base,
                                    const char* stem) {
  std::string path = base / (std::string(stem) + "-XXXXXX");
  if (mkdtemp(path.data()) == nullptr) FuzzFailure(target, "cannot make a directory");
  return path;
}

// A device file of `segments` segments in a private directory under the temporary directory,
// open both as the engine opens it (device(), which the readers under test read through) and as
// a plain file (Write, which places an input's images in it); removed with its directory when
// destroyed, so that a fuzzing process leaves nothing behind.
class DeviceFile {
 public:
  // Makes the directory and the device file; stops the run, reported for `target`, on failure.
  DeviceFile(const char* target, const char* stem, uint32_t segment_size, uint32_t segments)
      : target_(target),
        segment_size_(segment_size),
        dir_(PrivateDirectory(target, std::filesystem::temp_directory_path(), stem)) {
    engine::Status s =
        device_.Open(dir_ + "/segments", segment_size, uint64_t(segments) * segment_size);
    if (s.ok()) s = device_.Grow(segments);
    if (!s.ok()) FuzzFailure(target, "cannot open the device", s);
    fd_ = open((dir_ + "/segments").c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) FuzzFailure(target, "cannot open the device file for writing");
  }
  // Closes the file and removes the directory.
  ~DeviceFile() {
    close(fd_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  DeviceFile(const DeviceFile&) = delete;
  DeviceFile& operator=(const DeviceFile&) = delete;

  // The device as the engine's readers see it.
  engine::Device* device() { return &device_; }
  // The device as the engine's readers see it, for read-only contexts.
  const engine::Device* device() const { return &device_; }

  // Writes `n` bytes from `data` at the start of `segment` (spilling into the next ones).
  void Write(uint32_t segment, const char* data, size_t n) {
    if (pwrite(fd_, data, n, off_t(uint64_t(segment) * segment_size_)) != ssize_t(n)) {
      FuzzFailure(target_, "cannot write the device file");
    }
  }

 private:
  const char* target_;
  uint32_t segment_size_;
  std::string dir_;
  engine::Device device_;
  int fd_ = -1;
};

// The options manifest_seeds writes its manifests with and manifest_fuzz loads them with
// (test_util.h's SmallOptions): a manifest must repeat segment_size, node_size and max_levels.
inline engine::Options ManifestOptions() {
  engine::Options o;
  o.directory = "/nonexistent";
  o.segment_size = 256u << 10;
  o.node_size = 4096;
  o.max_levels = 5;
  o.max_device_size = 64ull * o.segment_size;
  return o;
}

// The parts of an arena that a manifest describes and loading one fills in, built the way
// EngineImpl builds them, over a mapping of their own that ends with the keyspace table (no
// memtables or log buffers are needed). The parts are public: the seeds fill them in, the
// target loads into them and checks them.
class ManifestArena {
 public:
  // The device file's size in segments: below the maximum, so that a manifest may describe
  // segments beyond it.
  static constexpr uint64_t kDeviceSegments = 48;

  // Maps a zeroed arena and lays out the parts over it, as EngineImpl's constructor does; stops
  // the run, reported for `target`, when it cannot map one.
  explicit ManifestArena(const char* target)
      : options(ManifestOptions()),
        layout(engine::ArenaLayout::For(options)),
        size(layout.memtables),
        arena(static_cast<char*>(
            mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))),
        shared(reinterpret_cast<engine::SharedState*>(arena)),
        segments(arena, &shared->segments, nullptr),
        keyspaces(arena, &shared->keyspaces),
        logs(options, arena, &shared->logs, nullptr, &segments, &shared->counters,
             &shared->write_mu, nullptr, nullptr),
        levels(options, &shared->levels, &shared->counters),
        target_(target) {
    if (arena == MAP_FAILED) FuzzFailure(target_, "cannot map an arena");
  }
  // Unmaps the arena.
  ~ManifestArena() { munmap(arena, size); }
  ManifestArena(const ManifestArena&) = delete;
  ManifestArena& operator=(const ManifestArena&) = delete;

  // Zeroes the arena and formats it as FormatArena and Recover do. The arena is zeroed by
  // dropping its pages, which costs only the few pages a load touched.
  void Format() {
    if (madvise(arena, size, MADV_DONTNEED) != 0) FuzzFailure(target_, "cannot zero the arena");
    segments.Format(layout.segment_table, options.max_device_size / options.segment_size);
    keyspaces.Format(layout.keyspace_table);
    levels.Format();
    segments.set_count(kDeviceSegments);
    segments.info(0).kind = uint8_t(engine::SegmentKind::kReserved);
  }

  engine::Options options;
  engine::ArenaLayout layout;
  size_t size;
  char* arena;
  engine::SharedState* shared;
  engine::SegmentTable segments;
  engine::KeyspaceTable keyspaces;
  engine::LogSet logs;
  engine::LevelSet levels;

 private:
  const char* target_;
};

// The segment size of recovery_fuzz's engines, in which recovery_seeds cuts its segments.
constexpr uint32_t kRecoverySegmentSize = 256u << 10;

// The options recovery_fuzz opens its engines with and recovery_seeds runs its engine with:
// one L0 megabyte, the smallest segments, a device of 64 segments, no fsync (nothing here needs
// to survive a machine crash).
inline engine::Options RecoveryOptions(const std::string& dir) {
  engine::Options o;
  o.directory = dir;
  o.segment_size = kRecoverySegmentSize;
  o.node_size = 4096;
  o.l0_size = 1u << 20;
  o.memtables = 2;
  o.max_levels = 5;
  o.max_key_size = 256;
  o.max_value_size = 32u << 10;
  o.max_device_size = 64ull * kRecoverySegmentSize;
  o.use_fsync = false;
  return o;
}

// An anonymous mapping the size of an engine's arena, to open engines with `options` on as
// after a restart (the engines must be gone before it is).
class EngineArena {
 public:
  // Maps the arena; stops the run, reported for `target`, when it cannot.
  EngineArena(const char* target, const engine::Options& options)
      : target_(target),
        options_(options),
        size_(engine::Engine::ArenaSize(options)),
        arena_(mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) {
    if (arena_ == MAP_FAILED) FuzzFailure(target_, "cannot map an arena");
  }
  // Unmaps the arena.
  ~EngineArena() { munmap(arena_, size_); }
  EngineArena(const EngineArena&) = delete;
  EngineArena& operator=(const EngineArena&) = delete;

  // Opens the engine on the arena zeroed, as after a restart; the pages are dropped rather than
  // written, which costs only those the last engine touched.
  engine::Status Open(std::unique_ptr<engine::Engine>* engine) {
    if (madvise(arena_, size_, MADV_DONTNEED) != 0) FuzzFailure(target_, "cannot zero the arena");
    return engine::Engine::Open(options_, arena_, size_, engine);
  }

 private:
  const char* target_;
  engine::Options options_;
  size_t size_;
  void* arena_;
};

}  // namespace slipstream::fuzz
