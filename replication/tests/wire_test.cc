// The control messages: every message round-trips, and anything that is not exactly one
// well-formed message is refused (never crashes, never half-parses).
#include "slipstream/replication/wire.h"

#include <gtest/gtest.h>

#include <random>

namespace slipstream::replication {
namespace {

std::vector<Message> Samples() {
  return {Hello{42, 7, "primary-1", 3},
          HelloOk{7, 8u << 20, 4, 0x16000028ull},
          Open{uint32_t(StreamId::kWal), 3, 0x1234567890ull},
          OpenOk{2, 0xdeadbeef000ull, 8u << 20, 0x0123456789abcdefull},
          Close{2, 65536},
          CloseOk{2},
          Flush{1, 4096},
          FlushOk{1, 4096},
          Error{uint32_t(ErrorCode::kStaleVersion), "stale"},
          Join{42, 7, "primary-1"},
          JoinOk{2}};
}

TEST(Wire, EveryMessageRoundTrips) {
  for (const Message& m : Samples()) {
    std::string bytes = Encode(m);
    Message back;
    Status s = Decode(bytes, &back);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(back.index(), m.index());
    EXPECT_EQ(Encode(back), bytes);
  }
}

TEST(Wire, HelloOkCarriesTheResumePosition) {
  Message back;
  ASSERT_TRUE(Decode(Encode(HelloOk{3, 1u << 20, 2, 0x2a0001000ull, 77}), &back).ok());
  const auto* ok = std::get_if<HelloOk>(&back);
  ASSERT_NE(ok, nullptr);
  EXPECT_EQ(ok->version, 3u);
  EXPECT_EQ(ok->buffer_size, 1u << 20);
  EXPECT_EQ(ok->buffers, 2u);
  EXPECT_EQ(ok->resume, 0x2a0001000ull);
  EXPECT_EQ(ok->index_resume, 77u);
}

TEST(Wire, TruncatedExtendedAndForeignBytesAreRefused) {
  for (const Message& m : Samples()) {
    std::string bytes = Encode(m);
    Message out;
    for (size_t n = 0; n < bytes.size(); n++) {
      EXPECT_FALSE(Decode(bytes.substr(0, n), &out).ok()) << "truncated to " << n;
    }
    EXPECT_FALSE(Decode(bytes + "x", &out).ok());
    std::string bad_magic = bytes;
    bad_magic[0] ^= 1;
    EXPECT_FALSE(Decode(bad_magic, &out).ok());
    std::string bad_type = bytes;
    bad_type[4] = 99;
    EXPECT_FALSE(Decode(bad_type, &out).ok());
  }
}

TEST(Wire, BadNamesAndStreamsAreRefused) {
  Message out;
  for (const std::string& name :
       std::vector<std::string>{"", ".", "..", "a/b", "x y", std::string(64, 'a')}) {
    EXPECT_FALSE(Decode(Encode(Hello{1, 1, name}), &out).ok()) << name;
  }
  EXPECT_TRUE(Decode(Encode(Hello{1, 1, std::string(63, 'a')}), &out).ok());
  EXPECT_FALSE(Decode(Encode(Open{0, 1, 0}), &out).ok());
  EXPECT_TRUE(Decode(Encode(Open{4, 1, 0}), &out).ok());  // the index stream
  EXPECT_FALSE(Decode(Encode(Open{5, 1, 0}), &out).ok());
}

// Random bytes and random mutations of real messages: either refused, or a message whose
// encoding is exactly the input.
TEST(Wire, MutationsNeverHalfParse) {
  std::mt19937 rng(7);
  std::vector<Message> samples = Samples();
  for (int i = 0; i < 20000; i++) {
    std::string bytes = Encode(samples[rng() % samples.size()]);
    int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; e++) {
      switch (rng() % 3) {
        case 0:
          bytes[rng() % bytes.size()] ^= char(1 << (rng() % 8));
          break;
        case 1:
          bytes.resize(rng() % (bytes.size() + 1));
          break;
        default:
          bytes.push_back(char(rng()));
          break;
      }
      if (bytes.empty()) bytes.push_back(0);
    }
    Message out;
    if (Decode(bytes, &out).ok()) {
      EXPECT_EQ(Encode(out), bytes);
    }
  }
}

}  // namespace
}  // namespace slipstream::replication
