// LogSet: see log_set.h.
#include "log_set.h"

#include <lz4.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "clock.h"
#include "coding.h"
#include "crc32c.h"
#include "slipstream/engine/log_writer.h"

namespace slipstream::engine {

namespace {

// A random nonce per log segment use (seeds its checksum chain).
uint64_t RandomNonce() {
  thread_local std::mt19937_64 rng(std::random_device{}() ^ uint64_t(getpid()) << 32);
  return rng();
}

ObservedLog ObservedKind(uint32_t kind) {
  return kind == uint32_t(LogKind::kL0) ? ObservedLog::kL0 : ObservedLog::kLarge;
}

}  // namespace

void LogSet::Format(uint64_t l0_buffers, uint64_t large_buffers) {
  shared_->flush_mu.Init();
  SharedLog* logs[2] = {&shared_->l0, &shared_->large};
  uint64_t bases[2] = {l0_buffers, large_buffers};
  uint32_t counts[2] = {kL0LogBuffers, kLargeLogBuffers};
  for (int l = 0; l < 2; l++) {
    logs[l]->kind = uint32_t(l == 0 ? LogKind::kL0 : LogKind::kLarge);
    logs[l]->buffer_count = counts[l];
    for (uint32_t b = 0; b < counts[l]; b++) {
      logs[l]->buffers[b].data_offset = bases[l] + uint64_t(b) * options_.segment_size;
    }
  }
}

int LogSet::FreeBuffersAhead(LogKind kind) const {
  const SharedLog& log = Log(kind);
  int n = 0;
  for (uint32_t i = 1; i < log.buffer_count; i++) {
    const SharedLogBuffer& b = log.buffers[(log.current + i) % log.buffer_count];
    if (b.state.load() != SharedLogBuffer::kFree || b.pins != 0) break;
    n++;
  }
  return n;
}

Status LogSet::Rotate(LogKind kind) {
  SharedLog* log = &Log(kind);
  SegmentKind segment_kind = kind == LogKind::kL0 ? SegmentKind::kL0Log : SegmentKind::kLargeLog;
  uint32_t segment;
  Status s = segments_->Allocate(segment_kind, 0, &segment);
  if (!s.ok()) return s;
  s = device_->ZeroSegment(segment);
  if (!s.ok()) return s;
  uint64_t sequence = log->next_sequence++;
  {
    SharedLock lock(segments_->mutex());
    segments_->info(segment).sequence = sequence;
  }
  SharedLogBuffer& cur = log->buffers[log->current];
  if (cur.state.load() == SharedLogBuffer::kActive) {
    char payload[12];
    EncodeFixed32(payload, segment);
    EncodeFixed64(payload + 4, sequence);
    AppendRecord(Buffer(cur), &log->cursor, LogRecordType::kNext, shared_->last_lsn.load(),
                 {std::string_view(payload, 12)});
    AppendChecksum(kind);
    cur.appended.store(log->cursor.pos, std::memory_order_release);
    cur.state.store(SharedLogBuffer::kSealed);
    SharedLock lock(segments_->mutex());
    segments_->info(cur.segment).flags |= kSegmentSealed;
  }
  uint32_t next = (log->current + 1) % log->buffer_count;
  SharedLogBuffer& nb = log->buffers[next];
  nb.generation.fetch_add(1);
  nb.segment = segment;
  nb.sequence = sequence;
  nb.written = 0;
  nb.pins = 0;
  // The buffer keeps its earlier use's bytes past the cursor: nothing reads them (write-outs
  // and the observer take [written, appended), readers follow pointers to appended records),
  // the device segment was zeroed above, and the new nonce keeps stale records off the chain.
  StartLogSegment(Buffer(nb), options_.segment_size, kind, sequence, segment, RandomNonce(),
                  &log->cursor);
  nb.appended.store(log->cursor.pos, std::memory_order_release);
  nb.state.store(SharedLogBuffer::kActive);
  log->current = next;
  background_->Wake();  // the sealed buffer should be written out before writers need it again
  return Status::OK();
}

LogSet::Appended LogSet::Append(LogKind kind, LogRecordType type, Lsn lsn,
                                std::initializer_list<std::string_view> parts) {
  SharedLog& log = Log(kind);
  SharedLogBuffer& b = log.buffers[log.current];
  uint32_t offset = AppendRecord(Buffer(b), &log.cursor, type, lsn, parts);
  return Appended{b.segment, offset};
}

void LogSet::AppendChecksum(LogKind kind) {
  SharedLog& log = Log(kind);
  engine::AppendChecksum(Buffer(log.buffers[log.current]), &log.cursor);
}

void LogSet::Publish(LogKind kind) {
  SharedLog& log = Log(kind);
  log.buffers[log.current].appended.store(log.cursor.pos, std::memory_order_release);
}

bool LogSet::HasSealedBuffer() const {
  for (const SharedLog* log : {&shared_->l0, &shared_->large}) {
    for (uint32_t i = 0; i < log->buffer_count; i++) {
      if (log->buffers[i].state.load() == SharedLogBuffer::kSealed) return true;
    }
  }
  return false;
}

bool LogSet::HasUnflushed() const {
  for (const SharedLog* log : {&shared_->l0, &shared_->large}) {
    for (uint32_t i = 0; i < log->buffer_count; i++) {
      const SharedLogBuffer& b = log->buffers[i];
      if (b.state.load() != SharedLogBuffer::kFree && b.appended.load() > b.written) return true;
      if (b.state.load() == SharedLogBuffer::kSealed) return true;
    }
  }
  return false;
}

bool LogSet::IsBuffered(uint32_t segment) const {
  for (const SharedLog* log : {&shared_->l0, &shared_->large}) {
    for (uint32_t i = 0; i < log->buffer_count; i++) {
      if (log->buffers[i].state.load() != SharedLogBuffer::kFree &&
          log->buffers[i].segment == segment) {
        return true;
      }
    }
  }
  return false;
}

Status LogSet::WriteOut(bool sync, Lsn wait_for) {
  SharedLock flush(&shared_->flush_mu);
  if (sync && wait_for != 0 && shared_->durable_lsn.load() >= wait_for) return Status::OK();
  bool wrote = false;
  capture_.valid = false;  // everything appended goes out now, the captured bytes included
  return WriteOutLocked(sync, nullptr, &wrote);
}

// Without a capture: every appended byte, behind the barrier. With one: the bytes it captured
// that are still unwritten, without the barrier (the host's log already covers them).
Status LogSet::WriteOutLocked(bool sync, const Capture* upto, bool* wrote) {
  struct Job {
    SharedLogBuffer* buffer;
    uint32_t log_kind;
    uint32_t end;
  };
  std::vector<Job> jobs;
  std::vector<WriteRequest> requests;
  Lsn target;
  uint64_t records;
  {
    SharedLock lock(write_mu_);
    target = upto != nullptr ? upto->last_lsn : shared_->last_lsn.load();
    records = counters_->unflushed_records.exchange(0);
    for (SharedLog* log : {&shared_->large, &shared_->l0}) {
      for (uint32_t k = 0; k < log->buffer_count; k++) {
        // Oldest buffer first, so a sealed segment's bytes go out before its successor's.
        uint32_t index = (log->current + 1 + k) % log->buffer_count;
        SharedLogBuffer& b = log->buffers[index];
        uint32_t state = b.state.load();
        if (state == SharedLogBuffer::kFree) continue;
        uint32_t appended = b.appended.load();
        if (upto != nullptr) {
          // Only the bytes the capture saw, and only in the segment it saw them in.
          const Capture::Range& r = upto->ranges[CaptureIndex(log->kind)][index];
          appended =
              r.live && r.generation == b.generation.load() ? std::min(appended, r.end) : b.written;
        }
        if (appended > b.written) {
          b.pins++;
          jobs.push_back(Job{&b, log->kind, appended});
          requests.push_back(WriteRequest{uint64_t(b.segment) * options_.segment_size + b.written,
                                          Buffer(b) + b.written, appended - b.written});
        } else if (state == SharedLogBuffer::kSealed && b.pins == 0 &&
                   b.written == b.appended.load()) {
          b.state.store(SharedLogBuffer::kFree);
        }
      }
    }
  }
  uint64_t bytes = 0;
  for (const WriteRequest& r : requests) bytes += r.length;
  // Every captured record was appended before the snapshot above, so the barrier covers it.
  Status s = requests.empty() || upto != nullptr || !options_.persist_barrier
                 ? Status::OK()
                 : options_.persist_barrier();
  if (s.ok() && upto == nullptr && options_.persist_barrier) counters_->log_barrier_calls++;
  if (s.ok() && observer_ != nullptr) {
    for (size_t i = 0; i < jobs.size(); i++) {
      const SharedLogBuffer& b = *jobs[i].buffer;
      observer_->OnLogWrite(LogWriteEvent{ObservedKind(jobs[i].log_kind), b.segment, b.sequence,
                                          b.written,
                                          std::string_view(requests[i].data, requests[i].length)});
    }
  }
  if (s.ok()) s = device_->Write(requests, sync && options_.use_fsync);
  {
    SharedLock lock(write_mu_);
    for (const Job& j : jobs) {
      j.buffer->pins--;
      if (s.ok()) j.buffer->written = std::max(j.buffer->written, j.end);
      if (j.buffer->state.load() == SharedLogBuffer::kSealed && j.buffer->pins == 0 &&
          j.buffer->written == j.buffer->appended.load()) {
        j.buffer->state.store(SharedLogBuffer::kFree);
      }
    }
  }
  if (!s.ok()) return s;
  *wrote = !requests.empty();
  if (sync) {
    Lsn durable = shared_->durable_lsn.load();
    while (durable < target && !shared_->durable_lsn.compare_exchange_weak(durable, target)) {
    }
  }
  counters_->device_bytes_written += bytes;
  shared_->last_flush_micros.store(NowMicros());
  if (!requests.empty() || records) {
    counters_->log_flushes++;
    counters_->log_records_flushed += records;
  }
  background_->NotifyProgress();
  return Status::OK();
}

bool LogSet::DefersToHostLog() const {
  return options_.persist_barrier && options_.host_log_needed && options_.host_log_durable;
}

// A capture's bytes go out once the host's log covers them; then the next capture is taken. A
// capture the host has not covered within max_writeout_lag_ms is dropped, and everything goes
// out behind the barrier, as without a host log.
Status LogSet::PeriodicWriteOut(bool sync, bool* wrote) {
  *wrote = false;
  if (!DefersToHostLog()) {
    *wrote = true;
    return WriteOut(sync, 0);
  }
  SharedLock flush(&shared_->flush_mu);
  uint64_t now = NowMicros();
  if (capture_.valid) {
    if (options_.host_log_durable() >= capture_.host_position) {
      Status s = WriteOutLocked(sync, &capture_, wrote);
      capture_.valid = false;
      if (!s.ok()) return s;
    } else if (now - capture_.micros >= uint64_t(options_.max_writeout_lag_ms) * 1000) {
      capture_.valid = false;
      return WriteOutLocked(sync, nullptr, wrote);
    } else {
      return Status::OK();  // the host's log gets there by itself, soon
    }
  }
  TakeCapture(now);
  return Status::OK();
}

// Notes each buffer's appended end, then (so that it covers all of them) the host's position.
void LogSet::TakeCapture(uint64_t now) {
  bool any = false;
  {
    SharedLock lock(write_mu_);
    capture_.last_lsn = shared_->last_lsn.load();
    for (const SharedLog* log : {&shared_->large, &shared_->l0}) {
      for (uint32_t i = 0; i < log->buffer_count; i++) {
        const SharedLogBuffer& b = log->buffers[i];
        Capture::Range& r = capture_.ranges[CaptureIndex(log->kind)][i];
        r.live = b.state.load() != SharedLogBuffer::kFree;
        r.generation = b.generation.load();
        r.end = b.appended.load();
        any = any || (r.live && r.end > b.written);
      }
    }
  }
  if (!any) return;
  capture_.host_position = options_.host_log_needed();
  capture_.micros = now;
  capture_.valid = true;
}

Status LogSet::Sync(Lsn lsn) {
  Lsn last = shared_->last_lsn.load();
  if (lsn > last) lsn = last;
  if (shared_->durable_lsn.load() >= lsn) return Status::OK();
  return WriteOut(true, lsn);
}

Status LogSet::ReadValue(std::string_view ikey, const LeafEntry& entry, std::string* value) const {
  if (entry.kind == ValueKind::kInline) {
    value->assign(entry.inline_value);
    return Status::OK();
  }
  if (entry.kind == ValueKind::kTombstone) return Status::NotFound();
  const ValuePtr& ptr = entry.ptr;
  SegmentKind expected =
      RefersToLargeLog(entry.kind) ? SegmentKind::kLargeLog : SegmentKind::kMediumLog;
  if (ptr.where.segment == 0 || ptr.where.segment >= segments_->count() ||
      segments_->info(ptr.where.segment).kind != uint8_t(expected) ||
      ptr.where.offset < kLogHeaderSize || ptr.record_bytes < kRecordHeaderSize ||
      uint64_t(ptr.where.offset) + ptr.record_bytes > options_.segment_size) {
    return Status::Corruption("value pointer out of bounds or into a segment of another kind");
  }
  std::string record;
  bool from_buffer = false;
  if (expected == SegmentKind::kLargeLog) {
    // The record may still be only in a shared buffer; the generation check catches reuse.
    const SharedLog& log = shared_->large;
    for (uint32_t i = 0; i < log.buffer_count && !from_buffer; i++) {
      const SharedLogBuffer& b = log.buffers[i];
      uint32_t gen = b.generation.load();
      if (b.state.load() == SharedLogBuffer::kFree || b.segment != ptr.where.segment) continue;
      record.assign(Buffer(b) + ptr.where.offset, ptr.record_bytes);
      std::atomic_thread_fence(std::memory_order_acquire);
      from_buffer = b.generation.load() == gen && b.segment == ptr.where.segment;
    }
  }
  if (!from_buffer) {
    record.assign(device_->Segment(ptr.where.segment) + ptr.where.offset, ptr.record_bytes);
  }
  RecordHeader h;
  std::memcpy(&h, record.data(), sizeof(h));
  uint32_t length = h.type_and_length >> 8;
  const char* payload = record.data() + kRecordHeaderSize;
  if ((h.type_and_length & 0xff) != uint8_t(LogRecordType::kValue) ||
      length != ptr.record_bytes - kRecordHeaderSize ||
      crc32c::Value(payload, length) != h.payload_crc) {
    return Status::Corruption("value record damaged (bad header or checksum)");
  }
  const char* limit = payload + length;
  uint32_t key_size;
  const char* p = DecodeVarint32(payload, limit, &key_size);
  if (!p || uint64_t(limit - p) < uint64_t(key_size) + 5 || std::string_view(p, key_size) != ikey) {
    return Status::Corruption("value record belongs to another key");
  }
  p += key_size;
  uint8_t flags = uint8_t(*p++);
  uint32_t raw_size = DecodeFixed32(p);
  p += 4;
  if (raw_size > options_.max_value_size) return Status::Corruption("value record size impossible");
  if (flags & kValueFlagLz4) {
    value->resize(raw_size);
    int n = LZ4_decompress_safe(p, value->data(), int(limit - p), int(raw_size));
    if (n != int(raw_size)) return Status::Corruption("large value does not decompress");
  } else {
    if (uint32_t(limit - p) != raw_size) return Status::Corruption("value record size mismatch");
    value->assign(p, raw_size);
  }
  if (entry.kind == ValueKind::kLargePatch) {  // the value's first bytes as changed since
    if (entry.inline_value.size() > value->size() || raw_size != ptr.value_size)
      return Status::Corruption("large value patch longer than its value");
    std::memcpy(value->data(), entry.inline_value.data(), entry.inline_value.size());
  }
  return Status::OK();
}

Status LogSet::Resume(LogKind kind, uint32_t segment, uint64_t sequence, uint32_t valid_end,
                      uint32_t chain) {
  SharedLog* log = &Log(kind);
  SharedLogBuffer& b = log->buffers[0];
  char* buf = Buffer(b);
  std::memset(buf, 0, options_.segment_size);
  b.generation.fetch_add(1);
  b.segment = segment;
  b.sequence = sequence;
  b.pins = 0;
  Status s;
  if (valid_end >= kLogHeaderSize) {
    std::memcpy(buf, device_->Segment(segment), valid_end);
    log->cursor = LogCursor{valid_end, chain};
    b.written = valid_end;
    s = device_->ZeroRange(uint64_t(segment) * options_.segment_size + valid_end,
                           options_.segment_size - valid_end);
  } else {
    s = device_->ZeroSegment(segment);
    StartLogSegment(buf, options_.segment_size, kind, sequence, segment,
                    (uint64_t(segment) << 32) ^ sequence ^ 0x9e3779b97f4a7c15ull, &log->cursor);
    b.written = 0;
  }
  b.appended.store(log->cursor.pos);
  b.state.store(SharedLogBuffer::kActive);
  log->current = 0;
  log->next_sequence = std::max(log->next_sequence, sequence + 1);
  return s;
}

}  // namespace slipstream::engine
