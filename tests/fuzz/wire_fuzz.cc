// Fuzzes the replication control messages (wire.h) a backup and a primary read from each other:
// Decode must refuse garbage without crashing, and whatever it accepts must be exactly the
// encoding of the message it returns (Encode gives the same bytes back).
#include <string>

#include "fuzz_input.h"
#include "slipstream/replication/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace slipstream::replication;
  using slipstream::fuzz::FuzzFailure;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Message message;
  if (!Decode(bytes, &message).ok()) return 0;
  if (Encode(message) != bytes) {
    const std::string message = "Decode accepted " + std::to_string(size) +
                                " bytes that are not the encoding of their message";
    FuzzFailure("wire", message.c_str());
  }
  if (const auto* hello = std::get_if<Hello>(&message); hello && !IsValidName(hello->primary)) {
    FuzzFailure("wire", "Decode accepted a hello with an invalid primary name");
  }
  return 0;
}
