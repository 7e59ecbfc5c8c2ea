// StreamShipper: see stream_shipper.h.
#include "slipstream/replication/stream_shipper.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "buffer_scan.h"
#include "slipstream/replication/direct_append.h"

namespace slipstream::replication {

namespace {

uint64_t Nonce() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

}  // namespace

StreamShipper::StreamShipper(uint32_t stream, uint64_t first_sequence, uint64_t start,
                             std::vector<BackupLink*> links)
    : stream_(stream),
      size_(links.empty() ? 0 : links[0]->buffer_size()),
      sequence_(first_sequence),
      start_(start),
      segment_start_(start),
      end_(start) {
  for (BackupLink* l : links) {
    Target t;
    t.link = l;
    t.placed = t.durable = start;
    if (l->buffer_size() != size_) t.failed = Status::InvalidArgument("buffer size differs");
    targets_.push_back(t);
  }
}

int StreamShipper::live() const {
  int n = 0;
  for (const Target& t : targets_) n += t.failed.ok() ? 1 : 0;
  return n;
}

std::vector<std::string> StreamShipper::failures() const {
  std::vector<std::string> out;
  for (const Target& t : targets_) {
    if (!t.failed.ok()) out.push_back(t.link->address() + ": " + t.failed.ToString());
  }
  return out;
}

void StreamShipper::Drop(Target* t, const Status& why) {
  if (t->failed.ok()) t->failed = why.ok() ? Status::Disconnected("dropped") : why;
}

// Formats a fresh segment image and opens a buffer for it on every live backup.
Status StreamShipper::StartSegment() {
  image_.assign(size_, '\0');
  engine::StartLogSegment(image_.data(), size_, KindOfStream(stream_), sequence_, 0, Nonce(),
                          &cursor_);
  marks_.clear();
  marks_.push_back(Mark{0, segment_start_});
  shipped_ = 0;  // the header goes out with the first append
  for (Target& t : targets_) {
    if (!t.failed.ok()) continue;
    t.has_buffer = false;
    Status s = t.link->Open(stream_, sequence_, segment_start_, &t.buffer);
    if (s.ok()) {
      t.has_buffer = true;
    } else {
      Drop(&t, s);
    }
  }
  started_ = true;
  return live() > 0 ? Status::OK() : Status::Unavailable("no backup is left for the stream");
}

Status StreamShipper::Rotate(int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (Target& t : targets_) {
    if (!t.failed.ok() || !t.has_buffer) continue;
    while (t.failed.ok() && t.link->placed(t.buffer) < cursor_.pos) {
      if (std::chrono::steady_clock::now() > deadline) {
        Drop(&t, Status::Timeout("backup did not confirm placement before the buffer closed"));
        break;
      }
      Status s = t.link->Poll(1);
      if (!s.ok()) Drop(&t, s);
    }
    if (!t.failed.ok()) continue;
    Status s = t.link->Close(t.buffer, cursor_.pos);
    if (!s.ok()) {
      Drop(&t, s);
      continue;
    }
    t.has_buffer = false;
    t.placed = t.durable = end_;  // a closed buffer is durable on the backup
  }
  sequence_++;
  segment_start_ = end_;
  return StartSegment();
}

Status StreamShipper::Append(uint64_t position, std::string_view bytes) {
  if (position != end_) return Status::InvalidArgument("stream bytes must be appended in order");
  if (size_ == 0) return Status::Unavailable("no backup");
  if (!started_) {
    Status s = StartSegment();
    if (!s.ok()) return s;
  }
  while (!bytes.empty()) {
    uint32_t overhead = uint32_t(engine::kRecordHeaderSize + engine::kChecksumEntrySize);
    uint32_t room = size_ - cursor_.pos;
    if (room < overhead + kMinRecordRoom) {
      Status s = Rotate(5000);
      if (!s.ok()) return s;
      continue;
    }
    size_t n = std::min<size_t>({bytes.size(), room - overhead, engine::kMaxRecordPayload});
    uint32_t from = shipped_;
    engine::AppendRecord(image_.data(), &cursor_, engine::LogRecordType::kWal, end_,
                         {bytes.substr(0, n)});
    uint32_t checksum_at = cursor_.pos;
    engine::AppendChecksum(image_.data(), &cursor_);
    end_ += n;
    bytes.remove_prefix(n);
    marks_.push_back(Mark{cursor_.pos, end_});
    shipped_ = cursor_.pos;
    for (Target& t : targets_) {
      if (!t.failed.ok()) continue;
      Status s = t.link->Append(t.buffer, image_.data(), from, checksum_at, cursor_.pos);
      if (!s.ok()) Drop(&t, s);
    }
    if (live() == 0) return Status::Unavailable("no backup is left for the stream");
  }
  return Status::OK();
}

void StreamShipper::ExportCursor(SharedCursor* cursor) {
  *cursor = SharedCursor{};
  if (!started_ || targets_.size() != 1) return;
  Target& t = targets_[0];
  if (!t.failed.ok() || !t.has_buffer) return;
  // Records appended through the cursor continue the buffer: every byte before them must be
  // placed, or the backup's valid prefix would end before them (a WRITE that failed).
  Status s = t.link->Poll(0);
  if (!s.ok()) {
    Drop(&t, s);
    return;
  }
  if (t.link->placed(t.buffer) != cursor_.pos) return;
  if (t.link->ExportPeer(&cursor->peer)) {
    cursor->transport = uint32_t(CursorTransport::kShm);
  } else if (t.link->shares_buffers()) {
    cursor->transport = uint32_t(CursorTransport::kTcp);
  } else {
    return;
  }
  const rdma::RemoteRegion remote = t.link->remote(t.buffer);
  cursor->buffer_size = size_;
  cursor->sequence = sequence_;
  cursor->rkey = remote.rkey;
  cursor->remote_addr = remote.addr;
  cursor->pos = cursor_.pos;
  cursor->chain = cursor_.chain;
  cursor->end = end_;
  cursor->valid = 1;
}

Status StreamShipper::AdoptCursor(const SharedCursor& cursor) {
  // Appends made through a description of this very buffer (its random key) since it was
  // exported; a cursor left invalid by a refused WRITE still carries what was placed before.
  if (!started_ || targets_.size() != 1 || cursor.sequence != sequence_) return Status::OK();
  Target& t = targets_[0];
  if (!t.failed.ok() || !t.has_buffer || t.link->remote(t.buffer).rkey != cursor.rkey) {
    return Status::OK();
  }
  if (cursor.broken != 0) {
    Status why = Status::Disconnected(
        "a committing backend's WRITEs to the open buffer were not acknowledged");
    Drop(&t, why);
    return why;
  }
  if (cursor.pos <= cursor_.pos || cursor.pos > size_ || cursor.end <= end_) return Status::OK();
  cursor_.pos = cursor.pos;
  cursor_.chain = cursor.chain;
  end_ = cursor.end;
  shipped_ = cursor.pos;
  marks_.push_back(Mark{cursor.pos, cursor.end});
  t.link->AdoptPlaced(t.buffer, cursor.pos);  // a direct WRITE is placed when it returns
  Refresh();
  return Status::OK();
}

uint64_t StreamShipper::PositionAt(uint32_t offset) const {
  // Marks are in increasing offset order: find the last one at or before `offset`.
  auto it = std::upper_bound(marks_.begin(), marks_.end(), offset,
                             [](uint32_t o, const Mark& m) { return o < m.offset; });
  return it == marks_.begin() ? segment_start_ : std::prev(it)->position;
}

void StreamShipper::Refresh() {
  for (Target& t : targets_) {
    if (!t.failed.ok() || !t.has_buffer) continue;
    t.placed = std::max(t.placed, PositionAt(t.link->placed(t.buffer)));
  }
}

Status StreamShipper::Poll(int timeout_ms) {
  bool first = true;
  for (Target& t : targets_) {
    if (!t.failed.ok()) continue;
    Status s = t.link->Poll(first ? timeout_ms : 0);
    first = false;
    if (!s.ok()) Drop(&t, s);
  }
  Refresh();
  return live() > 0 ? Status::OK() : Status::Unavailable("no backup is left for the stream");
}

uint64_t StreamShipper::KthHighest(int count, uint64_t Target::*field) const {
  std::vector<uint64_t> values;
  for (const Target& t : targets_) {
    if (t.failed.ok()) values.push_back(t.*field);
  }
  if (count <= 0) return end_;
  if (int(values.size()) < count) return start_;  // nothing is on `count` backups for sure
  std::sort(values.rbegin(), values.rend());
  return values[size_t(count - 1)];
}

uint64_t StreamShipper::Placed(int count) const {
  return KthHighest(count, &Target::placed);
}

uint64_t StreamShipper::Durable(int count) const {
  return KthHighest(count, &Target::durable);
}

Status StreamShipper::WaitPlaced(uint64_t position, int count, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Placed(count) < position) {
    if (live() < count) return Status::Unavailable("fewer backups than required are left");
    if (std::chrono::steady_clock::now() > deadline) return Status::Timeout("placement");
    Status s = Poll(1);
    if (!s.ok() && count > 0) return s;
  }
  return Status::OK();
}

Status StreamShipper::Flush(int count, int timeout_ms, uint64_t* durable) {
  Status s = StartFlush(timeout_ms);
  return s.ok() ? FinishFlush(count, durable) : s;
}

Status StreamShipper::StartFlush(int timeout_ms) {
  Status s = WaitPlaced(end_, live(), timeout_ms);
  if (!s.ok() && s.code() != Status::Code::kTimeout) return s;
  for (Target& t : targets_) {
    if (!t.failed.ok() || !t.has_buffer) continue;
    Status f = t.link->StartFlush(t.buffer, t.link->placed(t.buffer));
    if (!f.ok()) {
      Drop(&t, f);
      continue;
    }
    t.flushing = true;
  }
  return Status::OK();
}

Status StreamShipper::FinishFlush(int count, uint64_t* durable) {
  for (Target& t : targets_) {
    if (!t.flushing) continue;
    t.flushing = false;
    if (!t.failed.ok()) continue;
    uint32_t done = 0;
    Status f = t.link->FinishFlush(t.buffer, &done);
    if (!f.ok()) {
      Drop(&t, f);
      continue;
    }
    t.durable = std::max(t.durable, PositionAt(done));
  }
  *durable = KthHighest(count, &Target::durable);
  return live() >= count ? Status::OK()
                         : Status::Unavailable("fewer backups than required are left");
}

}  // namespace slipstream::replication
