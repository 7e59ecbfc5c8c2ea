// Seeds for log_scan_fuzz: segment images of every log kind, written with the engine's log
// writer (log_writer.h) and record payloads laid out as the write path, compaction and
// replication lay them out; intact, sealed with a NEXT record, and torn.
#include <string>
#include <vector>

#include "coding.h"
#include "format.h"
#include "log_payloads.h"
#include "seeds.h"
#include "slipstream/engine/log_format.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::fuzz {
namespace {

using namespace engine;

// Room for every seed's appends; the image is cut after the last byte written plus a little
// zeroed space, so that the scan sees a clean end.
constexpr uint32_t kImageSize = 16u << 10;
constexpr uint32_t kZeroTail = 32;

// One record of an append: its type, LSN and payload.
struct Rec {
  LogRecordType type;
  uint64_t lsn;
  std::string payload;
};

// A segment image being written the way LogSet and Compaction write theirs.
class Image {
 public:
  // Starts a zeroed segment as LogSet::Rotate does.
  Image(LogKind kind, uint64_t sequence, uint32_t segment, uint64_t nonce)
      : buf_(kImageSize, '\0') {
    StartLogSegment(buf_.data(), kImageSize, kind, sequence, segment, nonce, &cursor_);
  }
  // One append: its records, then the checksum entry that commits them.
  void Append(const std::vector<Rec>& recs, bool commit = true) {
    for (const Rec& r : recs) AppendRecord(buf_.data(), &cursor_, r.type, r.lsn, {r.payload});
    if (commit) AppendChecksum(buf_.data(), &cursor_);
  }
  // The bytes written so far and a zeroed tail.
  std::string Bytes() const { return buf_.substr(0, cursor_.pos + kZeroTail); }

 private:
  std::string buf_;
  LogCursor cursor_;
};

// An L0 put of an inline value.
Rec Put(uint64_t lsn, KeyspaceId ks, std::string_view key, std::string_view value) {
  return Rec{LogRecordType::kPut, lsn, InlinePutPayload(ks, key, value)};
}

// The payload of an L0 put whose value went to the large log: the kind and a ValuePtr.
Rec PutLarge(uint64_t lsn, KeyspaceId ks, std::string_view key, ValuePtr ptr) {
  std::string ikey = MakeInternalKey(ks, key);
  char buf[16];
  std::string p(buf, EncodeVarint32(buf, uint32_t(ikey.size())) - buf);
  p += ikey;
  p.push_back(char(ValueKind::kLargePtr));
  ptr.EncodeTo(buf);
  p.append(buf, ValuePtr::kEncodedSize);
  return Rec{LogRecordType::kPut, lsn, p};
}

// The payload of an L0 delete: varint ikey size, ikey.
Rec Delete(uint64_t lsn, KeyspaceId ks, std::string_view key) {
  std::string ikey = MakeInternalKey(ks, key);
  char varint[5];
  std::string p(varint, EncodeVarint32(varint, uint32_t(ikey.size())) - varint);
  return Rec{LogRecordType::kDelete, lsn, p + ikey};
}

// Keyspace create (id, tag) and drop (id) records, as write_path.cc appends them.
Rec Keyspace(LogRecordType type, uint64_t lsn, uint32_t id, uint64_t tag) {
  std::string payload = KeyspacePayload(id, tag);
  if (type == LogRecordType::kKeyspaceDrop) payload.resize(4);
  return Rec{type, lsn, payload};
}

// The NEXT record LogSet::Rotate seals a segment with.
Rec Next(uint64_t lsn, uint32_t segment, uint64_t sequence) {
  return Rec{LogRecordType::kNext, lsn, NextPayload(segment, sequence)};
}

// A value record of the medium or large log (LZ4 when `compress`).
Rec Value(uint64_t lsn, KeyspaceId ks, std::string_view key, const std::string& value,
          bool compress) {
  return Rec{LogRecordType::kValue, lsn, ValuePayload(MakeInternalKey(ks, key), value, compress)};
}

// L0, medium, large and WAL segments: fresh, with batches, sealed, and torn.
std::vector<Seed> LogScanSeeds() {
  std::vector<Seed> seeds;
  {
    Image empty(LogKind::kL0, 1, 5, 0x1111);
    seeds.push_back({"l0_empty", empty.Bytes()});
  }
  {
    Image l0(LogKind::kL0, 3, 7, 0x9e3779b97f4a7c15ull);
    l0.Append({Keyspace(LogRecordType::kKeyspaceCreate, 1, 1, 42)});
    l0.Append({Put(2, 1, "row1", "alpha"), Put(2, 1, "row2", "beta"), Delete(2, 1, "row0")});
    l0.Append({PutLarge(3, 1, "big", ValuePtr{{9, 64}, 1200, 4000})});
    l0.Append({});  // an empty append: a checksum entry alone
    l0.Append({Put(4, 1, "row3", Text(300, 1))});
    l0.Append({Keyspace(LogRecordType::kKeyspaceDrop, 5, 1, 0)});
    seeds.push_back({"l0_batches", l0.Bytes()});
    l0.Append({Put(6, 1, "torn", "never committed")}, /*commit=*/false);
    seeds.push_back({"l0_torn", l0.Bytes()});
  }
  {
    Image sealed(LogKind::kL0, 4, 8, 0x2222);
    sealed.Append({Put(10, 2, "k", "v")});
    sealed.Append({Next(10, 11, 5)});
    seeds.push_back({"l0_sealed", sealed.Bytes()});
  }
  {
    Image large(LogKind::kLarge, 2, 9, 0x3333);
    large.Append({Value(7, 1, "big", Text(4000, 2), true)});
    large.Append({Value(8, 1, "raw", Text(700, 3), false)});
    seeds.push_back({"large", large.Bytes()});
  }
  {
    // Compaction's medium segments carry LSN 0 and one append per segment.
    Image medium(LogKind::kMedium, 1, 12, (uint64_t(3) << 32) | 12);
    medium.Append({Value(0, 1, "m1", Text(600, 4), false), Value(0, 1, "m2", Text(900, 5), false)});
    seeds.push_back({"medium", medium.Bytes()});
  }
  {
    Image wal(LogKind::kWal, 1, 1, 0x4444);
    wal.Append({Rec{LogRecordType::kWal, 0x1000000, Text(200, 6)}});
    wal.Append({Rec{LogRecordType::kWal, 0x10000c8, Text(120, 7)}});
    seeds.push_back({"wal", wal.Bytes()});
  }
  return seeds;
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(log_scan, LogScanSeeds);
}  // namespace slipstream::fuzz
