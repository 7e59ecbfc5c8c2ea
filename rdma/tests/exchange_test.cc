// The all-to-all exchange (exchange.h) on the shm and tcp backends: 2, 3 and 5 participants in
// threads of this process, each opening concurrently and sending batches of encoded rows (a
// pointer-mapped layout over its arena, masked to one target's rows) through small channels so
// that WouldBlock happens and is handled by draining; every row arriving exactly once at its
// owner, intact, with counters that agree on both sides. Also: finishing (Close, then leaving
// at once) fails nobody, refused batches send nothing, max_batch_bytes() is exact, a
// participant lost mid-stream fails the others with a status naming it (after what it sent),
// SetSource, strays and participants with a wrong secret or exchange id are not admitted,
// empty streams, and option validation.
#include "slipstream/rdma/exchange.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "exchange_wire.h"
#include "slipstream/rdma/region.h"
#include "slipstream/rdma/schedule.h"
#include "slipstream/rdma/transport.h"

namespace slipstream::rdma {
namespace {

using Clock = std::chrono::steady_clock;
using Code = Status::Code;

constexpr char kSecret[] = "exchange-test-secret";
// The seed of every random choice; a failure names the participant, which reseeds from this.
constexpr uint64_t kSeed = 0x5eed2024e8c4a001ull;
// Setup and any one wait on a peer in the tests that expect success.
constexpr int kExchangeTimeoutMs = 20000;
// How long past an exchange's own timeout a call may take before the test calls it a hang.
constexpr auto kHangSlack = std::chrono::seconds(30);
// Every run of a participant gives up (failing the test) after this long.
constexpr auto kRunLimit = std::chrono::seconds(90);

// Rows: a header (origin, row number, length: 4 bytes each), a random body of 1..280 bytes and
// an 8-byte checksum of everything before it, so 21..300 bytes.
constexpr size_t kRowHeader = 12;
constexpr size_t kRowTrailer = 8;
constexpr size_t kMaxBody = 280;

// splitmix64's finalizer.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a over `length` bytes at `data`.
uint64_t Checksum(const char* data, size_t length) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < length; i++) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

// The participant that owns row `row` of participant `origin` among `n`.
uint32_t OwnerOf(uint32_t origin, uint32_t row, uint32_t n) {
  return static_cast<uint32_t>(Mix((uint64_t{origin} << 32) | row) % n);
}

uint32_t Load32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

uint64_t Load64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Whether `text` names participant `index` (the number, not merely a digit of another one).
bool NamesParticipant(const std::string& text, uint32_t index) {
  return std::regex_search(text, std::regex("(^|[^0-9])" + std::to_string(index) + "([^0-9]|$)"));
}

// A participant's encoded rows: random junk between them, so that bridged gaps carry bytes
// that are not rows.
struct Arena {
  std::string bytes;
  std::vector<Fragment> rows;  // row r is bytes [rows[r].offset, + rows[r].length)
};

Arena BuildArena(uint32_t origin, uint32_t rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  Arena arena;
  for (uint32_t r = 0; r < rows; r++) {
    const uint64_t junk = uniform(0, 24);
    for (uint64_t i = 0; i < junk; i++) arena.bytes.push_back(static_cast<char>(rng()));
    const uint32_t length = static_cast<uint32_t>(kRowHeader + uniform(1, kMaxBody) + kRowTrailer);
    std::string row(length, '\0');
    std::memcpy(row.data(), &origin, 4);
    std::memcpy(row.data() + 4, &r, 4);
    std::memcpy(row.data() + 8, &length, 4);
    for (size_t i = kRowHeader; i < length - kRowTrailer; i++) row[i] = static_cast<char>(rng());
    const uint64_t sum = Checksum(row.data(), length - kRowTrailer);
    std::memcpy(row.data() + length - kRowTrailer, &sum, 8);
    arena.rows.push_back({arena.bytes.size(), length});
    arena.bytes += row;
  }
  for (int i = 0; i < 16; i++) arena.bytes.push_back(static_cast<char>(rng()));
  return arena;
}

// The bytes a batch takes in a message as exchange.h counts them: the encoded layout and the
// wire image planned for `costs`.
uint64_t BatchBytes(const RegionLayout& layout, const TransferCosts& costs) {
  std::string encoded;
  layout.EncodeTo(&encoded);
  return encoded.size() + PlanSchedule(layout, costs).wire_bytes;
}

// One batch for one target.
struct Batch {
  uint32_t target = 0;
  RegionLayout layout;
};

// Plans the batches of arena rows [begin, end) for every participant but `self`: one layout
// over the rows' items (in shuffled order when `shuffle`), masked to each target's rows. When
// a target's batch comes out larger than `limit` bytes the range is split in two.
void PlanChunk(const Arena& arena, uint32_t self, uint32_t n, size_t begin, size_t end,
               bool shuffle, uint64_t limit, const TransferCosts& costs, std::mt19937_64* rng,
               std::vector<Batch>* out, std::string* error) {
  std::vector<uint32_t> order(end - begin);
  std::iota(order.begin(), order.end(), static_cast<uint32_t>(begin));
  if (shuffle) std::shuffle(order.begin(), order.end(), *rng);
  std::vector<Fragment> items;
  std::vector<uint32_t> owner;
  for (uint32_t r : order) {
    items.push_back(arena.rows[r]);
    owner.push_back(OwnerOf(self, r, n));
  }
  RegionLayout whole;
  Status s = RegionLayout::PointerMapped(items, &whole);
  if (!s.ok()) {
    *error = "PointerMapped: " + s.ToString();
    return;
  }
  std::vector<RowMask> masks = MasksByOwner(owner, n);
  std::vector<Batch> planned;
  for (uint32_t t = 0; t < n; t++) {
    if (t == self || masks[t].Count() == 0) continue;
    Batch batch;
    batch.target = t;
    s = whole.WithMask(masks[t], &batch.layout);
    if (!s.ok()) {
      *error = "WithMask: " + s.ToString();
      return;
    }
    if (BatchBytes(batch.layout, costs) > limit) {
      if (end - begin < 2) {
        *error = "a single row does not fit a batch";
        return;
      }
      const size_t middle = begin + (end - begin) / 2;
      PlanChunk(arena, self, n, begin, middle, shuffle, limit, costs, rng, out, error);
      PlanChunk(arena, self, n, middle, end, shuffle, limit, costs, rng, out, error);
      return;
    }
    planned.push_back(std::move(batch));
  }
  for (Batch& batch : planned) out->push_back(std::move(batch));
}

// Every batch of `arena` for the other participants: consecutive rows spanning at most
// `limit` bytes of the arena per chunk, every other chunk with its items shuffled.
std::vector<Batch> PlanBatches(const Arena& arena, uint32_t self, uint32_t n, uint64_t limit,
                               const TransferCosts& costs, uint64_t seed, std::string* error) {
  std::mt19937_64 rng(seed);
  std::vector<Batch> batches;
  size_t begin = 0;
  bool shuffle = false;
  while (begin < arena.rows.size() && error->empty()) {
    size_t end = begin + 1;
    while (end < arena.rows.size() &&
           arena.rows[end].offset + arena.rows[end].length - arena.rows[begin].offset <= limit) {
      end++;
    }
    PlanChunk(arena, self, n, begin, end, shuffle, limit, costs, &rng, &batches, error);
    shuffle = !shuffle;
    begin = end;
  }
  return batches;
}

// What one participant sent and received, checked as it arrives.
class Tally {
 public:
  Tally(uint32_t self, uint32_t n, const std::vector<uint32_t>& rows_per_origin)
      : got(n),
        batches_from(n, 0),
        payload_from(n, 0),
        ends_from(n, 0),
        batches_to(n, 0),
        payload_to(n, 0),
        self_(self),
        n_(n),
        rows_per_origin_(rows_per_origin) {
    for (uint32_t o = 0; o < n; o++) got[o].assign(rows_per_origin[o], 0);
  }

  // Records a problem (the first one is kept, all are counted).
  void Fail(const std::string& what) {
    if (error.empty()) error = "participant " + std::to_string(self_) + ": " + what;
    errors++;
  }

  // Checks one received message and counts its rows.
  void Take(const ExchangeMessage& message) {
    const uint32_t from = message.from;
    if (from >= n_ || from == self_) return Fail("a message from " + std::to_string(from));
    if (ends_from[from] > 0) {
      return Fail("a message from " + std::to_string(from) + " after its end");
    }
    if (message.end) {
      ends_from[from]++;
      return;
    }
    batches_from[from]++;
    payload_from[from] += message.layout.payload_bytes();
    if (message.wire_offset > message.data.size()) return Fail("wire_offset past the message");
    const std::string_view wire(message.data.data() + message.wire_offset,
                                message.data.size() - message.wire_offset);
    LandingCursor cursor(message.layout, message.options);
    Fragment landed;
    uint64_t rows = 0;
    while (cursor.Next(&landed)) {
      rows++;
      if (landed.offset > wire.size() || landed.length > wire.size() - landed.offset) {
        return Fail("a row lands past the wire image");
      }
      CheckRow(wire.substr(landed.offset, landed.length), from);
    }
    if (rows != message.layout.selected_rows()) Fail("fewer rows than the layout selects");
  }

  // Counts this participant's own rows, which stay local.
  void KeepLocal(const Arena& arena) {
    for (uint32_t r = 0; r < arena.rows.size(); r++) {
      if (OwnerOf(self_, r, n_) == self_) got[self_][r]++;
    }
  }

  std::string error;
  uint64_t errors = 0;
  std::vector<std::vector<uint32_t>> got;  // [origin][row]: arrivals here
  std::vector<uint64_t> batches_from, payload_from, ends_from;
  std::vector<uint64_t> batches_to, payload_to;
  uint64_t would_blocks = 0;
  std::string phase;  // what the participant was doing (for failure messages)

 private:
  // One received row: intact, from the participant that sent it, and owned here.
  void CheckRow(std::string_view row, uint32_t from) {
    if (row.size() < kRowHeader + kRowTrailer) return Fail("a row too short");
    const uint32_t origin = Load32(row.data()), number = Load32(row.data() + 4);
    const uint32_t length = Load32(row.data() + 8);
    if (length != row.size()) return Fail("a row of the wrong length");
    if (Load64(row.data() + length - kRowTrailer) != Checksum(row.data(), length - kRowTrailer)) {
      return Fail("a row with a bad checksum");
    }
    if (origin != from) {
      return Fail("a row of " + std::to_string(origin) + " from " + std::to_string(from));
    }
    if (number >= rows_per_origin_[origin]) return Fail("a row number out of range");
    if (OwnerOf(origin, number, n_) != self_) return Fail("a row owned by another participant");
    got[origin][number]++;
  }

  uint32_t self_;
  uint32_t n_;
  std::vector<uint32_t> rows_per_origin_;
};

// Receives what already arrived without waiting; when nothing had, waits up to `wait_ms` for
// one message. Timeout is not a failure here.
Status Drain(Exchange* exchange, int wait_ms, Tally* tally) {
  bool any = false;
  for (;;) {
    ExchangeMessage message;
    Status s = exchange->Receive(&message, 0);
    if (s.code() == Code::kTimeout) break;
    if (!s.ok()) return s;
    tally->Take(message);
    any = true;
  }
  if (any) return Status::OK();
  ExchangeMessage message;
  Status s = exchange->Receive(&message, wait_ms);
  if (s.code() == Code::kTimeout) return Status::OK();
  if (!s.ok()) return s;
  tally->Take(message);
  return Status::OK();
}

// Calls `attempt` until it returns anything but WouldBlock, draining between attempts.
template <typename Attempt>
Status UntilSent(Exchange* exchange, Tally* tally, Clock::time_point deadline, Attempt attempt) {
  for (;;) {
    Status s = attempt();
    if (s.code() != Code::kWouldBlock) return s;
    tally->would_blocks++;
    if (Clock::now() > deadline) {
      tally->Fail("still WouldBlock at the test's deadline");
      return Status::Timeout("test deadline");
    }
    s = Drain(exchange, 2, tally);
    if (!s.ok()) return s;
  }
}

// A participant's whole stream: every batch (the WouldBlock dance), the end to every peer,
// receiving until AllEnded, then Close. Returns the first failed call (OK when none failed); the
// test's own findings go to the tally.
Status RunStream(Exchange* exchange, const std::vector<Batch>& batches, const TransferCosts& costs,
                 int receive_wait_ms, Clock::time_point deadline, Tally* tally) {
  tally->phase = "sending batches (TrySend, or Receive on WouldBlock)";
  for (const Batch& batch : batches) {
    Status s = UntilSent(exchange, tally, deadline,
                         [&] { return exchange->TrySend(batch.target, batch.layout, costs); });
    if (!s.ok()) return s;
    tally->batches_to[batch.target]++;
    tally->payload_to[batch.target] += batch.layout.payload_bytes();
  }
  tally->phase = "ending streams (TryEnd, or Receive on WouldBlock)";
  for (uint32_t t = 0; t < exchange->participants(); t++) {
    if (t == exchange->self()) continue;
    Status s = UntilSent(exchange, tally, deadline, [&] { return exchange->TryEnd(t); });
    if (!s.ok()) return s;
  }
  tally->phase = "receiving until AllEnded";
  while (!exchange->AllEnded()) {
    if (Clock::now() > deadline) {
      tally->Fail("not AllEnded at the test's deadline");
      return Status::Timeout("test deadline");
    }
    ExchangeMessage message;
    Status s = exchange->Receive(&message, receive_wait_ms);
    if (s.code() == Code::kTimeout) continue;
    if (!s.ok()) return s;
    tally->Take(message);
  }
  ExchangeMessage extra;
  if (exchange->Receive(&extra, 0).ok()) tally->Fail("a message after AllEnded");
  tally->phase = "Close";
  return exchange->Close(kExchangeTimeoutMs);
}

// Small channels: 16 KiB Receive Buffers, so batches are a few KiB and WouldBlock is common.
ChannelOptions SmallChannel(uint32_t receive_buffers, uint32_t send_buffer_size = 64 << 10,
                            uint32_t packages_in_flight = 2) {
  ChannelOptions channel;
  channel.receive_buffers = receive_buffers;
  channel.receive_buffer_size = 16 << 10;
  channel.send_buffer_size = send_buffer_size;
  channel.packages_in_flight = packages_in_flight;
  return channel;
}

// Transport options for `backend` with `secret`.
TransportOptions TransportFor(const std::string& backend, const std::string& secret = kSecret) {
  TransportOptions transport;
  transport.backend = backend;
  transport.secret = secret;
  transport.connect_timeout_ms = 5000;
  return transport;
}

// Listeners for a group of participants (one per entry of `transports`), and the exchange
// options of each: same channel, exchange id 7, every address.
struct Group {
  std::vector<std::unique_ptr<Listener>> listeners;
  std::vector<ExchangeOptions> options;
};

Group MakeGroup(const std::vector<TransportOptions>& transports, const ChannelOptions& channel,
                int timeout_ms) {
  Group group;
  std::vector<std::string> addresses;
  for (const TransportOptions& transport : transports) {
    std::unique_ptr<Listener> listener;
    Status s = Listen(transport, "127.0.0.1:0", &listener);
    EXPECT_TRUE(s.ok()) << transport.backend << ": " << s.ToString();
    if (!s.ok()) return Group{};
    addresses.push_back(listener->address());
    group.listeners.push_back(std::move(listener));
  }
  for (uint32_t i = 0; i < transports.size(); i++) {
    ExchangeOptions options;
    options.transport = transports[i];
    options.channel = channel;
    options.exchange_id = 7;
    options.self = i;
    options.addresses = addresses;
    options.timeout_ms = timeout_ms;
    group.options.push_back(options);
  }
  return group;
}

Group MakeGroup(const std::string& backend, uint32_t n, const ChannelOptions& channel,
                int timeout_ms) {
  return MakeGroup(std::vector<TransportOptions>(n, TransportFor(backend)), channel, timeout_ms);
}

// Opens every participant of `group` at once, each in its own thread; returns each Open's
// status and how long it took.
struct Opened {
  std::vector<Status> status;
  std::vector<std::unique_ptr<Exchange>> exchanges;
  std::vector<Clock::duration> took;
};

Opened OpenAll(Group* group) {
  const size_t n = group->options.size();
  Opened opened;
  opened.status.resize(n);
  opened.exchanges.resize(n);
  opened.took.resize(n);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; i++) {
    threads.emplace_back([&, i] {
      const Clock::time_point start = Clock::now();
      opened.status[i] =
          Exchange::Open(group->options[i], group->listeners[i].get(), &opened.exchanges[i]);
      opened.took[i] = Clock::now() - start;
    });
  }
  for (std::thread& t : threads) t.join();
  return opened;
}

class ExchangeTest : public ::testing::TestWithParam<std::string> {
 protected:
  // N participants, each in its own thread, open concurrently and exchange every row of their
  // arenas; checks every row, the counters on both sides, and that WouldBlock happened. With
  // `destroy_when_done` each participant destroys its exchange as soon as AllEnded.
  void AllToAll(uint32_t n, const ChannelOptions& channel, uint32_t rows, bool destroy_when_done);
};

void ExchangeTest::AllToAll(uint32_t n, const ChannelOptions& channel, uint32_t rows,
                            bool destroy_when_done) {
  const std::string backend = GetParam();
  const TransferCosts costs = TransferCosts::Measured(backend);
  Group group = MakeGroup(backend, n, channel, kExchangeTimeoutMs);
  ASSERT_EQ(group.listeners.size(), n);

  std::vector<Arena> arenas;
  std::vector<uint32_t> rows_per_origin;
  for (uint32_t i = 0; i < n; i++) {
    const uint32_t count = rows + 97 * i;  // different sizes, so streams end at different times
    arenas.push_back(BuildArena(i, count, Mix(kSeed ^ (uint64_t{n} << 40) ^ i)));
    rows_per_origin.push_back(count);
  }
  std::vector<Tally> tallies;
  for (uint32_t i = 0; i < n; i++) tallies.emplace_back(i, n, rows_per_origin);
  std::vector<std::unique_ptr<Exchange>> exchanges(n);
  std::vector<Status> opened(n), ran(n);
  std::vector<size_t> batch_counts(n, 0);
  std::vector<uint64_t> max_batch(n, 0);

  const Clock::time_point deadline = Clock::now() + kRunLimit;
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < n; i++) {
    threads.emplace_back([&, i] {
      Tally& tally = tallies[i];
      opened[i] = Exchange::Open(group.options[i], group.listeners[i].get(), &exchanges[i]);
      if (!opened[i].ok()) return;
      Exchange* exchange = exchanges[i].get();
      if (exchange->participants() != n || exchange->self() != i) {
        tally.Fail("participants() or self() wrong");
      }
      for (uint32_t j = 0; j < n; j++) {
        if (j != i && exchange->backend(j) != backend) {
          tally.Fail("backend(" + std::to_string(j) + ") is " + exchange->backend(j));
        }
      }
      max_batch[i] = exchange->max_batch_bytes();
      // A batch is one package: it fits a Receive Buffer and a Send Buffer part.
      const uint64_t part =
          channel.send_buffer_size / (channel.sender_threads * channel.packages_in_flight);
      if (max_batch[i] < 1024 ||
          max_batch[i] > std::min<uint64_t>(channel.receive_buffer_size, part)) {
        tally.Fail("max_batch_bytes() is " + std::to_string(max_batch[i]));
        return;
      }
      std::string error;
      std::vector<Batch> batches =
          PlanBatches(arenas[i], i, n, max_batch[i] / 2, costs, Mix(kSeed ^ 0xba7c4 ^ i), &error);
      if (!error.empty()) return tally.Fail(error);
      batch_counts[i] = batches.size();
      tally.KeepLocal(arenas[i]);
      ran[i] = exchange->SetSource(arenas[i].bytes.data(), arenas[i].bytes.size());
      if (!ran[i].ok()) return;
      ran[i] = RunStream(exchange, batches, costs, 1000, deadline, &tally);
      if (destroy_when_done) exchanges[i].reset();
    });
  }
  for (std::thread& t : threads) t.join();

  for (uint32_t i = 0; i < n; i++) {
    EXPECT_TRUE(opened[i].ok()) << backend << " participant " << i << ": " << opened[i].ToString();
    EXPECT_TRUE(ran[i].ok()) << backend << " participant " << i << " " << tallies[i].phase << ": "
                             << ran[i].ToString();
    EXPECT_EQ(tallies[i].error, "") << backend << " (" << tallies[i].errors << " problems)";
  }
  ASSERT_FALSE(HasFailure());

  // Every row exactly once, at its owner (and, by Tally::CheckRow, nowhere else).
  uint64_t missing = 0, duplicated = 0, moved = 0;
  std::string example;
  for (uint32_t o = 0; o < n; o++) {
    for (uint32_t r = 0; r < rows_per_origin[o]; r++) {
      const uint32_t owner = OwnerOf(o, r, n);
      const uint32_t count = tallies[owner].got[o][r];
      if (count != 1 && example.empty()) {
        example = "row " + std::to_string(r) + " of " + std::to_string(o) + " arrived " +
                  std::to_string(count) + " times at " + std::to_string(owner);
      }
      missing += count == 0;
      duplicated += count > 1;
      moved += owner != o;
    }
  }
  EXPECT_EQ(missing, 0u) << backend << ": " << example;
  EXPECT_EQ(duplicated, 0u) << backend << ": " << example;
  EXPECT_GT(moved, 0u);

  uint64_t would_blocks = 0, batches = 0;
  for (uint32_t i = 0; i < n; i++) {
    would_blocks += tallies[i].would_blocks;
    batches += batch_counts[i];
    for (uint32_t j = 0; j < n; j++) {
      if (j != i) {
        EXPECT_EQ(tallies[i].ends_from[j], 1u) << "end of " << j << " at " << i;
      }
    }
  }
  // Every pair sends more batches than a peer has buffers, and a participant drains only when
  // a send would block or once it has sent everything: some send must have blocked.
  EXPECT_GT(would_blocks, 0u) << backend;
  EXPECT_GT(batches, uint64_t{n} * (n - 1) * channel.receive_buffers * 2) << backend;

  if (destroy_when_done) return;
  for (uint32_t i = 0; i < n; i++) {
    for (uint32_t j = 0; j < n; j++) {
      if (i == j) continue;
      const ExchangeCounters sent = exchanges[i]->counters(j);
      const ExchangeCounters received = exchanges[j]->counters(i);
      const std::string pair = backend + " " + std::to_string(i) + " -> " + std::to_string(j);
      EXPECT_EQ(sent.batches_sent, tallies[i].batches_to[j]) << pair;
      EXPECT_EQ(sent.payload_bytes_sent, tallies[i].payload_to[j]) << pair;
      EXPECT_EQ(received.batches_received, tallies[j].batches_from[i]) << pair;
      EXPECT_EQ(received.payload_bytes_received, tallies[j].payload_from[i]) << pair;
      EXPECT_EQ(received.batches_received, sent.batches_sent) << pair;
      EXPECT_EQ(received.payload_bytes_received, sent.payload_bytes_sent) << pair;
      EXPECT_EQ(received.wire_bytes_received, sent.wire_bytes_sent) << pair;
      EXPECT_GE(sent.wire_bytes_sent, sent.payload_bytes_sent) << pair;
      EXPECT_GT(sent.batches_sent, 0u) << pair;
    }
  }
  // The exchanges go before the arenas they registered.
  exchanges.clear();
}

// Two participants exchange every row exactly once, intact, at its owner, through WouldBlock,
// and their counters agree.
TEST_P(ExchangeTest, TwoParticipantsDeliverEveryRowOnce) {
  AllToAll(2, SmallChannel(3), 4000, false);
}

// Three participants exchange every row exactly once, intact, at its owner, through
// WouldBlock, and every pair's counters agree; Send Buffer parts (8 KiB) smaller than the
// Receive Buffers bound the batches here.
TEST_P(ExchangeTest, ThreeParticipantsDeliverEveryRowOnce) {
  AllToAll(3, SmallChannel(3, 32 << 10, 4), 3000, false);
}

// Five participants with two Receive Buffers per channel exchange every row exactly once,
// intact, at its owner, through WouldBlock, and every pair's counters agree.
TEST_P(ExchangeTest, FiveParticipantsDeliverEveryRowOnce) {
  AllToAll(5, SmallChannel(2), 2000, false);
}

// Participants that Close and destroy their exchange at once fail nobody: the others still
// receive their rows and their ends, and their own Close succeeds.
TEST_P(ExchangeTest, DestroyingAfterTheEndFailsNobody) {
  AllToAll(3, SmallChannel(2), 1500, true);
}

// Two participants opened concurrently, for tests that drive one exchange from the test's
// thread; empty (with a failed expectation) when Open failed.
std::vector<std::unique_ptr<Exchange>> OpenPair(const std::string& backend) {
  Group group = MakeGroup(backend, 2, SmallChannel(2), kExchangeTimeoutMs);
  if (group.listeners.size() != 2) return {};
  Opened opened = OpenAll(&group);
  for (uint32_t i = 0; i < 2; i++) {
    EXPECT_TRUE(opened.status[i].ok())
        << backend << " " << i << ": " << opened.status[i].ToString();
    if (!opened.status[i].ok()) return {};
  }
  return std::move(opened.exchanges);
}

// A pointer-mapped layout of one item.
RegionLayout OneItem(uint64_t offset, uint64_t length) {
  RegionLayout layout;
  Status s = RegionLayout::PointerMapped({{offset, length}}, &layout);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return layout;
}

// `length` random bytes.
std::string RandomSource(size_t length, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string source(length, '\0');
  for (char& c : source) c = static_cast<char>(rng());
  return source;
}

// Receives the next message of `exchange` and checks that it is a batch from `from` carrying
// `payload`.
void ExpectBatch(Exchange* exchange, uint32_t from, const std::string& payload) {
  ExchangeMessage message;
  Status s = exchange->Receive(&message, kExchangeTimeoutMs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(message.from, from);
  ASSERT_FALSE(message.end) << "an end instead of the batch";
  ASSERT_LE(message.wire_offset, message.data.size());
  std::string got;
  s = Unpack(message.layout, message.options,
             std::string_view(message.data).substr(message.wire_offset), &got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(got == payload) << "the batch's bytes differ";
}

// The documented way to finish, repeated: a participant that ends its streams, receives until
// AllEnded, Closes and destroys its exchange at once fails nobody; its peer (ending before or
// after receiving the other's end) still gets the end and a successful Close. Closing before
// the ends is refused.
TEST_P(ExchangeTest, LeavingRightAfterTheEndFailsNobody) {
  constexpr int kRounds = 200;
  int failures = 0;
  std::string first;
  for (int round = 0; round < kRounds && !HasFatalFailure(); round++) {
    std::vector<std::unique_ptr<Exchange>> exchanges = OpenPair(GetParam());
    ASSERT_EQ(exchanges.size(), 2u);
    Status leaver;
    if (round == 0) {
      EXPECT_EQ(exchanges[1]->Close(kExchangeTimeoutMs).code(), Code::kInvalidArgument);
    }
    std::thread leaving([&] {
      leaver = exchanges[0]->TryEnd(1);
      ExchangeMessage message;
      while (leaver.ok() && !exchanges[0]->AllEnded()) {
        leaver = exchanges[0]->Receive(&message, kExchangeTimeoutMs);
      }
      if (leaver.ok()) leaver = exchanges[0]->Close(kExchangeTimeoutMs);
      exchanges[0].reset();
    });
    const bool flush_first = round % 2 == 0;
    Status s = flush_first ? exchanges[1]->TryEnd(0) : Status::OK();
    ExchangeMessage message;
    while (s.ok() && !exchanges[1]->AllEnded()) {
      s = exchanges[1]->Receive(&message, kExchangeTimeoutMs);
    }
    if (s.ok() && !flush_first) s = exchanges[1]->TryEnd(0);
    if (s.ok()) s = exchanges[1]->Close(kExchangeTimeoutMs);
    leaving.join();
    const Status* statuses[2] = {&leaver, &s};
    for (int i = 0; i < 2; i++) {
      if (statuses[i]->ok()) continue;
      if (failures++ == 0) {
        first = "round " + std::to_string(round) +
                (flush_first ? " (end, then receive)" : " (receive, then end)") + ": participant " +
                std::to_string(i) + ": " + statuses[i]->ToString();
      }
    }
  }
  EXPECT_EQ(failures, 0) << GetParam() << ", of " << kRounds << " rounds; the first: " << first;
}

// Refused batches send nothing: one larger than max_batch_bytes() (one long item, or many
// short ones), a target that is self or out of range, a layout leaving the source (or sent
// before any source) are InvalidArgument, and the peer's first message afterwards is the one
// good batch that followed them.
TEST_P(ExchangeTest, RefusedBatchesSendNothing) {
  const std::string backend = GetParam();
  const TransferCosts costs = TransferCosts::Measured(backend);
  std::string source;  // outlives the exchanges that register it
  std::vector<std::unique_ptr<Exchange>> exchanges = OpenPair(backend);
  ASSERT_EQ(exchanges.size(), 2u);
  Exchange* sender = exchanges[0].get();
  Exchange* receiver = exchanges[1].get();
  const uint64_t max = sender->max_batch_bytes();
  ASSERT_GT(max, 1024u);
  source = RandomSource(4 * max, Mix(kSeed ^ 0x2ef05ed));

  const RegionLayout good = OneItem(16, max / 2);
  const RegionLayout too_long = OneItem(16, max + 1);
  ASSERT_GT(BatchBytes(too_long, costs), max);
  RegionLayout too_many;  // over the limit by many short items
  {
    std::vector<Fragment> items;
    for (uint64_t at = 0; at + 40 <= source.size(); at += 64) items.push_back({at, 40});
    ASSERT_TRUE(RegionLayout::PointerMapped(items, &too_many).ok());
    ASSERT_GT(BatchBytes(too_many, costs), max);
  }

  // Before any source: every layout leaves the (empty) source.
  EXPECT_EQ(sender->TrySend(1, good, costs).code(), Code::kInvalidArgument);
  ASSERT_TRUE(sender->SetSource(source.data(), source.size()).ok());
  EXPECT_EQ(sender->TrySend(1, too_long, costs).code(), Code::kInvalidArgument);
  EXPECT_EQ(sender->TrySend(1, too_many, costs).code(), Code::kInvalidArgument);
  EXPECT_EQ(sender->TrySend(0, good, costs).code(), Code::kInvalidArgument);  // self
  EXPECT_EQ(sender->TrySend(2, good, costs).code(), Code::kInvalidArgument);
  EXPECT_EQ(sender->TrySend(UINT32_MAX, good, costs).code(), Code::kInvalidArgument);
  EXPECT_EQ(sender->TryEnd(0).code(), Code::kInvalidArgument);
  EXPECT_EQ(sender->TryEnd(2).code(), Code::kInvalidArgument);
  EXPECT_EQ(sender->TrySend(1, OneItem(source.size() - 10, 20), costs).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(sender->TrySend(1, OneItem(source.size() + 4096, 8), costs).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(sender->counters(1).batches_sent, 0u);
  EXPECT_EQ(sender->counters(1).payload_bytes_sent, 0u);
  ExchangeMessage message;
  EXPECT_EQ(receiver->Receive(&message, 100).code(), Code::kTimeout);

  // Then one good batch and the end: they arrive in order, so the first message shows that
  // nothing went out before it.
  Status s = sender->TrySend(1, good, costs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(sender->TryEnd(1).ok());
  // After the end, the stream to that peer takes nothing more.
  EXPECT_FALSE(sender->TrySend(1, good, costs).ok());
  ExpectBatch(receiver, 0, source.substr(16, max / 2));
  s = receiver->Receive(&message, kExchangeTimeoutMs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(message.end);
  EXPECT_TRUE(receiver->AllEnded());
  EXPECT_EQ(receiver->Receive(&message, 0).code(), Code::kTimeout);
  EXPECT_EQ(receiver->counters(0).batches_received, 1u);
  EXPECT_EQ(receiver->counters(0).payload_bytes_received, max / 2);
  EXPECT_EQ(sender->counters(1).batches_sent, 1u);

  // The other direction is unaffected.
  ASSERT_TRUE(receiver->TryEnd(0).ok());
  s = sender->Receive(&message, kExchangeTimeoutMs);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(message.end);
  EXPECT_TRUE(sender->AllEnded());
}

// max_batch_bytes() is exact, as exchange.h defines it (encoded layout and wire image
// together): a batch of exactly that many bytes is sent and arrives intact, one byte more is
// InvalidArgument.
TEST_P(ExchangeTest, BatchOfMaxBatchBytesIsSent) {
  const std::string backend = GetParam();
  const TransferCosts costs = TransferCosts::Measured(backend);
  std::string source;  // outlives the exchanges that register it
  std::vector<std::unique_ptr<Exchange>> exchanges = OpenPair(backend);
  ASSERT_EQ(exchanges.size(), 2u);
  Exchange* sender = exchanges[0].get();
  const uint64_t max = sender->max_batch_bytes();
  ASSERT_GT(max, 1024u);
  source = RandomSource(2 * max, Mix(kSeed ^ 0xb0dede));
  ASSERT_TRUE(sender->SetSource(source.data(), source.size()).ok());
  // The longest single item whose batch is at most max bytes (exactly max, for these sizes).
  uint64_t fits = max;
  while (fits > 0 && BatchBytes(OneItem(16, fits), costs) > max) fits--;
  ASSERT_GT(fits, 0u);
  EXPECT_EQ(BatchBytes(OneItem(16, fits), costs), max);
  EXPECT_EQ(sender->TrySend(1, OneItem(16, fits + 1), costs).code(), Code::kInvalidArgument);
  Status s = sender->TrySend(1, OneItem(16, fits), costs);
  ASSERT_TRUE(s.ok()) << "a batch of " << BatchBytes(OneItem(16, fits), costs)
                      << " bytes, max_batch_bytes() " << max << ": " << s.ToString();
  ExpectBatch(exchanges[1].get(), 0, source.substr(16, fits));
}

// A participant that destroys its exchange in the middle of its stream makes every other
// participant's calls fail with a status (neither OK nor Timeout) naming it, and none hangs.
TEST_P(ExchangeTest, LostParticipantFailsTheOthers) {
  constexpr uint32_t kN = 3, kLost = 1;
  constexpr int kTimeoutMs = 5000;
  const std::string backend = GetParam();
  const TransferCosts costs = TransferCosts::Measured(backend);
  Group group = MakeGroup(backend, kN, SmallChannel(2), kTimeoutMs);
  ASSERT_EQ(group.listeners.size(), kN);
  std::vector<Arena> arenas;
  std::vector<uint32_t> rows_per_origin;
  for (uint32_t i = 0; i < kN; i++) {
    arenas.push_back(BuildArena(i, 600, Mix(kSeed ^ 0x105700 ^ i)));
    rows_per_origin.push_back(600);
  }
  std::vector<Tally> tallies;
  for (uint32_t i = 0; i < kN; i++) tallies.emplace_back(i, kN, rows_per_origin);
  std::vector<std::unique_ptr<Exchange>> exchanges(kN);
  std::vector<Status> opened(kN), failed(kN);
  std::vector<Clock::duration> took(kN);
  std::vector<uint32_t> lost_sent(kN, 0);

  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < kN; i++) {
    threads.emplace_back([&, i] {
      Tally& tally = tallies[i];
      opened[i] = Exchange::Open(group.options[i], group.listeners[i].get(), &exchanges[i]);
      if (!opened[i].ok()) return;
      Exchange* exchange = exchanges[i].get();
      std::string error;
      std::vector<Batch> batches = PlanBatches(arenas[i], i, kN, exchange->max_batch_bytes() / 2,
                                               costs, Mix(kSeed ^ 0x1057 ^ i), &error);
      if (!error.empty()) return tally.Fail(error);
      if (!exchange->SetSource(arenas[i].bytes.data(), arenas[i].bytes.size()).ok()) {
        return tally.Fail("SetSource failed");
      }
      if (i == kLost) {
        // A few batches to each peer, never an end, then gone.
        for (size_t b = 0; b < batches.size() && b < 4; b++) {
          if (exchange->TrySend(batches[b].target, batches[b].layout, costs).ok()) {
            lost_sent[batches[b].target]++;
          }
        }
        exchanges[i].reset();
        return;
      }
      const Clock::time_point start = Clock::now();
      failed[i] = RunStream(exchange, batches, costs, kTimeoutMs, start + kRunLimit, &tally);
      took[i] = Clock::now() - start;
    });
  }
  for (std::thread& t : threads) t.join();

  for (uint32_t i = 0; i < kN; i++) {
    ASSERT_TRUE(opened[i].ok()) << backend << " participant " << i << ": " << opened[i].ToString();
    if (i == kLost) continue;
    const Status& s = failed[i];
    EXPECT_FALSE(s.ok()) << backend << " participant " << i << " finished without " << kLost;
    EXPECT_NE(s.code(), Code::kTimeout) << backend << " participant " << i << ": " << s.ToString();
    EXPECT_NE(s.code(), Code::kWouldBlock) << s.ToString();
    EXPECT_TRUE(NamesParticipant(s.message(), kLost))
        << backend << " participant " << i << ": " << s.ToString();
    EXPECT_LT(took[i], std::chrono::milliseconds(kTimeoutMs) + kHangSlack)
        << backend << " participant " << i;
    EXPECT_EQ(tallies[i].error, "") << backend;
    EXPECT_EQ(tallies[i].ends_from[kLost], 0u);
    EXPECT_LE(tallies[i].batches_from[kLost], lost_sent[i]);
  }
  exchanges.clear();
}

// Batches a participant sent (TrySend returned OK) before it destroyed its exchange still
// arrive, intact and in order; only then does Receive fail, naming it, and then so does
// TrySend to it.
TEST_P(ExchangeTest, BatchesSentBeforeALossArriveFirst) {
  const std::string backend = GetParam();
  const TransferCosts costs = TransferCosts::Measured(backend);
  std::string source;  // outlives the exchanges that register it
  std::vector<std::unique_ptr<Exchange>> exchanges = OpenPair(backend);
  ASSERT_EQ(exchanges.size(), 2u);
  const uint64_t max = exchanges[1]->max_batch_bytes();
  source = RandomSource(4 * max, Mix(kSeed ^ 0x1055));
  ASSERT_TRUE(exchanges[1]->SetSource(source.data(), source.size()).ok());
  ASSERT_TRUE(exchanges[0]->SetSource(source.data(), source.size()).ok());
  // As many batches as participant 0 has Receive Buffers, so none would block.
  const uint64_t sizes[2] = {max / 2, max / 3};
  for (uint64_t size : sizes) {
    Status s = exchanges[1]->TrySend(0, OneItem(size, size), costs);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  exchanges[1].reset();
  for (uint64_t size : sizes) ExpectBatch(exchanges[0].get(), 1, source.substr(size, size));
  ExchangeMessage message;
  const Clock::time_point start = Clock::now();
  Status s = exchanges[0]->Receive(&message, kExchangeTimeoutMs);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), Code::kTimeout) << s.ToString();
  EXPECT_TRUE(NamesParticipant(s.message(), 1)) << s.ToString();
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(kExchangeTimeoutMs) + kHangSlack);
  s = exchanges[0]->TrySend(1, OneItem(0, 100), costs);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.code(), Code::kWouldBlock) << s.ToString();
  EXPECT_TRUE(NamesParticipant(s.message(), 1)) << s.ToString();
  EXPECT_FALSE(exchanges[0]->AllEnded());
}

// SetSource replaces the source: a batch described after it is read from the new buffer, one
// sent before it arrives with the old buffer's bytes, and an empty source is refused.
TEST_P(ExchangeTest, SetSourceReplacesTheSource) {
  const std::string backend = GetParam();
  const TransferCosts costs = TransferCosts::Measured(backend);
  const std::string first = RandomSource(8192, Mix(kSeed ^ 0x50c1));
  const std::string second = RandomSource(4096, Mix(kSeed ^ 0x50c2));
  std::string buffer = first, shorter = second;  // outlive the exchanges that register them
  std::vector<std::unique_ptr<Exchange>> exchanges = OpenPair(backend);
  ASSERT_EQ(exchanges.size(), 2u);
  Exchange* sender = exchanges[0].get();
  ASSERT_TRUE(sender->SetSource(buffer.data(), buffer.size()).ok());
  ASSERT_TRUE(sender->TrySend(1, OneItem(100, 3000), costs).ok());
  // The new source is shorter: a layout that fitted the old one now leaves it.
  ASSERT_TRUE(sender->SetSource(shorter.data(), shorter.size()).ok());
  EXPECT_EQ(sender->TrySend(1, OneItem(5000, 100), costs).code(), Code::kInvalidArgument);
  buffer.assign(buffer.size(), 'x');  // the old buffer is the caller's again
  ASSERT_TRUE(sender->TrySend(1, OneItem(100, 3000), costs).ok());
  ExpectBatch(exchanges[1].get(), 0, first.substr(100, 3000));
  ExpectBatch(exchanges[1].get(), 0, second.substr(100, 3000));
  char byte = 0;
  EXPECT_EQ(sender->SetSource(nullptr, 16).code(), Code::kInvalidArgument);
  EXPECT_EQ(sender->SetSource(&byte, 0).code(), Code::kInvalidArgument);
}

// A hello names the batches' encoding: one from a build that encoded pointer-mapped offsets
// whole ("SLEX") is refused, so such participants never meet.
TEST(ExchangeWire, AHelloOfAnotherEncodingIsRefused) {
  Message m;
  m.opcode = exchange_wire::kHello;
  m.data = exchange_wire::EncodeHello(1, 3, 77);
  uint32_t from = 0;
  ASSERT_TRUE(exchange_wire::HelloFrom(m, std::nullopt, 3, 77, &from));
  EXPECT_EQ(from, 1u);
  const uint32_t older = 0x58454c53;  // "SLEX"
  std::memcpy(m.data.data(), &older, sizeof(older));
  EXPECT_FALSE(exchange_wire::HelloFrom(m, std::nullopt, 3, 77));
}

// SetSourceFor gives each peer a source of its own: a batch to a peer is read from that peer's
// buffer, a layout beyond it is refused, a peer with none refuses to send, self and unknown
// targets are refused, and SetSource afterwards replaces them all.
TEST_P(ExchangeTest, SetSourceForGivesEachPeerItsOwnBuffer) {
  const std::string backend = GetParam();
  const TransferCosts costs = TransferCosts::Measured(backend);
  const std::string to_one = RandomSource(8192, Mix(kSeed ^ 0x50f1));
  const std::string to_two = RandomSource(4096, Mix(kSeed ^ 0x50f2));
  std::string one = to_one, two = to_two;  // outlive the exchanges that register them
  Group group = MakeGroup(backend, 3, SmallChannel(2), kExchangeTimeoutMs);
  ASSERT_EQ(group.listeners.size(), 3u);
  Opened opened = OpenAll(&group);
  for (uint32_t i = 0; i < 3; i++) ASSERT_TRUE(opened.status[i].ok()) << backend << " " << i;
  Exchange* sender = opened.exchanges[0].get();
  ASSERT_TRUE(sender->SetSourceFor(1, one.data(), one.size()).ok());
  EXPECT_EQ(sender->TrySend(2, OneItem(0, 100), costs).code(), Code::kInvalidArgument);
  ASSERT_TRUE(sender->SetSourceFor(2, two.data(), two.size()).ok());
  ASSERT_TRUE(sender->TrySend(1, OneItem(5000, 3000), costs).ok());
  EXPECT_EQ(sender->TrySend(2, OneItem(5000, 100), costs).code(), Code::kInvalidArgument);
  ASSERT_TRUE(sender->TrySend(2, OneItem(100, 3000), costs).ok());
  ExpectBatch(opened.exchanges[1].get(), 0, to_one.substr(5000, 3000));
  ExpectBatch(opened.exchanges[2].get(), 0, to_two.substr(100, 3000));
  char byte = 0;
  EXPECT_EQ(sender->SetSourceFor(0, &byte, 1).code(), Code::kInvalidArgument);
  EXPECT_EQ(sender->SetSourceFor(3, &byte, 1).code(), Code::kInvalidArgument);
  EXPECT_EQ(sender->SetSourceFor(1, nullptr, 16).code(), Code::kInvalidArgument);
  // One source for all again: peer 2's sends now read from it.
  ASSERT_TRUE(sender->SetSource(one.data(), one.size()).ok());
  ASSERT_TRUE(sender->TrySend(2, OneItem(5000, 3000), costs).ok());
  ExpectBatch(opened.exchanges[2].get(), 0, to_one.substr(5000, 3000));
}

// A participant of another exchange (same group, same secret) that connects to a member while
// the group opens is dropped, and the group opens anyway.
TEST_P(ExchangeTest, StrayFromAnotherExchangeIsDropped) {
  Group group = MakeGroup(GetParam(), 3, SmallChannel(2), kExchangeTimeoutMs);
  ASSERT_EQ(group.listeners.size(), 3u);
  // The stray believes it is participant 1 of exchange 8 whose participant 0 is ours.
  std::unique_ptr<Listener> stray_listener;
  ASSERT_TRUE(Listen(TransportFor(GetParam()), "127.0.0.1:0", &stray_listener).ok());
  ExchangeOptions stray = group.options[1];
  stray.exchange_id = 8;
  stray.addresses = {group.options[0].addresses[0], stray_listener->address()};
  stray.timeout_ms = 3000;
  Status stray_status;
  std::unique_ptr<Exchange> stray_exchange;
  std::thread stray_thread(
      [&] { stray_status = Exchange::Open(stray, stray_listener.get(), &stray_exchange); });
  Opened opened = OpenAll(&group);
  stray_thread.join();
  EXPECT_FALSE(stray_status.ok()) << "the stray was admitted";
  for (uint32_t i = 0; i < 3; i++) {
    EXPECT_TRUE(opened.status[i].ok()) << i << ": " << opened.status[i].ToString();
  }
}

// Two well-configured participants and one with `bad` options: Open fails on all three, in
// bounded time, rather than admitting the bad one.
void ExpectNotAdmitted(const std::string& backend, const TransportOptions& bad_transport,
                       uint64_t bad_exchange_id) {
  constexpr uint32_t kBad = 1;
  constexpr int kTimeoutMs = 1500;
  std::vector<TransportOptions> transports(3, TransportFor(backend));
  transports[kBad] = bad_transport;
  Group group = MakeGroup(transports, SmallChannel(2), kTimeoutMs);
  ASSERT_EQ(group.listeners.size(), 3u);
  group.options[kBad].exchange_id = bad_exchange_id;
  Opened opened = OpenAll(&group);
  for (uint32_t i = 0; i < 3; i++) {
    const Status& s = opened.status[i];
    EXPECT_FALSE(s.ok()) << backend << " participant " << i << " opened";
    EXPECT_NE(s.code(), Code::kWouldBlock) << s.ToString();
    EXPECT_LT(opened.took[i], std::chrono::milliseconds(kTimeoutMs) + kHangSlack)
        << backend << " participant " << i << ": " << s.ToString();
    if (i != kBad) {
      EXPECT_TRUE(NamesParticipant(s.message(), kBad))
          << backend << " participant " << i << ": " << s.ToString();
    }
  }
}

// A participant holding another secret is not admitted: Open fails on every participant
// within the exchange's timeout (plus slack), the good ones naming it.
TEST_P(ExchangeTest, WrongSecretIsNotAdmitted) {
  ExpectNotAdmitted(GetParam(), TransportFor(GetParam(), "another-secret"), 7);
}

// A participant of another exchange (a different exchange_id, the right secret) is not
// admitted: Open fails on every participant within the timeout (plus slack), naming it.
TEST_P(ExchangeTest, WrongExchangeIdIsNotAdmitted) {
  ExpectNotAdmitted(GetParam(), TransportFor(GetParam()), 8);
}

// Streams with nothing but their end: every participant sees each peer's end once and
// AllEnded, and no batch is counted.
TEST_P(ExchangeTest, EmptyStreamsEnd) {
  constexpr uint32_t kN = 4;
  Group group = MakeGroup(GetParam(), kN, SmallChannel(2), kExchangeTimeoutMs);
  ASSERT_EQ(group.listeners.size(), kN);
  std::vector<std::unique_ptr<Exchange>> exchanges(kN);
  std::vector<Status> opened(kN), ran(kN);
  std::vector<uint32_t> rows_per_origin(kN, 0);
  std::vector<Tally> tallies;
  for (uint32_t i = 0; i < kN; i++) tallies.emplace_back(i, kN, rows_per_origin);
  const Clock::time_point deadline = Clock::now() + kRunLimit;
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < kN; i++) {
    threads.emplace_back([&, i] {
      opened[i] = Exchange::Open(group.options[i], group.listeners[i].get(), &exchanges[i]);
      if (!opened[i].ok()) return;
      if (exchanges[i]->AllEnded()) tallies[i].Fail("AllEnded before any end");
      ran[i] = RunStream(exchanges[i].get(), {}, TransferCosts::Measured(GetParam()), 1000,
                         deadline, &tallies[i]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (uint32_t i = 0; i < kN; i++) {
    ASSERT_TRUE(opened[i].ok()) << "participant " << i << ": " << opened[i].ToString();
    EXPECT_TRUE(ran[i].ok()) << "participant " << i << ": " << ran[i].ToString();
    EXPECT_EQ(tallies[i].error, "");
    EXPECT_TRUE(exchanges[i]->AllEnded());
    for (uint32_t j = 0; j < kN; j++) {
      if (j == i) continue;
      EXPECT_EQ(tallies[i].ends_from[j], 1u) << "end of " << j << " at " << i;
      EXPECT_EQ(tallies[i].batches_from[j], 0u);
      const ExchangeCounters c = exchanges[i]->counters(j);
      EXPECT_EQ(c.batches_sent, 0u);
      EXPECT_EQ(c.batches_received, 0u);
      EXPECT_EQ(c.payload_bytes_sent, 0u);
      EXPECT_EQ(c.payload_bytes_received, 0u);
    }
  }
}

// Options that cannot describe an exchange are refused: no addresses, self past the
// addresses, and a peer address that is not one fails (in bounded time); a group of one
// either is refused as InvalidArgument or is a working exchange that has already ended.
TEST_P(ExchangeTest, BadOptionsAreRefused) {
  Group group = MakeGroup(GetParam(), 2, SmallChannel(2), 1500);
  ASSERT_EQ(group.listeners.size(), 2u);
  std::unique_ptr<Exchange> exchange;

  ExchangeOptions options = group.options[0];
  options.addresses.clear();
  EXPECT_EQ(Exchange::Open(options, group.listeners[0].get(), &exchange).code(),
            Code::kInvalidArgument);

  options = group.options[0];
  options.self = 2;
  EXPECT_EQ(Exchange::Open(options, group.listeners[0].get(), &exchange).code(),
            Code::kInvalidArgument);
  options.self = UINT32_MAX;
  EXPECT_EQ(Exchange::Open(options, group.listeners[0].get(), &exchange).code(),
            Code::kInvalidArgument);

  // Participant 1 connects to participant 0 at an address that is none.
  options = group.options[1];
  options.addresses[0] = "not an address";
  const Clock::time_point start = Clock::now();
  Status s = Exchange::Open(options, group.listeners[1].get(), &exchange);
  EXPECT_FALSE(s.ok());
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(options.timeout_ms) + kHangSlack);

  // A group of one: nothing to connect to, nothing to wait for.
  options = group.options[0];
  options.addresses.resize(1);
  s = Exchange::Open(options, group.listeners[0].get(), &exchange);
  if (s.ok()) {
    ASSERT_NE(exchange, nullptr);
    EXPECT_EQ(exchange->participants(), 1u);
    EXPECT_EQ(exchange->self(), 0u);
    EXPECT_TRUE(exchange->AllEnded());
    RegionLayout layout;
    ASSERT_TRUE(RegionLayout::PointerMapped({{0, 1}}, &layout).ok());
    char byte = 0;
    ASSERT_TRUE(exchange->SetSource(&byte, 1).ok());
    const TransferCosts costs = TransferCosts::Measured(GetParam());
    EXPECT_EQ(exchange->TrySend(0, layout, costs).code(), Code::kInvalidArgument);
    EXPECT_EQ(exchange->TrySend(1, layout, costs).code(), Code::kInvalidArgument);
    EXPECT_EQ(exchange->TryEnd(0).code(), Code::kInvalidArgument);
    exchange.reset();
  } else {
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ExchangeTest, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace slipstream::rdma
