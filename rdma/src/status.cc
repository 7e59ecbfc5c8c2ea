// Human-readable rendering of rdma::Status.
#include "slipstream/rdma/status.h"

namespace slipstream::rdma {

namespace {

// The printable name of a status code.
const char* CodeName(Status::Code code) {
  switch (code) {
    case Status::Code::kOk:
      return "OK";
    case Status::Code::kInvalidArgument:
      return "InvalidArgument";
    case Status::Code::kAuthFailed:
      return "AuthFailed";
    case Status::Code::kDisconnected:
      return "Disconnected";
    case Status::Code::kRemoteAccess:
      return "RemoteAccess";
    case Status::Code::kWouldBlock:
      return "WouldBlock";
    case Status::Code::kTimeout:
      return "Timeout";
    case Status::Code::kUnavailable:
      return "Unavailable";
    case Status::Code::kIOError:
      return "IOError";
  }
  return "Unknown";
}

}  // namespace

// "OK", or "<Code>: <message>" (just "<Code>" when there is no message).
std::string Status::ToString() const {
  std::string text = CodeName(code_);
  if (!ok() && !message_.empty()) {
    text += ": ";
    text += message_;
  }
  return text;
}

}  // namespace slipstream::rdma
