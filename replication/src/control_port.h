// ControlPort: control messages over one transport connection. It owns a few registered
// send and receive slots, keeps receives posted, decodes what arrives (a malformed message
// ends the connection), and hands every other completion (the primary's WRITEs) to its caller.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>

#include "slipstream/rdma/transport.h"
#include "slipstream/replication/wire.h"

namespace slipstream::replication {

class ControlPort {
 public:
  // Work request ids at or above this are the port's own; callers use smaller ones.
  static constexpr uint64_t kOwnIds = 1ull << 62;

  explicit ControlPort(rdma::Connection* connection) : connection_(connection) {}
  ~ControlPort();
  ControlPort(const ControlPort&) = delete;
  ControlPort& operator=(const ControlPort&) = delete;

  // Registers the slots and posts the receives.
  Status Init();

  // Posts a message (waiting, while polling, for a free send slot).
  Status Send(const Message& message, const std::function<void(const rdma::Completion&)>& other);

  // Polls completions for up to timeout_ms (0: only what is there): decoded messages queue up
  // for Next(), other completions go to `other`. A failed connection or a malformed message
  // is an error.
  Status Poll(int timeout_ms, const std::function<void(const rdma::Completion&)>& other);

  // Takes the oldest received message; false if none.
  bool Next(Message* message);

  // Polls until a message arrives or timeout_ms passes (Timeout).
  Status Receive(int timeout_ms, Message* message,
                 const std::function<void(const rdma::Completion&)>& other);

 private:
  static constexpr uint32_t kSendSlots = 8;
  static constexpr uint32_t kRecvSlots = 16;
  static constexpr uint64_t kSendTag = kOwnIds;
  static constexpr uint64_t kRecvTag = kOwnIds | (1ull << 61);

  Status PostRecv(uint32_t slot);

  rdma::Connection* connection_;
  rdma::LocalRegion slots_{};  // kSendSlots send slots, then kRecvSlots receive slots
  bool send_busy_[kSendSlots] = {};
  std::deque<Message> inbox_;
};

}  // namespace slipstream::replication
