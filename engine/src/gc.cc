// Large-log garbage collection: pick a sealed segment by its invalid-byte ratio alone (GC
// never scans the log to find work), then relocate its still-live values to the head of the
// large log with conditional puts.
#include "engine_impl.h"
#include "slipstream/engine/log_scanner.h"

namespace slipstream::engine {

// A sealed large-log segment past the invalid-byte threshold, not yet evacuated (0: none).
uint32_t EngineImpl::PickGarbageSegment() {
  SharedLock w(&shared_->write_mu);
  SharedLock a(segments_.mutex());
  uint32_t best = 0;
  double best_ratio = 0;
  for (uint64_t seg = 1; seg < segments_.count(); seg++) {
    const SegmentInfo& info = segments_.info(seg);
    if (info.kind != uint8_t(SegmentKind::kLargeLog) || !(info.flags & kSegmentSealed) ||
        (info.flags & (kSegmentEvacuated | kSegmentRetired)) || info.bytes_written == 0 ||
        info.invalid_bytes >= info.bytes_written) {
      continue;
    }
    double ratio = double(info.invalid_bytes) / double(info.bytes_written);
    if (ratio >= options_.gc_threshold && ratio > best_ratio) {
      best = uint32_t(seg);
      best_ratio = ratio;
    }
  }
  if (best) segments_.info(best).flags |= kSegmentEvacuated;
  return best;
}

// Relocates the still-live values of a large-log segment (each relocation is skipped if the
// key moved on meanwhile). The segment is freed when compaction has dropped the last stale
// pointer into it.
Status EngineImpl::CollectGarbage(uint32_t segment) {
  EpochPin pin(&shared_->epochs);
  LogScan scan = ScanLogSegment(device_.Segment(segment), options_.segment_size);
  if (!scan.header_ok) {
    return Status::Corruption("large-log segment " + std::to_string(segment) + " has no header");
  }
  shared_->counters.device_bytes_read += scan.valid_end;
  std::vector<WriteOp> batch;
  size_t batch_bytes = 0;
  uint64_t relocated = 0;
  auto flush = [&]() -> Status {
    if (batch.empty()) return Status::OK();
    Status s = WriteOps(batch, nullptr, /*may_stall=*/false);
    batch.clear();
    batch_bytes = 0;
    return s;
  };
  // Busy means L0 is full and compaction must run first (possibly in this very process): the
  // segment becomes eligible again, and a later round skips the values already relocated.
  auto back_off = [&](const Status& s) {
    if (s.IsBusy()) {
      SharedLock a(segments_.mutex());
      segments_.info(segment).flags &= uint16_t(~kSegmentEvacuated);
    }
    return s;
  };
  for (const ScannedRecord& rec : scan.records) {
    if (rec.type != LogRecordType::kValue) continue;
    const char* p = rec.payload.data();
    const char* limit = p + rec.payload.size();
    uint32_t key_size;
    p = DecodeVarint32(p, limit, &key_size);
    if (!p || uint64_t(limit - p) < uint64_t(key_size) + 5 || key_size < kKeyspacePrefix) {
      return Status::Corruption("large-log record with a bad key in segment " +
                                std::to_string(segment));
    }
    std::string_view ikey(p, key_size);
    KeyspaceId ks = KeyspaceOf(ikey);
    if (!keyspaces_.IsLive(ks)) continue;
    WriteOp op;
    op.type = WriteOp::kRelocate;
    op.keyspace = ks;
    op.key = UserKeyOf(ikey);
    op.value = rec.payload;
    op.relocate_from = ValuePtr{
        {segment, rec.offset}, RecordSpace(rec.payload.size()), DecodeFixed32(p + key_size + 1)};
    batch_bytes += rec.payload.size() + 64;
    relocated += rec.payload.size();
    batch.push_back(std::move(op));
    if (batch.size() >= 64 || batch_bytes >= options_.segment_size / 2) {
      Status s = flush();
      if (!s.ok()) return back_off(s);
    }
  }
  Status s = flush();
  if (!s.ok()) return back_off(s);
  shared_->counters.gc_runs++;
  shared_->counters.gc_bytes_relocated += relocated;
  return Status::OK();
}

}  // namespace slipstream::engine
