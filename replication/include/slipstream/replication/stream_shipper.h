// StreamShipper: the primary's writer of one stream (the WAL) to several backups. It formats
// the stream into segments the size of a backup buffer (engine log segments: a header, then
// records carrying stream positions, each append followed by its chained checksum), writes
// every append to every live backup with one-sided WRITEs, and tells how far the stream is
// placed, or durable, on how many backups. A backup whose link fails is dropped from the
// count; the stream goes on on the others.
//
// Not thread-safe: the shipper's one thread drives it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "slipstream/engine/log_writer.h"
#include "slipstream/replication/backup_link.h"

namespace slipstream::replication {

struct SharedCursor;

class StreamShipper {
 public:
  // Room kept at a buffer's end so a record of a few bytes and its checksum always fit before
  // rotating (AppendDirect stops there too).
  static constexpr uint32_t kMinRecordRoom = 64;

  // Every link must offer buffers of one size. The first segment is `first_sequence`, and the
  // stream starts at position `start` (for WAL, an LSN).
  StreamShipper(uint32_t stream, uint64_t first_sequence, uint64_t start,
                std::vector<BackupLink*> links);

  // Appends the stream bytes from position `position` (which must be end()) as one round:
  // one record (more when it crosses buffers) and one checksum per buffer it touches.
  Status Append(uint64_t position, std::string_view bytes);

  // The position after the last appended byte.
  uint64_t end() const { return end_; }

  // Processes completions for up to timeout_ms.
  Status Poll(int timeout_ms);

  // The highest position placed on at least `count` backups (the start if none).
  uint64_t Placed(int count) const;
  // The highest position known durable on at least `count` backups (closed buffers and
  // flushes; the start if none): where such a backup resumes at worst.
  uint64_t Durable(int count) const;
  // Polls until Placed(count) >= position (Timeout, or Unavailable when fewer than `count`
  // backups are left).
  Status WaitPlaced(uint64_t position, int count, int timeout_ms);

  // Makes everything appended durable on every live backup, and returns the position durable
  // on at least `count` of them.
  Status Flush(int count, int timeout_ms, uint64_t* durable);
  // Flush in two halves: StartFlush waits for the placement and sends every live backup its
  // FLUSH; FinishFlush collects the answers. Between them the caller may start the flushes of
  // other shippers, so that backups served by different shippers flush at once.
  Status StartFlush(int timeout_ms);
  Status FinishFlush(int count, uint64_t* durable);

  // Direct appends by other processes (direct_append.h), for a shipper of one backup whose
  // transport lets other processes write into it (shm through the backup's heap, tcp through
  // placer links): ExportCursor describes the open segment (valid = 0 when there is none, or
  // the backup cannot be written so); AdoptCursor takes over what was appended through such a
  // description since, before this shipper appends, rotates or flushes again. The caller holds
  // the lock that serialises the appends. A cursor is exported only once every append of this
  // shipper to the buffer completed, so that appends through it never follow a WRITE that
  // failed. A cursor an appender marked broken (WRITEs that may land unannounced) drops the
  // backup: AdoptCursor returns why, and the caller reconnects (the backup revokes the
  // appender's registrations and persists the valid prefix, which the new link resumes from).
  void ExportCursor(SharedCursor* cursor);
  Status AdoptCursor(const SharedCursor& cursor);

  // Backups still receiving.
  int live() const;
  // Why each dropped backup was dropped (its address and the error).
  std::vector<std::string> failures() const;

 private:
  struct Target {
    BackupLink* link;
    uint32_t buffer = 0;
    bool has_buffer = false;
    Status failed;
    uint64_t placed = 0;    // stream position placed (in closed buffers and the open one)
    uint64_t durable = 0;   // stream position durable
    bool flushing = false;  // a FLUSH was sent and its answer is not read yet
  };
  // Where an append ends in the buffer, and the stream position it completes.
  struct Mark {
    uint32_t offset;
    uint64_t position;
  };

  // Closes the current segment on every live backup (once all of it is placed) and starts
  // the next.
  Status Rotate(int timeout_ms);
  Status StartSegment();
  // Updates each target's placed position from its link.
  void Refresh();
  // The position of the last append that ends at or before `offset` of the open buffer.
  uint64_t PositionAt(uint32_t offset) const;
  void Drop(Target* t, const Status& why);
  uint64_t KthHighest(int count, uint64_t Target::*field) const;

  uint32_t stream_;
  uint32_t size_;
  uint64_t sequence_;
  uint64_t start_;  // of the stream
  uint64_t segment_start_;
  uint64_t end_;
  std::string image_;
  engine::LogCursor cursor_;
  uint32_t shipped_ = 0;  // bytes of the segment written to the backups
  std::vector<Mark> marks_;
  std::vector<Target> targets_;
  bool started_ = false;
};

}  // namespace slipstream::replication
