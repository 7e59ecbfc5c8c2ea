// Fuzzes the replication control messages (wire.h) a backup and a primary read from each other:
// Decode must refuse garbage without crashing, and whatever it accepts must be exactly the
// encoding of the message it returns (Encode gives the same bytes back).
#include <cstdio>
#include <cstdlib>

#include "slipstream/replication/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace slipstream::replication;
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Message message;
  if (!Decode(bytes, &message).ok()) return 0;
  if (Encode(message) != bytes) {
    std::fprintf(stderr,
                 "wire: Decode accepted %zu bytes that are not the encoding of their message\n",
                 size);
    std::abort();
  }
  if (const auto* hello = std::get_if<Hello>(&message); hello && !IsValidName(hello->primary)) {
    std::fprintf(stderr, "wire: Decode accepted a hello with an invalid primary name\n");
    std::abort();
  }
  return 0;
}
