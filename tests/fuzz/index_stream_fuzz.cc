// Fuzzes the index-shipping stream a Send-Index backup parses (index_stream.h): IndexApplier
// reassembles framed compaction events and large-log bytes from the records a primary wrote,
// and hands each decoded event to the replica engine, here a fake that records the calls.
//
// Input: flags (bit 0: the applier awaits a seed; bit 1: sessions mode), a cut count n (mod
// 17), n cut points (u16 each), n + 1 order keys (u8), n + 1 jitter bytes (u8), then the stream.
// The stream is cut into n + 1 records at the cut points.
//  * Default mode: the records are fed in the order of their keys (out of order, and each
//    record whose jitter byte is odd fed twice, as a persist that repeats does). The replica
//    must see exactly the calls it sees when the stream arrives as one record, and the applier
//    must end in the same state: reassembly does not depend on how the stream was cut or
//    ordered. Every event the replica gets must be one the stream carries: re-encoded by the
//    primary's encoder it is a frame of the stream (or, for an install, it ends where the
//    install's resume position says).
//  * Sessions mode: each record is moved by its jitter byte and may start a primary's session
//    (AddSessionStart), as a backup meets streams of primaries that reconnected; the applier
//    must stay consistent (its end never moves back) and memory-safe.
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_input.h"
#include "slipstream/engine/engine.h"
#include "slipstream/replication/index_stream.h"

namespace {

using namespace slipstream;
using namespace slipstream::replication;

// Where the fuzzed stream starts: a replica that already holds a prefix of it.
constexpr uint64_t kStart = 7000;

// Stops the run with a message: a property of the index stream's applier does not hold.
[[noreturn]] void Fail(const char* what) {
  fuzz::FuzzFailure("index_stream", what);
}

// A replica engine that records every import call as the frame the primary would have sent
// for it (so two recordings compare byte for byte), refuses some of them by a rule of their
// contents (so refusals are reached, and the same in every run), and checks that each event is
// one the stream carries. Nothing but the import calls is used by IndexApplier.
class FakeReplica : public engine::Engine {
 public:
  // `stream` (may be null: nothing is checked) is the whole stream the applier is fed.
  explicit FakeReplica(const std::string* stream) : stream_(stream) {
    options_.segment_size = 4096;
    if (stream_ != nullptr) {
      // Whether the stream holds a compressed segment's frame header (magic "SIDX", type 6)
      // anywhere: such frames re-encode differently (LZ4 has many encodings of the same bytes).
      const char lz4_header[8] = {'S', 'I', 'D', 'X', 6, 0, 0, 0};
      compressed_ = stream_->find(std::string_view(lz4_header, 8)) != std::string::npos;
    }
  }

  const std::string& log() const { return log_; }

  engine::Status ImportLogBytes(const engine::LogWriteEvent& event) override {
    const std::string frame = EncodeLogWrite(event);
    MustCarry(frame, "a log write the stream does not carry");
    return Record("log", frame, event.offset % 16 == 15);
  }
  engine::Status BeginImport(const engine::CompactionBeginEvent& event) override {
    return Record("begin", EncodeCompactionBegin(event), event.dest_level > 8);
  }
  engine::Status ImportSegment(const engine::CompactionSegmentEvent& event) override {
    const std::string frame = EncodeCompactionSegment(event);
    if (!compressed_) MustCarry(frame, "a segment the stream does not carry");
    if (event.bytes.size() > uint64_t(options_.segment_size) + 4096) {
      Fail("a segment larger than the applier allows");
    }
    return Record("segment", frame, event.segment % 8 == 7);
  }
  engine::Status InstallImport(const engine::CompactionInstalledEvent& event,
                               uint64_t resume_at) override {
    const std::string frame = EncodeCompactionInstalled(event);
    if (stream_ != nullptr) {
      // resume_at is where the install's frame ends in the stream.
      if (resume_at < kStart + frame.size() || resume_at - kStart > stream_->size() ||
          stream_->compare(resume_at - kStart - frame.size(), 8, frame, 0, 8) != 0) {
        Fail("an install's resume position is not the end of its frame");
      }
    }
    return Record("install@" + std::to_string(resume_at), frame, event.tree_id % 9 == 8);
  }
  uint64_t ImportResumePosition() override { return 0; }
  void AbandonImport(uint64_t compaction) override {
    log_ += "abandon " + std::to_string(compaction) + "\n";
  }
  engine::Status ImportLevels(const std::vector<uint32_t>& level_trees) override {
    const std::string frame = EncodeSeedEnd(level_trees);
    MustCarry(frame, "a seed's end the stream does not carry");
    return Record("levels", frame, level_trees.size() > 30);
  }
  const engine::Options& options() const override { return options_; }

  // The rest of the engine: never called by IndexApplier.
  engine::Status CreateKeyspace(uint64_t, engine::KeyspaceId*) override { return Unused(); }
  engine::Status LookupKeyspace(uint64_t, engine::KeyspaceId*) override { return Unused(); }
  engine::Status DropKeyspace(engine::KeyspaceId) override { return Unused(); }
  engine::Status ListKeyspaces(std::vector<std::pair<uint64_t, engine::KeyspaceId>>*) override {
    return Unused();
  }
  engine::Status Put(engine::KeyspaceId, std::string_view, std::string_view,
                     engine::Lsn*) override {
    return Unused();
  }
  engine::Status Delete(engine::KeyspaceId, std::string_view, engine::Lsn*) override {
    return Unused();
  }
  engine::Status Write(const engine::WriteBatch&, engine::Lsn*) override { return Unused(); }
  engine::Status Sync(engine::Lsn) override { return Unused(); }
  engine::Status Get(engine::KeyspaceId, std::string_view, std::string*) override {
    return Unused();
  }
  std::unique_ptr<engine::PointReader> NewPointReader() override { return nullptr; }
  std::unique_ptr<engine::Iterator> NewIterator(engine::KeyspaceId) override { return nullptr; }
  bool DoBackgroundWork() override { return false; }
  void WaitForBackgroundWork(int) override {}
  engine::Status CompactAll() override { return Unused(); }
  engine::Status RunGC() override { return Unused(); }
  engine::Status ShipLevels(engine::EngineObserver*) override { return Unused(); }
  engine::Stats GetStats() override { return engine::Stats{}; }
  engine::Status ApproximateSize(engine::KeyspaceId, uint64_t*) override { return Unused(); }
  engine::Status Verify() override { return Unused(); }

 private:
  // Appends a call to the log and answers it: refused when `refuse`.
  engine::Status Record(const std::string& call, const std::string& frame, bool refuse) {
    log_ += call + " " + std::to_string(frame.size()) + " ";
    log_ += frame;
    log_ += refuse ? " refused\n" : "\n";
    return refuse ? engine::Status::InvalidArgument("refused by the fake replica")
                  : engine::Status::OK();
  }
  // Fails unless the stream (when checked) holds `frame` as it is.
  void MustCarry(const std::string& frame, const char* what) const {
    if (stream_ != nullptr && stream_->find(frame) == std::string::npos) Fail(what);
  }
  // What a call IndexApplier never makes answers.
  static engine::Status Unused() { return engine::Status::InvalidArgument("not a replica call"); }

  const std::string* stream_;
  bool compressed_ = false;
  engine::Options options_;
  std::string log_;
};

// One record of the stream as a backup persists it.
struct Piece {
  uint64_t offset = 0;  // in the stream
  std::string_view bytes;
  uint8_t key = 0;     // feeding order
  uint8_t jitter = 0;  // duplicate (default mode), or displacement and session (sessions mode)
};

// Everything an applier reports, as one comparable string.
std::string State(const IndexApplier& applier) {
  return std::to_string(applier.end()) + " " + std::to_string(applier.frames()) + " " +
         std::to_string(applier.installed()) + " " + std::to_string(applier.horizon()) + " " +
         std::to_string(applier.failures()) + " " + std::to_string(applier.lost()) + " " +
         applier.error().ToString();
}

// The stream fed whole and fed in pieces out of order must give the same calls and state.
void DefaultMode(const std::string& stream, std::vector<Piece> pieces, bool await_seed) {
  FakeReplica whole_replica(&stream);
  IndexApplier whole(&whole_replica, kStart, await_seed);
  (void)whole.Feed(kStart, stream);
  if (whole.end() != kStart + stream.size()) Fail("a whole stream fed in one record is not taken");

  FakeReplica cut_replica(&stream);
  IndexApplier cut(&cut_replica, kStart, await_seed);
  std::stable_sort(pieces.begin(), pieces.end(),
                   [](const Piece& a, const Piece& b) { return a.key < b.key; });
  uint64_t end = cut.end();
  for (const Piece& piece : pieces) {
    for (int times = 0; times < 1 + (piece.jitter & 1); times++) {
      (void)cut.Feed(kStart + piece.offset, piece.bytes);
      if (cut.end() < end) Fail("the applier's end moved back");
      end = cut.end();
    }
  }
  if (cut_replica.log() != whole_replica.log()) {
    Fail("the replica got other calls from a stream cut and reordered than from it whole");
  }
  if (State(cut) != State(whole)) {
    Fail("the applier ends in another state for a stream cut and reordered than for it whole");
  }
  cut.AbandonOpen();
  whole.AbandonOpen();
}

// Records moved around and sessions started at some of them: no property but consistency.
void SessionsMode(const std::vector<Piece>& pieces, bool await_seed) {
  FakeReplica replica(nullptr);
  IndexApplier applier(&replica, kStart, await_seed);
  uint64_t end = applier.end();
  for (const Piece& piece : pieces) {
    const int64_t displacement = int64_t(piece.jitter >> 1) - 64;
    const uint64_t position =
        uint64_t(std::max<int64_t>(0, int64_t(kStart + piece.offset) + displacement));
    if (piece.key & 1) applier.AddSessionStart(position);
    (void)applier.Feed(position, piece.bytes);
    if (applier.end() < end) Fail("the applier's end moved back");
    end = applier.end();
  }
  const ImportProgress progress = applier.Progress();
  if (progress.applied_end != applier.end() || progress.frames != applier.frames() ||
      progress.refused != applier.failures()) {
    Fail("Progress disagrees with the applier");
  }
  applier.AbandonOpen();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput p(data, size);
  const uint8_t flags = uint8_t(p.Take(1));
  const size_t n = size_t(p.Take(1) % 17);
  std::vector<uint64_t> cuts(n);
  for (uint64_t& cut : cuts) cut = p.Take(2);
  std::vector<Piece> pieces(n + 1);
  for (Piece& piece : pieces) piece.key = uint8_t(p.Take(1));
  for (Piece& piece : pieces) piece.jitter = uint8_t(p.Take(1));
  const std::string stream(p.rest());

  // Cut points inside the stream, ascending and distinct; pieces between them.
  for (uint64_t& cut : cuts) cut = stream.empty() ? 0 : cut % stream.size();
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  cuts.push_back(stream.size());
  pieces.resize(cuts.size());
  uint64_t from = 0;
  for (size_t i = 0; i < cuts.size(); i++) {
    pieces[i].offset = from;
    pieces[i].bytes = std::string_view(stream).substr(from, cuts[i] - from);
    from = cuts[i];
  }

  const bool await_seed = flags & 1;
  if (flags & 2) {
    SessionsMode(pieces, await_seed);
  } else {
    DefaultMode(stream, pieces, await_seed);
  }
  return 0;
}
