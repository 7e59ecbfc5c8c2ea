// Status formatting.
#include "slipstream/engine/status.h"

namespace slipstream::engine {

// Returns "OK" or "<code name>: <message>".
std::string Status::ToString() const {
  const char* name = "OK";
  switch (code_) {
    case Code::kOk:
      return "OK";
    case Code::kNotFound:
      name = "NotFound";
      break;
    case Code::kCorruption:
      name = "Corruption";
      break;
    case Code::kInvalidArgument:
      name = "InvalidArgument";
      break;
    case Code::kIOError:
      name = "IOError";
      break;
    case Code::kBusy:
      name = "Busy";
      break;
  }
  return message_.empty() ? std::string(name) : std::string(name) + ": " + message_;
}

}  // namespace slipstream::engine
