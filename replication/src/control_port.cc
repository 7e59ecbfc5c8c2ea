// ControlPort: see control_port.h.
#include "control_port.h"

#include <chrono>
#include <cstring>

namespace slipstream::replication {

ControlPort::~ControlPort() {
  if (slots_.addr != nullptr) connection_->FreeRegion(slots_);
}

Status ControlPort::Init() {
  Status s = connection_->AllocateRegion(size_t(kSendSlots + kRecvSlots) * kMaxMessage,
                                         rdma::kLocalOnly, &slots_);
  for (uint32_t i = 0; s.ok() && i < kRecvSlots; i++) s = PostRecv(i);
  return s;
}

Status ControlPort::PostRecv(uint32_t slot) {
  rdma::RecvRequest r;
  r.wr_id = kRecvTag | slot;
  r.sge =
      rdma::Sge{slots_.addr + size_t(kSendSlots + slot) * kMaxMessage, kMaxMessage, slots_.lkey};
  return connection_->PostRecv(&r, 1);
}

Status ControlPort::Send(const Message& message,
                         const std::function<void(const rdma::Completion&)>& other) {
  std::string bytes = Encode(message);
  if (bytes.size() > kMaxMessage) return Status::InvalidArgument("control message too long");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (true) {
    for (uint32_t i = 0; i < kSendSlots; i++) {
      if (send_busy_[i]) continue;
      char* slot = slots_.addr + size_t(i) * kMaxMessage;
      std::memcpy(slot, bytes.data(), bytes.size());
      rdma::Sge sge{slot, uint32_t(bytes.size()), slots_.lkey};
      rdma::WorkRequest wr;
      wr.wr_id = kSendTag | i;
      wr.opcode = rdma::Opcode::kSend;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      Status s = connection_->Post(&wr, 1);
      if (s.ok()) send_busy_[i] = true;
      return s;
    }
    if (std::chrono::steady_clock::now() > deadline) return Status::Timeout("no free send slot");
    Status s = Poll(10, other);
    if (!s.ok()) return s;
  }
}

Status ControlPort::Poll(int timeout_ms,
                         const std::function<void(const rdma::Completion&)>& other) {
  constexpr size_t kBatch = 32;
  rdma::Completion completions[kBatch];
  // A full batch may leave completions queued that no descriptor announces (see
  // Connection::wait_fd): they are taken now, without waiting again.
  for (int timeout = timeout_ms;; timeout = 0) {
    size_t n = 0;
    Status s = connection_->Poll(completions, kBatch, timeout, &n);
    for (size_t i = 0; i < n; i++) {
      const rdma::Completion& c = completions[i];
      if (c.wr_id < kOwnIds) {
        if (other) other(c);
        continue;
      }
      if (c.status != rdma::WcStatus::kSuccess) {
        return Status::Disconnected("control message failed on the connection");
      }
      if ((c.wr_id & kRecvTag) == kRecvTag) {
        uint32_t slot = uint32_t(c.wr_id & 0xffff);
        if (slot >= kRecvSlots) return Status::InvalidArgument("bad receive completion");
        const char* data = slots_.addr + size_t(kSendSlots + slot) * kMaxMessage;
        Message m;
        Status d = Decode(std::string_view(data, c.byte_len), &m);
        if (!d.ok()) return d;  // a malformed peer: the caller drops it
        inbox_.push_back(std::move(m));
        Status r = PostRecv(slot);
        if (!r.ok()) return r;
      } else {
        uint32_t slot = uint32_t(c.wr_id & 0xffff);
        if (slot < kSendSlots) send_busy_[slot] = false;
      }
    }
    if (!s.ok() || n < kBatch) return s;
  }
}

bool ControlPort::Next(Message* message) {
  if (inbox_.empty()) return false;
  *message = std::move(inbox_.front());
  inbox_.pop_front();
  return true;
}

Status ControlPort::Receive(int timeout_ms, Message* message,
                            const std::function<void(const rdma::Completion&)>& other) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!Next(message)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status::Timeout("no reply from the peer");
    Status s = Poll(int(std::min<int64_t>(left.count(), 50)), other);
    if (!s.ok()) return s;
  }
  return Status::OK();
}

}  // namespace slipstream::replication
