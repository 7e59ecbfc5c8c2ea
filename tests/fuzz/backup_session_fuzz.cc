// Fuzzes the backup's side of replication against a scripted primary: a BackupServer session
// (BackupServer::Serve) answers the primary's requests (HELLO, OPEN, FLUSH, CLOSE, and anything
// else a peer sends), scans the buffers the primary writes into with one-sided WRITEs, and
// persists what is valid, here into a store that checks every persist. The primary is a fake
// transport connection that plays the input's script, one event after another each time the
// session polls, and hangs up when the script ends.
//
// Input: options (per-primary buffers u8, system id u8, timeline u8, stored version u8, resume
// u8), then events, each a kind byte (mod 4) and its fields:
//   0 message: length u16, bytes (delivered into the next posted receive, as a SEND);
//   1 write: buffer u8, offset u16, length u8, bytes (a raw WRITE into a granted buffer);
//   2 format: buffer u8, stream u8, sequence u8 (the primary's log writer starts a segment);
//   3 append: buffer u8, records u8, length u8 (the log writer appends records and a checksum).
// Properties: every answer is a well-formed message whose fields keep the server's own limits;
// every persist hands the store a range inside the buffer whose records lie inside it and past
// what was persisted before; the stored version only grows; nothing overruns (ASan).
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "buffer_scan.h"
#include "fake_connection.h"
#include "fuzz_input.h"
#include "slipstream/engine/log_writer.h"
#include "slipstream/replication/backup_server.h"
#include "slipstream/replication/backup_store.h"
#include "slipstream/replication/wire.h"

namespace {

using namespace slipstream;
using namespace slipstream::replication;

constexpr uint32_t kBufferSize = 64 * 1024;

// Stops the run with a message: a property of the backup's side does not hold.
[[noreturn]] void Fail(const char* what) {
  fuzz::FuzzFailure("backup_session", what);
}

// A store that keeps nothing but checks what it is handed (see the file comment).
class CheckingStore : public BackupStore {
 public:
  CheckingStore(uint64_t version, uint64_t resume) : version_(version), resume_(resume) {}

  Status Persist(const SegmentId& segment, const char* image, uint32_t from, uint32_t to,
                 const std::vector<engine::ScannedRecord>& records, bool closed) override {
    (void)closed;
    if (from > to || to > kBufferSize) Fail("a persist beyond the buffer");
    if (!IsValidName(segment.primary) || !IsValidStream(segment.stream)) {
      Fail("a persist of a segment no primary can name");
    }
    for (const engine::ScannedRecord& r : records) {
      const uint64_t end = uint64_t(r.offset) + engine::kRecordHeaderSize + r.payload.size();
      if (r.offset < from || end > to) Fail("a persisted record outside the persisted range");
      if (r.payload.data() != image + r.offset + engine::kRecordHeaderSize) {
        Fail("a persisted record's payload is not in the image");
      }
    }
    return Status::OK();
  }
  Status LoadVersion(const std::string& primary, uint64_t* version) override {
    (void)primary;
    *version = version_;
    return Status::OK();
  }
  Status SaveVersion(const std::string& primary, uint64_t version) override {
    (void)primary;
    if (version <= version_) Fail("a saved version that does not grow");
    version_ = version;
    return Status::OK();
  }
  uint64_t ResumePosition(const std::string& primary, uint32_t stream) override {
    (void)primary;
    (void)stream;
    return resume_;
  }

 private:
  uint64_t version_;
  uint64_t resume_;
};

// One event of the script.
struct Event {
  uint8_t kind = 0;
  std::string bytes;  // message, write
  uint8_t buffer = 0, a = 0, b = 0;
  uint16_t offset = 0;
};

// The primary as a connection: see the file comment. The session's thread makes every call but
// WaitForHangUp, which the fuzzer's thread makes.
class ScriptedPrimary : public rdma::Connection {
 public:
  explicit ScriptedPrimary(std::deque<Event> script) : script_(std::move(script)) {}

  rdma::Status AllocateRegion(size_t length, uint32_t access, rdma::LocalRegion* region) override {
    regions_.Allocate(length, access, region);
    if (access & rdma::kRemoteWrite) granted_.push_back(*region);
    return rdma::Status::OK();
  }
  rdma::Status RegisterLocal(void* addr, size_t length, rdma::LocalRegion* region) override {
    regions_.Register(addr, length, region);
    return rdma::Status::OK();
  }
  rdma::Status FreeRegion(const rdma::LocalRegion& region) override {
    for (size_t i = 0; i < granted_.size(); i++) {
      if (granted_[i].lkey == region.lkey) granted_.erase(granted_.begin() + long(i));
    }
    cursors_.erase(region.lkey);
    regions_.Free(region);
    return rdma::Status::OK();
  }
  rdma::RemoteRegion Describe(const rdma::LocalRegion& region) const override {
    return fuzz::HeapRegions::Describe(region);
  }

  // The server only answers: every SEND must be a well-formed answer within its limits.
  rdma::Status Post(const rdma::WorkRequest* requests, size_t count) override {
    if (hung_up()) return rdma::Status::Disconnected("the scripted primary hung up");
    for (size_t i = 0; i < count; i++) {
      const rdma::WorkRequest& wr = requests[i];
      if (wr.opcode != rdma::Opcode::kSend) Fail("the server posted something else than a SEND");
      const std::string bytes = fuzz::GatheredBytes(wr);
      Message answer;
      if (!Decode(bytes, &answer).ok()) Fail("the server sent a malformed message");
      CheckAnswer(answer);
      if (wr.signaled) {
        rdma::Completion c;
        c.wr_id = wr.wr_id;
        c.opcode = rdma::Opcode::kSend;
        completions_.push_back(c);
      }
    }
    return rdma::Status::OK();
  }
  rdma::Status PostRecv(const rdma::RecvRequest* requests, size_t count) override {
    for (size_t i = 0; i < count; i++) receives_.push_back(requests[i]);
    return rdma::Status::OK();
  }
  // Plays the script up to its next message; hangs up once it has ended.
  rdma::Status Poll(rdma::Completion* out, size_t max, int timeout_ms, size_t* count) override {
    (void)timeout_ms;
    while (completions_.empty() && !script_.empty()) Play();
    *count = fuzz::PopCompletions(&completions_, out, max);
    if (*count == 0 && script_.empty()) {
      Disconnect();
      return rdma::Status::Disconnected("the scripted primary hung up");
    }
    return rdma::Status::OK();
  }
  rdma::Status state() const override {
    return hung_up() ? rdma::Status::Disconnected("the scripted primary hung up")
                     : rdma::Status::OK();
  }
  void Disconnect() override {
    std::lock_guard<std::mutex> lock(mu_);
    hung_up_ = true;
    cv_.notify_all();
  }
  std::string backend() const override { return "scripted"; }
  uint32_t max_sge() const override { return 4; }

  // Waits until the connection is down: the script ended, or the session dropped the primary.
  void WaitForHangUp() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return hung_up_; });
  }

 private:
  // Whether the connection is down.
  bool hung_up() const {
    std::lock_guard<std::mutex> lock(mu_);
    return hung_up_;
  }
  // The granted buffer an event names (by order of grant), or null.
  rdma::LocalRegion* Granted(uint8_t buffer) {
    return granted_.empty() ? nullptr : &granted_[buffer % granted_.size()];
  }
  // Plays the script's next event.
  void Play() {
    Event e = std::move(script_.front());
    script_.pop_front();
    switch (e.kind) {
      case 0: {  // a SEND: into the next posted receive, failing it when it does not fit
        if (receives_.empty()) return;
        const rdma::RecvRequest receive = receives_.front();
        receives_.pop_front();
        rdma::Completion c;
        c.wr_id = receive.wr_id;
        c.opcode = rdma::Opcode::kRecv;
        if (e.bytes.size() > receive.sge.length) {
          c.status = rdma::WcStatus::kLocalLengthError;
        } else {
          std::memcpy(const_cast<void*>(receive.sge.addr), e.bytes.data(), e.bytes.size());
          c.byte_len = uint32_t(e.bytes.size());
        }
        completions_.push_back(c);
        return;
      }
      case 1: {  // a WRITE: placed when it lies inside the buffer, as a NIC checks
        rdma::LocalRegion* r = Granted(e.buffer);
        if (r == nullptr || e.offset + e.bytes.size() > r->length) return;
        std::memcpy(r->addr + e.offset, e.bytes.data(), e.bytes.size());
        return;
      }
      case 2: {  // the log writer formats the buffer as a segment
        rdma::LocalRegion* r = Granted(e.buffer);
        if (r == nullptr) return;
        std::memset(r->addr, 0, r->length);
        engine::StartLogSegment(r->addr, uint32_t(r->length), KindOfStream(1 + e.a % 4), e.b, 0,
                                0xfeed, &cursors_[r->lkey]);
        return;
      }
      default: {  // the log writer appends records and their checksum, when they fit
        rdma::LocalRegion* r = Granted(e.buffer);
        if (r == nullptr || cursors_.count(r->lkey) == 0) return;
        engine::LogCursor& cursor = cursors_[r->lkey];
        const int records = 1 + e.a % 4;
        const std::string payload(e.b, char('a' + e.b % 26));
        const size_t need =
            records * (engine::kRecordHeaderSize + payload.size()) + engine::kChecksumEntrySize;
        if (cursor.pos + need > r->length) return;
        for (int i = 0; i < records; i++) {
          engine::AppendRecord(r->addr, &cursor, engine::LogRecordType::kWal, position_, {payload});
          position_ += payload.size();
        }
        engine::AppendChecksum(r->addr, &cursor);
        return;
      }
    }
  }
  // The server's answers keep its own limits.
  void CheckAnswer(const Message& answer) {
    if (const auto* ok = std::get_if<HelloOk>(&answer)) {
      if (ok->buffer_size != kBufferSize || !IsValidBufferSize(ok->buffer_size) ||
          ok->buffers == 0) {
        Fail("a HELLO answer offers buffers the server does not have");
      }
    } else if (const auto* ok = std::get_if<OpenOk>(&answer)) {
      if (ok->length != kBufferSize) Fail("an OPEN answer hands out a buffer of another size");
    } else if (const auto* ok = std::get_if<FlushOk>(&answer)) {
      if (ok->durable > kBufferSize) Fail("a FLUSH answer says more is durable than a buffer");
    } else if (!std::holds_alternative<CloseOk>(answer) && !std::holds_alternative<Error>(answer)) {
      Fail("the server sent a message only a primary sends");
    }
  }

  std::deque<Event> script_;
  std::deque<rdma::RecvRequest> receives_;
  std::deque<rdma::Completion> completions_;
  fuzz::HeapRegions regions_;
  std::vector<rdma::LocalRegion> granted_;
  std::map<uint32_t, engine::LogCursor> cursors_;
  uint64_t position_ = 1000;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool hung_up_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput p(data, size);
  BackupOptions options;
  options.buffers = 4;
  options.buffers_per_primary = 1 + uint32_t(p.Take(1) % 4);
  options.system_id = p.Take(1);
  options.timeline = uint32_t(p.Take(1));
  options.buffer_size = kBufferSize;
  const uint64_t version = p.Take(1);
  const uint64_t resume = p.Take(1) * 1000;
  std::deque<Event> script;
  while (!p.empty()) {
    Event e;
    e.kind = uint8_t(p.Take(1) % 4);
    switch (e.kind) {
      case 0:
        e.bytes = std::string(p.Bytes(size_t(p.Take(2))));
        break;
      case 1:
        e.buffer = uint8_t(p.Take(1));
        e.offset = uint16_t(p.Take(2));
        e.bytes = std::string(p.Bytes(size_t(p.Take(1))));
        break;
      default:
        e.buffer = uint8_t(p.Take(1));
        e.a = uint8_t(p.Take(1));
        e.b = uint8_t(p.Take(1));
        break;
    }
    script.push_back(std::move(e));
  }

  CheckingStore store(version, resume);
  BackupServer server(options, &store);
  auto primary = std::make_unique<ScriptedPrimary>(std::move(script));
  ScriptedPrimary* scripted = primary.get();
  if (!server.Serve(std::move(primary)).ok()) Fail("the server refused to serve");
  scripted->WaitForHangUp();
  server.Stop();  // the session persists what its open buffers hold and ends
  return 0;
}
