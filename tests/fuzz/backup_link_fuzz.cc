// Fuzzes the primary's side of replication against a scripted backup: BackupLink reads the
// backup's answers (HELLO's buffers and resume positions, buffers opened, flushes and closes)
// and a StreamShipper acts on them, as a backup holding the secret, or a broken one, could make
// it. The backup is a fake transport connection that answers each request with the next reply
// of the input's script, completes WRITEs at once (or fails them, as the script says), and
// hangs up when the script ends.
//
// Input: an op count n, n ops (each byte mod 4: append a small piece of stream, append a large
// piece, flush, poll), then the script: replies of [flags u8][length u16][bytes], flags bit 0
// "also answer with the next reply" (an extra, unasked-for message), bit 1 "fail the WRITEs
// posted until the next reply".
// Properties: what the link sends is always a well-formed message; a link that connects offers
// buffers a segment fits; the shipper never reports more placed or durable than it appended;
// every WRITE lands inside a buffer the backup handed out, with an id the control port leaves
// to the link; nothing overruns (ASan).
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "control_port.h"
#include "fake_connection.h"
#include "fuzz_input.h"
#include "slipstream/replication/backup_link.h"
#include "slipstream/replication/stream_shipper.h"
#include "slipstream/replication/wire.h"

namespace {

using namespace slipstream;
using namespace slipstream::replication;

// The largest buffer the fuzzer lets the shipper format (a valid size may be up to 1 GB).
constexpr uint32_t kMaxShippedBuffer = 1u << 20;

// Stops the run with a message: a property of the primary's side does not hold.
[[noreturn]] void Fail(const char* what) {
  fuzz::FuzzFailure("backup_link", what);
}

// One reply of the script.
struct Reply {
  uint8_t flags = 0;
  std::string bytes;
};

// The backup as a connection: see the file comment. Single-threaded, like the link.
class ScriptedBackup : public rdma::Connection {
 public:
  explicit ScriptedBackup(std::deque<Reply> script) : script_(std::move(script)) {}

  rdma::Status AllocateRegion(size_t length, uint32_t access, rdma::LocalRegion* region) override {
    regions_.Allocate(length, access, region);
    return rdma::Status::OK();
  }
  rdma::Status RegisterLocal(void* addr, size_t length, rdma::LocalRegion* region) override {
    regions_.Register(addr, length, region);
    return rdma::Status::OK();
  }
  rdma::Status FreeRegion(const rdma::LocalRegion& region) override {
    regions_.Free(region);
    return rdma::Status::OK();
  }
  rdma::RemoteRegion Describe(const rdma::LocalRegion& region) const override {
    return fuzz::HeapRegions::Describe(region);
  }

  rdma::Status Post(const rdma::WorkRequest* requests, size_t count) override {
    if (hung_up_) return rdma::Status::Disconnected("the scripted backup hung up");
    for (size_t i = 0; i < count; i++) {
      const rdma::WorkRequest& wr = requests[i];
      const std::string bytes = fuzz::GatheredBytes(wr);
      if (wr.opcode == rdma::Opcode::kSend) {
        Message request;
        if (!Decode(bytes, &request).ok()) Fail("the link sent a malformed message");
        if (wr.signaled) Complete(wr.wr_id, rdma::Opcode::kSend, rdma::WcStatus::kSuccess, 0);
        Answer();
      } else if (wr.opcode == rdma::Opcode::kWrite) {
        CheckWrite(wr, bytes.size());
        const rdma::WcStatus status =
            fail_writes_ ? rdma::WcStatus::kRemoteAccessError : rdma::WcStatus::kSuccess;
        if (wr.signaled || status != rdma::WcStatus::kSuccess) {
          Complete(wr.wr_id, wr.opcode, status, 0);
        }
      } else {
        Fail("the link posted a request other than SEND or WRITE");
      }
    }
    return rdma::Status::OK();
  }
  rdma::Status PostRecv(const rdma::RecvRequest* requests, size_t count) override {
    for (size_t i = 0; i < count; i++) receives_.push_back(requests[i]);
    return rdma::Status::OK();
  }
  rdma::Status Poll(rdma::Completion* out, size_t max, int timeout_ms, size_t* count) override {
    (void)timeout_ms;  // everything the script does happens at once
    *count = fuzz::PopCompletions(&completions_, out, max);
    if (*count == 0 && hung_up_) return rdma::Status::Disconnected("the scripted backup hung up");
    return rdma::Status::OK();
  }
  rdma::Status state() const override {
    return hung_up_ ? rdma::Status::Disconnected("the scripted backup hung up")
                    : rdma::Status::OK();
  }
  void Disconnect() override { hung_up_ = true; }
  std::string backend() const override { return "scripted"; }
  uint32_t max_sge() const override { return 4; }

 private:
  // Queues a completion.
  void Complete(uint64_t wr_id, rdma::Opcode opcode, rdma::WcStatus status, uint32_t bytes) {
    rdma::Completion c;
    c.wr_id = wr_id;
    c.opcode = opcode;
    c.status = status;
    c.byte_len = bytes;
    completions_.push_back(c);
  }
  // Delivers the script's next reply (and the one after it, when flagged) into posted
  // receives, as a transport does: one that does not fit its receive fails it. Hangs up when
  // the script has ended.
  void Answer() {
    bool more = true;
    while (more) {
      if (script_.empty() || receives_.empty()) {
        hung_up_ = true;
        return;
      }
      Reply reply = std::move(script_.front());
      script_.pop_front();
      more = reply.flags & 1;
      fail_writes_ = reply.flags & 2;
      const rdma::RecvRequest receive = receives_.front();
      receives_.pop_front();
      if (reply.bytes.size() > receive.sge.length) {
        Complete(receive.wr_id, rdma::Opcode::kRecv, rdma::WcStatus::kLocalLengthError, 0);
        continue;
      }
      std::memcpy(const_cast<void*>(receive.sge.addr), reply.bytes.data(), reply.bytes.size());
      Complete(receive.wr_id, rdma::Opcode::kRecv, rdma::WcStatus::kSuccess,
               uint32_t(reply.bytes.size()));
      Message m;
      if (Decode(reply.bytes, &m).ok()) {
        if (const auto* ok = std::get_if<OpenOk>(&m)) opened_.push_back(*ok);
      }
    }
  }
  // A WRITE must land inside a buffer some OPEN answer handed out (its rkey and range), and its
  // id must not be one the link's control port takes for its own.
  void CheckWrite(const rdma::WorkRequest& wr, uint64_t length) const {
    if (wr.wr_id >= ControlPort::kOwnIds) Fail("a WRITE's id is among the control port's own");
    for (const OpenOk& ok : opened_) {
      const uint64_t offset = wr.remote_addr - ok.addr;  // modulo 2^64, as a NIC adds
      if (wr.rkey == ok.rkey && offset <= ok.length && length <= ok.length - offset) return;
    }
    Fail("the link wrote outside every buffer the backup handed out");
  }

  std::deque<Reply> script_;
  std::deque<rdma::RecvRequest> receives_;
  std::deque<rdma::Completion> completions_;
  fuzz::HeapRegions regions_;
  std::vector<OpenOk> opened_;
  bool hung_up_ = false;
  bool fail_writes_ = false;
};

// `n` bytes of stream from position `position` (any bytes do: the backup never reads them).
std::string StreamBytes(uint64_t position, size_t n) {
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; i++) bytes[i] = char((position + i) * 131);
  return bytes;
}

// The shipper's promises hold whatever the backup answered.
void CheckShipper(const StreamShipper& shipper, uint64_t start) {
  if (shipper.Placed(1) > shipper.end() || shipper.Durable(1) > shipper.end() ||
      shipper.Placed(1) < start || shipper.Durable(1) < start) {
    Fail("the shipper reports a position it never appended");
  }
  if (shipper.live() < 0 || shipper.live() > 1) Fail("the shipper counts backups it lacks");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::FuzzInput p(data, size);
  const size_t n = size_t(p.Take(1) % 32);
  std::string ops(p.Bytes(n));
  std::deque<Reply> script;
  while (!p.empty()) {
    Reply reply;
    reply.flags = uint8_t(p.Take(1));
    reply.bytes = std::string(p.Bytes(size_t(p.Take(2))));
    script.push_back(std::move(reply));
  }

  LinkOptions options;
  options.primary = "p1";
  options.version = 3;
  options.rpc_timeout_ms = 10;
  std::unique_ptr<BackupLink> link;
  auto backup = std::make_unique<ScriptedBackup>(std::move(script));
  if (!BackupLink::Connect(options, std::move(backup), &link).ok()) return 0;
  if (!IsValidBufferSize(link->buffer_size())) Fail("the link took buffers no segment fits");
  if (link->buffer_size() > kMaxShippedBuffer) return 0;

  constexpr uint64_t kStart = 5000;
  StreamShipper shipper(uint32_t(StreamId::kWal), 1, kStart, {link.get()});
  for (char op : ops) {
    Status s;
    uint64_t durable = 0;
    switch (uint8_t(op) % 4) {
      case 0:
        s = shipper.Append(shipper.end(), StreamBytes(shipper.end(), 3000));
        break;
      case 1:
        s = shipper.Append(shipper.end(), StreamBytes(shipper.end(), 70000));
        break;
      case 2:
        s = shipper.Flush(1, 10, &durable);
        if (s.ok() && (durable > shipper.end() || durable < kStart)) {
          Fail("a flush reports a durable position never appended");
        }
        break;
      case 3:
        s = shipper.Poll(0);
        break;
    }
    CheckShipper(shipper, kStart);
    if (!s.ok()) break;
  }
  return 0;
}
