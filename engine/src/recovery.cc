// Recovery: load the manifest (manifest.cc), then follow each log's chain of segments and
// replay the L0 recovery log's valid prefix (found by the Tailwind scan) into the memtables,
// re-deriving the large log's accounting on the way.
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "coding.h"
#include "crc32c.h"
#include "engine_impl.h"
#include "slipstream/engine/log_scanner.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::engine {

namespace {

// What recovery learns about one scanned log segment.
struct ScannedSegment {
  uint32_t segment;
  uint64_t sequence;
  LogScan scan;
};

}  // namespace

// Loads the manifest (or starts fresh), then replays the logs.
Status EngineImpl::Recover() {
  uint64_t file_segments;
  Status s = device_.SizeInSegments(&file_segments);
  if (!s.ok()) return s;
  std::string image;
  s = levels_.ReadManifest(&image);
  if (s.IsNotFound()) {
    // No manifest was ever written, so no write was ever acknowledged: start fresh.
    // 64 segments to start with, or all that max_device_size allows if fewer.
    uint64_t initial = std::min<uint64_t>(64, options_.max_device_size / options_.segment_size);
    s = device_.Truncate();
    if (s.ok()) s = device_.Grow(initial);
    if (!s.ok()) return s;
    segments_.set_count(initial);
    segments_.info(0).kind = uint8_t(SegmentKind::kReserved);
    return ReplayLogs(std::string());
  }
  if (!s.ok()) return s;
  // The segment table and the device mapping end at max_device_size; a bigger file (written
  // with a bigger setting, or grown behind the engine's back) may hold segments the manifest
  // names beyond both.
  uint64_t max_segments = options_.max_device_size / options_.segment_size;
  if (file_segments > max_segments) {
    return Status::InvalidArgument("the device file holds " + std::to_string(file_segments) +
                                   " segments, more than the " + std::to_string(max_segments) +
                                   " max_device_size allows: open with the max_device_size "
                                   "it was written with");
  }
  segments_.set_count(std::max<uint64_t>(file_segments, 1));
  segments_.info(0).kind = uint8_t(SegmentKind::kReserved);
  return ReplayLogs(image);
}

// Loads the manifest image into the arena, then scans and replays the logs.
Status EngineImpl::ReplayLogs(const std::string& image) {
  uint64_t first_large_sequence = 0;  // version 1 manifests: rescan every large segment
  if (!image.empty()) {
    ManifestTail tail;
    Status loaded = levels_.LoadManifest(image, &segments_, &keyspaces_, &logs_, &tail);
    if (!loaded.ok()) return loaded;
    logs_.set_last_lsn(tail.snapshot_lsn);
    first_large_sequence = tail.first_large_sequence;
  }

  // Gather each log's known segments by sequence.
  std::map<uint64_t, uint32_t> l0_known, large_known;
  for (uint64_t i = 1; i < segments_.count(); i++) {
    const SegmentInfo& info = segments_.info(i);
    if (info.flags & kSegmentImported) continue;  // a primary's log, not this node's chain
    if (info.kind == uint8_t(SegmentKind::kL0Log)) l0_known[info.sequence] = uint32_t(i);
    if (info.kind == uint8_t(SegmentKind::kLargeLog)) large_known[info.sequence] = uint32_t(i);
  }

  // Follows a log's chain: the known segments from sequence `from` on (always the newest),
  // then NEXT records onwards. Older large-log segments hold only compacted values, which the
  // manifest describes exactly.
  auto follow = [&](std::map<uint64_t, uint32_t>& known, SegmentKind kind, uint64_t from,
                    std::vector<ScannedSegment>* chain) -> Status {
    std::vector<std::pair<uint64_t, uint32_t>> todo(known.lower_bound(from), known.end());
    if (todo.empty() && !known.empty()) todo.push_back(*known.rbegin());
    size_t i = 0;
    while (i < todo.size()) {
      auto [sequence, segment] = todo[i++];
      ScannedSegment ss{segment, sequence,
                        ScanLogSegment(device_.Segment(segment), options_.segment_size)};
      if (ss.scan.header_ok &&
          (ss.scan.header.sequence != sequence ||
           ss.scan.header.kind !=
               uint32_t(kind == SegmentKind::kL0Log ? LogKind::kL0 : LogKind::kLarge))) {
        return Status::Corruption("log segment " + std::to_string(segment) +
                                  " has a foreign header");
      }
      chain->push_back(ss);
      if (i < todo.size()) continue;
      for (const ScannedRecord& rec : ss.scan.records) {
        if (rec.type != LogRecordType::kNext || rec.payload.size() != 12) continue;
        uint32_t next = DecodeFixed32(rec.payload.data());
        uint64_t next_seq = DecodeFixed64(rec.payload.data() + 4);
        if (next == 0 || next >= segments_.count()) {
          return Status::Corruption("NEXT record points outside the device");
        }
        // Rotate gives a log's next segment the next sequence, so a NEXT record naming one at
        // or below its own segment's is damage, and following it could go round for ever.
        if (next_seq <= sequence) {
          return Status::Corruption("NEXT record in log segment " + std::to_string(segment) +
                                    " goes back to sequence " + std::to_string(next_seq));
        }
        SegmentInfo& info = segments_.info(next);
        if (info.kind != uint8_t(SegmentKind::kFree) &&
            !(info.kind == uint8_t(kind) && info.sequence == next_seq)) {
          return Status::Corruption("NEXT record points into a segment in use");
        }
        info = SegmentInfo{};
        info.kind = uint8_t(kind);
        info.sequence = next_seq;
        todo.emplace_back(next_seq, next);
      }
    }
    for (size_t k = 0; k + 1 < chain->size(); k++) {
      segments_.info((*chain)[k].segment).flags |= kSegmentSealed;
    }
    return Status::OK();
  };

  std::vector<ScannedSegment> large_chain, l0_chain;
  Status s = follow(large_known, SegmentKind::kLargeLog, first_large_sequence, &large_chain);
  if (s.ok()) s = follow(l0_known, SegmentKind::kL0Log, 0, &l0_chain);
  if (!s.ok()) return s;
  for (size_t k = 0; k + 1 < l0_chain.size(); k++) {
    if (l0_chain[k].scan.stopped_at_damage) {
      return Status::Corruption("sealed L0 log segment " + std::to_string(l0_chain[k].segment) +
                                " is damaged at offset " +
                                std::to_string(l0_chain[k].scan.valid_end));
    }
  }

  // Large-log records recovery may reference: those in scanned segments' valid prefixes.
  std::unordered_map<uint64_t, uint32_t> large_records;  // (segment, offset) -> record bytes
  std::unordered_set<uint32_t> scanned_large;
  for (const ScannedSegment& ss : large_chain) {
    scanned_large.insert(ss.segment);
    for (const ScannedRecord& rec : ss.scan.records) {
      if (rec.type == LogRecordType::kValue) {
        large_records[(uint64_t(ss.segment) << 32) | rec.offset] = RecordSpace(rec.payload.size());
      }
    }
  }
  std::unordered_set<uint64_t> referenced;
  auto large_pointer_valid = [&](const ValuePtr& p) {
    auto it = large_records.find((uint64_t(p.where.segment) << 32) | p.where.offset);
    if (it != large_records.end()) return it->second == p.record_bytes;
    // Of a scanned segment only the valid prefix survives (the log resumes after it, zeroing
    // the rest, or the whole segment if its header is damaged): a record elsewhere in it, even
    // one whose checksum matches, belongs to an append that never completed.
    if (scanned_large.count(p.where.segment)) return false;
    // A sealed segment the manifest describes: check the record in place.
    if (p.where.segment == 0 || p.where.segment >= segments_.count() ||
        segments_.info(p.where.segment).kind != uint8_t(SegmentKind::kLargeLog) ||
        p.where.offset < kLogHeaderSize ||
        uint64_t(p.where.offset) + p.record_bytes > options_.segment_size ||
        p.record_bytes < kRecordHeaderSize) {
      return false;
    }
    const char* rec = device_.Segment(p.where.segment) + p.where.offset;
    RecordHeader h;
    std::memcpy(&h, rec, sizeof(h));
    return (h.type_and_length & 0xff) == uint8_t(LogRecordType::kValue) &&
           (h.type_and_length >> 8) == p.record_bytes - kRecordHeaderSize &&
           crc32c::Value(rec + kRecordHeaderSize, p.record_bytes - kRecordHeaderSize) ==
               h.payload_crc;
  };

  // Walks the L0 log batch by batch, up to the first batch whose large value did not survive
  // (there the log is cut, so the recovered state is a prefix of the acknowledged history).
  // The first pass only finds the cut and the large values that surviving uncompacted records
  // reference; the second applies the batches. The large log's accounting is settled between
  // the two, because compactions that make room during the second pass retire segments by it.
  Lsn last_lsn = logs_.last_lsn();
  const Lsn manifest_compacted_lsn = levels_.compacted_lsn();
  size_t cut_segment = l0_chain.size();
  uint32_t cut_offset = 0;
  auto walk = [&](bool apply) -> Status {
    for (size_t k = 0; k < l0_chain.size(); k++) {
      const std::vector<ScannedRecord>& recs = l0_chain[k].scan.records;
      size_t i = 0;
      while (i < recs.size()) {
        if (apply && k == cut_segment && recs[i].batch_start == cut_offset) return Status::OK();
        size_t j = i;
        while (j < recs.size() && recs[j].batch_start == recs[i].batch_start) j++;
        std::vector<WriteOp> batch;
        bool valid = true;
        for (size_t r = i; r < j && valid; r++) {
          const ScannedRecord& rec = recs[r];
          if (rec.type != LogRecordType::kPut && rec.type != LogRecordType::kDelete) continue;
          const char* p = rec.payload.data();
          const char* limit = p + rec.payload.size();
          uint32_t key_size;
          p = DecodeVarint32(p, limit, &key_size);
          if (!p || uint64_t(limit - p) < key_size || key_size < kKeyspacePrefix) {
            return Status::Corruption("L0 log record with a bad key");
          }
          WriteOp op;
          op.type = rec.type == LogRecordType::kPut ? WriteOp::kPut : WriteOp::kDelete;
          op.ikey.assign(p, key_size);
          p += key_size;
          if (op.type == WriteOp::kPut) {
            if (p == limit || !IsValidValueKind(uint8_t(*p)))
              return Status::Corruption("L0 log record with a bad kind");
            auto kind = ValueKind(uint8_t(*p++));
            op.value = std::string_view(p, size_t(limit - p));
            if (kind == ValueKind::kLargePtr) {
              if (op.value.size() != ValuePtr::kEncodedSize)
                return Status::Corruption("bad large pointer");
              op.relocate_from = ValuePtr::DecodeFrom(p);
              op.type = WriteOp::kRelocate;  // marks "value is a large pointer" during replay
              // A compacted record's value may long be gone (overwritten, collected, its
              // segment reused): only records still to be applied need theirs.
              if (!apply && rec.lsn > manifest_compacted_lsn)
                valid = large_pointer_valid(op.relocate_from);
            } else if (kind == ValueKind::kLargePatch) {
              bool owner;
              std::string_view prefix;
              if (!LargePatch::DecodeFrom(op.value, &op.relocate_from, &owner, &prefix))
                return Status::Corruption("bad large value patch");
              op.type = WriteOp::kPatch;  // marks "value is a patch" during replay
              if (!apply && rec.lsn > manifest_compacted_lsn)
                valid = large_pointer_valid(op.relocate_from);
            }
          }
          op.keyspace = rec.lsn > manifest_compacted_lsn ? 1 : 0;  // 1: must be applied
          batch.push_back(std::move(op));
        }
        if (!valid) {
          cut_segment = k;
          cut_offset = recs[i].batch_start;
          return Status::OK();
        }
        size_t first = i;
        i = j;
        if (!apply) {
          for (const WriteOp& op : batch) {
            if (op.keyspace == 1 && (op.type == WriteOp::kRelocate || op.type == WriteOp::kPatch)) {
              referenced.insert((uint64_t(op.relocate_from.where.segment) << 32) |
                                op.relocate_from.where.offset);
            }
          }
          continue;
        }
        for (size_t r = first; r < j; r++) {
          const ScannedRecord& rec = recs[r];
          last_lsn = std::max(last_lsn, rec.lsn);
          if (rec.type == LogRecordType::kKeyspaceCreate ||
              rec.type == LogRecordType::kKeyspaceDrop) {
            if (rec.payload.size() < 4) return Status::Corruption("bad keyspace record");
            uint32_t id = DecodeFixed32(rec.payload.data());
            KeyspaceSlot* slot = keyspaces_.Insert(id);
            if (slot == nullptr) return Status::Corruption("keyspace table full during replay");
            if (rec.type == LogRecordType::kKeyspaceCreate && rec.payload.size() == 12) {
              if (slot->state.load() == KeyspaceSlot::kEmpty ||
                  slot->state.load() == KeyspaceSlot::kDeleted) {
                slot->tag = DecodeFixed64(rec.payload.data() + 4);
                slot->state.store(KeyspaceSlot::kLive);
              }
            } else if (rec.type == LogRecordType::kKeyspaceDrop) {
              slot->state.store(KeyspaceSlot::kDropped);
            }
            keyspaces_.NoteUsed(id);
          }
        }
        for (size_t r = first, b = 0; r < j; r++) {
          const ScannedRecord& rec = recs[r];
          if (rec.type != LogRecordType::kPut && rec.type != LogRecordType::kDelete) continue;
          WriteOp& op = batch[b++];
          if (op.keyspace == 0) continue;  // already in the levels
          ValueKind kind = op.type == WriteOp::kDelete     ? ValueKind::kTombstone
                           : op.type == WriteOp::kRelocate ? ValueKind::kLargePtr
                           : op.type == WriteOp::kPatch    ? ValueKind::kLargePatch
                                                           : ValueKind::kInline;
          uint64_t need = MemTable::EntrySpace(op.ikey.size(), op.value.size());
          while (true) {
            MemTable active = memtables_.Get(levels_.Latest().active_memtable);
            if (active.used() + need <= options_.l0_size || active.entries() == 0) break;
            if (SwitchMemtable(false)) continue;
            Status cs = CompactAll();  // recovery is single-process: compact to make room
            if (!cs.ok()) return cs;
          }
          memtables_.Get(levels_.Latest().active_memtable).Insert(op.ikey, rec.lsn, kind, op.value);
        }
      }
    }
    return Status::OK();
  };
  Status walked = walk(false);
  if (!walked.ok()) return walked;

  // Re-derive the accounting of the scanned large segments. The manifest counted every value
  // appended before it was written, but values of uncompacted memtables may have been lost
  // with the crash (never written out) or orphaned (their L0 record lost), and values appended
  // after it are not counted at all. So: written is what the scan found; compacted values
  // (lsn <= compacted_lsn) were on the device before the manifest named them, and the
  // manifest's invalid bytes concern only those; an uncompacted value is garbage unless an L0
  // record that survived references it (and was not already counted as an orphan).
  // Orphans up to large_accounted_lsn were counted by an earlier recovery; LSNs then restart
  // above every scanned record, so a record's LSN tells which recovery saw it first.
  const Lsn counted_lsn = std::max(manifest_compacted_lsn, levels_.large_accounted_lsn());
  Lsn scanned_lsn = 0;
  for (const ScannedSegment& ss : large_chain) {
    SegmentInfo& info = segments_.info(ss.segment);
    uint64_t written = 0;
    for (const ScannedRecord& rec : ss.scan.records) {
      scanned_lsn = std::max(scanned_lsn, rec.lsn);
      if (rec.type != LogRecordType::kValue) continue;
      uint32_t bytes = RecordSpace(rec.payload.size());
      written += bytes;
      if (rec.lsn > counted_lsn && !referenced.count((uint64_t(ss.segment) << 32) | rec.offset)) {
        info.invalid_bytes += bytes;
      }
    }
    info.bytes_written = written;
  }
  for (const ScannedSegment& ss : l0_chain) {
    for (const ScannedRecord& rec : ss.scan.records) scanned_lsn = std::max(scanned_lsn, rec.lsn);
  }
  levels_.set_large_accounted_lsn(std::max(levels_.large_accounted_lsn(), scanned_lsn));

  walked = walk(true);
  if (!walked.ok()) return walked;
  last_lsn = std::max(last_lsn, scanned_lsn);  // records cut or orphaned keep their LSNs
  logs_.set_last_lsn(last_lsn);
  logs_.set_durable_lsn(last_lsn);

  // Resume appending: the L0 log at the cut or the end of its last segment; later segments
  // of a cut log are freed.
  if (cut_segment < l0_chain.size()) {
    for (size_t k = cut_segment + 1; k < l0_chain.size(); k++)
      segments_.info(l0_chain[k].segment) = SegmentInfo{};
    l0_chain.resize(cut_segment + 1);
    l0_chain.back().scan.valid_end = cut_offset;
    // The chain value at cut_offset is rebuilt by rescanning just that prefix.
    std::string prefix(device_.Segment(l0_chain.back().segment), cut_offset);
    prefix.resize(options_.segment_size, '\0');
    l0_chain.back().scan = ScanLogSegment(prefix.data(), prefix.size());
    segments_.info(l0_chain.back().segment).flags &= uint16_t(~kSegmentSealed);
  }
  for (LogKind kind : {LogKind::kL0, LogKind::kLarge}) {
    std::vector<ScannedSegment>& chain = kind == LogKind::kL0 ? l0_chain : large_chain;
    uint64_t max_seq = logs_.next_sequence(kind);
    for (const ScannedSegment& ss : chain) max_seq = std::max(max_seq, ss.sequence + 1);
    logs_.set_next_sequence(kind, max_seq);
    if (chain.empty()) {
      uint32_t seg;
      s = segments_.Allocate(kind == LogKind::kL0 ? SegmentKind::kL0Log : SegmentKind::kLargeLog, 0,
                             &seg);
      if (!s.ok()) return s;
      uint64_t seq = logs_.next_sequence(kind);
      segments_.info(seg).sequence = seq;
      s = logs_.Resume(kind, seg, seq, 0, 0);
    } else {
      const ScannedSegment& tail = chain.back();
      s = logs_.Resume(kind, tail.segment, tail.sequence,
                       tail.scan.header_ok ? tail.scan.valid_end : 0, tail.scan.chain);
    }
    if (!s.ok()) return s;
  }
  // After Resume the active segment of each log is its chain's tail (or a fresh segment).
  uint64_t first_l0 =
      l0_chain.empty() ? logs_.active_sequence(LogKind::kL0) : l0_chain.front().sequence;
  // The replayed memtable may point into any scanned large segment.
  uint64_t first_large =
      large_chain.empty() ? logs_.active_sequence(LogKind::kLarge) : large_chain.front().sequence;
  levels_.Apply([&](Version& v) {
    v.active_first_log_sequence = first_l0;
    v.active_first_large_sequence = first_large;
    v.immutable_first_large_sequence = first_large;
  });
  // Record the recovered state (also the first manifest of a fresh engine).
  std::string manifest;
  {
    SharedLock w(&shared_->write_mu);
    SharedLock a(segments_.mutex());
    manifest = levels_.NextManifest(logs_.last_lsn(), segments_, keyspaces_, logs_);
  }
  return levels_.WriteManifest(manifest);
}

}  // namespace slipstream::engine
