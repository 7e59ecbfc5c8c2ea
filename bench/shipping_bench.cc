// shipping_bench: what a replica spends to keep up with a primary's engine, Send-Index against
// Build-Index, in one run (issue 10). A primary engine runs a YCSB-style load and update phase
// (uniform keys, a value mix of small, medium and large values); its index-shipping frames
// (bench: no transport, the replica-side cost only) are then applied to a Send-Index replica,
// and the same writes, with the same background work, to a Build-Index replica that compacts
// for itself. Reports, per replica: CPU seconds (user + system of this process while it
// works, io_uring workers included), device bytes written and read, and bytes received
// (Send-Index: the frames; Build-Index: keys and values, what its WAL carries at least).
//
//   shipping_bench [--records=200000] [--updates=200000] [--mix=SD|S|M|L] [--l0-size-mb=4]
//                  [--dir=/tmp]
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "slipstream/engine/engine.h"
#include "slipstream/replication/index_stream.h"

namespace {

using namespace slipstream;

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// An engine in a fresh directory under `base`.
struct BenchEngine {
  BenchEngine(const std::string& base, const std::string& name, uint64_t l0_size,
              std::shared_ptr<engine::EngineObserver> observer) {
    dir = base + "/shipping-bench-" + name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    options.directory = dir;
    options.use_fsync = false;
    options.l0_size = l0_size;
    options.observer = std::move(observer);
    size = engine::Engine::ArenaSize(options);
    arena = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    engine::Status s = engine::Engine::Open(options, arena, size, &e);
    if (!s.ok()) {
      std::fprintf(stderr, "open %s: %s\n", dir.c_str(), s.ToString().c_str());
      std::exit(1);
    }
    e->CreateKeyspace(1, &ks);
  }
  ~BenchEngine() {
    e.reset();
    munmap(arena, size);
    std::filesystem::remove_all(dir);
  }
  std::string dir;
  engine::Options options;
  size_t size = 0;
  void* arena = nullptr;
  std::unique_ptr<engine::Engine> e;
  engine::KeyspaceId ks = 0;
};

struct Op {
  std::string key;
  uint32_t value_size;
  uint32_t seed;
};

std::string MakeValue(uint32_t size, uint32_t seed) {
  // Random letters: about 4.7 bits of entropy per byte, so LZ4 finds little to take in the
  // values themselves (the keys and the node structure are what it compresses).
  std::string v(size, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint32_t i = 0; i < size; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = char('a' + x % 26);
  }
  return v;
}

// Runs the ops on `b`, with background work after every 10,000 as a host's worker would.
void Drive(BenchEngine& b, const std::vector<Op>& ops) {
  for (size_t i = 0; i < ops.size(); i++) {
    engine::Status s = b.e->Put(b.ks, ops[i].key, MakeValue(ops[i].value_size, ops[i].seed));
    if (!s.ok()) {
      std::fprintf(stderr, "put: %s\n", s.ToString().c_str());
      std::exit(1);
    }
    if (i % 10000 == 9999) {
      while (b.e->DoBackgroundWork()) {
      }
    }
  }
  while (b.e->DoBackgroundWork()) {
  }
  b.e->CompactAll();
}

// Feeds every event to two observers (the two encoders).
struct Tee : engine::EngineObserver {
  Tee(std::shared_ptr<engine::EngineObserver> a, std::shared_ptr<engine::EngineObserver> b)
      : a(std::move(a)), b(std::move(b)) {}
  void OnLogWrite(const engine::LogWriteEvent& e) override {
    a->OnLogWrite(e);
    b->OnLogWrite(e);
  }
  void OnCompactionBegin(const engine::CompactionBeginEvent& e) override {
    a->OnCompactionBegin(e);
    b->OnCompactionBegin(e);
  }
  void OnCompactionSegment(const engine::CompactionSegmentEvent& e) override {
    a->OnCompactionSegment(e);
    b->OnCompactionSegment(e);
  }
  void OnCompactionInstalled(const engine::CompactionInstalledEvent& e) override {
    a->OnCompactionInstalled(e);
    b->OnCompactionInstalled(e);
  }
  void OnCompactionAbandoned(uint64_t c) override {
    a->OnCompactionAbandoned(c);
    b->OnCompactionAbandoned(c);
  }
  std::shared_ptr<engine::EngineObserver> a, b;
};

// What one Send-Index replica spent applying a stream of frames.
struct Replica {
  std::string name;
  double cpu = 0;
  uint64_t received = 0;
  engine::Stats stats;
  bool ok = false;
};

// Applies `frames` to a fresh replica engine and checks it installed every compaction.
Replica ApplyFrames(const std::string& base, const std::string& name, uint64_t l0_size,
                    const std::vector<std::string>& frames) {
  Replica r;
  r.name = name == "send-index" ? "Send-Index" : "Send-Index, LZ4";
  BenchEngine replica(base, name, l0_size, nullptr);
  sync();  // the previous phase's dirty pages are not written back on this one's time
  double t = CpuSeconds();
  replication::IndexApplier applier(replica.e.get(), 0);
  for (const std::string& f : frames) {
    replication::Status s = applier.Feed(r.received, f);
    r.received += f.size();
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), s.ToString().c_str());
      return r;
    }
  }
  r.cpu = CpuSeconds() - t;
  r.stats = replica.e->GetStats();
  r.ok = applier.installed() == r.stats.compactions && r.stats.compactions > 0;
  if (!r.ok) std::fprintf(stderr, "%s installed no compaction, or not every one\n", name.c_str());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t records = 200000, updates = 200000, l0_size = 4u << 20;
  std::string mix = "SD", base = "/tmp";
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a.rfind("--records=", 0) == 0)
      records = std::stoull(a.substr(10));
    else if (a.rfind("--updates=", 0) == 0)
      updates = std::stoull(a.substr(10));
    else if (a.rfind("--mix=", 0) == 0)
      mix = a.substr(6);
    else if (a.rfind("--l0-size-mb=", 0) == 0)
      l0_size = std::stoull(a.substr(13)) << 20;
    else if (a.rfind("--dir=", 0) == 0)
      base = a.substr(6);
    else {
      std::fprintf(stderr,
                   "usage: shipping_bench [--records=N] [--updates=N] [--mix=SD|S|M|L] "
                   "[--l0-size-mb=N] [--dir=D]\n");
      return 2;
    }
  }
  // Percent small / medium / large (Anthus' mixes) and Parallax-like sizes.
  int small = 60, medium = 20;
  if (mix == "S")
    small = 100, medium = 0;
  else if (mix == "M")
    small = 0, medium = 100;
  else if (mix == "L")
    small = 0, medium = 0;
  std::mt19937_64 rng(1);
  std::vector<Op> ops;
  for (uint64_t i = 0; i < records + updates; i++) {
    uint64_t k = i < records ? i : rng() % records;
    int c = int(rng() % 100);
    uint32_t size = c < small            ? 20 + rng() % 60
                    : c < small + medium ? 200 + rng() % 600
                                         : 1500 + rng() % 1000;
    char key[32];
    std::snprintf(key, sizeof(key), "user%012llu",
                  (unsigned long long)(k * 2654435761u % (records * 4)));
    ops.push_back(Op{key, size, uint32_t(i)});
  }
  uint64_t user_bytes = 0;
  for (const Op& op : ops) user_bytes += op.key.size() + op.value_size;

  std::vector<std::string> frames, lz4_frames;
  auto plain = std::make_shared<replication::IndexEventEncoder>(
      [&frames](std::string f) { frames.push_back(std::move(f)); });
  auto packed = std::make_shared<replication::IndexEventEncoder>(
      [&lz4_frames](std::string f) { lz4_frames.push_back(std::move(f)); }, true);
  double t0 = CpuSeconds();
  double primary_cpu;
  engine::Stats ps;
  {
    BenchEngine primary(base, "primary", l0_size, std::make_shared<Tee>(plain, packed));
    Drive(primary, ops);
    primary_cpu = CpuSeconds() - t0;  // (both encoders included)
    ps = primary.e->GetStats();
  }  // its files go, and their page cache with them: no replica pays for evicting it
  {
    Replica send = ApplyFrames(base, "send-index", l0_size, frames);
    Replica send_lz4 = ApplyFrames(base, "send-index-lz4", l0_size, lz4_frames);
    if (!send.ok || !send_lz4.ok) return 1;

    BenchEngine build(base, "build-index", l0_size, nullptr);
    sync();
    double t2 = CpuSeconds();
    Drive(build, ops);
    double build_cpu = CpuSeconds() - t2;
    engine::Stats bs = build.e->GetStats();

    double n = double(ops.size());
    std::printf(
        "shipping_bench: %llu records, %llu updates, mix %s, %llu compactions on the primary\n",
        (unsigned long long)records, (unsigned long long)updates, mix.c_str(),
        (unsigned long long)ps.compactions);
    std::printf(
        "| replica | CPU us/op | device MB written | device MB read | MB received "
        "|\n|---|---:|---:|---:|---:|\n");
    std::printf("| primary (for scale) | %.2f | %.1f | %.1f | - |\n", primary_cpu / n * 1e6,
                ps.device_bytes_written / 1e6, ps.device_bytes_read / 1e6);
    for (const Replica* r : {&send, &send_lz4}) {
      std::printf("| %s | %.2f | %.1f | %.1f | %.1f |\n", r->name.c_str(), r->cpu / n * 1e6,
                  r->stats.device_bytes_written / 1e6, r->stats.device_bytes_read / 1e6,
                  r->received / 1e6);
    }
    std::printf("| Build-Index | %.2f | %.1f | %.1f | %.1f |\n", build_cpu / n * 1e6,
                bs.device_bytes_written / 1e6, bs.device_bytes_read / 1e6, user_bytes / 1e6);
    std::printf(
        "Build-Index / Send-Index: CPU %.2fx (with LZ4 %.2fx), device writes %.2fx, device "
        "reads %s; network Send-Index / Build-Index %.2fx (with LZ4 %.2fx)\n",
        build_cpu / send.cpu, build_cpu / send_lz4.cpu,
        double(bs.device_bytes_written) / double(send.stats.device_bytes_written),
        send.stats.device_bytes_read == 0 ? "none on Send-Index" : "see table",
        double(send.received) / double(user_bytes), double(send_lz4.received) / double(user_bytes));
  }
  return 0;
}
