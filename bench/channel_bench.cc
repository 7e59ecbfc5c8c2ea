// channel_bench: Geyer et al.'s throughput and consume tests of the multi-buffer channel, on the
// shm and tcp backends, single buffer (receive_buffers = 1, the paper's baseline) against
// multi buffer (2..7), over receive-buffer sizes, data sizes and sender thread counts.
//
// Method: for every configuration the parent process (the sender) listens on 127.0.0.1 and
// forks the receiver, which connects with the shared secret; both open a Channel. The sender's
// threads send the data (data size bytes per round, split evenly among the sender threads, each
// share one message) over and over for a fixed time, then one empty end message; the receiver
// answers the end message with a message carrying the byte count it saw. Throughput = payload
// bytes sent / (time from the first Send to the answer). The receiver takes every package with
// ReceivePackage and:
//  * throughput test: releases it at once (it consumes as fast as it can; the sender never waits
//    for consumption, only for a free buffer);
//  * consume test: reads every byte of it (sums it as 64-bit words; --consume=copy copies it out
//    instead) before releasing it, so a buffer is only reused after it was consumed.

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_util.h"
#include "slipstream/rdma/channel.h"
#include "slipstream/rdma/status.h"
#include "slipstream/rdma/transport.h"

namespace {

namespace rdma = slipstream::rdma;
using Clock = std::chrono::steady_clock;
using slipstream::bench::CompilerBarrier;
using slipstream::bench::ParseSize;
using slipstream::bench::SecondsSince;
using slipstream::bench::SizeName;
using slipstream::bench::SplitWords;

constexpr char kUsage[] =
    "usage: channel_bench [--report | --quick | --full] [--csv-dir=DIR] [--seconds=S]\n"
    "                     [--backend=shm,tcp] [--mode=throughput|consume|both]\n"
    "                     [--buffers=1,2,4,7 | 1-7] [--buffer-size=4K,64K,...]\n"
    "                     [--data-size=8,64K,1G,...] [--threads=1,2,4]\n"
    "                     [--consume=read|copy] [--send=copy|region] [--in-flight=1-8]\n"
    "Default (--report): a representative grid in a few minutes. --quick: a small grid with\n"
    "short runs. --full: every combination of backends, modes, buffers 1-7, buffer sizes\n"
    "4K..64M (x4), data sizes 8B..1G (x8) and threads 1,2,4 (hours on 2 cores). Giving any of\n"
    "--backend/--mode/--buffers/--buffer-size/--data-size/--threads runs just that grid\n"
    "(defaults: shm,tcp; both; 1,4; 64K; 64M; 1). The smallest receive buffer the channel\n"
    "accepts is 4 KiB (ChannelOptions minimum in rdma/src/channel.cc). --in-flight: packages\n"
    "each sender thread keeps in flight (ChannelOptions::packages_in_flight; default 4).\n";

constexpr char kSecret[] = "channel_bench shared secret";
constexpr uint32_t kOpData = 1;
constexpr uint32_t kOpEnd = 2;             // the end of the timed data: answer, then stop
constexpr uint32_t kOpAnswer = 3;          // the receiver's answer: payload bytes seen, checksum
constexpr uint32_t kOpWarmupEnd = 4;       // the end of the untimed warm-up: answer, start counting
constexpr uint32_t kMinBufferSize = 4096;  // channel.cc refuses smaller receive buffers
constexpr uint32_t kHeaderBytes = 48;      // the channel's package header (package_header_size)
constexpr int kSendTimeoutMs = 60000;
constexpr size_t kMiB = 1u << 20;
constexpr size_t kCopySpan = 64u << 20;  // --consume=copy copies into a buffer this large

// One point of the grid.
struct Config {
  std::string backend;
  std::string mode;  // "throughput" or "consume"
  uint32_t buffers = 1;
  uint32_t buffer_size = 64u << 10;
  uint64_t data_size = 64u << 20;
  uint32_t threads = 1;

  // The fields in the order the grid runs and prints in (single and multi buffer adjacent).
  auto Key() const { return std::tie(backend, mode, threads, buffer_size, data_size, buffers); }
  // Orders configurations by Key().
  bool operator<(const Config& other) const { return Key() < other.Key(); }
};

// What one configuration measured.
struct Result {
  Config config;
  uint64_t messages = 0;
  uint64_t packages = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  double mib_per_s = 0;
};

// Everything the command line sets.
struct Flags {
  std::string grid = "report";  // report, quick, full or custom
  std::string csv_dir;
  double seconds = 0.2;  // sending time per configuration
  bool seconds_given = false;
  std::string consume = "read";
  std::string send = "copy";
  uint32_t in_flight = rdma::ChannelOptions{}.packages_in_flight;
  std::vector<std::string> backends = {"shm", "tcp"};
  std::vector<std::string> modes = {"throughput", "consume"};
  std::vector<uint32_t> buffers = {1, 4};
  std::vector<uint32_t> buffer_sizes = {64u << 10};
  std::vector<uint64_t> data_sizes = {64u << 20};
  std::vector<uint32_t> threads = {1};
};

// Parses a list of sizes ("4K,64K"); false on a malformed entry.
bool ParseSizes(std::string_view text, std::vector<uint64_t>* sizes) {
  sizes->clear();
  for (const std::string& word : SplitWords(text)) {
    uint64_t bytes = 0;
    if (!ParseSize(word, &bytes) || bytes == 0) return false;
    sizes->push_back(bytes);
  }
  return !sizes->empty();
}

// Parses a list of small counts with ranges ("1,2,4" or "1-7"); false on a malformed entry.
bool ParseCounts(std::string_view text, std::vector<uint32_t>* counts) {
  counts->clear();
  for (const std::string& word : SplitWords(text)) {
    size_t dash = word.find('-');
    int first = std::atoi(word.substr(0, dash).c_str());
    int last = dash == std::string::npos ? first : std::atoi(word.substr(dash + 1).c_str());
    if (first < 1 || last < first) return false;
    for (int value = first; value <= last; value++) counts->push_back(uint32_t(value));
  }
  return !counts->empty();
}

// Reads the command line into `flags`; false (after printing why) on a bad flag.
bool ParseFlags(int argc, char** argv, Flags* flags) {
  bool custom = false;
  for (int i = 1; i < argc; i++) {
    std::string_view arg = argv[i];
    size_t eq = arg.find('=');
    std::string_view name = arg.substr(0, eq);
    std::string value = eq == std::string_view::npos ? "" : std::string(arg.substr(eq + 1));
    bool ok = true;
    std::vector<uint64_t> sizes;
    if (name == "--help" || name == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (name == "--report" || name == "--quick" || name == "--full") {
      flags->grid = std::string(name.substr(2));
    } else if (name == "--csv-dir") {
      flags->csv_dir = value;
    } else if (name == "--seconds") {
      flags->seconds = std::atof(value.c_str());
      flags->seconds_given = true;
      ok = flags->seconds > 0;
    } else if (name == "--consume") {
      flags->consume = value;
      ok = value == "read" || value == "copy";
    } else if (name == "--send") {
      flags->send = value;
      ok = value == "copy" || value == "region";
    } else if (name == "--in-flight") {
      int count = std::atoi(value.c_str());
      ok = count >= 1 && count <= 8;
      flags->in_flight = uint32_t(count);
    } else if (name == "--backend" || name == "--backends") {
      flags->backends = SplitWords(value);
      for (const std::string& b : flags->backends) ok = ok && (b == "shm" || b == "tcp");
      custom = true;
    } else if (name == "--mode") {
      flags->modes =
          value == "both" ? std::vector<std::string>{"throughput", "consume"} : SplitWords(value);
      for (const std::string& m : flags->modes) ok = ok && (m == "throughput" || m == "consume");
      custom = true;
    } else if (name == "--buffers") {
      ok = ParseCounts(value, &flags->buffers) && flags->buffers.back() <= 7;
      for (uint32_t b : flags->buffers) ok = ok && b <= 7;
      custom = true;
    } else if (name == "--threads") {
      ok = ParseCounts(value, &flags->threads);
      for (uint32_t t : flags->threads) ok = ok && t <= 16;
      custom = true;
    } else if (name == "--buffer-size") {
      ok = ParseSizes(value, &sizes);
      flags->buffer_sizes.clear();
      for (uint64_t size : sizes) {
        ok = ok && size >= kMinBufferSize && size <= (1u << 30);
        flags->buffer_sizes.push_back(uint32_t(size));
      }
      custom = true;
    } else if (name == "--data-size") {
      ok = ParseSizes(value, &flags->data_sizes);
      for (uint64_t size : flags->data_sizes) ok = ok && size <= (1ull << 30);
      custom = true;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad flag: %s\n%s", argv[i], kUsage);
      return false;
    }
  }
  if (custom) flags->grid = "custom";
  if (flags->grid == "quick" && !flags->seconds_given) flags->seconds = 0.05;
  return true;
}

// Adds every combination of the given lists to `grid`.
void AddProduct(const std::vector<std::string>& backends, const std::vector<std::string>& modes,
                const std::vector<uint32_t>& buffers, const std::vector<uint32_t>& buffer_sizes,
                const std::vector<uint64_t>& data_sizes, const std::vector<uint32_t>& threads,
                std::set<Config>* grid) {
  for (const std::string& backend : backends) {
    for (const std::string& mode : modes) {
      for (uint32_t count : buffers) {
        for (uint32_t buffer_size : buffer_sizes) {
          for (uint64_t data_size : data_sizes) {
            for (uint32_t thread_count : threads) {
              grid->insert(Config{backend, mode, count, buffer_size, data_size, thread_count});
            }
          }
        }
      }
    }
  }
}

// The configurations to run: the report grid (three sweeps), the quick grid, the full
// product, or the product of the flags' lists.
std::set<Config> BuildGrid(const Flags& flags) {
  std::set<Config> grid;
  const std::vector<std::string> both_modes = {"throughput", "consume"};
  const std::vector<uint32_t> one_to_seven = {1, 2, 3, 4, 5, 6, 7};
  if (flags.grid == "custom") {
    AddProduct(flags.backends, flags.modes, flags.buffers, flags.buffer_sizes, flags.data_sizes,
               flags.threads, &grid);
  } else if (flags.grid == "full") {
    std::vector<uint32_t> buffer_sizes;
    for (uint64_t size = 4u << 10; size <= (64u << 20); size *= 4) {
      buffer_sizes.push_back(uint32_t(size));
    }
    std::vector<uint64_t> data_sizes;
    for (uint64_t size = 8; size <= (1ull << 30); size *= 8) data_sizes.push_back(size);
    AddProduct(flags.backends, both_modes, one_to_seven, buffer_sizes, data_sizes, {1, 2, 4},
               &grid);
  } else if (flags.grid == "quick") {
    AddProduct(flags.backends, {"throughput"}, {1, 4, 7}, {64u << 10},
               {8, 2u << 10, 512u << 10, 16u << 20}, {1}, &grid);
    AddProduct(flags.backends, {"consume"}, {1, 4}, {4u << 10, 64u << 10, 1u << 20}, {16u << 20},
               {1}, &grid);
    AddProduct(flags.backends, both_modes, {1, 4}, {64u << 10}, {16u << 20}, {2}, &grid);
  } else {  // report
    // Sweep 1: throughput test against data size, 1..7 buffers of 64 KiB.
    AddProduct(flags.backends, {"throughput"}, one_to_seven, {64u << 10},
               {8, 128, 2u << 10, 32u << 10, 512u << 10, 8u << 20, 128u << 20, 1u << 30}, {1},
               &grid);
    // Sweep 2: both tests against receive-buffer size, single against multi buffer.
    AddProduct(flags.backends, both_modes, {1, 2, 4, 7}, {4u << 10, 64u << 10, 1u << 20, 16u << 20},
               {16u << 10, 1u << 20, 64u << 20}, {1}, &grid);
    // Sweep 3: sender threads.
    AddProduct(flags.backends, both_modes, {1, 4}, {64u << 10}, {1u << 20, 64u << 20}, {1, 2, 4},
               &grid);
  }
  return grid;
}

// Transport options both sides use (room for 7 x 64 MiB buffers or a 1 GiB send region).
rdma::TransportOptions BenchOptions(const std::string& backend) {
  rdma::TransportOptions options;
  options.backend = backend;
  options.secret = kSecret;
  options.connect_timeout_ms = 10000;
  options.region_capacity = 3ull << 30;
  return options;
}

// Reads every byte of `data` (as 64-bit words, then the tail) and returns their sum.
uint64_t ReadEveryByte(std::string_view data) {
  uint64_t sum = 0;
  size_t i = 0;
  for (; i + 8 <= data.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, data.data() + i, 8);
    sum += word;
  }
  for (; i < data.size(); i++) sum += uint8_t(data[i]);
  return sum;
}

// Prints a failed status of the forked receiver and returns its exit code.
int ReceiverFailed(const char* what, const rdma::Status& status) {
  std::fprintf(stderr, "channel_bench receiver: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

// The forked receiver: connects, opens the channel with the configuration's receive buffers,
// takes packages (releasing each at once, or after consuming it), answers the end message
// with the payload byte count, then waits for the sender to hang up.
int ReceiverMain(const Config& config, const Flags& flags, const std::string& address) {
  std::unique_ptr<rdma::Connection> connection;
  rdma::Status s = rdma::Connect(BenchOptions(config.backend), address, &connection);
  if (!s.ok()) return ReceiverFailed("connect", s);
  rdma::ChannelOptions options;
  options.receive_buffers = config.buffers;
  options.receive_buffer_size = config.buffer_size;
  options.send_buffer_size = 64u << 10;  // only the answer goes this way
  options.sender_threads = 1;
  std::unique_ptr<rdma::Channel> channel;
  s = rdma::Channel::Open(connection.get(), options, 10000, &channel);
  if (!s.ok()) return ReceiverFailed("open", s);
  const bool consume = config.mode == "consume";
  const bool copy_out = flags.consume == "copy";
  char* copy_target = nullptr;
  if (consume && copy_out) {
    void* memory =
        ::mmap(nullptr, kCopySpan, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return 1;
    copy_target = static_cast<char*>(memory);
    std::memset(copy_target, 0, kCopySpan);
  }
  uint64_t bytes = 0, checksum = 0, copy_offset = 0;
  for (;;) {
    rdma::PackageView package;
    s = channel->ReceivePackage(&package, kSendTimeoutMs);
    if (!s.ok()) return ReceiverFailed("receive", s);
    const uint32_t opcode = package.opcode;
    if (opcode == kOpEnd || opcode == kOpWarmupEnd) {
      s = channel->Release(package);
      uint64_t answer[2] = {bytes, checksum};
      if (s.ok()) {
        s = channel->Send(kOpAnswer,
                          std::string_view(reinterpret_cast<char*>(answer), sizeof(answer)), 0,
                          kSendTimeoutMs);
      }
      if (!s.ok()) return ReceiverFailed("answer", s);
      if (opcode == kOpEnd) break;
      bytes = 0;  // the warm-up does not count
      continue;
    }
    if (consume && copy_out) {
      if (copy_offset + package.data.size() > kCopySpan) copy_offset = 0;
      std::memcpy(copy_target + copy_offset, package.data.data(), package.data.size());
      CompilerBarrier();
      copy_offset += package.data.size();
    } else if (consume) {
      checksum += ReadEveryByte(package.data);
    }
    bytes += package.data.size();
    s = channel->Release(package);
    if (!s.ok()) return ReceiverFailed("release", s);
  }
  // Stay until the sender hangs up, so the answer is surely out before this side goes away.
  for (;;) {
    rdma::PackageView package;
    s = channel->ReceivePackage(&package, 1000);
    if (!s.ok() && s.code() != rdma::Status::Code::kTimeout) return 0;
    if (s.ok()) channel->Release(package);
  }
}

// A source of data for the sender: a plain buffer filled once (for Send), reused across
// configurations and never inherited by the forked receivers.
class SourceBuffer {
 public:
  // Unmaps the buffer.
  ~SourceBuffer() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }

  // Makes the buffer at least `size` bytes, filled with a pattern; false on failure.
  bool Reserve(uint64_t size) {
    if (size <= size_) return true;
    if (data_ != nullptr) ::munmap(data_, size_);
    void* memory =
        ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
      data_ = nullptr;
      size_ = 0;
      return false;
    }
    ::madvise(memory, size, MADV_DONTFORK);
    data_ = static_cast<char*>(memory);
    size_ = size;
    for (uint64_t i = 0; i < size; i += 8) {
      uint64_t word = i * 0x9e3779b97f4a7c15ull;
      std::memcpy(data_ + i, &word, std::min<uint64_t>(8, size - i));
    }
    return true;
  }

  // The first byte of the data.
  const char* data() const { return data_; }

 private:
  char* data_ = nullptr;
  uint64_t size_ = 0;
};

// Waits up to `timeout_ms` for a child to exit, then kills it; true if it exited with 0.
bool ReapChild(pid_t child, int timeout_ms) {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  int status = 0;
  for (;;) {
    pid_t done = ::waitpid(child, &status, WNOHANG);
    if (done == child) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (done < 0) return false;
    if (Clock::now() >= deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      return false;
    }
    ::usleep(2000);
  }
}

// Sends `bytes` of `data` untimed from slot 0, then the warm-up end, and waits for the
// receiver's answer (which must count exactly those bytes).
rdma::Status Warmup(rdma::Channel* channel, const char* data, uint64_t bytes) {
  rdma::Status s = channel->Send(kOpData, std::string_view(data, bytes), 0, kSendTimeoutMs);
  if (s.ok()) s = channel->Send(kOpWarmupEnd, {}, 0, kSendTimeoutMs);
  rdma::Message answer;
  if (s.ok()) s = channel->Receive(&answer, kSendTimeoutMs);
  if (!s.ok()) return s;
  uint64_t received[2] = {0, 0};
  if (answer.opcode != kOpAnswer || answer.data.size() != sizeof(received)) {
    return rdma::Status::InvalidArgument("malformed warm-up answer from the receiver");
  }
  std::memcpy(received, answer.data.data(), sizeof(received));
  if (received[0] != bytes) return rdma::Status::InvalidArgument("warm-up bytes lost");
  return rdma::Status::OK();
}

// Runs one configuration: forks the receiver, sends for the configured time from
// `threads` sender threads, and measures until the receiver's answer. Returns the result, or
// nothing (after printing why) when something failed.
std::optional<Result> RunConfig(const Config& config, const Flags& flags, SourceBuffer* source) {
  const rdma::TransportOptions options = BenchOptions(config.backend);
  std::unique_ptr<rdma::Listener> listener;
  rdma::Status s = rdma::Listen(options, "127.0.0.1:0", &listener);
  if (!s.ok()) {
    std::fprintf(stderr, "listen: %s\n", s.ToString().c_str());
    return {};
  }
  const bool use_region = flags.send == "region";
  // The untimed warm-up: twice the payload of all receive buffers, so that the pages the
  // steady state touches exist before the clock starts.
  const uint64_t warmup_bytes =
      std::min<uint64_t>(2ull * config.buffers * (config.buffer_size - kHeaderBytes), 1ull << 30);
  const uint64_t source_bytes = std::max<uint64_t>({config.data_size, warmup_bytes, 8});
  if (!use_region && !source->Reserve(source_bytes)) {
    std::fprintf(stderr, "cannot map %s of source data\n", SizeName(config.data_size).c_str());
    return {};
  }
  const std::string address = listener->address();
  std::fflush(nullptr);
  pid_t child = ::fork();
  if (child == 0) {
    listener.reset();
    ::_exit(ReceiverMain(config, flags, address));
  }
  if (child < 0) {
    std::fprintf(stderr, "fork failed\n");
    return {};
  }
  std::optional<Result> result;
  {
    std::unique_ptr<rdma::Connection> connection;
    std::unique_ptr<rdma::Channel> channel;
    rdma::LocalRegion region;
    s = listener->Accept(10000, &connection);
    rdma::ChannelOptions channel_options;
    channel_options.receive_buffers = 1;  // only the receiver's answer comes back
    channel_options.receive_buffer_size = kMinBufferSize;
    channel_options.sender_threads = config.threads;
    channel_options.packages_in_flight = flags.in_flight;
    // Send Buffer parts (in_flight per thread) as large as a receive buffer: full-size packages
    // (up to a 2 GiB Send Buffer; beyond that the parts, and so the packages, get smaller).
    channel_options.send_buffer_size = uint32_t(std::min<uint64_t>(
        uint64_t(config.threads) * flags.in_flight * std::max(config.buffer_size, 64u << 10),
        1ull << 31));
    if (s.ok()) s = rdma::Channel::Open(connection.get(), channel_options, 10000, &channel);
    if (s.ok() && use_region) {
      s = connection->AllocateRegion(source_bytes, rdma::kLocalOnly, &region);
      if (s.ok()) std::memset(region.addr, 0x5a, region.length);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "%s setup: %s\n", config.backend.c_str(), s.ToString().c_str());
    } else {
      s = Warmup(channel.get(), use_region ? region.addr : source->data(), warmup_bytes);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "%s warm-up: %s\n", config.backend.c_str(), s.ToString().c_str());
    } else {
      result = Result{config};
      const uint64_t share = config.data_size / config.threads;
      const uint64_t payload = channel->peer_buffer_size() - channel->package_header_size();
      std::vector<uint64_t> sent(config.threads), messages(config.threads),
          packages(config.threads);
      std::vector<rdma::Status> failures(config.threads);
      const Clock::time_point start = Clock::now();
      const Clock::time_point deadline = start + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(flags.seconds));
      std::vector<std::thread> senders;
      for (uint32_t t = 0; t < config.threads; t++) {
        senders.emplace_back([&, t] {
          // The last thread also takes the remainder of the data.
          const uint64_t offset = t * share;
          const uint64_t length = t + 1 == config.threads ? config.data_size - offset : share;
          const uint64_t per_message = std::max<uint64_t>(1, (length + payload - 1) / payload);
          do {
            rdma::Status status =
                use_region
                    ? channel->SendRegion(kOpData, region, offset, length, t, kSendTimeoutMs)
                    : channel->Send(kOpData, std::string_view(source->data() + offset, length), t,
                                    kSendTimeoutMs);
            if (!status.ok()) {
              failures[t] = status;
              return;
            }
            sent[t] += length;
            messages[t]++;
            packages[t] += per_message;
          } while (Clock::now() < deadline);
        });
      }
      for (std::thread& sender : senders) sender.join();
      for (uint32_t t = 0; t < config.threads && s.ok(); t++) s = failures[t];
      if (s.ok()) s = channel->Send(kOpEnd, {}, 0, kSendTimeoutMs);
      rdma::Message answer;
      if (s.ok()) s = channel->Receive(&answer, kSendTimeoutMs);
      result->seconds = SecondsSince(start);
      for (uint32_t t = 0; t < config.threads; t++) {
        result->bytes += sent[t];
        result->messages += messages[t];
        result->packages += packages[t];
      }
      result->mib_per_s = double(result->bytes) / result->seconds / double(kMiB);
      uint64_t received[2] = {0, 0};
      if (s.ok() && (answer.opcode != kOpAnswer || answer.data.size() != sizeof(received))) {
        s = rdma::Status::InvalidArgument("malformed answer from the receiver");
      }
      if (s.ok()) {
        std::memcpy(received, answer.data.data(), sizeof(received));
        if (received[0] != result->bytes) {
          s = rdma::Status::InvalidArgument("the receiver saw " + std::to_string(received[0]) +
                                            " bytes, not " + std::to_string(result->bytes));
        }
      }
      if (!s.ok()) {
        std::fprintf(stderr, "%s %s: %s\n", config.backend.c_str(), config.mode.c_str(),
                     s.ToString().c_str());
        result.reset();
      }
    }
    if (region.addr != nullptr && connection) connection->FreeRegion(region);
    channel.reset();
  }
  if (!ReapChild(child, 15000)) {
    std::fprintf(stderr, "the receiver did not end cleanly\n");
    result.reset();
  }
  return result;
}

// A table cell with the value (more decimals below 10 when none were asked for), or "-".
std::string Cell(std::optional<double> value, int decimals) {
  if (!value) return "-";
  if (decimals == 0 && *value < 10) decimals = *value < 1 ? 3 : 1;  // small values stay readable
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", decimals, *value);
  return text;
}

// One row of the summary: a (backend, mode, threads, buffer size, data size) with throughput
// per buffer count.
struct RowKey {
  std::string backend, mode;
  uint32_t threads;
  uint32_t buffer_size;
  uint64_t data_size;
  // Orders rows by backend, mode, threads, buffer size, then data size.
  bool operator<(const RowKey& o) const {
    return std::tie(backend, mode, threads, buffer_size, data_size) <
           std::tie(o.backend, o.mode, o.threads, o.buffer_size, o.data_size);
  }
};

// Counts of the consume goal per backend.
struct GoalTally {
  int pass = 0;
  int total = 0;
  double worst = 1e9;
  double best = 0;
};

// Prints one table per (backend, mode, threads): rows buffer size x data size, columns the
// buffer counts, then the best multi-buffer / single-buffer ratio. Consume rows whose data
// exceeds one receive buffer get the goal's PASS/MISS. Fills `tallies` per backend.
void PrintTables(const std::vector<Result>& results, std::map<std::string, GoalTally>* tallies) {
  std::map<RowKey, std::map<uint32_t, double>> rows;
  std::set<uint32_t> counts;
  for (const Result& r : results) {
    const Config& c = r.config;
    rows[RowKey{c.backend, c.mode, c.threads, c.buffer_size, c.data_size}][c.buffers] = r.mib_per_s;
    counts.insert(c.buffers);
  }
  std::string current;
  for (const auto& [key, by_count] : rows) {
    const std::string table = key.backend + " " + key.mode + " test, " +
                              std::to_string(key.threads) + " sender thread" +
                              (key.threads > 1 ? "s" : "");
    if (table != current) {
      current = table;
      std::printf("\n%s (MiB/s by receive buffer count)\n%-8s %-6s", table.c_str(), "bufsize",
                  "data");
      for (uint32_t count : counts) std::printf(" %8u", count);
      std::printf(" %10s %s\n", "multi/1", key.mode == "consume" ? "goal>=2x" : "");
    }
    std::printf("%-8s %-6s", SizeName(key.buffer_size).c_str(), SizeName(key.data_size).c_str());
    for (uint32_t count : counts) {
      auto it = by_count.find(count);
      std::printf(
          " %8s",
          Cell(it == by_count.end() ? std::nullopt : std::optional<double>(it->second), 0).c_str());
    }
    auto single = by_count.find(1);
    double best = 0;
    uint32_t best_count = 0;
    for (const auto& [count, mib] : by_count) {
      if (count > 1 && mib > best) {
        best = mib;
        best_count = count;
      }
    }
    if (single == by_count.end() || best_count == 0 || single->second <= 0) {
      std::printf(" %10s\n", "-");
      continue;
    }
    const double ratio = best / single->second;
    char ratio_text[32];
    std::snprintf(ratio_text, sizeof(ratio_text), "%.2f(%u)", ratio, best_count);
    std::printf(" %10s", ratio_text);
    const bool exceeds = key.data_size > key.buffer_size - kHeaderBytes;
    if (key.mode == "consume" && exceeds) {
      GoalTally& tally = (*tallies)[key.backend];
      tally.total++;
      if (ratio >= 2.0) tally.pass++;
      tally.worst = std::min(tally.worst, ratio);
      tally.best = std::max(tally.best, ratio);
      std::printf(" %s", ratio >= 2.0 ? "PASS" : "MISS");
    } else if (key.mode == "consume") {
      std::printf(" (fits one buffer)");
    }
    std::printf("\n");
  }
}

// Writes every result to DIR/channel.csv; false on I/O failure.
bool WriteCsv(const std::vector<Result>& results, const std::string& directory) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  const std::string path = directory + "/channel.csv";
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return false;
  std::fprintf(file,
               "backend,mode,buffers,buffer_size,data_size,threads,messages,packages,bytes,"
               "seconds,mib_per_s\n");
  for (const Result& r : results) {
    const Config& c = r.config;
    std::fprintf(file, "%s,%s,%u,%u,%" PRIu64 ",%u,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%.6f,%.3f\n",
                 c.backend.c_str(), c.mode.c_str(), c.buffers, c.buffer_size, c.data_size,
                 c.threads, r.messages, r.packages, r.bytes, r.seconds, r.mib_per_s);
  }
  const bool ok = std::fclose(file) == 0;
  if (ok) std::printf("\nwrote %s\n", path.c_str());
  return ok;
}

// Runs the grid, prints progress, the tables and the goal; returns the exit code.
int Run(const Flags& flags) {
  const std::set<Config> grid = BuildGrid(flags);
  std::printf(
      "channel_bench: %s grid, %zu configurations, %.2f s of sending each; receivers are "
      "forked processes on 127.0.0.1; consume = %s every byte; send = %s; %u packages in "
      "flight per sender thread\n",
      flags.grid.c_str(), grid.size(), flags.seconds, flags.consume == "read" ? "read" : "copy out",
      flags.send == "copy" ? "Send (copy)" : "SendRegion (zero-copy)", flags.in_flight);
  std::printf("(receive buffers below 4 KiB are refused by the channel: 4 KiB is the smallest)\n");
  SourceBuffer source;
  std::vector<Result> results;
  int failures = 0;
  const Clock::time_point start = Clock::now();
  size_t index = 0;
  for (const Config& config : grid) {
    index++;
    std::optional<Result> result = RunConfig(config, flags, &source);
    if (!result) {
      failures++;
      std::printf("[%zu/%zu] %s %s buffers=%u x %s data=%s threads=%u: FAILED\n", index,
                  grid.size(), config.backend.c_str(), config.mode.c_str(), config.buffers,
                  SizeName(config.buffer_size).c_str(), SizeName(config.data_size).c_str(),
                  config.threads);
      continue;
    }
    std::printf(
        "[%zu/%zu] %s %-10s buffers=%u x %-4s data=%-4s threads=%u: %9s MiB/s "
        "(%" PRIu64 " messages in %.2f s)\n",
        index, grid.size(), config.backend.c_str(), config.mode.c_str(), config.buffers,
        SizeName(config.buffer_size).c_str(), SizeName(config.data_size).c_str(), config.threads,
        Cell(result->mib_per_s, 0).c_str(), result->messages, result->seconds);
    std::fflush(stdout);
    results.push_back(*result);
  }
  std::map<std::string, GoalTally> tallies;
  PrintTables(results, &tallies);
  std::printf("\n");
  for (const auto& [backend, tally] : tallies) {
    std::printf(
        "goal %s consume test, multi >= 2x single buffer once data > one buffer: %s "
        "(%d of %d rows pass; ratios %.2f..%.2f)\n",
        backend.c_str(), tally.pass == tally.total ? "PASS" : "MISS", tally.pass, tally.total,
        tally.worst, tally.best);
  }
  if (tallies.empty()) {
    std::printf(
        "goal consume test: not measured (no consume row with 1 and 2+ buffers whose data "
        "exceeds one buffer)\n");
  }
  std::printf("%zu configurations in %.0f s, %d failed\n", grid.size(), SecondsSince(start),
              failures);
  if (!flags.csv_dir.empty() && !WriteCsv(results, flags.csv_dir)) {
    std::fprintf(stderr, "cannot write CSV into %s\n", flags.csv_dir.c_str());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

// Parses the flags and runs the grid; no exception leaves main.
int main(int argc, char** argv) {
  try {
    std::signal(SIGPIPE, SIG_IGN);
    Flags flags;
    if (!ParseFlags(argc, argv, &flags)) return 2;
    return Run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "channel_bench: %s\n", e.what());
    return 1;
  }
}
