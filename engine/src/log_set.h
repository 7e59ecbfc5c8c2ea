// LogSet: the engine's two shared logs (the L0 recovery log and the large-value log) and
// what happens to their bytes: LSN assignment, appends into segment buffers in the arena,
// rotation to a fresh segment, group-commit write-out to the device, and reading value
// records back (from a buffer or the device, validated before they are trusted).
//
// Appends and rotations run under the engine's write mutex; write-out under the log set's own
// flush mutex, taking the write mutex only to snapshot and to release buffers.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "background_signal.h"
#include "device.h"
#include "node.h"
#include "segment_table.h"
#include "shared_state.h"
#include "slipstream/engine/log_format.h"
#include "slipstream/engine/observer.h"
#include "slipstream/engine/options.h"

namespace slipstream::engine {

class LogSet {
 public:
  // Room always kept in a segment for a NEXT record and its checksum.
  static constexpr uint32_t kReserve = 64;

  LogSet(const Options& options, char* arena, SharedLogs* shared, Device* device,
         SegmentTable* segments, SharedCounters* counters, SharedMutex* write_mu,
         BackgroundSignal* background, EngineObserver* observer)
      : options_(options),
        arena_(arena),
        shared_(shared),
        device_(device),
        segments_(segments),
        counters_(counters),
        write_mu_(write_mu),
        background_(background),
        observer_(observer) {}

  // Lays out the buffers of a fresh arena: kL0LogBuffers from arena offset `l0_buffers`,
  // kLargeLogBuffers from `large_buffers`.
  void Format(uint64_t l0_buffers, uint64_t large_buffers);

  // --- LSNs ---
  Lsn last_lsn() const { return shared_->last_lsn.load(); }
  // Records the LSN of the newest append (the caller holds the write mutex).
  void set_last_lsn(Lsn lsn) { shared_->last_lsn.store(lsn); }
  Lsn durable_lsn() const { return shared_->durable_lsn.load(); }
  void set_durable_lsn(Lsn lsn) { shared_->durable_lsn.store(lsn); }

  // --- appending (the caller holds the write mutex) ---
  // True if `bytes` (plus room for a NEXT record) fit in the log's active segment.
  bool HasRoom(LogKind log, size_t bytes) const {
    return Log(log).cursor.pos + bytes + kReserve <= options_.segment_size;
  }
  // Next free byte of the log's active segment.
  uint32_t position(LogKind log) const { return Log(log).cursor.pos; }
  // Buffers after the active one that are free to start a new segment in.
  int FreeBuffersAhead(LogKind log) const;
  // Seals the active segment with a NEXT record naming a freshly zeroed segment and starts
  // that segment in the next buffer (which the caller made sure is free).
  Status Rotate(LogKind log);
  // Where a record landed.
  struct Appended {
    uint32_t segment;
    uint32_t offset;
  };
  // Appends one record (the caller checked that it fits); no checksum yet.
  Appended Append(LogKind log, LogRecordType type, Lsn lsn,
                  std::initializer_list<std::string_view> parts);
  // Appends the chained checksum that makes every record before it valid.
  void AppendChecksum(LogKind log);
  // Makes the appends so far visible to write-out and to readers of the buffers.
  void Publish(LogKind log);
  // The chain position of the log's active segment.
  uint64_t active_sequence(LogKind log) const {
    const SharedLog& l = Log(log);
    return l.buffers[l.current].sequence;
  }

  // --- write-out ---
  // Writes every appended byte of both logs (large log first: an L0 record never becomes
  // durable before the value it points to), then fdatasync if `sync`; frees written-out
  // sealed buffers. Callers up to `wait_for` that queued behind a sync find their work done.
  Status WriteOut(bool sync, Lsn wait_for);
  // The background flusher's periodic write-out. Without the host log positions of Options
  // (host_log_needed, host_log_durable) it is WriteOut(sync, 0). With them it writes what an
  // earlier call captured once the host's log is durable past it, so the barrier is not
  // called, and captures what is appended now; a capture that waited max_writeout_lag_ms goes
  // out with everything else, behind the barrier. Sets *wrote if bytes went out.
  Status PeriodicWriteOut(bool sync, bool* wrote);
  // Makes every record up to `lsn` durable.
  Status Sync(Lsn lsn);
  // Appended bytes not yet written out.
  bool HasUnflushed() const;
  // A sealed segment still in a buffer: writers need that buffer back soon.
  bool HasSealedBuffer() const;
  // True if a shared buffer still holds `segment` (it may not be freed yet).
  bool IsBuffered(uint32_t segment) const;
  uint64_t last_flush_micros() const { return shared_->last_flush_micros.load(); }

  // --- reading ---
  // Copies the value of a medium or large pointer out, after locating, bounds-checking,
  // checksumming and matching the record to `ikey`; inline values are copied as they are.
  Status ReadValue(std::string_view ikey, const LeafEntry& entry, std::string* value) const;

  // --- recovery ---
  uint64_t next_sequence(LogKind log) const { return Log(log).next_sequence; }
  void set_next_sequence(LogKind log, uint64_t sequence) { Log(log).next_sequence = sequence; }
  // Makes buffer 0 the active buffer over `segment`, continuing after its valid prefix
  // (valid_end 0: a fresh segment). The bytes past the prefix are zeroed on the device so
  // that a torn append can never be mistaken for part of a later one.
  Status Resume(LogKind log, uint32_t segment, uint64_t sequence, uint32_t valid_end,
                uint32_t chain);

 private:
  // What a periodic write-out saw appended, left for the host's log to cover. Process-local:
  // only the process that took it writes by it, under flush_mu.
  struct Capture {
    struct Range {
      bool live;            // the buffer held a segment
      uint32_t generation;  // which use of the buffer
      uint32_t end;         // its appended bytes
    };
    bool valid = false;
    uint64_t host_position = 0;  // host_log_needed(), read after the ends
    uint64_t micros = 0;         // when taken
    Lsn last_lsn = 0;
    Range ranges[2][kLargeLogBuffers] = {};  // [L0, large][buffer]
  };
  static int CaptureIndex(uint32_t kind) { return kind == uint32_t(LogKind::kL0) ? 0 : 1; }
  // Whether the options give the host log positions periodic write-outs wait for.
  bool DefersToHostLog() const;
  Status WriteOutLocked(bool sync, const Capture* upto, bool* wrote);
  void TakeCapture(uint64_t now);

  SharedLog& Log(LogKind log) const { return log == LogKind::kL0 ? shared_->l0 : shared_->large; }
  char* Buffer(const SharedLogBuffer& b) const { return arena_ + b.data_offset; }

  const Options& options_;
  char* arena_;
  SharedLogs* shared_;
  Device* device_;
  SegmentTable* segments_;
  SharedCounters* counters_;
  SharedMutex* write_mu_;
  BackgroundSignal* background_;
  EngineObserver* observer_;
  Capture capture_;
};

}  // namespace slipstream::engine
