// Options: every size and threshold of the engine, validated by Engine::Open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "slipstream/engine/observer.h"
#include "slipstream/engine/status.h"

namespace slipstream::engine {

struct Options {
  // Directory holding the device file and the manifest; created if missing.
  std::string directory;

  // Size of every device segment (logs, indexes, bloom filters). Power of two, 256 KiB..1 GiB.
  uint32_t segment_size = 2u << 20;

  // Size of a B+-tree node (leaf or index). Power of two, 1 KiB..64 KiB, at most segment_size / 8.
  uint32_t node_size = 8192;

  // Bytes of key-value data an L0 memtable holds before it is compacted into L1.
  uint64_t l0_size = 64ull << 20;

  // Memtable slots in shared memory (2..8), each of about l0_size. One is written, one is
  // compacted; the others let writers go on while long-lived iterators pin the memtables they
  // saw (an iterator pins at most two).
  uint32_t memtables = 4;

  // Capacity ratio between consecutive levels (2..64).
  uint32_t growth_factor = 8;

  // Number of on-device levels L1..Ln (1..12).
  uint32_t max_levels = 7;

  // Key plus value below this many bytes: small, stored in place everywhere.
  uint32_t small_threshold = 100;

  // Key plus value from this many bytes on: large, stored in the large log.
  uint32_t large_threshold = 1000;

  // Level from which medium values are stored in place; 0 means "the last level in use".
  uint32_t medium_inplace_level = 0;

  // LZ4-compress large values (kept only when it saves space).
  bool compress_large = true;

  // A sealed large-log segment whose invalid bytes pass this fraction is garbage-collected.
  double gc_threshold = 0.10;

  // Bloom filter bits per key for each level.
  uint32_t bloom_bits_per_key = 10;

  // Verify node checksums on every read (corruption is reported, never followed).
  bool verify_checksums = true;

  // Upper bound of the device file; also the size of the read-only mapping reserved.
  uint64_t max_device_size = 256ull << 30;

  // Limits on user input.
  uint32_t max_key_size = 1024;
  uint32_t max_value_size = 1u << 20;

  // The background log flusher writes out unsynced appends at least this often (Sync() always
  // flushes at once); like PostgreSQL's wal_writer_delay. 1..10000.
  uint32_t flush_interval_ms = 10;

  // fdatasync on Sync(); tests that only care about crash-of-process may keep it, benches too.
  bool use_fsync = true;

  // Write-ahead barrier: called before newly appended records can reach the device (before
  // each log write-out and before a memtable is compacted), in the process doing the write.
  // A host that logs its changes elsewhere first (PostgreSQL's WAL) makes that log durable up
  // to every change already applied here, so nothing the host's log lacks is ever persisted.
  // A failure fails the write-out. Empty: no barrier.
  std::function<Status()> persist_barrier;

  // A writer waiting for memtable room asks this (in its own process) on every round; true
  // ends the wait with Status::Busy, so the host can honour a cancel or timeout. Empty: never.
  std::function<bool()> interrupted;

  // A writer gives up with Status::Busy after waiting this long while every memtable slot but
  // the active one is pinned by long-lived readers (only they can end the wait, and they may
  // be waiting for this writer). 0: wait for ever.
  uint32_t pinned_wait_ms = 30000;

  // Told about log write-outs and compactions in this handle's process (observer.h). Empty:
  // nobody is told.
  std::shared_ptr<EngineObserver> observer;
};

}  // namespace slipstream::engine
