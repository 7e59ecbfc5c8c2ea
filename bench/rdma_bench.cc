// rdma_bench: WRITE bandwidth and latency of the rdma transports (shm, tcp) over message sizes,
// measured in one run beside three references: a raw memcpy loop, a raw loopback TCP stream
// (plain send/recv over 127.0.0.1) and UCX's ucp_put_bw over its tcp transport (ucx_perftest).
//
// Method (after ib_write_bw / ib_write_lat):
//  * bandwidth: the initiator keeps a window of signaled WRITEs in flight, reposting as
//    completions arrive, for a fixed time per size; bandwidth = bytes written / time.
//  * latency: one signaled WRITE, then wait for its completion; the median is reported.
// Every target is a forked child process that connects to the initiator (the parent) over
// 127.0.0.1 with the shared secret; for shm that makes the two heaps belong to truly separate
// processes. WRITEs (and the memcpy and TCP references) walk through 64 MiB buffers, so large
// sizes are not served from the cache.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench_util.h"
#include "slipstream/rdma/status.h"
#include "slipstream/rdma/transport.h"

extern char** environ;

namespace {

namespace rdma = slipstream::rdma;
using Clock = std::chrono::steady_clock;
using slipstream::bench::CompilerBarrier;
using slipstream::bench::ParseSize;
using slipstream::bench::ParseSizeList;
using slipstream::bench::SecondsSince;
using slipstream::bench::SizeName;
using slipstream::bench::SplitWords;

constexpr char kUsage[] =
    "usage: rdma_bench [--backends=shm,tcp] [--min-size=8] [--max-size=4M] [--window=128]\n"
    "                  [--seconds=0.2] [--repeat=3] [--lat-seconds=0.1]\n"
    "                  [--ucx-sizes=LIST|all|none]\n"
    "                  [--busy-poll] [--quick] [--full] [--csv-dir=DIR]\n"
    "Sizes take K/M/G suffixes (powers of two). Message sizes run in powers of two from\n"
    "--min-size to --max-size. Each bandwidth point is the median of --repeat rounds (all\n"
    "series interleaved). --quick: one short round, UCX at 1 MiB only; --full: five longer\n"
    "rounds, UCX at every size. Needs ucx_perftest (Debian ucx-utils) for the UCX column.\n";

constexpr char kSecret[] = "rdma_bench shared secret";
constexpr size_t kSpanBytes = 64u << 20;  // every buffer the writes walk through
constexpr size_t kMiB = 1u << 20;
constexpr int kPollTimeoutMs = 1000;
constexpr int kStallTimeoutMs = 30000;  // give up when nothing completes for this long

// Everything the command line sets.
struct Flags {
  std::vector<std::string> backends = {"shm", "tcp"};
  size_t min_size = 8;
  size_t max_size = 4u << 20;
  uint32_t window = 128;
  double seconds = 0.2;
  double lat_seconds = 0.1;
  int repeat = 3;  // bandwidth rounds per point; the median is reported
  std::string ucx_sizes = "8,1K,64K,1M,4M";
  bool busy_poll = false;
  std::string csv_dir;
};

// One measured point of one series.
struct Sample {
  uint64_t iterations = 0;
  double seconds = 0;
  double mib_per_s = 0;      // bandwidth tests (the median round's)
  double min_mib_per_s = 0;  // the slowest and fastest of the rounds
  double max_mib_per_s = 0;
  int rounds = 1;
  double median_us = 0;  // latency tests
  double mean_us = 0;
};

// Reads the command line into `flags`; false (after printing why) on a bad flag.
bool ParseFlags(int argc, char** argv, Flags* flags) {
  bool quick = false;
  bool full = false;
  std::optional<std::string> ucx_sizes;
  std::optional<double> seconds;
  std::optional<double> lat_seconds;
  std::optional<int> repeat;
  for (int i = 1; i < argc; i++) {
    std::string_view arg = argv[i];
    size_t eq = arg.find('=');
    std::string_view name = arg.substr(0, eq);
    std::string value = eq == std::string_view::npos ? "" : std::string(arg.substr(eq + 1));
    bool ok = true;
    if (name == "--help" || name == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (name == "--backends") {
      flags->backends = SplitWords(value);
      for (const std::string& b : flags->backends) ok = ok && (b == "shm" || b == "tcp");
    } else if (name == "--min-size") {
      ok = ParseSize(value, &flags->min_size) && flags->min_size > 0;
    } else if (name == "--max-size") {
      ok = ParseSize(value, &flags->max_size) && flags->max_size <= kSpanBytes;
    } else if (name == "--window") {
      flags->window = static_cast<uint32_t>(std::atoi(value.c_str()));
      ok = flags->window >= 1 && flags->window <= 256;
    } else if (name == "--seconds") {
      seconds = std::atof(value.c_str());
      ok = *seconds > 0;
    } else if (name == "--lat-seconds") {
      lat_seconds = std::atof(value.c_str());
      ok = *lat_seconds > 0;
    } else if (name == "--repeat") {
      repeat = std::atoi(value.c_str());
      ok = *repeat >= 1;
    } else if (name == "--ucx-sizes") {
      ucx_sizes = value;
    } else if (name == "--busy-poll") {
      flags->busy_poll = true;
    } else if (name == "--quick") {
      quick = true;
    } else if (name == "--full") {
      full = true;
    } else if (name == "--csv-dir") {
      flags->csv_dir = value;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad flag: %s\n%s", argv[i], kUsage);
      return false;
    }
  }
  if (quick) {
    flags->repeat = 1;
    flags->seconds = 0.1;
    flags->lat_seconds = 0.03;
    flags->ucx_sizes = "1M";
  }
  if (full) {
    flags->repeat = 5;
    flags->seconds = 0.5;
    flags->lat_seconds = 0.3;
    flags->ucx_sizes = "all";
  }
  if (seconds) flags->seconds = *seconds;
  if (repeat) flags->repeat = *repeat;
  if (lat_seconds) flags->lat_seconds = *lat_seconds;
  if (ucx_sizes) flags->ucx_sizes = *ucx_sizes;
  if (flags->min_size > flags->max_size) {
    std::fprintf(stderr, "--min-size is larger than --max-size\n");
    return false;
  }
  return true;
}

// The time point `seconds` after `start`.
Clock::time_point After(Clock::time_point start, double seconds) {
  return start +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// The offset of the i-th message of `size` bytes as it walks through a buffer of kSpanBytes.
size_t WalkOffset(uint64_t i, size_t size) {
  const size_t slots = std::max<size_t>(kSpanBytes / size, 1);
  return static_cast<size_t>(i % slots) * size;
}

// The median of `values` (which it reorders); 0 when empty.
double Median(std::vector<double>* values) {
  if (values->empty()) return 0;
  auto middle = values->begin() + values->size() / 2;
  std::nth_element(values->begin(), middle, values->end());
  return *middle;
}

// A zero-filled anonymous mapping not inherited by forked children, touched page by page.
char* MapTouched(size_t bytes) {
  void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return nullptr;
  ::madvise(memory, bytes, MADV_DONTFORK);
  std::memset(memory, 0x5a, bytes);
  return static_cast<char*>(memory);
}

// The round with the median bandwidth, carrying the range of all rounds.
Sample MedianSample(std::vector<Sample>* samples) {
  std::sort(samples->begin(), samples->end(),
            [](const Sample& a, const Sample& b) { return a.mib_per_s < b.mib_per_s; });
  Sample median = (*samples)[samples->size() / 2];
  median.min_mib_per_s = samples->front().mib_per_s;
  median.max_mib_per_s = samples->back().mib_per_s;
  median.rounds = int(samples->size());
  return median;
}

// Waits up to 15 s for a forked child to exit, then kills it.
void ReapChild(pid_t child) {
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(15);
  int status = 0;
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (Clock::now() >= deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      return;
    }
    ::usleep(2000);
  }
}

// --- raw memcpy ------------------------------------------------------------------------------

// Copies `size`-byte messages between two 64 MiB buffers for about `seconds`.
Sample MemcpyBandwidth(char* destination, const char* source, size_t size, double seconds) {
  const uint64_t batch = std::max<uint64_t>(1, (256u << 10) / size);
  uint64_t iterations = 0;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = After(start, seconds);
  do {
    for (uint64_t k = 0; k < batch; k++, iterations++) {
      const size_t offset = WalkOffset(iterations, size);
      std::memcpy(destination + offset, source + offset, size);
      CompilerBarrier();
    }
  } while (Clock::now() < deadline);
  Sample sample;
  sample.iterations = iterations;
  sample.seconds = SecondsSince(start);
  sample.mib_per_s = double(iterations) * double(size) / sample.seconds / double(kMiB);
  return sample;
}

// Times single memcpy calls of `size` bytes for about `seconds`: median and mean.
Sample MemcpyLatency(char* destination, const char* source, size_t size, double seconds) {
  std::vector<double> times;
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = After(start, seconds);
  double total = 0;
  for (uint64_t i = 0; (i < 10 || Clock::now() < deadline) && i < 1000000; i++) {
    const size_t offset = WalkOffset(i, size);
    const Clock::time_point t0 = Clock::now();
    std::memcpy(destination + offset, source + offset, size);
    CompilerBarrier();
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    times.push_back(us);
    total += us;
  }
  Sample sample;
  sample.iterations = times.size();
  sample.seconds = SecondsSince(start);
  sample.mean_us = total / double(times.size());
  sample.median_us = Median(&times);
  return sample;
}

// --- raw loopback TCP ------------------------------------------------------------------------

// Commands the raw TCP receiver understands (the first word of a command).
enum RawCommand : uint64_t { kRawQuit = 0, kRawStream = 1, kRawPingPong = 2 };

// Sends exactly `length` bytes; false on error.
bool SendAll(int fd, const char* data, size_t length) {
  while (length > 0) {
    ssize_t n = ::send(fd, data, length, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    length -= static_cast<size_t>(n);
  }
  return true;
}

// Receives exactly `length` bytes; false on EOF or error.
bool RecvAll(int fd, char* data, size_t length) {
  while (length > 0) {
    ssize_t n = ::recv(fd, data, length, MSG_WAITALL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    length -= static_cast<size_t>(n);
  }
  return true;
}

// Turns Nagle off, as the tcp backend does on its sockets.
void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// The forked receiver of the raw TCP reference: connects, then serves commands until told to
// quit. Stream: receive `count` messages into a walking 64 MiB buffer, then one ack byte.
// Ping-pong: per message, receive it whole and answer with one byte.
int RawTcpReceiverMain(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return 1;
  }
  SetNoDelay(fd);
  char* buffer = MapTouched(kSpanBytes);
  if (buffer == nullptr) return 1;
  const char ack = 1;
  for (;;) {
    uint64_t command[3];
    if (!RecvAll(fd, reinterpret_cast<char*>(command), sizeof(command))) return 1;
    const uint64_t size = command[1];
    const uint64_t count = command[2];
    if (command[0] == kRawQuit) return 0;
    for (uint64_t i = 0; i < count; i++) {
      if (!RecvAll(fd, buffer + WalkOffset(i, size), size)) return 1;
      if (command[0] == kRawPingPong && !SendAll(fd, &ack, 1)) return 1;
    }
    if (command[0] == kRawStream && !SendAll(fd, &ack, 1)) return 1;
  }
}

// The sending side of the raw TCP reference, with its forked receiver.
class RawTcpPeer {
 public:
  // Stops the receiver and reaps it.
  ~RawTcpPeer() {
    if (fd_ >= 0) {
      uint64_t quit[3] = {kRawQuit, 0, 0};
      SendAll(fd_, reinterpret_cast<const char*>(quit), sizeof(quit));
      ::close(fd_);
    }
    if (child_ > 0) ReapChild(child_);
  }

  // Forks the receiver and accepts its connection; false (with `error`) on failure.
  bool Start(std::string* error) {
    int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = 0;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::listen(listener, 1) != 0 ||
        ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      *error = std::string("raw tcp listen: ") + std::strerror(errno);
      return false;
    }
    std::fflush(nullptr);
    child_ = ::fork();
    if (child_ == 0) {
      ::close(listener);
      ::_exit(RawTcpReceiverMain(ntohs(address.sin_port)));
    }
    pollfd p{listener, POLLIN, 0};
    if (child_ < 0 || ::poll(&p, 1, 10000) != 1) {
      *error = "raw tcp: the receiver did not connect";
      ::close(listener);
      return false;
    }
    fd_ = ::accept(listener, nullptr, nullptr);
    ::close(listener);
    if (fd_ < 0) {
      *error = std::string("raw tcp accept: ") + std::strerror(errno);
      return false;
    }
    SetNoDelay(fd_);
    return true;
  }

  // Streams `count` messages of `size` bytes and waits for the receiver's ack: seconds taken.
  std::optional<double> Stream(const char* source, size_t size, uint64_t count) {
    uint64_t command[3] = {kRawStream, size, count};
    const Clock::time_point start = Clock::now();
    if (!SendAll(fd_, reinterpret_cast<const char*>(command), sizeof(command))) return {};
    for (uint64_t i = 0; i < count; i++) {
      if (!SendAll(fd_, source + WalkOffset(i, size), size)) return {};
    }
    char ack;
    if (!RecvAll(fd_, &ack, 1)) return {};
    return SecondsSince(start);
  }

  // Streams for about `seconds` (after a calibration burst) and reports the bandwidth.
  std::optional<Sample> Bandwidth(const char* source, size_t size, double seconds) {
    uint64_t count = std::clamp<uint64_t>((8u << 20) / size, 16, 20000);
    std::optional<double> taken = Stream(source, size, count);
    if (!taken) return {};
    count = std::clamp<uint64_t>(uint64_t(double(count) * seconds / std::max(*taken, 1e-6)), 16,
                                 uint64_t(1) << 26);
    taken = Stream(source, size, count);
    if (!taken) return {};
    Sample sample;
    sample.iterations = count;
    sample.seconds = *taken;
    sample.mib_per_s = double(count) * double(size) / *taken / double(kMiB);
    return sample;
  }

  // Ping-pongs `size`-byte messages (answered with one byte) for about `seconds`.
  std::optional<Sample> Latency(const char* source, size_t size, double seconds) {
    std::vector<double> times;
    double total = 0;
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = After(start, seconds);
    // Commands of 16 round trips keep the receiver in step without knowing the count ahead.
    while ((times.size() < 16 || Clock::now() < deadline) && times.size() < 1000000) {
      uint64_t command[3] = {kRawPingPong, size, 16};
      if (!SendAll(fd_, reinterpret_cast<const char*>(command), sizeof(command))) return {};
      for (int i = 0; i < 16; i++) {
        const Clock::time_point t0 = Clock::now();
        char ack;
        if (!SendAll(fd_, source + WalkOffset(times.size(), size), size) ||
            !RecvAll(fd_, &ack, 1)) {
          return {};
        }
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        times.push_back(us);
        total += us;
      }
    }
    Sample sample;
    sample.iterations = times.size();
    sample.seconds = SecondsSince(start);
    sample.mean_us = total / double(times.size());
    sample.median_us = Median(&times);
    return sample;
  }

 private:
  int fd_ = -1;
  pid_t child_ = -1;
};

// --- the rdma transports ---------------------------------------------------------------------

// Transport options both sides of a benchmark connection use.
rdma::TransportOptions BenchOptions(const std::string& backend) {
  rdma::TransportOptions options;
  options.backend = backend;
  options.secret = kSecret;
  options.connect_timeout_ms = 10000;
  return options;
}

// Prints a failed status of the forked target to stderr and returns the child's exit code.
int TargetFailed(const char* what, const rdma::Status& status) {
  std::fprintf(stderr, "rdma_bench target: %s: %s\n", what, status.ToString().c_str());
  return 1;
}

// The forked target: connects, registers a 64 MiB region for remote writes, sends its
// description in a SEND, then does nothing but poll until the initiator disconnects (the shm
// target's CPU has no part in WRITEs; the tcp target's agent thread places them).
int TargetMain(const std::string& backend, const std::string& address) {
  std::unique_ptr<rdma::Connection> connection;
  rdma::Status s = rdma::Connect(BenchOptions(backend), address, &connection);
  if (!s.ok()) return TargetFailed("connect", s);
  rdma::LocalRegion target, message;
  s = connection->AllocateRegion(kSpanBytes, rdma::kRemoteWrite, &target);
  if (s.ok()) {
    s = connection->AllocateRegion(sizeof(rdma::RemoteRegion), rdma::kLocalOnly, &message);
  }
  if (!s.ok()) return TargetFailed("allocate", s);
  const rdma::RemoteRegion description = connection->Describe(target);
  std::memcpy(message.addr, &description, sizeof(description));
  rdma::Sge sge{message.addr, uint32_t(sizeof(description)), message.lkey};
  rdma::WorkRequest send;
  send.opcode = rdma::Opcode::kSend;
  send.sg_list = &sge;
  send.num_sge = 1;
  s = connection->Post(&send, 1);
  if (!s.ok()) return TargetFailed("post send", s);
  for (;;) {
    rdma::Completion completions[16];
    size_t count = 0;
    s = connection->Poll(completions, 16, 200, &count);
    if (!s.ok()) return 0;  // the initiator is done and disconnected
  }
}

// The initiating side of one backend, with its forked target.
class TransportPeer {
 public:
  // A peer for `backend` ("shm" or "tcp"); Start() sets it up.
  explicit TransportPeer(std::string backend) : backend_(std::move(backend)) {}

  // Disconnects (which ends the target) and reaps the target.
  ~TransportPeer() {
    connection_.reset();
    if (child_ > 0) ReapChild(child_);
  }

  // Forks the target, accepts it, learns its region and writes the region once so that every
  // page exists before timing; false (with `error`) on failure.
  bool Start(const Flags& flags, std::string* error) {
    window_ = flags.window;
    busy_poll_ = flags.busy_poll;
    std::unique_ptr<rdma::Listener> listener;
    rdma::Status s = rdma::Listen(BenchOptions(backend_), "127.0.0.1:0", &listener);
    if (!s.ok()) return Fail("listen", s, error);
    const std::string address = listener->address();
    std::fflush(nullptr);
    child_ = ::fork();
    if (child_ == 0) {
      listener.reset();
      ::_exit(TargetMain(backend_, address));
    }
    if (child_ < 0) return Fail("fork", rdma::Status::IOError(std::strerror(errno)), error);
    s = listener->Accept(10000, &connection_);
    if (!s.ok()) return Fail("accept", s, error);
    if (connection_->backend() != backend_) {
      *error = backend_ + ": the connection runs on " + connection_->backend();
      return false;
    }
    rdma::LocalRegion message;
    s = connection_->AllocateRegion(kSpanBytes, rdma::kLocalOnly, &source_);
    if (s.ok()) {
      s = connection_->AllocateRegion(sizeof(rdma::RemoteRegion), rdma::kLocalOnly, &message);
    }
    if (!s.ok()) return Fail("allocate", s, error);
    std::memset(source_.addr, 0x5a, source_.length);
    rdma::RecvRequest recv{
        1, rdma::Sge{message.addr, uint32_t(sizeof(rdma::RemoteRegion)), message.lkey}};
    s = connection_->PostRecv(&recv, 1);
    if (!s.ok()) return Fail("post recv", s, error);
    s = WaitCompletions(1, nullptr);
    if (!s.ok()) return Fail("receive the target's region", s, error);
    std::memcpy(&target_, message.addr, sizeof(target_));
    if (target_.length < kSpanBytes) {
      *error = backend_ + ": the target's region is too small";
      return false;
    }
    std::optional<Sample> warm = Bandwidth(kMiB, 0.0, error);
    return warm.has_value();
  }

  // Keeps `window` signaled WRITEs of `size` bytes in flight for about `seconds` (and at least
  // 16 WRITEs), then waits for all of them.
  std::optional<Sample> Bandwidth(size_t size, double seconds, std::string* error) {
    const uint64_t minimum = std::max<uint64_t>(16, seconds == 0 ? kSpanBytes / size : 0);
    constexpr uint32_t kMaxPostList = 32;
    std::vector<rdma::WorkRequest> requests(kMaxPostList);
    std::vector<rdma::Sge> sges(kMaxPostList);
    uint64_t posted = 0, completed = 0;
    bool stop = false;
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = After(start, seconds);
    while (!stop || completed < posted) {
      if (!stop) {
        const uint64_t room = window_ - (posted - completed);
        const uint32_t count = uint32_t(std::min<uint64_t>(room, kMaxPostList));
        for (uint32_t k = 0; k < count; k++) {
          const size_t offset = WalkOffset(posted + k, size);
          sges[k] = rdma::Sge{source_.addr + offset, uint32_t(size), source_.lkey};
          requests[k] = WriteRequest(posted + k, &sges[k], offset);
        }
        rdma::Status s = connection_->Post(requests.data(), count);
        if (!s.ok()) {
          Fail("post", s, error);
          return {};
        }
        posted += count;
      }
      size_t done = 0;
      rdma::Status s = WaitCompletions(1, &done);
      if (!s.ok()) {
        Fail("poll", s, error);
        return {};
      }
      completed += done;
      if (!stop && posted >= minimum && Clock::now() >= deadline) stop = true;
    }
    Sample sample;
    sample.iterations = posted;
    sample.seconds = SecondsSince(start);
    sample.mib_per_s = double(posted) * double(size) / sample.seconds / double(kMiB);
    return sample;
  }

  // Posts one signaled WRITE and waits for its completion, over and over for about `seconds`.
  // With `package_pattern` it posts what the channel posts per package instead: an unsignaled
  // WRITE of `size` bytes, then a signaled 8-byte WRITE with `fence`, and waits for the latter.
  std::optional<Sample> Latency(size_t size, double seconds, bool package_pattern,
                                std::string* error) {
    std::vector<double> times;
    double total = 0;
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = After(start, seconds);
    while ((times.size() < 16 || Clock::now() < deadline) && times.size() < 1000000) {
      const size_t offset = WalkOffset(times.size(), size);
      rdma::Sge sges[2] = {{source_.addr + offset, uint32_t(size), source_.lkey},
                           {source_.addr, 8, source_.lkey}};
      rdma::WorkRequest requests[2] = {WriteRequest(times.size(), &sges[0], offset),
                                       WriteRequest(times.size(), &sges[1], offset)};
      requests[0].signaled = !package_pattern;
      requests[1].fence = true;
      const Clock::time_point t0 = Clock::now();
      rdma::Status s = connection_->Post(requests, package_pattern ? 2 : 1);
      if (s.ok()) s = WaitCompletions(1, nullptr);
      if (!s.ok()) {
        Fail("latency", s, error);
        return {};
      }
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      times.push_back(us);
      total += us;
    }
    Sample sample;
    sample.iterations = times.size();
    sample.seconds = SecondsSince(start);
    sample.mean_us = total / double(times.size());
    sample.median_us = Median(&times);
    return sample;
  }

 private:
  // A signaled WRITE of one Sge to `offset` in the target's region.
  rdma::WorkRequest WriteRequest(uint64_t id, const rdma::Sge* sge, size_t offset) const {
    rdma::WorkRequest request;
    request.wr_id = id;
    request.opcode = rdma::Opcode::kWrite;
    request.sg_list = sge;
    request.num_sge = 1;
    request.remote_addr = target_.addr + offset;
    request.rkey = target_.rkey;
    return request;
  }

  // Polls until at least `at_least` completions arrived (all successful); their number goes to
  // `count` when given. Busy-polls with --busy-poll, else sleeps in Poll.
  rdma::Status WaitCompletions(size_t at_least, size_t* count) {
    rdma::Completion completions[64];
    size_t total = 0;
    Clock::time_point last_progress = Clock::now();
    while (total < at_least) {
      size_t n = 0;
      rdma::Status s = connection_->Poll(completions, 64, busy_poll_ ? 0 : kPollTimeoutMs, &n);
      if (!s.ok()) return s;
      for (size_t i = 0; i < n; i++) {
        if (completions[i].status != rdma::WcStatus::kSuccess) {
          return rdma::Status::IOError("a work request failed");
        }
      }
      total += n;
      if (n > 0) {
        last_progress = Clock::now();
      } else if (SecondsSince(last_progress) * 1000 > kStallTimeoutMs) {
        return rdma::Status::Timeout("no completion for 30 s");
      }
    }
    if (count != nullptr) *count = total;
    return rdma::Status::OK();
  }

  // Fills `error` with what failed; returns false.
  bool Fail(const char* what, const rdma::Status& status, std::string* error) const {
    *error = backend_ + " " + what + ": " + status.ToString();
    return false;
  }

  std::string backend_;
  uint32_t window_ = 128;
  bool busy_poll_ = false;
  pid_t child_ = -1;
  std::unique_ptr<rdma::Connection> connection_;
  rdma::LocalRegion source_;
  rdma::RemoteRegion target_;
};

// --- UCX -------------------------------------------------------------------------------------

// The full path of `program` found in PATH, or "" when it is not installed.
std::string FindInPath(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "/usr/bin:/bin";
  while (!rest.empty()) {
    size_t colon = rest.find(':');
    std::string candidate = std::string(rest.substr(0, colon)) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  return "";
}

// A TCP port that was free a moment ago (ucx_perftest needs one given on its command line).
uint16_t FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(address);
  uint16_t port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

// True when a socket of this machine listens on TCP `port` (read from /proc/net/tcp and
// tcp6, so the listener is not disturbed by a probing connection).
bool SomeoneListensOn(uint16_t port) {
  char wanted[8];
  std::snprintf(wanted, sizeof(wanted), ":%04X", unsigned(port));
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    FILE* file = std::fopen(path, "r");
    if (file == nullptr) continue;
    char line[512];
    bool found = false;
    while (!found && std::fgets(line, sizeof(line), file) != nullptr) {
      // Fields: sl local_address rem_address st ...; state 0A is LISTEN.
      char local[128], remote[128], state[8];
      if (std::sscanf(line, "%*s %127s %127s %7s", local, remote, state) != 3) continue;
      const size_t length = std::strlen(local);
      found = length >= 5 && std::strcmp(local + length - 5, wanted) == 0 &&
              std::strcmp(state, "0A") == 0;
    }
    std::fclose(file);
    if (found) return true;
  }
  return false;
}

// Waits up to `timeout_ms` for a listener on `port`.
bool WaitForListener(uint16_t port, int timeout_ms) {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < deadline) {
    if (SomeoneListensOn(port)) return true;
    ::usleep(20000);
  }
  return false;
}

// A child process running a program with UCX_TLS=tcp, its stdout and stderr on one pipe.
class Spawned {
 public:
  // Kills the child if it still runs and reaps it.
  ~Spawned() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }

  // Starts `argv` (argv[0] a full path); false on failure.
  bool Start(const std::vector<std::string>& argv) {
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return false;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
    std::vector<std::string> environment;
    for (char** e = environ; *e != nullptr; e++) {
      if (std::strncmp(*e, "UCX_TLS=", 8) != 0) environment.emplace_back(*e);
    }
    environment.emplace_back("UCX_TLS=tcp");
    std::vector<char*> env_pointers, arg_pointers;
    for (std::string& e : environment) env_pointers.push_back(e.data());
    env_pointers.push_back(nullptr);
    std::vector<std::string> args = argv;
    for (std::string& a : args) arg_pointers.push_back(a.data());
    arg_pointers.push_back(nullptr);
    int rc = ::posix_spawn(&pid_, args[0].c_str(), &actions, nullptr, arg_pointers.data(),
                           env_pointers.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipe_fds[1]);
    out_ = pipe_fds[0];
    if (rc != 0) pid_ = -1;
    return rc == 0;
  }

  // Reads until the output ends (the child exited) or `timeout_ms` passes; true if it ended.
  bool ReadToEnd(int timeout_ms) {
    const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      int left = int(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      if (left <= 0) return false;
      if (!ReadSome(left)) return true;
    }
  }

  // Everything the child printed so far.
  const std::string& output() const { return output_; }

 private:
  // Appends what the pipe has within `timeout_ms`; false at end of output or on timeout.
  bool ReadSome(int timeout_ms) {
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char buffer[4096];
    ssize_t n = ::read(out_, buffer, sizeof(buffer));
    if (n <= 0) return false;
    output_.append(buffer, size_t(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  std::string output_;
};

// The overall_bw column (MiB/s) of ucx_perftest's CSV output (-v -f), if present.
std::optional<double> ParseUcxBandwidth(const std::string& output) {
  size_t header = output.find("overall_bw");
  if (header == std::string::npos) return {};
  size_t line_start = output.rfind('\n', header);
  line_start = line_start == std::string::npos ? 0 : line_start + 1;
  std::vector<std::string> names = SplitWords(
      std::string_view(output).substr(line_start, output.find('\n', header) - line_start));
  size_t column = std::find(names.begin(), names.end(), "overall_bw") - names.begin();
  size_t values_start = output.find('\n', header);
  if (values_start == std::string::npos) return {};
  values_start++;
  size_t values_end = output.find('\n', values_start);
  std::vector<std::string> values = SplitWords(std::string_view(output).substr(
      values_start,
      values_end == std::string::npos ? std::string::npos : values_end - values_start));
  if (column >= values.size()) return {};
  char* end = nullptr;
  double value = std::strtod(values[column].c_str(), &end);
  if (end == values[column].c_str()) return {};
  return value;
}

// Runs `ucx_perftest -t ucp_put_bw` over UCX's tcp transport on loopback (server without a
// host, client at 127.0.0.1) for `size`-byte puts and returns its overall bandwidth in MiB/s.
std::optional<double> UcxPutBandwidth(const std::string& program, size_t size, std::string* error) {
  const uint64_t iterations = std::clamp<uint64_t>((1ull << 30) / size, 200, 200000);
  const uint64_t warmup = std::max<uint64_t>(iterations / 10, 10);
  for (int attempt = 0; attempt < 3; attempt++) {
    const uint16_t port_number = FreePort();
    const std::string port = std::to_string(port_number);
    std::vector<std::string> common = {"-t", "ucp_put_bw",
                                       "-s", std::to_string(size),
                                       "-n", std::to_string(iterations),
                                       "-w", std::to_string(warmup),
                                       "-p", port,
                                       "-f", "-v"};
    std::vector<std::string> server_argv = {program};
    server_argv.insert(server_argv.end(), common.begin(), common.end());
    std::vector<std::string> client_argv = {program, "127.0.0.1"};
    client_argv.insert(client_argv.end(), common.begin(), common.end());
    Spawned server;
    if (!server.Start(server_argv)) {
      *error = "cannot start ucx_perftest";
      return {};
    }
    if (!WaitForListener(port_number, 10000)) {
      server.ReadToEnd(100);
      *error = "ucx_perftest server did not start listening: " + server.output();
      continue;  // most likely the port was taken meanwhile
    }
    Spawned client;
    if (!client.Start(client_argv)) {
      *error = "cannot start ucx_perftest";
      return {};
    }
    if (!client.ReadToEnd(120000)) {
      *error = "ucx_perftest client timed out";
      continue;
    }
    server.ReadToEnd(5000);
    std::optional<double> bandwidth = ParseUcxBandwidth(client.output());
    if (bandwidth) return bandwidth;
    *error = "no bandwidth in ucx_perftest's output: " + client.output();
  }
  return {};
}

// --- report ----------------------------------------------------------------------------------

// Every measurement of the run, by test ("bw"/"lat"), series and size.
using Results = std::map<std::string, std::map<std::string, std::map<size_t, Sample>>>;

// The bandwidth of `series` at `size`, if measured.
std::optional<double> BandwidthAt(const Results& results, const std::string& series, size_t size) {
  auto test = results.find("bw");
  if (test == results.end()) return {};
  auto s = test->second.find(series);
  if (s == test->second.end()) return {};
  auto point = s->second.find(size);
  if (point == s->second.end()) return {};
  return point->second.mib_per_s;
}

// A table cell: the value with `decimals` digits (more below 10 when 0 were asked for), or "-".
std::string Cell(std::optional<double> value, int decimals) {
  if (!value) return "-";
  if (decimals == 0 && *value < 10) decimals = *value < 1 ? 3 : 1;  // small values stay readable
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", decimals, *value);
  return text;
}

// The ratio a/b as a cell, "-" when either is missing.
std::string RatioCell(std::optional<double> a, std::optional<double> b) {
  if (!a || !b || *b <= 0) return "-";
  return Cell(*a / *b, 2);
}

// Prints the bandwidth table with the ratios the goals use.
void PrintBandwidthTable(const Results& results, const std::vector<size_t>& sizes,
                         const Flags& flags) {
  std::printf("\nWRITE bandwidth (MiB/s; window %u; median of %d round(s) of %.2f s)\n",
              flags.window, flags.repeat, flags.seconds);
  std::printf("%-6s | %9s | %9s | %9s | %9s | %9s | %10s | %7s | %7s\n", "size", "memcpy",
              "raw tcp", "shm", "tcp", "ucx put", "shm/memcpy", "tcp/raw", "tcp/ucx");
  std::printf(
      "-------+-----------+-----------+-----------+-----------+-----------+------------+"
      "---------+--------\n");
  for (size_t size : sizes) {
    auto memcpy_bw = BandwidthAt(results, "memcpy", size);
    auto raw = BandwidthAt(results, "raw_tcp", size);
    auto shm = BandwidthAt(results, "shm", size);
    auto tcp = BandwidthAt(results, "tcp", size);
    auto ucx = BandwidthAt(results, "ucx_tcp_put", size);
    std::printf("%-6s | %9s | %9s | %9s | %9s | %9s | %10s | %7s | %7s\n", SizeName(size).c_str(),
                Cell(memcpy_bw, 0).c_str(), Cell(raw, 0).c_str(), Cell(shm, 0).c_str(),
                Cell(tcp, 0).c_str(), Cell(ucx, 0).c_str(), RatioCell(shm, memcpy_bw).c_str(),
                RatioCell(tcp, raw).c_str(), RatioCell(tcp, ucx).c_str());
  }
}

// Prints the latency table (median microseconds per operation).
void PrintLatencyTable(const Results& results, const std::vector<size_t>& sizes) {
  std::printf(
      "\nlatency (usec, median; WRITE until its completion; raw tcp: message until a "
      "1-byte answer)\n");
  std::printf("%-6s | %9s | %9s | %9s | %9s | %9s | %9s\n", "size", "memcpy", "raw tcp", "shm",
              "tcp", "shm pkg", "tcp pkg");
  std::printf("-------+-----------+-----------+-----------+-----------+-----------+----------\n");
  auto latency = [&](const std::string& series, size_t size) -> std::optional<double> {
    auto test = results.find("lat");
    if (test == results.end()) return {};
    auto s = test->second.find(series);
    if (s == test->second.end()) return {};
    auto point = s->second.find(size);
    if (point == s->second.end()) return {};
    return point->second.median_us;
  };
  for (size_t size : sizes) {
    std::printf("%-6s | %9s | %9s | %9s | %9s | %9s | %9s\n", SizeName(size).c_str(),
                Cell(latency("memcpy", size), 2).c_str(), Cell(latency("raw_tcp", size), 2).c_str(),
                Cell(latency("shm", size), 2).c_str(), Cell(latency("tcp", size), 2).c_str(),
                Cell(latency("shm_package", size), 2).c_str(),
                Cell(latency("tcp_package", size), 2).c_str());
  }
  std::printf(
      "(pkg: the channel's per-package pattern, a WRITE of the size then a fenced 8-byte "
      "WRITE, until the latter completes)\n");
}

// Prints one goal line: PASS/MISS with the ratio, or why it was not measured.
void PrintGoal(const char* text, std::optional<double> a, std::optional<double> b, double goal,
               const char* missing_reason) {
  if (!a || !b || *b <= 0) {
    std::printf("goal %-46s SKIPPED (%s)\n", text, missing_reason);
    return;
  }
  const double ratio = *a / *b;
  std::printf("goal %-46s %s (ratio %.2f: %.0f vs %.0f MiB/s)\n", text,
              ratio >= goal ? "PASS" : "MISS", ratio, *a, *b);
}

// Prints the slowest and fastest round of every series at `size` (how noisy the run was).
void PrintSpread(const Results& results, size_t size) {
  auto test = results.find("bw");
  if (test == results.end()) return;
  std::string line;
  for (const auto& [series, points] : test->second) {
    auto point = points.find(size);
    if (point == points.end()) continue;
    char text[96];
    std::snprintf(text, sizeof(text), " %s %.0f..%.0f;", series.c_str(),
                  point->second.min_mib_per_s, point->second.max_mib_per_s);
    line += text;
  }
  if (!line.empty()) {
    std::printf("rounds at %s (min..max MiB/s):%s\n", SizeName(size).c_str(), line.c_str());
  }
}

// Writes every sample to DIR/transport.csv; false on I/O failure.
bool WriteCsv(const Results& results, const std::string& directory) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  const std::string path = directory + "/transport.csv";
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return false;
  std::fprintf(file,
               "test,series,size,iterations,seconds,mib_per_s,min_mib_per_s,max_mib_per_s,"
               "rounds,median_us,mean_us\n");
  for (const auto& [test, series_map] : results) {
    for (const auto& [series, points] : series_map) {
      for (const auto& [size, sample] : points) {
        std::fprintf(file, "%s,%s,%zu,%" PRIu64 ",%.6f,%.3f,%.3f,%.3f,%d,%.3f,%.3f\n", test.c_str(),
                     series.c_str(), size, sample.iterations, sample.seconds, sample.mib_per_s,
                     sample.min_mib_per_s, sample.max_mib_per_s, sample.rounds, sample.median_us,
                     sample.mean_us);
      }
    }
  }
  const bool ok = std::fclose(file) == 0;
  if (ok) std::printf("\nwrote %s\n", path.c_str());
  return ok;
}

// Runs every measurement, size by size, so that all series of one size are measured within a
// second or two of each other; prints the tables and the goals. Returns the exit code.
int Run(const Flags& flags) {
  std::vector<size_t> sizes;
  for (size_t size = flags.min_size; size <= flags.max_size; size *= 2) sizes.push_back(size);
  std::vector<size_t> ucx_sizes;
  if (flags.ucx_sizes == "all") {
    ucx_sizes = sizes;
  } else if (flags.ucx_sizes != "none" && !ParseSizeList(flags.ucx_sizes, &ucx_sizes)) {
    std::fprintf(stderr, "bad --ucx-sizes\n");
    return 2;
  }
  const std::string ucx_program = FindInPath("ucx_perftest");
  std::string ucx_missing = "not asked for";
  if (!ucx_sizes.empty() && ucx_program.empty()) {
    ucx_missing = "ucx_perftest not found; apt-get install -y ucx-utils";
    std::printf(
        "NOTE: ucx_perftest is not installed (Debian package ucx-utils): the UCX column "
        "is skipped.\n");
    ucx_sizes.clear();
  } else if (!ucx_sizes.empty()) {
    ucx_missing = "UCX not measured at 1 MiB";
  }

  std::printf("rdma_bench: sizes %s..%s, backends", SizeName(sizes.front()).c_str(),
              SizeName(sizes.back()).c_str());
  for (const std::string& b : flags.backends) std::printf(" %s", b.c_str());
  std::printf("; targets are forked processes on 127.0.0.1; %s completion polling\n",
              flags.busy_poll ? "busy" : "sleeping");

  char* memcpy_source = MapTouched(kSpanBytes);
  char* memcpy_destination = MapTouched(kSpanBytes);
  if (memcpy_source == nullptr || memcpy_destination == nullptr) {
    std::fprintf(stderr, "cannot map the memcpy buffers\n");
    return 1;
  }
  std::string error;
  RawTcpPeer raw_tcp;
  if (!raw_tcp.Start(&error)) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  std::vector<std::unique_ptr<TransportPeer>> peers;
  for (const std::string& backend : flags.backends) {
    peers.push_back(std::make_unique<TransportPeer>(backend));
    if (!peers.back()->Start(flags, &error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return 1;
    }
  }

  Results results;
  for (size_t size : sizes) {
    std::printf("  measuring %s ...\n", SizeName(size).c_str());
    std::fflush(stdout);
    // Bandwidth: every series once per round, rounds interleaved, median of the rounds.
    std::map<std::string, std::vector<Sample>> rounds;
    for (int round = 0; round < flags.repeat; round++) {
      rounds["memcpy"].push_back(
          MemcpyBandwidth(memcpy_destination, memcpy_source, size, flags.seconds));
      std::optional<Sample> sample = raw_tcp.Bandwidth(memcpy_source, size, flags.seconds);
      if (!sample) {
        std::fprintf(stderr, "raw tcp stream failed at %s\n", SizeName(size).c_str());
        return 1;
      }
      rounds["raw_tcp"].push_back(*sample);
      for (size_t i = 0; i < peers.size(); i++) {
        sample = peers[i]->Bandwidth(size, flags.seconds, &error);
        if (!sample) {
          std::fprintf(stderr, "%s\n", error.c_str());
          return 1;
        }
        rounds[flags.backends[i]].push_back(*sample);
      }
      if (std::find(ucx_sizes.begin(), ucx_sizes.end(), size) != ucx_sizes.end()) {
        std::optional<double> ucx = UcxPutBandwidth(ucx_program, size, &error);
        if (ucx) {
          Sample ucx_sample;
          ucx_sample.mib_per_s = *ucx;
          rounds["ucx_tcp_put"].push_back(ucx_sample);
        } else {
          std::printf("NOTE: ucx_perftest at %s failed (%s)\n", SizeName(size).c_str(),
                      error.c_str());
        }
      }
    }
    for (auto& [series, samples] : rounds) results["bw"][series][size] = MedianSample(&samples);
    if (size == kMiB && results["bw"]["ucx_tcp_put"].count(size) == 0 && !ucx_sizes.empty()) {
      ucx_missing = "ucx_perftest failed at 1 MiB";
    }
    // Latency: one run per series.
    results["lat"]["memcpy"][size] =
        MemcpyLatency(memcpy_destination, memcpy_source, size, flags.lat_seconds);
    std::optional<Sample> sample = raw_tcp.Latency(memcpy_source, size, flags.lat_seconds);
    if (!sample) {
      std::fprintf(stderr, "raw tcp ping-pong failed at %s\n", SizeName(size).c_str());
      return 1;
    }
    results["lat"]["raw_tcp"][size] = *sample;
    for (size_t i = 0; i < peers.size(); i++) {
      for (bool package_pattern : {false, true}) {
        sample = peers[i]->Latency(size, flags.lat_seconds, package_pattern, &error);
        if (!sample) {
          std::fprintf(stderr, "%s\n", error.c_str());
          return 1;
        }
        results["lat"][flags.backends[i] + (package_pattern ? "_package" : "")][size] = *sample;
      }
    }
  }
  peers.clear();

  PrintBandwidthTable(results, sizes, flags);
  PrintLatencyTable(results, sizes);
  std::printf("\n");
  PrintSpread(results, kMiB);
  PrintGoal("shm WRITE bw @1MiB >= 0.70 x memcpy loop", BandwidthAt(results, "shm", kMiB),
            BandwidthAt(results, "memcpy", kMiB), 0.70, "1 MiB or shm not measured");
  PrintGoal("tcp WRITE bw @1MiB >= 0.80 x raw loopback TCP", BandwidthAt(results, "tcp", kMiB),
            BandwidthAt(results, "raw_tcp", kMiB), 0.80, "1 MiB or tcp not measured");
  PrintGoal("tcp WRITE bw @1MiB >= 3 x UCX tcp ucp_put_bw", BandwidthAt(results, "tcp", kMiB),
            BandwidthAt(results, "ucx_tcp_put", kMiB), 3.0, ucx_missing.c_str());
  if (!flags.csv_dir.empty() && !WriteCsv(results, flags.csv_dir)) {
    std::fprintf(stderr, "cannot write CSV into %s\n", flags.csv_dir.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

// Parses the flags and runs the benchmark; no exception leaves main.
int main(int argc, char** argv) {
  try {
    ::signal(SIGPIPE, SIG_IGN);
    Flags flags;
    if (!ParseFlags(argc, argv, &flags)) return 2;
    return Run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rdma_bench: %s\n", e.what());
    return 1;
  }
}
