// Status of transport operations. The RDMA layer has its own error domain (remote access
// errors, disconnects, authentication), so it does not share the engine's Status.
#pragma once

#include <string>
#include <string_view>

namespace slipstream::rdma {

class Status {
 public:
  enum class Code {
    kOk = 0,
    kInvalidArgument,  // a bad request from this side (never reached the peer)
    kAuthFailed,       // the peer did not prove it knows the shared secret
    kDisconnected,     // the connection is gone (peer closed, died, or was dropped)
    kRemoteAccess,     // the peer refused an access (bad key, out of bounds, wrong rights)
    kWouldBlock,       // no room now (queue full, no buffer free); retry later
    kTimeout,
    kUnavailable,  // the backend cannot run here (no device, no io_uring, ...)
    kIOError,
  };

  Status() = default;
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string_view m) { return Status(Code::kInvalidArgument, m); }
  static Status AuthFailed(std::string_view m) { return Status(Code::kAuthFailed, m); }
  static Status Disconnected(std::string_view m) { return Status(Code::kDisconnected, m); }
  static Status RemoteAccess(std::string_view m) { return Status(Code::kRemoteAccess, m); }
  static Status WouldBlock(std::string_view m) { return Status(Code::kWouldBlock, m); }
  static Status Timeout(std::string_view m) { return Status(Code::kTimeout, m); }
  static Status Unavailable(std::string_view m) { return Status(Code::kUnavailable, m); }
  static Status IOError(std::string_view m) { return Status(Code::kIOError, m); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  Status(Code code, std::string_view m) : code_(code), message_(m) {}
  Code code_ = Code::kOk;
  std::string message_;
};

}  // namespace slipstream::rdma
