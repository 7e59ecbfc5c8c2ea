// region_bench: D-RDMA's declarative non-contiguous regions (CIDR 2022; rdma/region.h,
// schedule.h, transfer.h) against the two ways a database ships scattered data today, on the
// shm and tcp backends.
//
//  A. Calibration: the four TransferCosts constants of a backend, measured on a connected pair
//     (WRITEs from the client into a remote-writable region of the server):
//      * wire_byte_ns: 1 MiB WRITEs of one gather entry, time per byte;
//      * piece_ns: WRITEs of max_sge() gather entries of 16 bytes (32 bytes apart in the
//        source): their time less the wire time of their bytes, per entry;
//      * copy_call_ns, copy_byte_ns: memcpy of pieces of variable length (averaging 8 and 256
//        bytes) into a staging buffer; the line through the two per-piece times;
//      * period_piece_ns, period_byte_ns (backends with strided gathers): 1 MiB WRITEs that
//        gather one entry of 8, and of 32, bytes again and again, 4 times its length apart;
//        the line through the two per-entry times, less wire_byte_ns per byte.
//     WRITEs go out kPostList per Post with the last one signaled, never more than
//     max_outstanding in flight.
//  B. D-RDMA's scenarios (§2.1 and §2.2, measured as in §5.1 and §5.2), three methods each:
//      * shuffle: a columnar table of --rows rows x 5 int4 columns (5 arrays in one buffer),
//        every row hashed (multiplicatively, by its number) to one of 2 targets;
//      * projection: --rows rows of 128 bytes (16 x 8-byte columns), columns 0, 1 and 5 of
//        every row to 1 target.
//     Methods: per-fragment (one work request per row, one gather entry per value or per
//     contiguous field group: the zero-copy baseline of §5.1), copy-out (the values copied into
//     a 4 MiB staging buffer per target, one WRITE per full or final buffer: §5.2) and regions
//     (per target a layout, PlanSchedule, then one ScatterRegions call for all targets).
//     Per-fragment and copy-out deliver the rows one after another; regions deliver the
//     layout's payload order (column by column for the shuffle) in its wire image, which may
//     carry bridged gaps. The timed section holds the whole pass: the hashing for every method,
//     and building the masks, layouts and schedules for regions. Every method's result is
//     checked once per scenario (regions through rdma::Unpack); a mismatch makes the exit code 1.
//     The receiver's cost to Unpack the regions wire image into packed form is reported apart.
//
// Both ends of every connection live in this process (pairs over 127.0.0.1), so the receiver's
// bytes are checked in place. CPU time is CLOCK_PROCESS_CPUTIME_ID over the timed section: it
// includes the tcp backend's agent threads of both ends. Every number is the best of --reps
// rounds of at least --seconds each, the methods interleaved round by round.

#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bench_util.h"
#include "slipstream/rdma/region.h"
#include "slipstream/rdma/schedule.h"
#include "slipstream/rdma/status.h"
#include "slipstream/rdma/transfer.h"
#include "slipstream/rdma/transport.h"

namespace {

namespace rdma = slipstream::rdma;
using Clock = std::chrono::steady_clock;
using slipstream::bench::CompilerBarrier;
using slipstream::bench::ParseSize;
using slipstream::bench::SecondsSince;

constexpr char kUsage[] =
    "usage: region_bench [--backend=shm|tcp|both] [--calibrate-only] [--rows=65536] [--reps=3]\n"
    "                    [--seconds=0.3] [--costs=calibrated|library] [--csv=PATH]\n"
    "                    [--projection=0,1,5 ...]\n"
    "Calibrates the TransferCosts of each backend, then runs D-RDMA's shuffle and projection\n"
    "scenarios with per-fragment WRITEs, copy-out and regions. Every number is the best of\n"
    "--reps rounds of at least --seconds. --costs: plan the regions with the constants just\n"
    "calibrated (default) or with TransferCosts::Measured(backend). --csv writes\n"
    "backend,scenario,method,payload_gbps,cpu_s_per_gb,wire_bytes (method regions_unpack: the\n"
    "receiver unpacking the regions wire image). --projection: the projected columns (of 16),\n"
    "repeatable; default 0,1,5 (D-RDMA's) and 12 of the 16.\n";

constexpr char kSecret[] = "region_bench shared secret";
constexpr int kTimeoutMs = 30000;
constexpr uint32_t kMaxOutstanding = 256;   // TransportOptions' default, per connection
constexpr uint32_t kPostList = 32;          // work requests per Post (one doorbell)
constexpr size_t kStagingBytes = 4u << 20;  // copy-out's buffer per target (§5.2)
constexpr size_t kMiB = 1u << 20;
constexpr double kGB = 1e9;
constexpr uint64_t kMaxRows = 1u << 22;

// Everything the command line sets.
struct Flags {
  std::vector<std::string> backends = {"shm", "tcp"};
  bool calibrate_only = false;
  uint64_t rows = 65536;
  int reps = 3;
  double seconds = 0.3;
  bool library_costs = false;  // plan with TransferCosts::Measured instead of the calibration
  std::string csv;
  // Column sets of the projection scenario: D-RDMA's 3 of 16, and 12 of 16.
  std::vector<std::vector<uint32_t>> projections = {{0, 1, 5},
                                                    {0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13}};
};

// Reads "0,1,5" into ascending distinct columns below 16; false when it is not that.
bool ParseColumns(const std::string& text, std::vector<uint32_t>* columns) {
  columns->clear();
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos) return false;
    const uint32_t column = uint32_t(std::atoi(item.c_str()));
    if (column >= 16 || (!columns->empty() && column <= columns->back())) return false;
    columns->push_back(column);
    at = comma + 1;
  }
  return !columns->empty();
}

// Reads the command line into `flags`; false (after printing why) on a bad flag.
bool ParseFlags(int argc, char** argv, Flags* flags) {
  bool projection_given = false;
  for (int i = 1; i < argc; i++) {
    std::string_view arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string_view name = arg.substr(0, eq);
    const std::string value = eq == std::string_view::npos ? "" : std::string(arg.substr(eq + 1));
    bool ok = true;
    if (name == "--help" || name == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (name == "--backend") {
      if (value == "both") {
        flags->backends = {"shm", "tcp"};
      } else {
        flags->backends = {value};
        ok = value == "shm" || value == "tcp";
      }
    } else if (name == "--calibrate-only") {
      flags->calibrate_only = true;
    } else if (name == "--rows") {
      ok = ParseSize(value, &flags->rows) && flags->rows >= 64 && flags->rows <= kMaxRows;
    } else if (name == "--reps") {
      flags->reps = std::atoi(value.c_str());
      ok = flags->reps >= 1;
    } else if (name == "--seconds") {
      flags->seconds = std::atof(value.c_str());
      ok = flags->seconds > 0;
    } else if (name == "--costs") {
      flags->library_costs = value == "library";
      ok = value == "library" || value == "calibrated";
    } else if (name == "--projection") {  // repeatable; replaces the default column sets
      std::vector<uint32_t> columns;
      ok = ParseColumns(value, &columns);
      if (ok) {
        if (!projection_given) flags->projections.clear();
        projection_given = true;
        flags->projections.push_back(columns);
      }
    } else if (name == "--csv") {
      flags->csv = value;
      ok = !value.empty();
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad flag: %s\n%s", argv[i], kUsage);
      return false;
    }
  }
  return true;
}

// --- plumbing --------------------------------------------------------------------------------

// Seconds of CPU this process (all its threads) has used.
double CpuSeconds() {
  timespec now{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return double(now.tv_sec) + double(now.tv_nsec) * 1e-9;
}

// The byte at `index` of every source buffer: an irregular pattern, so misplaced bytes show.
char PatternByte(uint64_t index) {
  return static_cast<char>((index * 0x9E3779B97F4A7C15ull) >> 56);
}

// Anonymous memory, touched page by page when mapped and unmapped on destruction.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  // Unmaps the memory.
  ~Buffer() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }

  // Maps `size` zeroed bytes and touches them; false when the mapping fails.
  bool Map(size_t size) {
    void* memory =
        ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return false;
    data_ = static_cast<char*>(memory);
    size_ = size;
    std::memset(data_, 0, size_);
    return true;
  }

  // Fills the buffer with the source pattern.
  void FillPattern() {
    for (size_t i = 0; i < size_; i++) data_[i] = PatternByte(i);
  }

  // The first byte.
  char* data() const { return data_; }
  // The length in bytes.
  size_t size() const { return size_; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

// Both ends of a loopback connection of one backend, in this process.
struct Pair {
  std::unique_ptr<rdma::Connection> server;  // the receiving side (from Accept)
  std::unique_ptr<rdma::Connection> client;  // the initiating side (from Connect)
};

// Transport options both ends use.
rdma::TransportOptions BenchOptions(const std::string& backend) {
  rdma::TransportOptions options;
  options.backend = backend;
  options.secret = kSecret;
  options.connect_timeout_ms = 10000;
  options.max_outstanding = kMaxOutstanding;
  return options;
}

// Connects a pair of `backend` over 127.0.0.1.
rdma::Status MakePair(const std::string& backend, Pair* pair) {
  std::unique_ptr<rdma::Listener> listener;
  rdma::Status s = rdma::Listen(BenchOptions(backend), "127.0.0.1:0", &listener);
  if (!s.ok()) return s;
  auto accepted =
      std::async(std::launch::async, [&] { return listener->Accept(10000, &pair->server); });
  s = rdma::Connect(BenchOptions(backend), listener->address(), &pair->client);
  const rdma::Status a = accepted.get();
  if (!s.ok()) return s;
  if (!a.ok()) return a;
  if (pair->client->backend() != backend) {
    return rdma::Status::Unavailable("the connection runs on " + pair->client->backend());
  }
  return rdma::Status::OK();
}

// Waits for at least one and at most `max` completions on `connection`; all must be successes.
rdma::Status PollSome(rdma::Connection* connection, size_t max, size_t* got) {
  std::array<rdma::Completion, kPostList> completions;
  max = std::clamp<size_t>(max, 1, completions.size());
  const Clock::time_point start = Clock::now();
  for (;;) {
    size_t n = 0;
    rdma::Status s = connection->Poll(completions.data(), max, 100, &n);
    if (!s.ok()) return s;
    for (size_t i = 0; i < n; i++) {
      if (completions[i].status != rdma::WcStatus::kSuccess) {
        return rdma::Status::IOError("a WRITE failed with completion status " +
                                     std::to_string(int(completions[i].status)));
      }
    }
    if (n > 0) {
      *got = n;
      return rdma::Status::OK();
    }
    if (SecondsSince(start) * 1000 > kTimeoutMs) return rdma::Status::Timeout("no completion");
  }
}

// WRITEs to one target, posted kPostList at a time (one doorbell) with only the last of each
// list signaled. WRITEs are placed in order, so a list's completion retires it and everything
// before it; no more than kMaxOutstanding requests are ever posted and not known placed.
class RequestQueue {
 public:
  // A queue on `connection` for requests of up to `max_sge` gather entries.
  RequestQueue(rdma::Connection* connection, uint32_t max_sge)
      : connection_(connection),
        max_sge_(max_sge),
        requests_(kPostList),
        sges_(size_t(kPostList) * max_sge) {}

  // Queues a WRITE of `count` entries to `remote_addr`, posting the list when it is full;
  // false once anything failed (status() says what).
  bool Add(const rdma::Sge* sges, uint32_t count, uint64_t remote_addr, uint64_t rkey,
           uint32_t repeat = 1, uint64_t repeat_stride = 0) {
    rdma::Sge* slot = &sges_[size_t(queued_) * max_sge_];
    std::copy(sges, sges + count, slot);
    rdma::WorkRequest& request = requests_[queued_];
    request.wr_id = requests_posted_ + queued_;
    request.opcode = rdma::Opcode::kWrite;
    request.sg_list = slot;
    request.num_sge = count;
    request.remote_addr = remote_addr;
    request.rkey = rkey;
    request.signaled = false;
    request.repeat = repeat;
    request.repeat_stride = repeat_stride;
    pieces_ += count;
    if (++queued_ == kPostList) PostQueued();
    return status_.ok();
  }

  // Posts the queued requests (a partial list) without waiting.
  void Flush() {
    if (queued_ > 0) PostQueued();
  }

  // Posts what is queued and waits until everything posted is placed.
  rdma::Status Drain() {
    Flush();
    while (status_.ok() && !lists_.empty()) RetireOldest();
    return status_;
  }

  // Forgets the counts (not the failure) of earlier passes.
  void ResetCounts() {
    requests_posted_ = 0;
    pieces_ = 0;
  }

  // Work requests posted since the last ResetCounts.
  uint64_t requests() const { return requests_posted_; }
  // Gather entries queued since the last ResetCounts.
  uint64_t pieces() const { return pieces_; }
  // The first failure, or OK.
  const rdma::Status& status() const { return status_; }

 private:
  // Posts the queued list with its last request signaled, first retiring older lists while it
  // would exceed kMaxOutstanding (or the transport reports that it is full).
  void PostQueued() {
    requests_[queued_ - 1].signaled = true;
    while (status_.ok()) {
      if (in_flight_ + queued_ > kMaxOutstanding) {
        RetireOldest();
        continue;
      }
      const rdma::Status s = connection_->Post(requests_.data(), queued_);
      if (s.ok()) {
        lists_.push_back(queued_);
        in_flight_ += queued_;
        requests_posted_ += queued_;
        break;
      }
      if (s.code() != rdma::Status::Code::kWouldBlock || lists_.empty()) {
        status_ = s;
      } else {
        RetireOldest();
      }
    }
    queued_ = 0;
  }

  // Waits for the oldest list's completion (and takes any later ones that came with it).
  void RetireOldest() {
    size_t got = 0;
    const rdma::Status s = PollSome(connection_, lists_.size(), &got);
    if (!s.ok()) {
      status_ = s;
      return;
    }
    for (size_t i = 0; i < got && !lists_.empty(); i++) {
      in_flight_ -= lists_.front();
      lists_.pop_front();
    }
  }

  rdma::Connection* connection_;
  uint32_t max_sge_;
  std::vector<rdma::WorkRequest> requests_;
  std::vector<rdma::Sge> sges_;
  uint32_t queued_ = 0;
  std::deque<uint32_t> lists_;  // the sizes of the posted lists not known placed, oldest first
  uint64_t in_flight_ = 0;
  uint64_t requests_posted_ = 0;
  uint64_t pieces_ = 0;
  rdma::Status status_;
};

// Copy-out to one target (§5.2): bytes are appended to its staging buffer, which travels as one
// WRITE when full (waiting for it before the buffer is reused) and once more at the end.
class StagingWriter {
 public:
  // Starts a pass: the buffer is empty and the next WRITE lands at the start of `remote`.
  void Start(rdma::Connection* connection, const rdma::LocalRegion& staging,
             const rdma::RemoteRegion& remote) {
    connection_ = connection;
    staging_ = staging;
    remote_ = remote;
    capacity_ = std::min(kStagingBytes, staging.length);
    fill_ = 0;
    written_ = 0;
    writes_ = 0;
    pending_ = false;
  }

  // Room for `length` more bytes, shipping the full buffer first when needed.
  char* Room(size_t length) {
    if (fill_ + length > capacity_) Ship(/*wait=*/true);
    return staging_.addr + fill_;
  }

  // Takes `length` bytes written at Room().
  void Advance(size_t length) { fill_ += length; }

  // Posts the last buffer, if it holds anything, without waiting.
  void PostLast() {
    if (fill_ > 0) Ship(/*wait=*/false);
  }

  // Waits until the last WRITE is placed; the first failure of the pass, if any.
  rdma::Status WaitLast() {
    if (pending_ && status_.ok()) {
      size_t got = 0;
      status_ = PollSome(connection_, 1, &got);
    }
    pending_ = false;
    return status_;
  }

  // WRITEs posted this pass.
  uint64_t writes() const { return writes_; }
  // Bytes those WRITEs carry.
  uint64_t written() const { return written_; }

 private:
  // Posts the buffer as one signaled WRITE, and with `wait` waits for it to be placed.
  void Ship(bool wait) {
    if (status_.ok()) {
      const rdma::Sge sge{staging_.addr, uint32_t(fill_), staging_.lkey};
      rdma::WorkRequest request;
      request.wr_id = writes_;
      request.opcode = rdma::Opcode::kWrite;
      request.sg_list = &sge;
      request.num_sge = 1;
      request.remote_addr = remote_.addr + written_;
      request.rkey = remote_.rkey;
      status_ = connection_->Post(&request, 1);
      pending_ = status_.ok();
      if (wait) WaitLast();
    }
    written_ += fill_;
    writes_++;
    fill_ = 0;
  }

  rdma::Connection* connection_ = nullptr;
  rdma::LocalRegion staging_;
  rdma::RemoteRegion remote_;
  size_t capacity_ = 0;
  size_t fill_ = 0;
  uint64_t written_ = 0;
  uint64_t writes_ = 0;
  bool pending_ = false;
  rdma::Status status_;
};

// Wall and CPU time of a method's passes, repeated for a round.
struct Timing {
  uint64_t passes = 0;
  double seconds = 0;
  double cpu_seconds = 0;
};

// Runs `pass` over and over for at least `seconds` (at least once).
rdma::Status TimePasses(const std::function<rdma::Status()>& pass, double seconds, Timing* timing) {
  const double cpu_start = CpuSeconds();
  const Clock::time_point start = Clock::now();
  uint64_t passes = 0;
  do {
    rdma::Status s = pass();
    if (!s.ok()) return s;
    passes++;
  } while (SecondsSince(start) < seconds);
  timing->passes = passes;
  timing->seconds = SecondsSince(start);
  timing->cpu_seconds = CpuSeconds() - cpu_start;
  return rdma::Status::OK();
}

// --- A. calibration ---------------------------------------------------------------------------

// What calibration measured on one backend and the constants derived from it.
struct Calibration {
  double big_write_ns_per_byte = 0;  // 1 MiB one-entry WRITEs
  double gather_ns_per_byte = 0;     // WRITEs of `gather_entries` 16-byte entries
  uint32_t gather_entries = 0;
  double copy_small_ns = 0;    // per memcpy of a piece of about 8 bytes
  double copy_large_ns = 0;    // per memcpy of a piece of about 256 bytes
  double period_small_ns = 0;  // per entry of 8 bytes in a strided gather (0: none)
  double period_large_ns = 0;  // per entry of 32 bytes
  rdma::TransferCosts costs;
};

constexpr uint32_t kGatherPiece = 16;   // bytes per gather entry in the piece measurement
constexpr uint32_t kGatherStride = 32;  // their distance in the source
constexpr uint32_t kCopySmall = 8;      // average piece lengths of the copy measurement
constexpr uint32_t kCopyLarge = 256;
constexpr uint32_t kPeriodSmall = 8;  // entry lengths of the strided gather measurement
constexpr uint32_t kPeriodLarge = 32;
constexpr size_t kCalibrationSpan = 8u << 20;  // source and target of the calibration WRITEs

// Times WRITEs of `entries` gather entries of `piece` bytes, `stride` bytes apart in `source`
// (each WRITE's bytes land contiguously in `remote`), for about `seconds`: ns per byte moved.
rdma::Status TimeWrites(rdma::Connection* client, const rdma::LocalRegion& source,
                        const rdma::RemoteRegion& remote, uint32_t entries, uint32_t piece,
                        uint32_t stride, double seconds, double* ns_per_byte) {
  RequestQueue queue(client, entries);
  std::vector<rdma::Sge> sges(entries);
  const uint64_t request_bytes = uint64_t(entries) * piece;
  const uint64_t source_span = uint64_t(entries) * stride;
  const uint64_t source_slots = std::max<uint64_t>(1, source.length / source_span);
  const uint64_t remote_slots = std::max<uint64_t>(1, remote.length / request_bytes);
  uint64_t requests = 0;
  const Clock::time_point start = Clock::now();
  do {
    for (uint32_t k = 0; k < kPostList; k++, requests++) {
      const char* base = source.addr + (requests % source_slots) * source_span;
      for (uint32_t e = 0; e < entries; e++) {
        sges[e] = rdma::Sge{base + uint64_t(e) * stride, piece, source.lkey};
      }
      queue.Add(sges.data(), entries, remote.addr + (requests % remote_slots) * request_bytes,
                remote.rkey);
    }
  } while (queue.status().ok() && SecondsSince(start) < seconds);
  const rdma::Status s = queue.Drain();
  if (!s.ok()) return s;
  *ns_per_byte = SecondsSince(start) * 1e9 / double(requests * request_bytes);
  return rdma::Status::OK();
}

// Times 1 MiB strided gathers of one `piece`-byte entry, 4 * piece bytes apart in `source`,
// for about `seconds`: ns per entry copied.
rdma::Status TimeStridedWrites(rdma::Connection* client, const rdma::LocalRegion& source,
                               const rdma::RemoteRegion& remote, uint32_t piece, double seconds,
                               double* ns_per_entry) {
  RequestQueue queue(client, 1);
  const uint32_t repeat = uint32_t(kMiB / piece);
  const uint64_t stride = 4 * uint64_t(piece);
  const uint64_t request_bytes = uint64_t(repeat) * piece;
  const uint64_t remote_slots = std::max<uint64_t>(1, remote.length / request_bytes);
  uint64_t requests = 0;
  const Clock::time_point start = Clock::now();
  do {
    for (uint32_t k = 0; k < kPostList; k++, requests++) {
      const rdma::Sge sge{source.addr, piece, source.lkey};
      queue.Add(&sge, 1, remote.addr + (requests % remote_slots) * request_bytes, remote.rkey,
                repeat, stride);
    }
  } while (queue.status().ok() && SecondsSince(start) < seconds);
  const rdma::Status s = queue.Drain();
  if (!s.ok()) return s;
  *ns_per_entry = SecondsSince(start) * 1e9 / double(requests * repeat);
  return rdma::Status::OK();
}

// Nanoseconds per memcpy of pieces `average` bytes long on average (lengths spread evenly over
// average/2 .. 3*average/2, read from a table, so that no copy has a length known at compile
// time), gathered from `source` 2*average bytes apart and appended to `staging`.
double TimeCopies(const Buffer& source, Buffer* staging, uint32_t average, double seconds) {
  constexpr size_t kBatch = 4096;
  std::vector<uint32_t> lengths(kBatch);
  uint64_t x = 0x2545F4914F6CDD1Dull;
  for (uint32_t& length : lengths) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    length = average / 2 + uint32_t(x % (average + 1));
  }
  const size_t stride = 2 * size_t(average);
  size_t from = 0, to = 0;
  uint64_t pieces = 0;
  const Clock::time_point start = Clock::now();
  do {
    for (size_t i = 0; i < kBatch; i++) {
      const uint32_t length = lengths[i];
      if (from + stride > source.size()) from = 0;
      if (to + length > staging->size()) to = 0;
      std::memcpy(staging->data() + to, source.data() + from, length);
      from += stride;
      to += length;
    }
    CompilerBarrier();
    pieces += kBatch;
  } while (SecondsSince(start) < seconds);
  return SecondsSince(start) * 1e9 / double(pieces);
}

// Measures the TransferCosts of the backend of `pair` (best of `reps` rounds per quantity).
rdma::Status Calibrate(Pair* pair, const Flags& flags, Calibration* out) {
  rdma::Connection* client = pair->client.get();
  rdma::Connection* server = pair->server.get();
  Buffer source_memory, copy_staging;
  if (!source_memory.Map(kCalibrationSpan) || !copy_staging.Map(kStagingBytes)) {
    return rdma::Status::IOError("cannot map the calibration buffers");
  }
  source_memory.FillPattern();
  rdma::LocalRegion source, landing;
  rdma::Status s = client->RegisterLocal(source_memory.data(), source_memory.size(), &source);
  if (!s.ok()) return s;
  s = server->AllocateRegion(kCalibrationSpan, rdma::kRemoteWrite, &landing);
  if (!s.ok()) {
    client->FreeRegion(source);
    return s;
  }
  const rdma::RemoteRegion remote = server->Describe(landing);
  out->gather_entries = std::min<uint32_t>(client->max_sge(), 256);
  out->big_write_ns_per_byte = out->gather_ns_per_byte = 1e300;
  out->copy_small_ns = out->copy_large_ns = 1e300;
  // One untimed round first: every page of both buffers exists before timing.
  double warm = 0;
  s = TimeWrites(client, source, remote, 1, kMiB, kMiB, 0.05, &warm);
  for (int rep = 0; rep < flags.reps && s.ok(); rep++) {
    double value = 0;
    s = TimeWrites(client, source, remote, 1, kMiB, kMiB, flags.seconds, &value);
    out->big_write_ns_per_byte = std::min(out->big_write_ns_per_byte, value);
    if (s.ok()) {
      s = TimeWrites(client, source, remote, out->gather_entries, kGatherPiece, kGatherStride,
                     flags.seconds, &value);
    }
    out->gather_ns_per_byte = std::min(out->gather_ns_per_byte, value);
    out->copy_small_ns = std::min(
        out->copy_small_ns, TimeCopies(source_memory, &copy_staging, kCopySmall, flags.seconds));
    out->copy_large_ns = std::min(
        out->copy_large_ns, TimeCopies(source_memory, &copy_staging, kCopyLarge, flags.seconds));
    if (s.ok() && client->max_repeat() > 1) {
      if (rep == 0) out->period_small_ns = out->period_large_ns = 1e300;
      s = TimeStridedWrites(client, source, remote, kPeriodSmall, flags.seconds, &value);
      out->period_small_ns = std::min(out->period_small_ns, value);
      if (s.ok())
        s = TimeStridedWrites(client, source, remote, kPeriodLarge, flags.seconds, &value);
      out->period_large_ns = std::min(out->period_large_ns, value);
    }
  }
  client->FreeRegion(source);
  server->FreeRegion(landing);
  if (!s.ok()) return s;
  rdma::TransferCosts& costs = out->costs;
  costs.wire_byte_ns = out->big_write_ns_per_byte;
  costs.piece_ns =
      std::max(0.0, (out->gather_ns_per_byte - out->big_write_ns_per_byte) * double(kGatherPiece));
  costs.copy_byte_ns =
      std::max(0.0, (out->copy_large_ns - out->copy_small_ns) / double(kCopyLarge - kCopySmall));
  costs.copy_call_ns = std::max(0.0, out->copy_small_ns - double(kCopySmall) * costs.copy_byte_ns);
  if (out->period_small_ns > 0) {
    // A strided gather must look dearer than nothing, or the planner would cut boxes at every
    // gap: at least a hundredth of a nanosecond per entry.
    const double per_byte = std::max(
        0.0, (out->period_large_ns - out->period_small_ns) / double(kPeriodLarge - kPeriodSmall));
    costs.period_byte_ns = std::max(0.0, per_byte - costs.wire_byte_ns);
    costs.period_piece_ns = std::max(0.01, out->period_small_ns - double(kPeriodSmall) * per_byte);
  }
  return rdma::Status::OK();
}

// The constants as a C++ initializer: {piece_ns, wire_byte_ns, copy_call_ns, copy_byte_ns,
// period_piece_ns, period_byte_ns}.
std::string CostsInitializer(const rdma::TransferCosts& costs) {
  char text[200];
  std::snprintf(text, sizeof(text), "{%.4g, %.4g, %.4g, %.4g, %.4g, %.4g}", costs.piece_ns,
                costs.wire_byte_ns, costs.copy_call_ns, costs.copy_byte_ns, costs.period_piece_ns,
                costs.period_byte_ns);
  return text;
}

// The thresholds FromCosts derives from `costs`, as text.
std::string ThresholdsText(const rdma::TransferCosts& costs) {
  const rdma::ScheduleOptions options = rdma::ScheduleOptions::FromCosts(costs);
  char text[128];
  std::snprintf(text, sizeof(text),
                "max_bridge = %u B, max_bridge_packed = %u B, min_in_place = %u B",
                options.max_bridge, options.max_bridge_packed, options.min_in_place);
  return text;
}

// Prints what calibration measured on `backend` and the constants.
void PrintCalibration(const std::string& backend, const Calibration& c) {
  std::printf("\n== calibration: %s (best of the rounds) ==\n", backend.c_str());
  std::printf("  1 MiB WRITEs, 1 entry:          %8.3f ns/B (%.2f GB/s)\n", c.big_write_ns_per_byte,
              1.0 / c.big_write_ns_per_byte);
  std::printf("  WRITEs of %u x %u B entries:   %8.3f ns/B -> piece_ns = %.4g\n", c.gather_entries,
              kGatherPiece, c.gather_ns_per_byte, c.costs.piece_ns);
  std::printf("  memcpy of ~%u B pieces:           %8.3f ns/piece\n", kCopySmall, c.copy_small_ns);
  std::printf(
      "  memcpy of ~%u B pieces:         %8.3f ns/piece -> copy_call_ns = %.4g, "
      "copy_byte_ns = %.4g\n",
      kCopyLarge, c.copy_large_ns, c.costs.copy_call_ns, c.costs.copy_byte_ns);
  if (c.period_small_ns > 0) {
    std::printf("  strided gather of %u B entries:  %8.3f ns/entry\n", kPeriodSmall,
                c.period_small_ns);
    std::printf(
        "  strided gather of %u B entries: %8.3f ns/entry -> period_piece_ns = %.4g, "
        "period_byte_ns = %.4g\n",
        kPeriodLarge, c.period_large_ns, c.costs.period_piece_ns, c.costs.period_byte_ns);
  }
  std::printf("  calibrated TransferCosts%s;  // %s: %s\n", CostsInitializer(c.costs).c_str(),
              backend.c_str(), ThresholdsText(c.costs).c_str());
  const rdma::TransferCosts library = rdma::TransferCosts::Measured(backend);
  std::printf("  library    TransferCosts::Measured(\"%s\") = %s: %s\n", backend.c_str(),
              CostsInitializer(library).c_str(), ThresholdsText(library).c_str());
}

// --- B. scenarios ------------------------------------------------------------------------------

enum class Method { kPerFragment = 0, kCopyOut = 1, kRegions = 2 };
constexpr Method kMethods[] = {Method::kPerFragment, Method::kCopyOut, Method::kRegions};

// The method's name in tables and the CSV.
const char* MethodName(Method method) {
  switch (method) {
    case Method::kPerFragment:
      return "per-fragment";
    case Method::kCopyOut:
      return "copy-out";
    case Method::kRegions:
      return "regions";
  }
  return "?";
}

// What one pass sent, summed over its targets.
struct PassStats {
  uint64_t requests = 0;
  uint64_t pieces = 0;  // gather entries
  uint64_t wire_bytes = 0;
  uint64_t packed_bytes = 0;  // regions: bytes copied into staging, or gathered from the source
};

// One connection's share of a scenario: the buffers on both ends.
struct Target {
  rdma::Connection* client = nullptr;
  rdma::Connection* server = nullptr;
  rdma::LocalRegion source;   // the scenario's source buffer, registered on `client`
  rdma::LocalRegion staging;  // on `client`: copy-out's buffer and regions' packed boxes
  rdma::LocalRegion landing;  // on `server`, remote-writable: where everything arrives
  rdma::RemoteRegion remote;  // `landing` as `client` addresses it
};

// A scenario: a source buffer, the targets its rows go to, and the three ways to send them.
// Subclasses describe the data (the source's size, what each target must receive) and
// implement per-fragment, copy-out and the regions' planning; the rest is shared.
class Scenario {
 public:
  // A scenario over `pairs` (one target each) of `rows` rows, planning regions for `costs`.
  Scenario(const std::vector<Pair*>& pairs, uint64_t rows, const rdma::TransferCosts& costs)
      : rows_(rows), costs_(costs) {
    for (Pair* pair : pairs) {
      Target target;
      target.client = pair->client.get();
      target.server = pair->server.get();
      targets_.push_back(target);
    }
    layouts_.resize(targets_.size());
    schedules_.resize(targets_.size());
    expected_rows_.resize(targets_.size());
    expected_regions_.resize(targets_.size());
    unpacked_.resize(targets_.size());
    writers_.resize(targets_.size());
  }

  // Gives every region back to its connection (before the source buffer goes).
  virtual ~Scenario() {
    for (Target& target : targets_) {
      if (target.source.addr != nullptr) target.client->FreeRegion(target.source);
      if (target.staging.addr != nullptr) target.client->FreeRegion(target.staging);
      if (target.landing.addr != nullptr) target.server->FreeRegion(target.landing);
    }
  }

  // The scenario's name in tables and the CSV.
  virtual const char* name() const = 0;
  // One line on the data and where it goes.
  virtual std::string Summary() const = 0;

  // Fills and registers the source, computes what each target must receive, plans the regions
  // once to size the staging and landing buffers, and allocates them; untimed.
  rdma::Status Setup() {
    if (!source_.Map(SourceBytes())) return rdma::Status::IOError("cannot map the source");
    source_.FillPattern();
    BuildExpected();
    rdma::Status s = Plan();
    for (size_t t = 0; t < targets_.size() && s.ok(); t++) {
      Target& target = targets_[t];
      s = target.client->RegisterLocal(source_.data(), source_.size(), &target.source);
      if (s.ok()) {
        const size_t staging = std::max<size_t>(kStagingBytes, schedules_[t].max_packed_run);
        s = target.client->AllocateRegion(staging, rdma::kLocalOnly, &target.staging);
      }
      if (s.ok()) {
        const size_t landing =
            std::max<size_t>({expected_rows_[t].size(), schedules_[t].wire_bytes, size_t(4096)});
        s = target.server->AllocateRegion(landing, rdma::kRemoteWrite, &target.landing);
      }
      if (s.ok()) {
        target.remote = target.server->Describe(target.landing);
        queues_.emplace_back(target.client, kMaxSgePerRow);
      }
    }
    return s;
  }

  // One whole pass of `method`; what it sent goes to *stats.
  rdma::Status Pass(Method method, PassStats* stats) {
    *stats = PassStats{};
    switch (method) {
      case Method::kPerFragment:
        return PerFragmentPass(stats);
      case Method::kCopyOut:
        return CopyOutPass(stats);
      case Method::kRegions:
        return RegionsPass(stats);
    }
    return rdma::Status::InvalidArgument("no such method");
  }

  // Zeroes every landing region (before a checked pass).
  void ClearLandings() {
    for (Target& target : targets_) std::memset(target.landing.addr, 0, target.landing.length);
  }

  // Checks what every target holds after a pass of `method`; false (with why) on a mismatch.
  bool Verify(Method method, const PassStats& stats, std::string* why) {
    uint64_t wire = 0;
    for (size_t t = 0; t < targets_.size(); t++) {
      const Target& target = targets_[t];
      const std::string& expected =
          method == Method::kRegions ? expected_regions_[t] : expected_rows_[t];
      std::string_view got(target.landing.addr, expected.size());
      if (method == Method::kRegions) {
        const rdma::ScheduleOptions& options = schedules_[t].options;
        if (rdma::WireBytes(layouts_[t], options) != schedules_[t].wire_bytes) {
          *why = "WireBytes disagrees with the schedule's wire_bytes";
          return false;
        }
        const std::string_view image(target.landing.addr, schedules_[t].wire_bytes);
        const rdma::Status s = rdma::Unpack(layouts_[t], options, image, &unpacked_[t]);
        if (!s.ok()) {
          *why = "Unpack: " + s.ToString();
          return false;
        }
        got = unpacked_[t];
        wire += schedules_[t].wire_bytes;
      } else {
        wire += expected.size();
      }
      if (got != expected) {
        const size_t at =
            std::mismatch(got.begin(), got.end(), expected.begin(), expected.end()).first -
            got.begin();
        *why = "target " + std::to_string(t) + " differs at byte " + std::to_string(at) + " of " +
               std::to_string(expected.size()) + " (received " + std::to_string(got.size()) + ")";
        return false;
      }
    }
    if (stats.wire_bytes != wire) {
      *why = "the pass reports " + std::to_string(stats.wire_bytes) + " wire bytes, expected " +
             std::to_string(wire);
      return false;
    }
    return true;
  }

  // Unpacks every target's regions wire image (of the last regions pass) into packed form.
  rdma::Status UnpackAll() {
    for (size_t t = 0; t < targets_.size(); t++) {
      const std::string_view image(targets_[t].landing.addr, schedules_[t].wire_bytes);
      const rdma::Status s = rdma::Unpack(layouts_[t], schedules_[t].options, image, &unpacked_[t]);
      if (!s.ok()) return s;
    }
    return rdma::Status::OK();
  }

  // The described bytes of one pass, all targets together.
  uint64_t payload_bytes() const {
    uint64_t bytes = 0;
    for (const std::string& expected : expected_rows_) bytes += expected.size();
    return bytes;
  }

  // Every target's schedule of the last planning.
  const std::vector<rdma::Schedule>& schedules() const { return schedules_; }
  // The thresholds the optimizer chose for the first target's region.
  const rdma::ScheduleOptions& options() const { return schedules_[0].options; }

 protected:
  static constexpr uint32_t kMaxSgePerRow = 8;

  // Bytes of the source buffer.
  virtual uint64_t SourceBytes() const = 0;
  // Fills expected_rows_ (rows one after another) and expected_regions_ (the layout's payload)
  // from the source, independently of the library.
  virtual void BuildExpected() = 0;
  // One work request per row to its target.
  virtual rdma::Status PerFragmentPass(PassStats* stats) = 0;
  // Every row copied into its target's staging buffer.
  virtual rdma::Status CopyOutPass(PassStats* stats) = 0;
  // Builds layouts_ and schedules_ (whatever a pass of regions must do before sending).
  virtual rdma::Status Plan() = 0;

  // Plans, then writes every target's wire image with one ScatterRegions call.
  rdma::Status RegionsPass(PassStats* stats) {
    rdma::Status s = Plan();
    if (!s.ok()) return s;
    std::vector<rdma::RegionTarget> regions(targets_.size());
    for (size_t t = 0; t < targets_.size(); t++) {
      rdma::RegionTarget& region = regions[t];
      region.connection = targets_[t].client;
      region.source = targets_[t].source;
      region.layout = &layouts_[t];
      region.schedule = &schedules_[t];
      region.staging = targets_[t].staging;
      region.remote = targets_[t].remote;
      region.remote_offset = 0;
    }
    rdma::TransferStats transfer;
    s = rdma::ScatterRegions(regions.data(), regions.size(), kTimeoutMs, &transfer);
    stats->requests = transfer.requests;
    stats->pieces = transfer.pieces;
    stats->wire_bytes = transfer.wire_bytes;
    stats->packed_bytes = transfer.packed_bytes + transfer.gathered_bytes;
    return s;
  }

  // Posts what every queue still holds, waits for all of it, and counts the pass.
  rdma::Status DrainQueues(PassStats* stats) {
    for (RequestQueue& queue : queues_) queue.Flush();
    rdma::Status result;
    for (RequestQueue& queue : queues_) {
      const rdma::Status s = queue.Drain();
      if (result.ok()) result = s;
      stats->requests += queue.requests();
      stats->pieces += queue.pieces();
      queue.ResetCounts();
    }
    stats->wire_bytes = payload_bytes();
    return result;
  }

  // Starts every target's staging writer for a copy-out pass.
  void StartWriters() {
    for (size_t t = 0; t < targets_.size(); t++) {
      writers_[t].Start(targets_[t].client, targets_[t].staging, targets_[t].remote);
    }
  }

  // Ships every target's last staging buffer, waits for all, and counts the pass.
  rdma::Status FinishWriters(PassStats* stats) {
    for (StagingWriter& writer : writers_) writer.PostLast();
    rdma::Status result;
    for (StagingWriter& writer : writers_) {
      const rdma::Status s = writer.WaitLast();
      if (result.ok()) result = s;
      stats->requests += writer.writes();
      stats->wire_bytes += writer.written();
    }
    stats->pieces = stats->requests;
    return result;
  }

  const uint64_t rows_;
  const rdma::TransferCosts costs_;
  Buffer source_;
  std::vector<Target> targets_;
  std::vector<RequestQueue> queues_;
  std::vector<StagingWriter> writers_;
  std::vector<rdma::RegionLayout> layouts_;
  std::vector<rdma::Schedule> schedules_;
  std::vector<std::string> expected_rows_;
  std::vector<std::string> expected_regions_;
  std::vector<std::string> unpacked_;
};

// The target of row `row` among `targets`: a multiplicative (Fibonacci) hash of its number.
inline uint32_t OwnerOf(uint64_t row, uint32_t targets) {
  const uint32_t hash = uint32_t(row) * 2654435761u;
  return uint32_t((uint64_t(hash) * targets) >> 32);
}

// D-RDMA's OLAP shuffle (§2.1, §5.1): a columnar table of 5 int4 columns, each row to the
// target its hash names.
class Shuffle : public Scenario {
 public:
  static constexpr uint32_t kColumns = 5;
  static constexpr uint32_t kWidth = 4;
  static constexpr uint32_t kRowBytes = kColumns * kWidth;

  // The shuffle of `rows` rows to the targets of `pairs`.
  Shuffle(const std::vector<Pair*>& pairs, uint64_t rows, const rdma::TransferCosts& costs)
      : Scenario(pairs, rows, costs) {
    for (uint32_t c = 0; c < kColumns; c++) columns_.push_back(rdma::Column{ColumnBase(c), kWidth});
  }

  // The scenario's name in tables and the CSV.
  const char* name() const override { return "shuffle"; }

  // The table and the targets.
  std::string Summary() const override {
    return std::to_string(rows_) + " rows x 5 int4 columns (columnar), rows hashed to " +
           std::to_string(targets_.size()) + " targets";
  }

 protected:
  // Five columns of `rows_` values.
  uint64_t SourceBytes() const override { return rows_ * kRowBytes; }

  // Rows: the selected rows' 5 values one row after another; regions: column by column.
  void BuildExpected() override {
    const uint32_t targets = uint32_t(targets_.size());
    for (uint64_t row = 0; row < rows_; row++) {
      std::string& out = expected_rows_[OwnerOf(row, targets)];
      for (uint32_t c = 0; c < kColumns; c++) out.append(Value(c, row), kWidth);
    }
    for (uint32_t c = 0; c < kColumns; c++) {
      for (uint64_t row = 0; row < rows_; row++) {
        expected_regions_[OwnerOf(row, targets)].append(Value(c, row), kWidth);
      }
    }
  }

  // One WRITE per row with one gather entry per column value.
  rdma::Status PerFragmentPass(PassStats* stats) override {
    const uint32_t targets = uint32_t(targets_.size());
    const char* base = source_.data();
    std::vector<uint64_t> sent(targets, 0);
    for (uint64_t row = 0; row < rows_; row++) {
      const uint32_t t = OwnerOf(row, targets);
      const Target& target = targets_[t];
      rdma::Sge sges[kColumns];
      for (uint32_t c = 0; c < kColumns; c++) {
        sges[c] = rdma::Sge{base + ColumnBase(c) + row * kWidth, kWidth, target.source.lkey};
      }
      if (!queues_[t].Add(sges, kColumns, target.remote.addr + sent[t] * kRowBytes,
                          target.remote.rkey)) {
        break;
      }
      sent[t]++;
    }
    return DrainQueues(stats);
  }

  // Each row's values copied into its target's staging buffer.
  rdma::Status CopyOutPass(PassStats* stats) override {
    const uint32_t targets = uint32_t(targets_.size());
    const char* base = source_.data();
    StartWriters();
    for (uint64_t row = 0; row < rows_; row++) {
      StagingWriter& writer = writers_[OwnerOf(row, targets)];
      char* out = writer.Room(kRowBytes);
      for (uint32_t c = 0; c < kColumns; c++) {
        std::memcpy(out + c * kWidth, base + ColumnBase(c) + row * kWidth, kWidth);
      }
      writer.Advance(kRowBytes);
    }
    return FinishWriters(stats);
  }

  // Hashes every row, makes the masks, and per target a masked bitmapped layout and its
  // schedule.
  rdma::Status Plan() override {
    const uint32_t targets = uint32_t(targets_.size());
    owner_.resize(rows_);
    for (uint64_t row = 0; row < rows_; row++) owner_[row] = OwnerOf(row, targets);
    std::vector<rdma::RowMask> masks = rdma::MasksByOwner(owner_, targets);
    rdma::RegionLayout table;
    rdma::Status s = rdma::RegionLayout::Bitmapped(columns_, rows_, &table);
    for (uint32_t t = 0; t < targets && s.ok(); t++) {
      s = table.WithMask(std::move(masks[t]), &layouts_[t]);
      if (s.ok()) schedules_[t] = rdma::PlanSchedule(layouts_[t], costs_);
    }
    return s;
  }

 private:
  // Where column `c` starts in the source.
  uint64_t ColumnBase(uint32_t c) const { return uint64_t(c) * rows_ * kWidth; }
  // The value of column `c` in row `row`.
  const char* Value(uint32_t c, uint64_t row) const {
    return source_.data() + ColumnBase(c) + row * kWidth;
  }

  std::vector<rdma::Column> columns_;
  std::vector<uint32_t> owner_;
};

// D-RDMA's OLTP projection (§2.2): row-major rows of 16 8-byte columns, some of them (by
// default columns 0, 1 and 5: two adjacent and one apart) of every row to one target.
class Projection : public Scenario {
 public:
  static constexpr uint32_t kStride = 128;
  static constexpr uint32_t kFieldBytes = 8;

  // The projection of `columns` (ascending, < 16) of `rows` rows to the target of `pair`.
  Projection(Pair* pair, uint64_t rows, std::vector<uint32_t> columns,
             const rdma::TransferCosts& costs)
      : Scenario({pair}, rows, costs), columns_(std::move(columns)) {
    row_bytes_ = uint32_t(columns_.size()) * kFieldBytes;
    for (size_t i = 0; i < columns_.size(); i++) {  // contiguous column groups
      if (i == 0 || columns_[i] != columns_[i - 1] + 1) {
        groups_.push_back({columns_[i] * kFieldBytes, 0});
      }
      groups_.back().length += kFieldBytes;
    }
    name_ = "projection-" + std::to_string(columns_.size()) + "of16";
  }

  // The scenario's name in tables and the CSV.
  const char* name() const override { return name_.c_str(); }

  // The table and the projection.
  std::string Summary() const override {
    std::string list;
    for (uint32_t c : columns_) list += (list.empty() ? "" : ",") + std::to_string(c);
    return std::to_string(rows_) + " rows x 128 B (16 x 8-byte columns), columns " + list +
           " to 1 target";
  }

 protected:
  // `rows_` rows of 128 bytes.
  uint64_t SourceBytes() const override { return rows_ * kStride; }

  // Row by row, the projected columns in order (the same for every method).
  void BuildExpected() override {
    std::string& out = expected_rows_[0];
    for (uint64_t row = 0; row < rows_; row++) {
      for (uint32_t column : columns_) {
        out.append(source_.data() + row * kStride + column * kFieldBytes, kFieldBytes);
      }
    }
    expected_regions_[0] = out;
  }

  // One WRITE per row with one gather entry per contiguous group of projected columns.
  rdma::Status PerFragmentPass(PassStats* stats) override {
    const Target& target = targets_[0];
    const char* base = source_.data();
    rdma::Sge sges[16];
    for (uint64_t row = 0; row < rows_; row++) {
      const char* at = base + row * kStride;
      for (size_t g = 0; g < groups_.size(); g++) {
        sges[g] = {at + groups_[g].offset, groups_[g].length, target.source.lkey};
      }
      if (!queues_[0].Add(sges, uint32_t(groups_.size()), target.remote.addr + row * row_bytes_,
                          target.remote.rkey)) {
        break;
      }
    }
    return DrainQueues(stats);
  }

  // Each row's projected columns copied into the staging buffer, 8 bytes at a time.
  rdma::Status CopyOutPass(PassStats* stats) override {
    const char* base = source_.data();
    StartWriters();
    StagingWriter& writer = writers_[0];
    for (uint64_t row = 0; row < rows_; row++) {
      const char* at = base + row * kStride;
      char* out = writer.Room(row_bytes_);
      for (uint32_t column : columns_) {
        std::memcpy(out, at + column * kFieldBytes, kFieldBytes);
        out += kFieldBytes;
      }
      writer.Advance(row_bytes_);
    }
    return FinishWriters(stats);
  }

  // A strided layout naming the projected columns, and its schedule.
  rdma::Status Plan() override {
    std::vector<rdma::Field> fields;
    for (uint32_t column : columns_) fields.push_back({column * kFieldBytes, kFieldBytes});
    const rdma::Status s =
        rdma::RegionLayout::Strided(0, kStride, rows_, std::move(fields), &layouts_[0]);
    if (s.ok()) schedules_[0] = rdma::PlanSchedule(layouts_[0], costs_);
    return s;
  }

 private:
  struct Group {
    uint32_t offset;
    uint32_t length;
  };
  std::vector<uint32_t> columns_;
  std::string name_;
  std::vector<Group> groups_;
  uint32_t row_bytes_ = 0;
};

// --- running and reporting ---------------------------------------------------------------------

// The best round of one method of one scenario.
struct MethodResult {
  bool verified = false;
  PassStats stats;              // of the checked pass
  double gbps = 0;              // payload GB/s, best round
  double cpu_s_per_gb = 1e300;  // CPU seconds per GB of payload, best round
};

// One CSV line.
struct CsvRow {
  std::string backend, scenario, method;
  double gbps = 0, cpu_s_per_gb = 0;
  uint64_t wire_bytes = 0;
};

// Formats a byte count with binary units for the summary lines.
std::string Bytes(uint64_t bytes) {
  char text[48];
  if (bytes >= kMiB) {
    std::snprintf(text, sizeof(text), "%.2f MiB", double(bytes) / double(kMiB));
  } else if (bytes >= 1024) {
    std::snprintf(text, sizeof(text), "%.1f KiB", double(bytes) / 1024.0);
  } else {
    std::snprintf(text, sizeof(text), "%" PRIu64 " B", bytes);
  }
  return text;
}

// Prints how the regions of a scenario travel (from the untimed planning in Setup).
void PrintSchedule(const Scenario& scenario, bool library_costs) {
  uint64_t runs = 0, packed_runs = 0, wire = 0, bridged = 0, packed = 0, fragments = 0;
  std::string periods;
  for (const rdma::Schedule& schedule : scenario.schedules()) {
    runs += schedule.box_count();
    for (uint64_t i = 0; i < schedule.box_count(); i++) {
      packed_runs += schedule.box(i).packed ? 1 : 0;
    }
    if (schedule.has_period()) {
      periods += "; a period of " + std::to_string(schedule.period_runs()) + " box(es), " +
                 std::to_string(schedule.period_wire_bytes) + " B, x " +
                 std::to_string(schedule.period_repeat) +
                 (schedule.period_packed() ? " (packed: a strided gather)" : "");
    }
    wire += schedule.wire_bytes;
    bridged += schedule.bridged_bytes;
    packed += schedule.packed_bytes;
    fragments += schedule.fragments;
  }
  std::printf(
      "  regions plan (%s costs): max_bridge %u B, max_bridge_packed %u B, min_in_place %u B;\n"
      "    %" PRIu64 " fragments -> %" PRIu64 " boxes (%" PRIu64
      " packed); wire %s = payload %s + bridged %s; "
      "packed %s%s\n",
      library_costs ? "library" : "calibrated", scenario.options().max_bridge,
      scenario.options().max_bridge_packed, scenario.options().min_in_place, fragments, runs,
      packed_runs, Bytes(wire).c_str(), Bytes(scenario.payload_bytes()).c_str(),
      Bytes(bridged).c_str(), Bytes(packed).c_str(), periods.c_str());
}

// Sets up, checks and times one scenario on `backend`; prints its table and appends CSV rows.
// False when a method's result did not match (the others are still measured).
bool RunScenario(Scenario* scenario, const std::string& backend, const Flags& flags,
                 std::vector<CsvRow>* csv) {
  std::printf("\n== %s on %s: %s ==\n", scenario->name(), backend.c_str(),
              scenario->Summary().c_str());
  rdma::Status s = scenario->Setup();
  if (!s.ok()) {
    std::printf("  setup failed: %s\n", s.ToString().c_str());
    return false;
  }
  const uint64_t payload = scenario->payload_bytes();
  std::printf("  payload %s per pass\n", Bytes(payload).c_str());
  PrintSchedule(*scenario, flags.library_costs);
  bool all_verified = true;
  MethodResult results[3];
  for (Method method : kMethods) {
    MethodResult& result = results[int(method)];
    scenario->ClearLandings();
    std::string why;
    s = scenario->Pass(method, &result.stats);
    if (!s.ok()) {
      why = s.ToString();
    } else if (scenario->Verify(method, result.stats, &why)) {
      result.verified = true;
    }
    std::printf("  check %-12s %s%s\n", MethodName(method),
                result.verified ? "OK" : "MISMATCH: ", why.c_str());
    all_verified = all_verified && result.verified;
  }
  PassStats scratch;
  for (int rep = 0; rep < flags.reps; rep++) {
    for (Method method : kMethods) {
      MethodResult& result = results[int(method)];
      if (!result.verified) continue;
      Timing timing;
      s = TimePasses([&] { return scenario->Pass(method, &scratch); }, flags.seconds, &timing);
      if (!s.ok()) {
        std::printf("  %s failed: %s\n", MethodName(method), s.ToString().c_str());
        result.verified = false;
        all_verified = false;
        continue;
      }
      const double gigabytes = double(timing.passes) * double(payload) / kGB;
      result.gbps = std::max(result.gbps, gigabytes / timing.seconds);
      result.cpu_s_per_gb = std::min(result.cpu_s_per_gb, timing.cpu_seconds / gigabytes);
    }
  }
  // The receiver's side: unpack the regions wire image (from a fresh regions pass).
  double unpack_gbps = 0, unpack_cpu = 1e300;
  uint64_t wire = 0;
  for (const rdma::Schedule& schedule : scenario->schedules()) wire += schedule.wire_bytes;
  if (results[int(Method::kRegions)].verified && scenario->Pass(Method::kRegions, &scratch).ok()) {
    for (int rep = 0; rep < flags.reps; rep++) {
      Timing timing;
      s = TimePasses([&] { return scenario->UnpackAll(); }, flags.seconds, &timing);
      if (!s.ok()) break;
      const double gigabytes = double(timing.passes) * double(payload) / kGB;
      unpack_gbps = std::max(unpack_gbps, gigabytes / timing.seconds);
      unpack_cpu = std::min(unpack_cpu, timing.cpu_seconds / gigabytes);
    }
  }

  std::printf("\n  %-12s | %12s | %12s | %9s | %9s | %12s | %9s\n", "method", "payload GB/s",
              "wire bytes", "requests", "pieces", "packed bytes", "CPU s/GB");
  std::printf(
      "  -------------+--------------+--------------+-----------+-----------+--------------+"
      "----------\n");
  for (Method method : kMethods) {
    const MethodResult& r = results[int(method)];
    if (!r.verified) {
      std::printf("  %-12s | %12s |\n", MethodName(method), "failed");
      continue;
    }
    std::printf("  %-12s | %12.3f | %12" PRIu64 " | %9" PRIu64 " | %9" PRIu64 " | %12" PRIu64
                " | %9.3f\n",
                MethodName(method), r.gbps, r.stats.wire_bytes, r.stats.requests, r.stats.pieces,
                r.stats.packed_bytes, r.cpu_s_per_gb);
    csv->push_back(CsvRow{backend, scenario->name(), MethodName(method), r.gbps, r.cpu_s_per_gb,
                          r.stats.wire_bytes});
  }
  const MethodResult& regions = results[int(Method::kRegions)];
  for (Method other : {Method::kPerFragment, Method::kCopyOut}) {
    const MethodResult& r = results[int(other)];
    if (!regions.verified || !r.verified) continue;
    std::printf("  regions / %-12s throughput x%.3g, CPU per GB x%.3g\n", MethodName(other),
                regions.gbps / r.gbps, regions.cpu_s_per_gb / r.cpu_s_per_gb);
  }
  if (unpack_gbps > 0) {
    std::printf(
        "  receiver Unpack of the regions wire image (%s -> %s packed): %.3f GB/s of "
        "payload, %.3f CPU s/GB\n",
        Bytes(wire).c_str(), Bytes(payload).c_str(), unpack_gbps, unpack_cpu);
    csv->push_back(
        CsvRow{backend, scenario->name(), "regions_unpack", unpack_gbps, unpack_cpu, wire});
  }
  return all_verified;
}

// Writes the CSV rows to `path`; false on I/O failure.
bool WriteCsv(const std::vector<CsvRow>& rows, const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return false;
  std::fprintf(file, "backend,scenario,method,payload_gbps,cpu_s_per_gb,wire_bytes\n");
  for (const CsvRow& row : rows) {
    std::fprintf(file, "%s,%s,%s,%.6f,%.6f,%" PRIu64 "\n", row.backend.c_str(),
                 row.scenario.c_str(), row.method.c_str(), row.gbps, row.cpu_s_per_gb,
                 row.wire_bytes);
  }
  return std::fclose(file) == 0;
}

// Calibrates and runs the scenarios on every backend asked for. Returns the exit code.
int Run(const Flags& flags) {
  std::printf("region_bench: backends");
  for (const std::string& backend : flags.backends) std::printf(" %s", backend.c_str());
  std::printf("; %" PRIu64 " rows; best of %d round(s) of >= %.2f s; GB = 1e9 bytes\n", flags.rows,
              flags.reps, flags.seconds);
  std::printf(
      "Both ends run in this process: CPU s/GB is CLOCK_PROCESS_CPUTIME_ID over the timed\n"
      "section and includes the receiver's work (on tcp, the agent threads of both ends).\n");
  std::vector<CsvRow> csv;
  std::vector<std::pair<std::string, rdma::TransferCosts>> calibrated;
  bool all_verified = true;
  for (const std::string& backend : flags.backends) {
    Pair pairs[2];
    rdma::Status s = MakePair(backend, &pairs[0]);
    if (s.ok() && !flags.calibrate_only) s = MakePair(backend, &pairs[1]);
    if (!s.ok()) {
      std::fprintf(stderr, "%s: cannot connect: %s\n", backend.c_str(), s.ToString().c_str());
      return 1;
    }
    Calibration calibration;
    s = Calibrate(&pairs[0], flags, &calibration);
    if (!s.ok()) {
      std::fprintf(stderr, "%s calibration: %s\n", backend.c_str(), s.ToString().c_str());
      return 1;
    }
    PrintCalibration(backend, calibration);
    calibrated.emplace_back(backend, calibration.costs);
    if (flags.calibrate_only) continue;
    const rdma::TransferCosts costs =
        flags.library_costs ? rdma::TransferCosts::Measured(backend) : calibration.costs;
    {
      Shuffle shuffle({&pairs[0], &pairs[1]}, flags.rows, costs);
      all_verified = RunScenario(&shuffle, backend, flags, &csv) && all_verified;
    }
    for (const std::vector<uint32_t>& columns : flags.projections) {
      Projection projection(&pairs[0], flags.rows, columns, costs);
      all_verified = RunScenario(&projection, backend, flags, &csv) && all_verified;
    }
  }
  std::printf(
      "\nTransferCosts {piece_ns, wire_byte_ns, copy_call_ns, copy_byte_ns} measured "
      "here:\n");
  for (const auto& [backend, costs] : calibrated) {
    std::printf("  %-4s %s  // %s\n", backend.c_str(), CostsInitializer(costs).c_str(),
                ThresholdsText(costs).c_str());
  }
  if (!flags.csv.empty()) {
    if (!WriteCsv(csv, flags.csv)) {
      std::fprintf(stderr, "cannot write %s\n", flags.csv.c_str());
      return 1;
    }
    std::printf("wrote %s\n", flags.csv.c_str());
  }
  if (!all_verified) {
    std::fprintf(stderr, "region_bench: a method's result did not match (see above)\n");
    return 1;
  }
  return 0;
}

}  // namespace

// Parses the flags and runs the benchmark; no exception leaves main.
int main(int argc, char** argv) {
  try {
    std::signal(SIGPIPE, SIG_IGN);
    Flags flags;
    if (!ParseFlags(argc, argv, &flags)) return 2;
    return Run(flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "region_bench: %s\n", e.what());
    return 1;
  }
}
