// Index shipping frames, their encoder and their applier: see index_stream.h.
#include "slipstream/replication/index_stream.h"

#include <lz4.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "slipstream/engine/crc32c.h"

namespace slipstream::replication {

namespace {

constexpr uint32_t kFrameMagic = 0x58444953;  // "SIDX"
constexpr size_t kFrameHeader = 12;           // magic, type, length

enum class FrameType : uint32_t {
  kLogWrite = 1,
  kBegin = 2,
  kSegment = 3,
  kInstalled = 4,
  kAbandoned = 5,
  kSegmentLz4 = 6,  // kSegment with the bytes LZ4-compressed (raw size first)
  kSeed = 7,        // Engine::ShipLevels begins: a new replica applies from here on
  kHorizon = 8,     // what is installed covers the primary's WAL below this position
  kSeedEnd = 9,     // Engine::ShipLevels ends: the tree at every level of the primary
};

// The type of a frame whose header `frame` starts with (0: not a frame header).
FrameType TypeOf(std::string_view frame) {
  uint32_t magic = 0, type = 0;
  if (frame.size() < kFrameHeader) return FrameType(0);
  std::memcpy(&magic, frame.data(), 4);
  std::memcpy(&type, frame.data() + 4, 4);
  return magic == kFrameMagic ? FrameType(type) : FrameType(0);
}

// Appends fixed-size little-endian fields and length-prefixed blobs.
class Writer {
 public:
  template <typename T>
  void Put(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void Blob(std::string_view b) {
    Put(uint32_t(b.size()));
    out_.append(b);
  }
  void U32s(const std::vector<uint32_t>& v) {
    Put(uint32_t(v.size()));
    for (uint32_t x : v) Put(x);
  }
  std::string Frame(FrameType type) {
    std::string f;
    f.reserve(kFrameHeader + out_.size() + 4);
    auto put = [&f](uint32_t v) { f.append(reinterpret_cast<const char*>(&v), 4); };
    put(kFrameMagic);
    put(uint32_t(type));
    put(uint32_t(out_.size()));
    f += out_;
    put(engine::crc32c::Value(f.data(), f.size()));
    return f;
  }

 private:
  std::string out_;
};

// Reads what Writer wrote; any overrun marks the reader bad.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  template <typename T>
  T Get() {
    T v{};
    if (in_.size() - pos_ < sizeof(T)) {
      bad_ = true;
      return v;
    }
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view Blob() {
    uint32_t n = Get<uint32_t>();
    if (bad_ || in_.size() - pos_ < n) {
      bad_ = true;
      return {};
    }
    std::string_view b = in_.substr(pos_, n);
    pos_ += n;
    return b;
  }
  std::vector<uint32_t> U32s() {
    uint32_t n = Get<uint32_t>();
    std::vector<uint32_t> v;
    if (bad_ || (in_.size() - pos_) / 4 < n) {
      bad_ = true;
      return v;
    }
    for (uint32_t i = 0; i < n; i++) v.push_back(Get<uint32_t>());
    return v;
  }
  // Everything read, nothing overran.
  bool Done() const { return !bad_ && pos_ == in_.size(); }

 private:
  std::string_view in_;
  size_t pos_ = 0;
  bool bad_ = false;
};

// Reads the fields a segment frame starts with (compressed or not) into `e`.
void ReadSegmentHead(Reader* r, engine::CompactionSegmentEvent* e) {
  e->compaction = r->Get<uint64_t>();
  e->dest_level = r->Get<uint32_t>();
  e->kind = engine::CompactionSegmentKind(r->Get<uint8_t>());
  e->segment = r->Get<uint32_t>();
}

Status FromEngine(const engine::Status& s) {
  if (s.ok()) return Status::OK();
  return Status::InvalidArgument("the replica's engine refused an import: " + s.ToString());
}

}  // namespace

// Frames the large log's bytes of one write-out.
std::string EncodeLogWrite(const engine::LogWriteEvent& e) {
  Writer w;
  w.Put(uint8_t(e.log));
  w.Put(e.segment);
  w.Put(e.sequence);
  w.Put(e.offset);
  w.Blob(e.bytes);
  return w.Frame(FrameType::kLogWrite);
}

// Frames a compaction's begin.
std::string EncodeCompactionBegin(const engine::CompactionBeginEvent& e) {
  Writer w;
  w.Put(e.compaction);
  w.Put(uint8_t(e.from_l0));
  w.Put(e.replaced_level);
  w.Put(e.dest_level);
  w.Put(e.segment_size);
  w.Put(e.node_size);
  return w.Frame(FrameType::kBegin);
}

// Frames one segment a compaction wrote.
std::string EncodeCompactionSegment(const engine::CompactionSegmentEvent& e) {
  Writer w;
  w.Put(e.compaction);
  w.Put(e.dest_level);
  w.Put(uint8_t(e.kind));
  w.Put(e.segment);
  w.Blob(e.bytes);
  return w.Frame(FrameType::kSegment);
}

// The same, its bytes compressed with LZ4 (for links that are the bottleneck); a segment that
// does not shrink goes uncompressed.
std::string EncodeCompactionSegmentLz4(const engine::CompactionSegmentEvent& e) {
  int bound = LZ4_compressBound(int(e.bytes.size()));
  std::string packed(size_t(bound), '\0');
  int n = LZ4_compress_default(e.bytes.data(), packed.data(), int(e.bytes.size()), bound);
  if (n <= 0 || size_t(n) >= e.bytes.size()) return EncodeCompactionSegment(e);
  packed.resize(size_t(n));
  Writer w;
  w.Put(e.compaction);
  w.Put(e.dest_level);
  w.Put(uint8_t(e.kind));
  w.Put(e.segment);
  w.Put(uint32_t(e.bytes.size()));
  w.Blob(packed);
  return w.Frame(FrameType::kSegmentLz4);
}

// Decodes an uncompressed segment frame and frames it again compressed; any other frame, or
// one that does not parse, is returned as it is (the replica judges it).
std::string CompressSegmentFrame(std::string_view frame) {
  uint32_t magic = 0, type = 0, length = 0;
  if (frame.size() < kFrameHeader + 4) return std::string(frame);
  std::memcpy(&magic, frame.data(), 4);
  std::memcpy(&type, frame.data() + 4, 4);
  std::memcpy(&length, frame.data() + 8, 4);
  if (magic != kFrameMagic || FrameType(type) != FrameType::kSegment ||
      frame.size() != kFrameHeader + size_t(length) + 4) {
    return std::string(frame);
  }
  Reader r(frame.substr(kFrameHeader, length));
  engine::CompactionSegmentEvent e{};
  ReadSegmentHead(&r, &e);
  e.bytes = r.Blob();
  if (!r.Done()) return std::string(frame);
  return EncodeCompactionSegmentLz4(e);
}

// Frames a compaction's end: the level it installed and what it retired.
std::string EncodeCompactionInstalled(const engine::CompactionInstalledEvent& e) {
  Writer w;
  w.Put(e.compaction);
  w.Put(uint8_t(e.from_l0));
  w.Put(e.replaced_level);
  w.Put(e.dest_level);
  w.Put(e.tree_id);
  w.Put(e.height);
  w.Put(e.root_segment);
  w.Put(e.root_offset);
  w.Put(e.bloom_segment);
  w.Put(e.bloom_offset);
  w.Put(e.entries);
  w.Put(e.segments);
  w.Put(e.manifest_number);
  w.Put(e.bloom_blocks);
  w.Put(e.bytes);
  w.Put(e.small_entries);
  w.Put(e.medium_entries);
  w.Put(e.large_entries);
  w.Put(e.tombstones);
  w.U32s(e.retired_segments);
  w.U32s(e.medium_segments);
  w.U32s(e.retired_log_segments);
  w.U32s(e.retired_trees);
  w.Put(e.next_keyspace_id);
  w.Put(uint32_t(e.keyspaces.size()));
  for (const engine::KeyspaceRecord& k : e.keyspaces) {
    w.Put(k.tag);
    w.Put(k.id);
    w.Put(k.state);
  }
  return w.Frame(FrameType::kInstalled);
}

// Frames a seed's end.
std::string EncodeSeedEnd(const std::vector<uint32_t>& level_trees) {
  Writer w;
  w.U32s(level_trees);
  return w.Frame(FrameType::kSeedEnd);
}

// Whether a frame (header first) is a seed's end.
bool IsSeedEndFrame(std::string_view frame) {
  return TypeOf(frame) == FrameType::kSeedEnd;
}

// Frames a WAL horizon.
std::string EncodeHorizon(uint64_t wal_position) {
  Writer w;
  w.Put(wal_position);
  return w.Frame(FrameType::kHorizon);
}

// Whether a frame (header first) is a seed's marker.
bool IsSeedFrame(std::string_view frame) {
  return TypeOf(frame) == FrameType::kSeed;
}

// Whether a frame (header first) is a compaction's end.
bool IsInstallFrame(std::string_view frame) {
  return TypeOf(frame) == FrameType::kInstalled;
}

// Frames the start of a seed.
std::string EncodeSeedBegin() {
  Writer w;
  return w.Frame(FrameType::kSeed);
}

// Frames a compaction's abandon.
std::string EncodeCompactionAbandoned(uint64_t compaction) {
  Writer w;
  w.Put(compaction);
  return w.Frame(FrameType::kAbandoned);
}

void IndexEventEncoder::OnLogWrite(const engine::LogWriteEvent& event) {
  if (event.log == engine::ObservedLog::kLarge) emit_(EncodeLogWrite(event));
}
void IndexEventEncoder::OnSeedBegin() {
  emit_(EncodeSeedBegin());
}
void IndexEventEncoder::OnSeedEnd(const std::vector<uint32_t>& level_trees) {
  emit_(EncodeSeedEnd(level_trees));
}
void IndexEventEncoder::OnCompactionBegin(const engine::CompactionBeginEvent& event) {
  emit_(EncodeCompactionBegin(event));
}
void IndexEventEncoder::OnCompactionSegment(const engine::CompactionSegmentEvent& event) {
  emit_(lz4_ ? EncodeCompactionSegmentLz4(event) : EncodeCompactionSegment(event));
}
void IndexEventEncoder::OnCompactionInstalled(const engine::CompactionInstalledEvent& event) {
  emit_(EncodeCompactionInstalled(event));
}
void IndexEventEncoder::OnCompactionAbandoned(uint64_t compaction) {
  emit_(EncodeCompactionAbandoned(compaction));
}

// Whether a record begins with a whole seed frame: 16 bytes with their own checksum. Every
// connection of a primary starts its index stream with one, where the backup's copy ended, so
// such a record ends whatever the old connection left (a frame cut by its end, or a stream
// that could not be parsed after a refused frame). Continuation bytes that look like one are
// not a practical worry.
namespace {
bool BeginsWithSeed(std::string_view record) {
  if (record.size() < kFrameHeader + 4) return false;
  uint32_t length, crc;
  std::memcpy(&length, record.data() + 8, 4);
  std::memcpy(&crc, record.data() + kFrameHeader, 4);
  return IsSeedFrame(record) && length == 0 &&
         crc == engine::crc32c::Value(record.data(), kFrameHeader);
}
}  // namespace

// Takes a record of the stream, in order or not, and applies what it completes.
Status IndexApplier::Feed(uint64_t position, std::string_view bytes) {
  uint64_t end = position + bytes.size();
  if (end <= end_) return Status::OK();  // persisted again: applied already
  if (position > end_ && session_starts_.count(position) != 0 && BeginsWithSeed(bytes)) {
    // A session that starts beyond what this applier holds (the old session's last bytes
    // never became durable here): what lies between is of no use before the seed.
    out_of_order_.erase(out_of_order_.begin(), out_of_order_.lower_bound(position));
    pending_.clear();
    lost_ = true;  // ends at this record, below
    end_ = position;
  }
  if (position > end_) {
    out_of_order_[position] = std::string(bytes);
    return Status::OK();
  }
  Status s = TakeRecord(position, bytes);
  // Records held beyond the gap this one filled.
  while (!out_of_order_.empty() && out_of_order_.begin()->first <= end_) {
    auto held = out_of_order_.extract(out_of_order_.begin());
    if (held.key() + held.mapped().size() > end_) {
      Status t = TakeRecord(held.key(), held.mapped());
      if (s.ok()) s = t;
    }
  }
  return s;
}

// Takes a record that reaches beyond end_ (and starts at or below it). A refused frame stops
// the parse: the rest of the stream is skipped until a record that begins a new connection's
// seed, and what the compaction in flight wrote is freed. The WAL is still complete on the
// backup, so nothing is lost: a promotion replays from the last install's horizon.
Status IndexApplier::TakeRecord(uint64_t position, std::string_view bytes) {
  std::string_view fresh = bytes.substr(end_ - position);
  if (position == end_ && (lost_ || !pending_.empty()) && session_starts_.count(position) != 0 &&
      BeginsWithSeed(bytes)) {
    pending_.clear();
    lost_ = false;
  }
  if (lost_) {
    end_ += fresh.size();
    return Status::OK();
  }
  Status s = Take(fresh);
  if (!s.ok()) {
    error_ = s;
    failures_++;
    lost_ = true;
    pending_.clear();
    AbandonOpen();
  }
  return s;
}

// Takes the stream bytes at end_. Frames whole in them are applied where they lie (a frame is
// up to a segment: copying each into a buffer first cost as much as writing it); only a frame
// cut by their end, or completing one cut before, goes through pending_.
Status IndexApplier::Take(std::string_view fresh) {
  uint64_t base = end_;
  end_ += fresh.size();
  if (!pending_.empty()) {
    pending_.append(fresh);
    size_t used = 0;
    Status s = Drain(pending_, end_ - pending_.size(), &used);
    pending_.erase(0, used);
    return s;
  }
  size_t used = 0;
  Status s = Drain(fresh, base, &used);
  pending_.assign(fresh.substr(used));
  return s;
}

// Applies every whole frame at the front of `data` (whose first byte is at stream position
// `base`); *used gets the bytes they took.
Status IndexApplier::Drain(std::string_view data, uint64_t base, size_t* used) {
  size_t pos = 0;
  Status s;
  while (s.ok() && data.size() - pos >= kFrameHeader) {
    uint32_t magic, type, length;
    std::memcpy(&magic, data.data() + pos, 4);
    std::memcpy(&type, data.data() + pos + 4, 4);
    std::memcpy(&length, data.data() + pos + 8, 4);
    if (magic != kFrameMagic || length > max_payload_) {
      s = Status::InvalidArgument("the index stream is damaged at a frame header");
      break;
    }
    if (data.size() - pos < kFrameHeader + length + 4) break;  // the rest comes later
    uint32_t crc;
    std::memcpy(&crc, data.data() + pos + kFrameHeader + length, 4);
    if (crc != engine::crc32c::Value(data.data() + pos, kFrameHeader + length)) {
      s = Status::InvalidArgument("an index stream frame fails its checksum");
      break;
    }
    s = Apply(type, data.substr(pos + kFrameHeader, length),
              base + pos + kFrameHeader + length + 4);
    if (s.ok()) frames_++;
    pos += kFrameHeader + length + 4;
  }
  *used = pos;
  return s;
}

// Decodes one frame and makes the replica engine import it.
Status IndexApplier::Apply(uint32_t type, std::string_view payload, uint64_t frame_end) {
  if (FrameType(type) == FrameType::kSeed) {
    if (!payload.empty()) return Status::InvalidArgument("a malformed seed frame");
    awaiting_seed_ = false;
    return Status::OK();
  }
  if (awaiting_seed_) return Status::OK();  // reflected in the seed that follows
  Status s = ApplyEvent(type, payload, frame_end);
  if (!s.ok() && open_compaction_ != 0) {
    replica_->AbandonImport(open_compaction_);  // nothing of it stays allocated
    open_compaction_ = 0;
  }
  return s;
}

// Decodes one event frame and makes the replica engine import it.
Status IndexApplier::ImportSegment(const engine::CompactionSegmentEvent& event) {
  auto start = std::chrono::steady_clock::now();
  Status s = FromEngine(replica_->ImportSegment(event));
  rewrite_nanos_ += uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
  if (s.ok()) {
    segments_++;
    segment_bytes_ += event.bytes.size();
  }
  return s;
}

ImportProgress IndexApplier::Progress() const {
  ImportProgress p;
  p.applied_end = end_;
  p.frames = frames_;
  p.installed = installed_;
  p.horizon = horizon_;
  p.refused = failures_;
  p.awaiting_seed = lost_;
  p.error = error_;
  p.segments = segments_;
  p.segment_bytes = segment_bytes_;
  p.rewrite_nanos = rewrite_nanos_;
  return p;
}

Status IndexApplier::ApplyEvent(uint32_t type, std::string_view payload, uint64_t frame_end) {
  Reader r(payload);
  switch (FrameType(type)) {
    case FrameType::kSeed:
      break;
    case FrameType::kLogWrite: {
      engine::LogWriteEvent e{};
      e.log = engine::ObservedLog(r.Get<uint8_t>());
      e.segment = r.Get<uint32_t>();
      e.sequence = r.Get<uint64_t>();
      e.offset = r.Get<uint32_t>();
      e.bytes = r.Blob();
      if (!r.Done()) break;
      return FromEngine(replica_->ImportLogBytes(e));
    }
    case FrameType::kBegin: {
      engine::CompactionBeginEvent e{};
      e.compaction = r.Get<uint64_t>();
      e.from_l0 = r.Get<uint8_t>() != 0;
      e.replaced_level = r.Get<uint32_t>();
      e.dest_level = r.Get<uint32_t>();
      e.segment_size = r.Get<uint32_t>();
      e.node_size = r.Get<uint32_t>();
      if (!r.Done()) break;
      open_compaction_ = e.compaction;
      return FromEngine(replica_->BeginImport(e));
    }
    case FrameType::kSegment: {
      engine::CompactionSegmentEvent e{};
      ReadSegmentHead(&r, &e);
      e.bytes = r.Blob();
      if (!r.Done()) break;
      return ImportSegment(e);
    }
    case FrameType::kSegmentLz4: {
      engine::CompactionSegmentEvent e{};
      ReadSegmentHead(&r, &e);
      uint32_t raw_size = r.Get<uint32_t>();
      std::string_view packed = r.Blob();
      if (!r.Done() || raw_size > max_payload_) break;
      std::string raw(raw_size, '\0');
      int n = LZ4_decompress_safe(packed.data(), raw.data(), int(packed.size()), int(raw_size));
      if (n < 0 || uint32_t(n) != raw_size) {
        return Status::InvalidArgument(
            "a compressed segment frame does not decompress to its size");
      }
      e.bytes = raw;
      return ImportSegment(e);
    }
    case FrameType::kInstalled: {
      engine::CompactionInstalledEvent e;
      e.compaction = r.Get<uint64_t>();
      e.from_l0 = r.Get<uint8_t>() != 0;
      e.replaced_level = r.Get<uint32_t>();
      e.dest_level = r.Get<uint32_t>();
      e.tree_id = r.Get<uint32_t>();
      e.height = r.Get<uint32_t>();
      e.root_segment = r.Get<uint32_t>();
      e.root_offset = r.Get<uint32_t>();
      e.bloom_segment = r.Get<uint32_t>();
      e.bloom_offset = r.Get<uint32_t>();
      e.entries = r.Get<uint64_t>();
      e.segments = r.Get<uint64_t>();
      e.manifest_number = r.Get<uint64_t>();
      e.bloom_blocks = r.Get<uint64_t>();
      e.bytes = r.Get<uint64_t>();
      e.small_entries = r.Get<uint64_t>();
      e.medium_entries = r.Get<uint64_t>();
      e.large_entries = r.Get<uint64_t>();
      e.tombstones = r.Get<uint64_t>();
      e.retired_segments = r.U32s();
      e.medium_segments = r.U32s();
      e.retired_log_segments = r.U32s();
      e.retired_trees = r.U32s();
      e.next_keyspace_id = r.Get<uint32_t>();
      uint32_t count = r.Get<uint32_t>();
      if (count > payload.size() / 16) break;  // each takes 16 bytes
      for (uint32_t i = 0; i < count; i++) {
        engine::KeyspaceRecord k;
        k.tag = r.Get<uint64_t>();
        k.id = r.Get<uint32_t>();
        k.state = r.Get<uint32_t>();
        if (k.state != 1 && k.state != 2) return Status::InvalidArgument("a keyspace state");
        e.keyspaces.push_back(k);
      }
      if (!r.Done()) break;
      Status s = FromEngine(replica_->InstallImport(e, frame_end));
      if (s.ok()) installed_++;
      if (e.compaction == open_compaction_) open_compaction_ = 0;
      return s;
    }
    case FrameType::kSeedEnd: {
      std::vector<uint32_t> level_trees = r.U32s();
      if (!r.Done()) break;
      return FromEngine(replica_->ImportLevels(level_trees));
    }
    case FrameType::kHorizon: {
      uint64_t horizon = r.Get<uint64_t>();
      if (!r.Done()) break;
      if (horizon > horizon_) horizon_ = horizon;  // installed levels only grow in coverage
      return Status::OK();
    }
    case FrameType::kAbandoned: {
      uint64_t compaction = r.Get<uint64_t>();
      if (!r.Done()) break;
      replica_->AbandonImport(compaction);
      if (compaction == open_compaction_) open_compaction_ = 0;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("a malformed index stream frame (type " + std::to_string(type) +
                                 ")");
}

void IndexApplier::AbandonOpen() {
  if (open_compaction_ != 0) replica_->AbandonImport(open_compaction_);
  open_compaction_ = 0;
}

IndexStore::~IndexStore() {
  std::lock_guard<std::mutex> lock(mu_);
  applier_.AbandonOpen();
}

// Keeps the image, then applies the index stream's new records.
Status IndexStore::Persist(const SegmentId& segment, const char* image, uint32_t from, uint32_t to,
                           const std::vector<engine::ScannedRecord>& records, bool closed) {
  Status s = FileBackupStore::Persist(segment, image, from, to, records, closed);
  if (!s.ok() || segment.stream != uint32_t(StreamId::kEngineIndex) ||
      (!primary_.empty() && segment.primary != primary_)) {
    return s;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (primary_.empty()) primary_ = segment.primary;  // the first primary that ships one
  for (const engine::ScannedRecord& r : records) {
    // A refused frame is reported (import_error), not failed back: the images are durable,
    // and the primary's WAL stream must go on. The applier skips what follows it.
    (void)applier_.Feed(r.lsn, r.payload);
  }
  return Status::OK();
}

// Reads each kept record of the index stream that ends beyond the applier's start and feeds
// it (the applier skips what lies below its start).
Status IndexStore::Recover() {
  std::vector<std::string> files;
  std::vector<PersistedRecord> records;
  if (primary_.empty()) {
    // The primary whose index stream was kept last: the one this replica follows.
    std::filesystem::file_time_type newest{};
    for (const std::string& p : Primaries()) {
      for (const std::string& f : SegmentFiles(p, uint32_t(StreamId::kEngineIndex))) {
        std::error_code ec;
        auto t = std::filesystem::last_write_time(f, ec);
        if (!ec && (primary_.empty() || t > newest)) {
          newest = t;
          primary_ = p;
        }
      }
    }
    if (primary_.empty()) return Status::OK();  // nothing kept yet
  }
  Status s = PersistedRecords(primary_, uint32_t(StreamId::kEngineIndex), &files, &records);
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  {
    std::string dir = SegmentPath(SegmentId{primary_, uint32_t(StreamId::kEngineIndex), 0, 0});
    FILE* f = std::fopen((dir.substr(0, dir.rfind('/')) + "/SESSIONS").c_str(), "r");
    unsigned long long position;
    while (f != nullptr && std::fscanf(f, "%llu", &position) == 1) {
      applier_.AddSessionStart(position);
    }
    if (f != nullptr) std::fclose(f);
  }
  std::string payload;
  for (const PersistedRecord& r : records) {
    if (r.position + r.length <= applier_.end()) continue;
    FILE* f = std::fopen(files[r.file].c_str(), "rb");
    if (f == nullptr) return Status::IOError("cannot open " + files[r.file]);
    payload.resize(r.length);
    bool ok = std::fseek(f, long(r.offset), SEEK_SET) == 0 &&
              std::fread(payload.data(), 1, r.length, f) == r.length;
    std::fclose(f);
    if (!ok) return Status::IOError("cannot read a record of " + files[r.file]);
    // A refused frame is recorded (import_error) and skipped past, as when it arrives live.
    (void)applier_.Feed(r.position, payload);
  }
  return Status::OK();
}

// One line per session start, fsynced before the hello is answered.
Status IndexStore::NoteSessionStart(const std::string& primary, uint32_t stream,
                                    uint64_t position) {
  if (stream != uint32_t(StreamId::kEngineIndex)) return Status::OK();
  std::lock_guard<std::mutex> lock(mu_);
  if (!primary_.empty() && primary != primary_) return Status::OK();
  std::string dir = SegmentPath(SegmentId{primary, stream, 0, 0});
  dir = dir.substr(0, dir.rfind('/'));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IOError("create " + dir + ": " + ec.message());
  std::string path = dir + "/SESSIONS";
  FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return Status::IOError("cannot open " + path);
  bool ok = std::fprintf(f, "%llu\n", static_cast<unsigned long long>(position)) > 0 &&
            std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return Status::IOError("cannot write " + path);
  applier_.AddSessionStart(position);
  return Status::OK();
}

// Below the install the replica's manifest records: a restart resumes there.
Status IndexStore::PruneInstalled(const std::vector<SegmentId>& open, PruneStats* removed) {
  uint64_t installed_end = replica_->ImportResumePosition();
  if (installed_end == 0) {
    if (removed != nullptr) *removed = PruneStats{};
    return Status::OK();
  }
  return PruneFiles(uint32_t(StreamId::kEngineIndex), installed_end, open, /*keep_resume=*/true,
                    removed);
}

ImportProgress IndexStore::Progress() {
  std::lock_guard<std::mutex> lock(mu_);
  return applier_.Progress();
}

}  // namespace slipstream::replication
