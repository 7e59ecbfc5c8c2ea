// engine_bench: runs db_bench-style workloads on the slipstream engine and on RocksDB in the
// same run and prints throughput, the slipstream/RocksDB ratio and write amplification.
//
// Both engines keep the write-ahead log on without a sync per write; a fill workload is timed
// until its writes are durable (slipstream Sync, RocksDB FlushWAL(true)). readrandom, readseq
// and seekrandom run on the database that fillrandom (and overwrite) filled.

#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "rocksdb/statistics.h"
#include "slipstream/engine/engine.h"

namespace {

namespace ss = slipstream::engine;
using Clock = std::chrono::steady_clock;

constexpr char kUsage[] =
    "usage: engine_bench [--num=N] [--value_size=BYTES] [--benchmarks=a,b,...] [--dir=PATH]\n"
    "                    [--engine=both|slipstream|rocksdb] [--l0_size_mb=MB]\n"
    "benchmarks: fillseq,fillrandom,overwrite,readrandom,readseq,seekrandom,S,M,L,SD,MD,LD\n";

// Every workload, in the order they run and are reported.
constexpr std::array<std::string_view, 12> kAllBenchmarks = {
    "fillseq", "fillrandom", "overwrite", "readrandom", "readseq", "seekrandom",
    "S",       "M",          "L",         "SD",         "MD",      "LD"};

// The workloads that share the database fillrandom fills.
constexpr std::array<std::string_view, 5> kRandomGroup = {"fillrandom", "overwrite", "readrandom",
                                                          "readseq", "seekrandom"};

constexpr std::string_view kKeyPrefix = "user";
constexpr size_t kKeyDigits = 12;
constexpr size_t kKeySize = kKeyPrefix.size() + kKeyDigits;
constexpr uint64_t kMaxNum = 1'000'000'000'000ull;
constexpr uint32_t kMaxValueSize = 1u << 20;
constexpr size_t kValuePoolSize = 8u << 20;
constexpr uint64_t kSeed = 301;
constexpr int kNextsPerSeek = 10;

// The Anthus value-size mixes: small, medium and large values with these percentages.
constexpr uint32_t kSmallValue = 5;
constexpr uint32_t kMediumValue = 100;
constexpr uint32_t kLargeValue = 2000;
struct AnthusMix {
  std::string_view name;
  uint32_t small_pct;
  uint32_t medium_pct;
};
constexpr std::array<AnthusMix, 6> kAnthusMixes = {
    {{"S", 100, 0}, {"M", 0, 100}, {"L", 0, 0}, {"SD", 60, 20}, {"MD", 20, 60}, {"LD", 20, 20}}};

// An engine error or a wrong result: the benchmark stops and exits 1.
class BenchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad command line: the benchmark prints the usage and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws BenchError if a slipstream status is not ok.
void Check(const ss::Status& status, std::string_view what) {
  if (!status.ok()) {
    throw BenchError("slipstream " + std::string(what) + ": " + status.ToString());
  }
}

// Throws BenchError if a RocksDB status is not ok.
void Check(const rocksdb::Status& status, std::string_view what) {
  if (!status.ok()) throw BenchError("rocksdb " + std::string(what) + ": " + status.ToString());
}

enum class EngineKind { kSlipstream = 0, kRocksDb = 1 };

// The engine's name as printed.
std::string_view EngineName(EngineKind engine) {
  return engine == EngineKind::kSlipstream ? "slipstream" : "rocksdb";
}

struct Flags {
  uint64_t num = 2'000'000;
  uint32_t value_size = 100;
  std::vector<std::string> benchmarks{kAllBenchmarks.begin(), kAllBenchmarks.end()};
  std::filesystem::path dir = "/tmp/slipstream-bench";
  std::vector<EngineKind> engines = {EngineKind::kSlipstream, EngineKind::kRocksDb};
  uint64_t l0_size_mb = 64;

  // Whether the workload `name` was asked for.
  bool Selected(std::string_view name) const {
    return std::find(benchmarks.begin(), benchmarks.end(), name) != benchmarks.end();
  }
};

// Parses the decimal value of flag `name`.
uint64_t ParseNumber(std::string_view name, std::string_view text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw UsageError("bad number for --" + std::string(name) + ": " + std::string(text));
  }
  return value;
}

// Parses --engine.
std::vector<EngineKind> ParseEngines(std::string_view text) {
  if (text == "both") return {EngineKind::kSlipstream, EngineKind::kRocksDb};
  if (text == "slipstream") return {EngineKind::kSlipstream};
  if (text == "rocksdb") return {EngineKind::kRocksDb};
  throw UsageError("bad --engine: " + std::string(text));
}

// Parses the comma list of --benchmarks, rejecting unknown names.
std::vector<std::string> ParseBenchmarks(std::string_view text) {
  std::vector<std::string> names;
  while (!text.empty()) {
    size_t comma = std::min(text.find(','), text.size());
    std::string_view name = text.substr(0, comma);
    if (std::find(kAllBenchmarks.begin(), kAllBenchmarks.end(), name) == kAllBenchmarks.end()) {
      throw UsageError("unknown benchmark: " + std::string(name));
    }
    names.emplace_back(name);
    text.remove_prefix(std::min(comma + 1, text.size()));
  }
  return names;
}

// Parses the command line (--name=value flags only).
Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    size_t eq = arg.find('=');
    if (!arg.starts_with("--") || eq == std::string_view::npos) {
      throw UsageError("bad argument: " + std::string(arg));
    }
    std::string_view name = arg.substr(2, eq - 2);
    std::string_view value = arg.substr(eq + 1);
    if (name == "num") {
      flags.num = ParseNumber(name, value);
    } else if (name == "value_size") {
      uint64_t size = ParseNumber(name, value);
      if (size == 0 || size > kMaxValueSize) throw UsageError("--value_size must be in 1..1048576");
      flags.value_size = static_cast<uint32_t>(size);
    } else if (name == "benchmarks") {
      flags.benchmarks = ParseBenchmarks(value);
    } else if (name == "dir") {
      flags.dir = std::string(value);
    } else if (name == "engine") {
      flags.engines = ParseEngines(value);
    } else if (name == "l0_size_mb") {
      flags.l0_size_mb = ParseNumber(name, value);
    } else {
      throw UsageError("unknown flag: --" + std::string(name));
    }
  }
  if (flags.num == 0 || flags.num >= kMaxNum) throw UsageError("--num must be in 1..10^12-1");
  if (flags.l0_size_mb == 0) throw UsageError("--l0_size_mb must be at least 1");
  if (flags.dir.empty()) throw UsageError("--dir must not be empty");
  return flags;
}

// Where one value lives in the value pool.
struct ValueRef {
  uint32_t offset = 0;
  uint32_t size = 0;
};

// Semi-compressible random bytes every value is a slice of: each 32-byte chunk is 16 random
// bytes followed by the same 16 bytes again, so LZ4 roughly halves it.
class ValuePool {
 public:
  ValuePool() : data_(kValuePoolSize, '\0') {
    std::mt19937_64 rng(kSeed);
    for (size_t chunk = 0; chunk < data_.size(); chunk += 32) {
      for (size_t i = 0; i < 16; i += sizeof(uint64_t)) {
        uint64_t word = rng();
        std::memcpy(&data_[chunk + i], &word, sizeof(word));
      }
      std::memcpy(&data_[chunk + 16], &data_[chunk], 16);
    }
  }

  // A random slice of `size` bytes.
  ValueRef Pick(uint32_t size, std::mt19937_64& rng) const {
    std::uniform_int_distribution<size_t> offset(0, data_.size() - size);
    return {static_cast<uint32_t>(offset(rng)), size};
  }

  // The bytes of a slice.
  std::string_view Get(ValueRef ref) const {
    return std::string_view(data_).substr(ref.offset, ref.size);
  }

 private:
  std::string data_;
};

// Value sizes of a workload: each key draws small, medium or large with these percentages.
struct ValueMix {
  std::array<uint32_t, 3> sizes;
  std::array<uint32_t, 3> percent;

  // Draws one value size.
  uint32_t Draw(std::mt19937_64& rng) const {
    uint32_t roll = static_cast<uint32_t>(rng() % 100);
    for (size_t i = 0; i + 1 < sizes.size(); ++i) {
      if (roll < percent[i]) return sizes[i];
      roll -= percent[i];
    }
    return sizes.back();
  }
};

// Every value `size` bytes.
ValueMix FixedSize(uint32_t size) {
  return {{size, size, size}, {100, 0, 0}};
}

// The value sizes of an Anthus mix.
ValueMix MixSizes(const AnthusMix& mix) {
  return {{kSmallValue, kMediumValue, kLargeValue},
          {mix.small_pct, mix.medium_pct, 100 - mix.small_pct - mix.medium_pct}};
}

// Writes key number `number` as "user" + 12 zero-padded digits into out[0..kKeySize).
void EncodeKey(uint64_t number, char* out) {
  std::memcpy(out, kKeyPrefix.data(), kKeyPrefix.size());
  for (size_t i = kKeySize; i > kKeyPrefix.size(); --i) {
    out[i - 1] = static_cast<char>('0' + number % 10);
    number /= 10;
  }
}

// A pre-generated sequence of operations: each key with the value to write, or the value a
// read must find.
class OpList {
 public:
  // Appends key number `number` with `value`.
  void Add(uint64_t number, ValueRef value) {
    size_t pos = keys_.size();
    keys_.resize(pos + kKeySize);
    EncodeKey(number, &keys_[pos]);
    values_.push_back(value);
  }

  // Reserves room for `count` operations.
  void Reserve(size_t count) {
    keys_.reserve(count * kKeySize);
    values_.reserve(count);
  }

  size_t size() const { return values_.size(); }
  std::string_view Key(size_t i) const {
    return std::string_view(keys_).substr(i * kKeySize, kKeySize);
  }
  ValueRef Value(size_t i) const { return values_[i]; }

 private:
  std::string keys_;
  std::vector<ValueRef> values_;
};

// Key numbers 0..num-1 in order.
std::vector<uint64_t> SequentialKeys(uint64_t num) {
  std::vector<uint64_t> keys(num);
  for (uint64_t i = 0; i < num; ++i) keys[i] = i;
  return keys;
}

// Key numbers 0..num-1 in a random order.
std::vector<uint64_t> ShuffledKeys(uint64_t num, std::mt19937_64& rng) {
  std::vector<uint64_t> keys = SequentialKeys(num);
  std::shuffle(keys.begin(), keys.end(), rng);
  return keys;
}

// `count` key numbers drawn uniformly from 0..num-1.
std::vector<uint64_t> UniformKeys(uint64_t count, uint64_t num, std::mt19937_64& rng) {
  std::uniform_int_distribution<uint64_t> pick(0, num - 1);
  std::vector<uint64_t> keys(count);
  for (uint64_t& key : keys) key = pick(rng);
  return keys;
}

// Writes of `keys` with values sized by `mix`; records each key's value in `latest` if given.
OpList MakeWrites(const std::vector<uint64_t>& keys, const ValueMix& mix, const ValuePool& pool,
                  std::mt19937_64& rng, std::vector<ValueRef>* latest) {
  OpList ops;
  ops.Reserve(keys.size());
  for (uint64_t key : keys) {
    ValueRef value = pool.Pick(mix.Draw(rng), rng);
    ops.Add(key, value);
    if (latest != nullptr) (*latest)[key] = value;
  }
  return ops;
}

// Reads of `keys`, each expecting the value `latest` holds for it.
OpList MakeReads(const std::vector<uint64_t>& keys, const std::vector<ValueRef>& latest) {
  OpList ops;
  ops.Reserve(keys.size());
  for (uint64_t key : keys) ops.Add(key, latest[key]);
  return ops;
}

// The operations of the fillrandom group, shared by both engines.
struct RandomPlan {
  OpList fill;
  OpList overwrite;  // empty unless overwrite is selected
  OpList reads;
  OpList seeks;
};

// Generates the fillrandom group: a permutation fill, then the selected overwrites, then reads
// and seeks that expect the last value written to each key.
RandomPlan MakeRandomPlan(const Flags& flags, const ValuePool& pool) {
  std::mt19937_64 rng(kSeed + 1);
  std::vector<ValueRef> latest(flags.num);
  ValueMix mix = FixedSize(flags.value_size);
  RandomPlan plan;
  plan.fill = MakeWrites(ShuffledKeys(flags.num, rng), mix, pool, rng, &latest);
  if (flags.Selected("overwrite")) {
    plan.overwrite = MakeWrites(UniformKeys(flags.num, flags.num, rng), mix, pool, rng, &latest);
  }
  if (flags.Selected("readrandom")) {
    plan.reads = MakeReads(UniformKeys(flags.num, flags.num, rng), latest);
  }
  if (flags.Selected("seekrandom")) {
    plan.seeks = MakeReads(UniformKeys(flags.num / 10, flags.num, rng), latest);
  }
  return plan;
}

// A cursor over the whole keyspace of one engine.
class BenchIterator {
 public:
  virtual ~BenchIterator() = default;
  virtual void SeekToFirst() = 0;
  virtual void Seek(std::string_view key) = 0;
  virtual void Next() = 0;
  virtual bool Valid() const = 0;
  virtual std::string_view key() const = 0;
  virtual std::string_view value() const = 0;
  // Throws BenchError if the iteration stopped on an error.
  virtual void CheckStatus() const = 0;
};

// One open database of either engine, with the operations the workloads use.
class BenchDb {
 public:
  virtual ~BenchDb() = default;
  virtual std::string_view name() const = 0;
  virtual void Put(std::string_view key, std::string_view value) = 0;
  // Makes every write issued so far durable.
  virtual void Sync() = 0;
  // Returns false if the key is missing.
  virtual bool Get(std::string_view key, std::string* value) = 0;
  virtual std::unique_ptr<BenchIterator> NewIterator() = 0;
  // Device bytes written per user byte put since the database was created.
  virtual double WriteAmplification() = 0;
  // Engine-specific counters worth printing after a write workload (may be empty).
  virtual std::string WriteNote() { return {}; }
};

// An anonymous shared mapping (zeroed), unmapped on destruction.
class SharedArena {
 public:
  explicit SharedArena(size_t size)
      : size_(size),
        data_(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)) {
    if (data_ == MAP_FAILED) {
      throw BenchError("mmap of a " + std::to_string(size) + "-byte arena: " + strerror(errno));
    }
  }
  ~SharedArena() { munmap(data_, size_); }
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  size_t size_;
  void* data_;
};

// BenchIterator over a slipstream iterator.
class SlipstreamIterator : public BenchIterator {
 public:
  explicit SlipstreamIterator(std::unique_ptr<ss::Iterator> it) : it_(std::move(it)) {}
  void SeekToFirst() override { it_->SeekToFirst(); }
  void Seek(std::string_view key) override { it_->Seek(key); }
  void Next() override { it_->Next(); }
  bool Valid() const override { return it_->Valid(); }
  std::string_view key() const override { return it_->key(); }
  std::string_view value() const override { return it_->value(); }
  void CheckStatus() const override { Check(it_->status(), "iterator"); }

 private:
  std::unique_ptr<ss::Iterator> it_;
};

// A fresh slipstream engine with one keyspace and one background worker thread.
class SlipstreamDb : public BenchDb {
 public:
  // Opens the engine in `dir`; members are declared so that the worker stops first, then the
  // engine closes, then the arena is unmapped.
  SlipstreamDb(const std::filesystem::path& dir, uint64_t l0_size)
      : options_(MakeOptions(dir, l0_size)), arena_(ss::Engine::ArenaSize(options_)) {
    Check(ss::Engine::Open(options_, arena_.data(), arena_.size(), &engine_), "open");
    Check(engine_->CreateKeyspace(1, &keyspace_), "create keyspace");
    worker_ = std::jthread([this](std::stop_token stop) {
      while (!stop.stop_requested()) {
        if (!engine_->DoBackgroundWork()) engine_->WaitForBackgroundWork(50);
      }
    });
  }

  std::string_view name() const override { return "slipstream"; }
  void Put(std::string_view key, std::string_view value) override {
    Check(engine_->Put(keyspace_, key, value, &last_lsn_), "put");
  }
  void Sync() override { Check(engine_->Sync(last_lsn_), "sync"); }
  bool Get(std::string_view key, std::string* value) override {
    ss::Status status = engine_->Get(keyspace_, key, value);
    if (status.IsNotFound()) return false;
    Check(status, "get");
    return true;
  }
  std::unique_ptr<BenchIterator> NewIterator() override {
    return std::make_unique<SlipstreamIterator>(engine_->NewIterator(keyspace_));
  }
  double WriteAmplification() override { return engine_->GetStats().WriteAmplification(); }
  std::string WriteNote() override {
    ss::Stats st = engine_->GetStats();
    char note[160];
    std::snprintf(note, sizeof(note), "compactions %llu, stalls %llu (%.2f s), %.1f records/flush",
                  static_cast<unsigned long long>(st.compactions),
                  static_cast<unsigned long long>(st.stall_count), double(st.stall_micros) / 1e6,
                  st.RecordsPerFlush());
    return note;
  }

 private:
  // The engine options of the benchmark.
  static ss::Options MakeOptions(const std::filesystem::path& dir, uint64_t l0_size) {
    ss::Options options;
    options.directory = dir.string();
    options.l0_size = l0_size;
    options.use_fsync = true;
    return options;
  }

  ss::Options options_;
  SharedArena arena_;
  std::unique_ptr<ss::Engine> engine_;
  ss::KeyspaceId keyspace_ = 0;
  ss::Lsn last_lsn_ = 0;
  std::jthread worker_;
};

// BenchIterator over a RocksDB iterator.
class RocksIterator : public BenchIterator {
 public:
  explicit RocksIterator(rocksdb::Iterator* it) : it_(it) {}
  void SeekToFirst() override { it_->SeekToFirst(); }
  void Seek(std::string_view key) override { it_->Seek(key); }
  void Next() override { it_->Next(); }
  bool Valid() const override { return it_->Valid(); }
  std::string_view key() const override { return it_->key().ToStringView(); }
  std::string_view value() const override { return it_->value().ToStringView(); }
  void CheckStatus() const override { Check(it_->status(), "iterator"); }

 private:
  std::unique_ptr<rocksdb::Iterator> it_;
};

// A fresh RocksDB database: WAL on without a sync per write, LZ4, two background threads.
class RocksDb : public BenchDb {
 public:
  // Opens the database in `dir`.
  explicit RocksDb(const std::filesystem::path& dir) : statistics_(rocksdb::CreateDBStatistics()) {
    rocksdb::Options options;
    options.create_if_missing = true;
    options.IncreaseParallelism(2);
    options.compression = rocksdb::kLZ4Compression;
    options.statistics = statistics_;
    write_options_.sync = false;
    write_options_.disableWAL = false;
    rocksdb::DB* db = nullptr;
    Check(rocksdb::DB::Open(options, dir.string(), &db), "open");
    db_.reset(db);
  }

  std::string_view name() const override { return "rocksdb"; }
  void Put(std::string_view key, std::string_view value) override {
    Check(db_->Put(write_options_, key, value), "put");
    user_bytes_ += key.size() + value.size();
  }
  void Sync() override { Check(db_->FlushWAL(true), "FlushWAL"); }
  bool Get(std::string_view key, std::string* value) override {
    rocksdb::Status status = db_->Get(rocksdb::ReadOptions(), key, value);
    if (status.IsNotFound()) return false;
    Check(status, "get");
    return true;
  }
  std::unique_ptr<BenchIterator> NewIterator() override {
    return std::make_unique<RocksIterator>(db_->NewIterator(rocksdb::ReadOptions()));
  }
  // Flushes the memtable first, so that what is in it counts as written.
  double WriteAmplification() override {
    Check(db_->Flush(rocksdb::FlushOptions()), "flush");
    uint64_t device_bytes = statistics_->getTickerCount(rocksdb::Tickers::WAL_FILE_BYTES) +
                            statistics_->getTickerCount(rocksdb::Tickers::COMPACT_WRITE_BYTES) +
                            statistics_->getTickerCount(rocksdb::Tickers::FLUSH_WRITE_BYTES);
    return user_bytes_ ? double(device_bytes) / double(user_bytes_) : 0.0;
  }

 private:
  std::shared_ptr<rocksdb::Statistics> statistics_;
  rocksdb::WriteOptions write_options_;
  std::unique_ptr<rocksdb::DB> db_;
  uint64_t user_bytes_ = 0;
};

// Opens a fresh database of `engine` in `dir`.
std::unique_ptr<BenchDb> OpenDb(EngineKind engine, const std::filesystem::path& dir,
                                const Flags& flags) {
  if (engine == EngineKind::kSlipstream) {
    return std::make_unique<SlipstreamDb>(dir, flags.l0_size_mb << 20);
  }
  return std::make_unique<RocksDb>(dir);
}

// A directory emptied when created and removed when destroyed.
class ScratchDir {
 public:
  explicit ScratchDir(std::filesystem::path path) : path_(std::move(path)) {
    std::filesystem::remove_all(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Throughput of one workload on one engine, with write amplification for writes.
struct Result {
  uint64_t ops = 0;
  double seconds = 0;
  std::optional<double> write_amp;
  std::string note;

  double OpsPerSec() const { return seconds > 0 ? double(ops) / seconds : 0.0; }
};

// The result of `ops` operations timed from `start` until now.
Result Timed(uint64_t ops, Clock::time_point start) {
  Result result;
  result.ops = ops;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

// Puts every operation and makes them durable (timed), then measures write amplification.
Result RunWrites(BenchDb& db, const OpList& ops, const ValuePool& pool) {
  Clock::time_point start = Clock::now();
  for (size_t i = 0; i < ops.size(); ++i) db.Put(ops.Key(i), pool.Get(ops.Value(i)));
  db.Sync();
  Result result = Timed(ops.size(), start);
  result.write_amp = db.WriteAmplification();
  result.note = db.WriteNote();
  return result;
}

// Gets every key (timed); a missing key or a wrong value is a correctness bug.
Result RunReadRandom(BenchDb& db, const OpList& reads, const ValuePool& pool) {
  std::string value;
  uint64_t found = 0;
  uint64_t wrong = 0;
  Clock::time_point start = Clock::now();
  for (size_t i = 0; i < reads.size(); ++i) {
    if (!db.Get(reads.Key(i), &value)) continue;
    ++found;
    if (value != pool.Get(reads.Value(i))) ++wrong;
  }
  Result result = Timed(reads.size(), start);
  if (found != reads.size() || wrong != 0) {
    throw BenchError(std::string(db.name()) +
                     " readrandom: " + std::to_string(reads.size() - found) + " keys missing and " +
                     std::to_string(wrong) + " wrong values among " + std::to_string(reads.size()) +
                     " gets of existing keys");
  }
  result.note = "found " + std::to_string(found) + "/" + std::to_string(reads.size());
  return result;
}

// The progress note of a scan: entries visited and key-value bytes read per second.
std::string ScanNote(uint64_t entries, uint64_t bytes, double seconds) {
  char note[64];
  std::snprintf(note, sizeof(note), "%llu entries, %.1f MB/s",
                static_cast<unsigned long long>(entries), double(bytes) / 1e6 / seconds);
  return note;
}

// Iterates the whole keyspace (timed), which must hold exactly `num` keys.
Result RunReadSeq(BenchDb& db, uint64_t num) {
  uint64_t count = 0;
  uint64_t bytes = 0;
  Clock::time_point start = Clock::now();
  std::unique_ptr<BenchIterator> it = db.NewIterator();
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    ++count;
    bytes += it->key().size() + it->value().size();
  }
  it->CheckStatus();
  Result result = Timed(count, start);
  if (count != num) {
    throw BenchError(std::string(db.name()) + " readseq: saw " + std::to_string(count) +
                     " keys, expected " + std::to_string(num));
  }
  result.note = ScanNote(count, bytes, result.seconds);
  return result;
}

// Seeks to every key and reads the next kNextsPerSeek entries (timed); each seek must land on its
// key with its last written value.
Result RunSeekRandom(BenchDb& db, const OpList& seeks, const ValuePool& pool) {
  uint64_t misses = 0;
  uint64_t entries = 0;
  uint64_t bytes = 0;
  Clock::time_point start = Clock::now();
  std::unique_ptr<BenchIterator> it = db.NewIterator();
  for (size_t i = 0; i < seeks.size(); ++i) {
    it->Seek(seeks.Key(i));
    if (!it->Valid() || it->key() != seeks.Key(i) || it->value() != pool.Get(seeks.Value(i))) {
      ++misses;
    }
    for (int n = 0; n < kNextsPerSeek && it->Valid(); ++n) {
      it->Next();
      if (!it->Valid()) break;
      ++entries;
      bytes += it->key().size() + it->value().size();
    }
  }
  it->CheckStatus();
  Result result = Timed(seeks.size(), start);
  if (misses != 0) {
    throw BenchError(std::string(db.name()) + " seekrandom: " + std::to_string(misses) + " of " +
                     std::to_string(seeks.size()) +
                     " seeks to existing keys missed the key or its value");
  }
  result.note = ScanNote(entries, bytes, result.seconds);
  return result;
}

// Results of every workload on every engine, printed as they come and as a table at the end.
class Report {
 public:
  // Records a result and prints its progress line.
  void Add(std::string_view workload, EngineKind engine, Result result) {
    std::printf("%-10s  %-10s  %12.0f ops/s  %9.2f s", std::string(workload).c_str(),
                std::string(EngineName(engine)).c_str(), result.OpsPerSec(), result.seconds);
    if (result.write_amp) std::printf("  WA %.2f", *result.write_amp);
    if (!result.note.empty()) std::printf("  %s", result.note.c_str());
    std::printf("\n");
    std::fflush(stdout);
    results_[std::string(workload)][static_cast<size_t>(engine)] = std::move(result);
  }

  // Prints the summary table of the selected workloads.
  void PrintSummary(const Flags& flags) const {
    std::printf("\n%-10s | %16s | %13s | %6s | %13s | %10s\n", "workload", "slipstream ops/s",
                "rocksdb ops/s", "ratio", "slipstream WA", "rocksdb WA");
    std::printf(
        "-----------+------------------+---------------+--------+---------------+---------"
        "---\n");
    for (std::string_view workload : kAllBenchmarks) {
      if (!flags.Selected(workload)) continue;
      const Result* slip = Find(workload, EngineKind::kSlipstream);
      const Result* rocks = Find(workload, EngineKind::kRocksDb);
      std::printf("%-10s | %16s | %13s | %6s | %13s | %10s\n", std::string(workload).c_str(),
                  Format(OpsPerSec(slip), "%.0f").c_str(), Format(OpsPerSec(rocks), "%.0f").c_str(),
                  Format(Ratio(workload), "%.2f").c_str(), Format(WriteAmp(slip), "%.2f").c_str(),
                  Format(WriteAmp(rocks), "%.2f").c_str());
    }
    std::printf(
        "(WA: device bytes written / user bytes put since the database was created; "
        "overwrite includes its fillrandom)\n");
  }

  // Prints the informational goal checks.
  void PrintGoals(const Flags& flags) const {
    std::optional<double> fill = flags.value_size == 100 ? Ratio("fillrandom") : std::nullopt;
    PrintGoal("fillrandom(100B) ratio >= 1.5", fill ? std::optional(*fill >= 1.5) : std::nullopt,
              "ratio " + Format(fill, "%.2f"));
    std::optional<double> read = Ratio("readrandom");
    PrintGoal("readrandom ratio >= 1.0", read ? std::optional(*read >= 1.0) : std::nullopt,
              "ratio " + Format(read, "%.2f"));
    std::optional<double> sd = Ratio("SD");
    std::optional<double> slip_wa = WriteAmp(Find("SD", EngineKind::kSlipstream));
    std::optional<double> rocks_wa = WriteAmp(Find("SD", EngineKind::kRocksDb));
    std::optional<bool> sd_met;
    if (sd && slip_wa && rocks_wa) sd_met = *sd >= 2.0 && *slip_wa <= 0.5 * *rocks_wa;
    PrintGoal("SD ratio >= 2.0 and WA <= 0.5x", sd_met,
              "ratio " + Format(sd, "%.2f") + ", WA " + Format(slip_wa, "%.2f") + " vs " +
                  Format(rocks_wa, "%.2f"));
  }

 private:
  // The result of a workload on an engine, or null if it did not run.
  const Result* Find(std::string_view workload, EngineKind engine) const {
    auto it = results_.find(workload);
    if (it == results_.end()) return nullptr;
    const std::optional<Result>& result = it->second[static_cast<size_t>(engine)];
    return result ? &*result : nullptr;
  }

  // Throughput of a result that may be missing.
  static std::optional<double> OpsPerSec(const Result* result) {
    return result ? std::optional(result->OpsPerSec()) : std::nullopt;
  }

  // Write amplification of a result that may be missing or have none.
  static std::optional<double> WriteAmp(const Result* result) {
    return result ? result->write_amp : std::nullopt;
  }

  // slipstream ops/s divided by RocksDB ops/s, if both ran.
  std::optional<double> Ratio(std::string_view workload) const {
    std::optional<double> slip = OpsPerSec(Find(workload, EngineKind::kSlipstream));
    std::optional<double> rocks = OpsPerSec(Find(workload, EngineKind::kRocksDb));
    if (!slip || !rocks || *rocks <= 0) return std::nullopt;
    return *slip / *rocks;
  }

  // Formats a number with `format`, or "-" if it is missing.
  static std::string Format(std::optional<double> value, const char* format) {
    if (!value) return "-";
    char text[32];
    std::snprintf(text, sizeof(text), format, *value);
    return text;
  }

  // Prints one goal line: PASS, MISS, or SKIP when it was not measured on both engines.
  static void PrintGoal(std::string_view goal, std::optional<bool> met, const std::string& detail) {
    const char* verdict = !met ? "SKIP" : *met ? "PASS" : "MISS";
    std::printf("goal %-34s %s (%s)\n", std::string(goal).c_str(), verdict, detail.c_str());
  }

  std::map<std::string, std::array<std::optional<Result>, 2>, std::less<>> results_;
};

// The "model name" line of /proc/cpuinfo, or "unknown".
std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    size_t colon = line.find(':');
    if (line.starts_with("model name") && colon != std::string::npos) {
      return line.substr(std::min(colon + 2, line.size()));
    }
  }
  return "unknown";
}

// Prints the processor count, kernel and CPU model.
void PrintMachine() {
  utsname name{};
  uname(&name);
  std::printf("machine: nproc=%ld kernel=%s %s cpu=%s\n", sysconf(_SC_NPROCESSORS_ONLN),
              name.sysname, name.release, CpuModel().c_str());
}

// The directory a workload runs in on an engine.
std::filesystem::path WorkloadDir(const Flags& flags, std::string_view workload,
                                  EngineKind engine) {
  return flags.dir / (std::string(workload) + "-" + std::string(EngineName(engine)));
}

// Runs one fill workload on a fresh database of each selected engine.
void RunFillWorkload(std::string_view workload, const OpList& ops, const ValuePool& pool,
                     const Flags& flags, Report* report) {
  for (EngineKind engine : flags.engines) {
    ScratchDir dir(WorkloadDir(flags, workload, engine));
    std::unique_ptr<BenchDb> db = OpenDb(engine, dir.path(), flags);
    report->Add(workload, engine, RunWrites(*db, ops, pool));
  }
}

// Runs fillrandom, then the selected overwrite and reads, on one database of each engine.
void RunRandomGroup(const RandomPlan& plan, const ValuePool& pool, const Flags& flags,
                    Report* report) {
  for (EngineKind engine : flags.engines) {
    ScratchDir dir(WorkloadDir(flags, "fillrandom", engine));
    std::unique_ptr<BenchDb> db = OpenDb(engine, dir.path(), flags);
    Result fill = RunWrites(*db, plan.fill, pool);
    if (flags.Selected("fillrandom")) report->Add("fillrandom", engine, std::move(fill));
    if (flags.Selected("overwrite")) {
      report->Add("overwrite", engine, RunWrites(*db, plan.overwrite, pool));
    }
    if (flags.Selected("readrandom")) {
      report->Add("readrandom", engine, RunReadRandom(*db, plan.reads, pool));
    }
    if (flags.Selected("readseq")) report->Add("readseq", engine, RunReadSeq(*db, flags.num));
    if (flags.Selected("seekrandom")) {
      report->Add("seekrandom", engine, RunSeekRandom(*db, plan.seeks, pool));
    }
  }
}

// Runs every selected workload and prints the summary.
void RunBenchmarks(const Flags& flags) {
  std::filesystem::create_directories(flags.dir);
  std::printf("engine_bench: num=%llu value_size=%u l0_size_mb=%llu dir=%s engines=",
              static_cast<unsigned long long>(flags.num), flags.value_size,
              static_cast<unsigned long long>(flags.l0_size_mb), flags.dir.c_str());
  for (size_t i = 0; i < flags.engines.size(); ++i) {
    std::printf("%s%s", i ? "," : "", EngineName(flags.engines[i]).data());
  }
  std::printf("\n");
  ValuePool pool;
  Report report;
  if (flags.Selected("fillseq")) {
    std::mt19937_64 rng(kSeed + 2);
    OpList ops =
        MakeWrites(SequentialKeys(flags.num), FixedSize(flags.value_size), pool, rng, nullptr);
    RunFillWorkload("fillseq", ops, pool, flags, &report);
  }
  if (std::any_of(kRandomGroup.begin(), kRandomGroup.end(),
                  [&](std::string_view name) { return flags.Selected(name); })) {
    RunRandomGroup(MakeRandomPlan(flags, pool), pool, flags, &report);
  }
  for (const AnthusMix& mix : kAnthusMixes) {
    if (!flags.Selected(mix.name)) continue;
    std::mt19937_64 rng(kSeed + 3);
    OpList ops = MakeWrites(ShuffledKeys(flags.num, rng), MixSizes(mix), pool, rng, nullptr);
    RunFillWorkload(mix.name, ops, pool, flags, &report);
  }
  report.PrintSummary(flags);
  PrintMachine();
  report.PrintGoals(flags);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  Flags flags;
  try {
    flags = ParseFlags(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "engine_bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
  try {
    RunBenchmarks(flags);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "engine_bench: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
