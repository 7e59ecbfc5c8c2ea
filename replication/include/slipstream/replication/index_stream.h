// Index shipping (Anthus Send-Index) over Tailwind buffers: the primary engine's observer
// events (a compaction's begin, segments, end or abandon, and the large log's bytes) are
// framed into one byte stream, StreamId::kEngineIndex, which a StreamShipper appends to the
// backups like the WAL; on a backup, IndexStore keeps the buffer images like any store and
// feeds the frames, in stream order, to a replica engine's import calls.
//
// A frame: magic u32, type u32, payload length u32, payload, crc32c of everything before it.
// The buffers' chained checksums already refuse torn or damaged records; the frame's own
// checksum also covers what the engine does not checksum (bloom segments, the bloom
// directory) end to end, and a frame that fails it stops the replica's import there.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "slipstream/engine/engine.h"
#include "slipstream/engine/observer.h"
#include "slipstream/replication/backup_store.h"

namespace slipstream::replication {

// The frames of one event each.
std::string EncodeLogWrite(const engine::LogWriteEvent& event);
std::string EncodeCompactionBegin(const engine::CompactionBeginEvent& event);
std::string EncodeCompactionSegment(const engine::CompactionSegmentEvent& event);
std::string EncodeCompactionSegmentLz4(const engine::CompactionSegmentEvent& event);
std::string EncodeCompactionInstalled(const engine::CompactionInstalledEvent& event);
std::string EncodeCompactionAbandoned(uint64_t compaction);
std::string EncodeSeedBegin();
std::string EncodeSeedEnd(const std::vector<uint32_t>& level_trees);
// A WAL horizon: the levels installed before it hold every change the primary's WAL logged
// below `wal_position`, so a replica's WAL replay at promotion may start there.
std::string EncodeHorizon(uint64_t wal_position);
// An uncompressed segment frame compressed (for a backup that wants LZ4); other frames as
// they are.
std::string CompressSegmentFrame(std::string_view frame);
// Whether a frame is a seed's marker (Engine::ShipLevels begins).
bool IsSeedFrame(std::string_view frame);
// Whether a frame is a seed's end.
bool IsSeedEndFrame(std::string_view frame);
// Whether a frame is a compaction's end.
bool IsInstallFrame(std::string_view frame);

// An EngineObserver for a primary that hands every event of index shipping, framed, to
// `emit` (in the order the engine raised them; the caller appends them to the stream). Only
// the large log's bytes are taken: the L0 log travels as WAL. With `lz4`, compaction segments
// are compressed (Anthus pays 1.3-3.8x Build-Index's network bytes without it).
class IndexEventEncoder : public engine::EngineObserver {
 public:
  using Emit = std::function<void(std::string frame)>;
  explicit IndexEventEncoder(Emit emit, bool lz4 = false) : emit_(std::move(emit)), lz4_(lz4) {}
  void OnLogWrite(const engine::LogWriteEvent& event) override;
  void OnSeedBegin() override;
  void OnSeedEnd(const std::vector<uint32_t>& level_trees) override;
  void OnCompactionBegin(const engine::CompactionBeginEvent& event) override;
  void OnCompactionSegment(const engine::CompactionSegmentEvent& event) override;
  void OnCompactionInstalled(const engine::CompactionInstalledEvent& event) override;
  void OnCompactionAbandoned(uint64_t compaction) override;

 private:
  Emit emit_;
  bool lz4_;
};

// How far a replica's import has got, as IndexStore::Progress reports it.
struct ImportProgress {
  uint64_t applied_end = 0;    // stream position applied up to
  uint64_t frames = 0;         // frames applied
  uint64_t installed = 0;      // compactions installed
  uint64_t horizon = 0;        // the highest WAL horizon the stream declared (0: none yet)
  uint64_t refused = 0;        // frames refused so far
  bool awaiting_seed = false;  // skipping the stream until the primary's next seed
  Status error;                // the last refusal (OK if none)
  uint64_t segments = 0;       // segments imported (index, bloom, medium runs)
  uint64_t segment_bytes = 0;  // their bytes, uncompressed
  uint64_t rewrite_nanos = 0;  // time spent rewriting and writing them (Engine::ImportSegment)
};

// Reassembles the stream from records that may split frames, and applies each whole frame to
// a replica engine. Records are taken in stream order; one below the applied end (a buffer
// persisted again) is skipped, one beyond it is held until the gap is filled.
class IndexApplier {
 public:
  // `start`: the stream position of the first frame. `await_seed`: a new replica, which skips
  // the frames before a seed's marker (what they did is reflected in the seed).
  IndexApplier(engine::Engine* replica, uint64_t start, bool await_seed = false)
      : replica_(replica),
        end_(start),
        awaiting_seed_(await_seed),
        max_payload_(uint64_t(replica->options().segment_size) + 4096) {}

  // Takes stream bytes [position, position + bytes.size()) and applies the frames they
  // complete; returns the failure of a frame they hold (damaged, or an import the engine
  // refused). After a failure nothing is applied until a record that begins with a seed's
  // marker (a primary's next connection): the compaction in flight is abandoned, and error()
  // keeps the failure.
  Status Feed(uint64_t position, std::string_view bytes);

  // Frees what the compaction being imported (begun, not ended) wrote so far: the applier is
  // going away (a promotion takes the engine over), and nothing will end it.
  void AbandonOpen();

  // A primary's session started shipping at `position` (BackupStore::NoteSessionStart): a
  // record there that begins with a seed's marker ends what the old session left, a frame it
  // cut or a stream skipped after a refused frame. Only there: a seed's marker inside the
  // stream's bytes (user data in a large value can look like one) is never taken for a cut.
  void AddSessionStart(uint64_t position) { session_starts_.insert(position); }

  // Where the bytes taken so far end, and the frames applied.
  // (Each install also records in the replica where the stream continues after it:
  // Engine::ImportResumePosition, where IndexStore::Recover starts again.)
  uint64_t end() const { return end_; }
  uint64_t frames() const { return frames_; }
  uint64_t installed() const { return installed_; }
  // The highest WAL horizon the stream declared (0: none yet).
  uint64_t horizon() const { return horizon_; }
  // The last failure (OK if none), how many there were, and whether the applier skips the
  // stream until the next seed.
  const Status& error() const { return error_; }
  uint64_t failures() const { return failures_; }
  bool lost() const { return lost_; }
  // Everything above, with the segments imported and the time their rewriting took.
  ImportProgress Progress() const;

 private:
  Status TakeRecord(uint64_t position, std::string_view bytes);
  Status Take(std::string_view fresh);
  Status Drain(std::string_view data, uint64_t base, size_t* used);
  Status Apply(uint32_t type, std::string_view payload, uint64_t frame_end);
  Status ApplyEvent(uint32_t type, std::string_view payload, uint64_t frame_end);
  // Imports one segment into the replica, counting it and the time its rewrite takes.
  Status ImportSegment(const engine::CompactionSegmentEvent& event);

  engine::Engine* replica_;
  uint64_t end_;
  std::string pending_;                           // bytes up to end_ not yet a whole frame
  std::map<uint64_t, std::string> out_of_order_;  // records beyond end_
  uint64_t frames_ = 0;
  uint64_t installed_ = 0;
  uint64_t horizon_ = 0;
  Status error_;
  uint64_t failures_ = 0;
  bool lost_ = false;  // after a failure: skip until a session start's seed
  std::set<uint64_t> session_starts_;
  bool awaiting_seed_;
  uint64_t max_payload_;          // a segment and a frame's fields, with room
  uint64_t open_compaction_ = 0;  // begun and not yet ended: abandoned if a frame fails
  uint64_t segments_ = 0;
  uint64_t segment_bytes_ = 0;
  uint64_t rewrite_nanos_ = 0;
};

// A backup's store when it keeps a Send-Index replica: every stream's images are kept as
// FileBackupStore keeps them, and the index stream of `primary` is also applied to `replica`
// as each persisted prefix arrives. Thread-safe.
class IndexStore : public FileBackupStore {
 public:
  // `index_start`: where the primary's index stream starts, for a replica that installed
  // nothing yet; one that did resumes after its last install. An empty `primary`: the first
  // primary that ships an index stream (Recover: the one whose stream was kept last).
  IndexStore(std::string directory, engine::Engine* replica, std::string primary,
             uint64_t index_start)
      : FileBackupStore(std::move(directory)),
        replica_(replica),
        primary_(std::move(primary)),
        applier_(replica, replica->ImportResumePosition() != 0 ? replica->ImportResumePosition()
                                                               : index_start) {}

  // The import in flight, if any, is abandoned: nothing of it stays allocated.
  ~IndexStore() override;

  // Feeds the kept images of the index stream again from where the replica's last install
  // left off: what it imported after that install (large-log bytes, a compaction in flight)
  // did not survive its restart. Call it before the server serves.
  Status Recover();

  Status Persist(const SegmentId& segment, const char* image, uint32_t from, uint32_t to,
                 const std::vector<engine::ScannedRecord>& records, bool closed) override;

  // Records durably (DIR/PRIMARY/SESSIONS) where a session of the primary starts the index
  // stream, and tells the applier; Recover reads them back.
  Status NoteSessionStart(const std::string& primary, uint32_t stream, uint64_t position) override;

  // Deletes the kept images of the index stream that hold only frames below the replica's
  // last install (Recover never feeds them again); what ResumePosition answers stays.
  Status PruneInstalled(const std::vector<SegmentId>& open, PruneStats* removed);

  // The applier's state, read under the store's lock.
  ImportProgress Progress();

 private:
  engine::Engine* replica_;
  std::string primary_;
  std::mutex mu_;
  IndexApplier applier_;
};

}  // namespace slipstream::replication
