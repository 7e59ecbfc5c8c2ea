// Options: every size and threshold of the engine, validated by Engine::Open. The settings a
// host exposes (sizes, thresholds, intervals) come from settings.def, one line each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "slipstream/engine/observer.h"
#include "slipstream/engine/settings.def"  // its constants (SS_CTYPE_*, SS_SCALE_*)
#include "slipstream/engine/status.h"

namespace slipstream::engine {

struct Options {
  // Directory holding the device file and the manifest; created if missing.
  std::string directory;

  // The settings of settings.def, one field each, initialised to the engine's default (in
  // bytes or milliseconds where the table counts in a unit). Their ranges and descriptions are
  // there; Engine::Open refuses values outside them.
#define SS_SETTING(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, CONTEXT, DESCRIPTION) \
  SS_CTYPE_##KIND FIELD = SS_SETTING_VALUE_##KIND(DEFAULT, SS_SCALE_##UNIT);
#include "slipstream/engine/settings.def"

  // Verify B+-tree node checksums (corruption is reported, never followed): a read checks a
  // node the first time this handle reads it (node_check_cache.h), Verify and compactions check
  // every node every time. false: never verified.
  bool verify_checksums = true;

  // Upper bound of the device file; also the size of the read-only mapping reserved.
  uint64_t max_device_size = 256ull << 30;

  // Limits on user input.
  uint32_t max_key_size = 1024;
  uint32_t max_value_size = 1u << 20;

  // fdatasync on Sync(); tests that only care about crash-of-process may keep it, benches too.
  bool use_fsync = true;

  // Whether the background flusher's periodic write-outs (every flush_interval_ms) end with an
  // fdatasync, so unsynced puts become durable within that interval. A host whose own log
  // holds every change (PostgreSQL's WAL, replayed after a crash from its last Sync()) turns
  // this off: the write-outs then only free log buffers, and durability costs one fdatasync a
  // host-chosen Sync() instead of one every flush interval.
  bool sync_background_flushes = true;

  // Write-ahead barrier: called before newly appended records can reach the device (before
  // each log write-out and before a memtable is compacted), in the process doing the write.
  // A host that logs its changes elsewhere first (PostgreSQL's WAL) makes that log durable up
  // to every change already applied here, so nothing the host's log lacks is ever persisted.
  // A failure fails the write-out. Empty: no barrier.
  std::function<Status()> persist_barrier;

  // Positions in the host's log (any unit that grows, such as PostgreSQL's WAL LSNs), so that
  // periodic write-outs seldom need the barrier: host_log_needed is a position the host's log
  // must be durable up to for every change already applied here, host_log_durable how far it
  // is durable now. Given both (and persist_barrier), a periodic write-out captures the ends of
  // the appends so far and the needed position, and a later one writes those bytes out once
  // the host made that position durable by itself (its commits' flushes, its log writer), with
  // no call of the barrier; a capture still waiting after max_writeout_lag_ms goes out with
  // everything else, behind the barrier. Write-outs of sealed segments and Sync() always call
  // the barrier. Empty: every write-out calls it.
  std::function<uint64_t()> host_log_needed;
  std::function<uint64_t()> host_log_durable;
  uint32_t max_writeout_lag_ms = 400;

  // A writer waiting for memtable room asks this (in its own process) on every round; true
  // ends the wait with Status::Busy, so the host can honour a cancel or timeout. Empty: never.
  std::function<bool()> interrupted;

  // Told about log write-outs and compactions in this handle's process (observer.h). Empty:
  // nobody is told.
  std::shared_ptr<EngineObserver> observer;
};

}  // namespace slipstream::engine
