// Many processes sharing one engine through its shared-memory arena: writers, readers and a
// background worker run concurrently in fork()ed children; iterator snapshots survive writes,
// compactions and GC done by another process.
//
// Children never return into gtest: each runs a body that returns an exit code and _exit()s
// with it, leaving a short diagnostic in a small shared control block (a MAP_SHARED mapping of
// its own, separate from the engine arena).
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace slipstream::engine::test {
namespace {

// ---------------------------------------------------------------------------------------------
// Control block and child processes

constexpr int kMaxChildren = 16;

struct Control {
  std::atomic<int> stop{0};
  std::atomic<uint64_t> progress[kMaxChildren];
  char message[kMaxChildren][512];
};

// A MAP_SHARED control block the children inherit (never part of the engine arena).
class SharedControl {
 public:
  SharedControl() {
    void* p =
        mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    ctl_ = new (p) Control();
    for (auto& p2 : ctl_->progress) p2.store(0);
    std::memset(ctl_->message, 0, sizeof(ctl_->message));
  }
  ~SharedControl() {
    ctl_->~Control();
    munmap(ctl_, sizeof(Control));
  }
  Control* get() const { return ctl_; }
  Control* operator->() const { return ctl_; }

 private:
  Control* ctl_;
};

// Exit codes of children (distinct so that a failure says where it happened).
enum ExitCode : int {
  kExitOk = 0,
  kExitOpen = 10,
  kExitWrite = 11,
  kExitReadBack = 12,
  kExitSync = 13,
  kExitScanOrder = 20,
  kExitScanValue = 21,
  kExitScanStatus = 22,
  kExitGet = 23,
  kExitMonotonic = 24,
  kExitSeek = 25,
  kExitSnapshot = 30,
  kExitPipe = 31,
  kExitCompact = 32,
  kExitException = 90,
};

// Records a diagnostic for child `slot` and returns `code` (for `return Fail(...)`).
int Fail(Control* ctl, int slot, int code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctl->message[slot], sizeof(ctl->message[slot]), fmt, ap);
  va_end(ap);
  return code;
}

struct Child {
  pid_t pid = -1;
  int slot = 0;
  std::string name;
  int status = 0;
  bool reaped = false;
};

// Forks a child that runs `body` and _exit()s with its result; it never returns into gtest.
Child Spawn(int slot, std::string name, const std::function<int()>& body) {
  fflush(stdout);
  fflush(stderr);
  Child c;
  c.slot = slot;
  c.name = std::move(name);
  c.pid = fork();
  if (c.pid == 0) {
    int code = kExitException;
    try {
      code = body();
    } catch (...) {
      code = kExitException;
    }
    _exit(code);
  }
  return c;
}

// Waits for `c`; after `timeout_s` (a hang, not a timing check) kills it and reports so.
void Reap(Child* c, int timeout_s, bool* hung) {
  if (c->reaped || c->pid <= 0) return;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (true) {
    pid_t r = waitpid(c->pid, &c->status, WNOHANG);
    if (r == c->pid) break;
    if (r < 0 && errno != EINTR) {
      c->status = -1;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, &c->status, 0);
      *hung = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  c->reaped = true;
}

// Waits for `c` to exit as long as `progress` keeps moving; false if it stood still for
// `no_progress_s` seconds (the child is then still running).
bool WaitWhileProgressing(Child* c, const std::atomic<uint64_t>* progress, int no_progress_s) {
  uint64_t last = progress->load();
  auto last_change = std::chrono::steady_clock::now();
  while (true) {
    pid_t r = waitpid(c->pid, &c->status, WNOHANG);
    if (r == c->pid || (r < 0 && errno != EINTR)) {
      c->reaped = true;
      return true;
    }
    uint64_t p = progress->load();
    if (p != last) {
      last = p;
      last_change = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - last_change >
               std::chrono::seconds(no_progress_s)) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Empty if the child exited with 0; otherwise how it ended and its message.
std::string Outcome(const Child& c, const Control* ctl) {
  std::string how;
  if (WIFEXITED(c.status)) {
    if (WEXITSTATUS(c.status) == 0) return "";
    how = "exit code " + std::to_string(WEXITSTATUS(c.status));
  } else if (WIFSIGNALED(c.status)) {
    how = "signal " + std::to_string(WTERMSIG(c.status));
  } else {
    how = "status " + std::to_string(c.status);
  }
  return c.name + " (pid " + std::to_string(c.pid) + ") failed: " + how + ": " +
         ctl->message[c.slot];
}

// ---------------------------------------------------------------------------------------------
// Deterministic workload: every writer's operation i is a function of (writer, i), and every
// value encodes its key and version, so anyone can check a value and recompute final states.

constexpr int kWriters = 3;
constexpr int kKeysPerWriter = 1500;
constexpr int kOpsPerWriter = 20000;
constexpr int kBatchLen = 10;  // ops [b*10, b*10+10) form one WriteBatch when (b % 7) == 3

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::string WriterKey(int w, int n) {
  char buf[32];
  snprintf(buf, sizeof(buf), "w%d-%05d", w, n);
  return buf;
}

struct WriterOp {
  bool is_delete;
  int n;        // key number in the writer's range
  size_t size;  // value size of a put
};

WriterOp OpOf(int w, int i) {
  uint64_t h = Mix((uint64_t(w) << 32) ^ uint64_t(i) ^ 0x5151);
  WriterOp op;
  op.n = int(h % kKeysPerWriter);
  op.is_delete = (h >> 20) % 10 == 0;
  static constexpr size_t kSizes[3] = {24, 200, 3000};  // small, medium, large
  op.size = kSizes[(h >> 28) % 3];
  return op;
}

// "<key>#<version>#" followed by a filler (runs of 8 equal bytes, so LZ4 has work) up to `size`.
std::string ValueOf(const std::string& key, uint64_t version, size_t size) {
  std::string v = key + "#" + std::to_string(version) + "#";
  uint64_t seed = Mix(std::hash<std::string>()(key) ^ (version * 0x100000001b3ull));
  while (v.size() < size) v.push_back(char('a' + Mix(seed + v.size() / 8) % 26));
  return v;
}

bool InBatch(int i) {
  return (i / kBatchLen) % 7 == 3;
}

// The final state of writer `w` after all its operations (or after `ops` of them).
void ApplyWriter(int w, int ops, std::map<std::string, std::string>* model) {
  for (int i = 0; i < ops; i++) {
    WriterOp op = OpOf(w, i);
    std::string key = WriterKey(w, op.n);
    if (op.is_delete) {
      model->erase(key);
    } else {
      (*model)[key] = ValueOf(key, uint64_t(i), op.size);
    }
  }
}

// Checks that `value` is a value some put of writer w wrote for `key`; returns its version or
// -1 with `why` filled.
int64_t CheckValue(std::string_view key, std::string_view value, std::string* why) {
  int w = -1, n = -1;
  char tail = 0;
  std::string k(key);
  if (sscanf(k.c_str(), "w%d-%d%c", &w, &n, &tail) != 2 || w < 0 || w >= kWriters || n < 0 ||
      n >= kKeysPerWriter || WriterKey(w, n) != k) {
    *why = "unexpected key '" + k + "'";
    return -1;
  }
  if (value.size() < k.size() + 3 || value.substr(0, k.size()) != k || value[k.size()] != '#') {
    *why = "value of " + k + " does not start with its key: '" + std::string(value.substr(0, 40)) +
           "'";
    return -1;
  }
  size_t end = value.find('#', k.size() + 1);
  if (end == std::string_view::npos) {
    *why = "value of " + k + " has no version";
    return -1;
  }
  int64_t version = std::atoll(std::string(value.substr(k.size() + 1, end - k.size() - 1)).c_str());
  if (version < 0 || version >= kOpsPerWriter) {
    *why = "value of " + k + " has version out of range " + std::to_string(version);
    return -1;
  }
  WriterOp op = OpOf(w, int(version));
  if (op.is_delete || op.n != n) {
    *why = "value of " + k + " claims version " + std::to_string(version) +
           " which is not a put of this key";
    return -1;
  }
  if (value != ValueOf(k, uint64_t(version), op.size)) {
    *why = "value of " + k + " version " + std::to_string(version) + " has wrong contents (size " +
           std::to_string(value.size()) + ", expected " + std::to_string(op.size) + ")";
    return -1;
  }
  return version;
}

// ---------------------------------------------------------------------------------------------
// Child bodies

int OpenChildEngine(const Options& options, const Arena& arena, Control* ctl, int slot,
                    std::unique_ptr<Engine>* e) {
  Status s = Engine::Open(options, arena.base(), arena.size(), e);
  if (!s.ok()) return Fail(ctl, slot, kExitOpen, "Engine::Open: %s", s.ToString().c_str());
  return kExitOk;
}

int WriterMain(const Options& options, const Arena& arena, KeyspaceId ks, int w, Control* ctl,
               int slot) {
  std::unique_ptr<Engine> e;
  if (int rc = OpenChildEngine(options, arena, ctl, slot, &e)) return rc;
  std::map<std::string, std::string> model;  // this writer's range as it must read now
  std::string got;
  Lsn lsn = 0;
  auto read_back = [&](const std::string& key, int i) -> int {
    Status s = e->Get(ks, key, &got);
    auto m = model.find(key);
    if (m == model.end()) {
      if (!s.IsNotFound()) {
        return Fail(ctl, slot, kExitReadBack, "writer %d op %d: Get(%s) after delete: %s", w, i,
                    key.c_str(),
                    s.ok() ? ("found " + got.substr(0, 30)).c_str() : s.ToString().c_str());
      }
    } else if (!s.ok() || got != m->second) {
      return Fail(ctl, slot, kExitReadBack, "writer %d op %d: Get(%s) after put: %s", w, i,
                  key.c_str(),
                  s.ok() ? ("wrong value " + got.substr(0, 30)).c_str() : s.ToString().c_str());
    }
    return kExitOk;
  };
  int i = 0;
  while (i < kOpsPerWriter) {
    if (InBatch(i)) {
      WriteBatch batch;
      std::vector<std::string> keys;
      for (int j = i; j < i + kBatchLen; j++) {
        WriterOp op = OpOf(w, j);
        std::string key = WriterKey(w, op.n);
        if (op.is_delete) {
          batch.Delete(ks, key);
          model.erase(key);
        } else {
          std::string v = ValueOf(key, uint64_t(j), op.size);
          batch.Put(ks, key, v);
          model[key] = v;
        }
        keys.push_back(key);
      }
      Status s = e->Write(batch, &lsn);
      if (!s.ok())
        return Fail(ctl, slot, kExitWrite, "writer %d batch at %d: %s", w, i, s.ToString().c_str());
      for (const std::string& key : keys) {
        if (int rc = read_back(key, i)) return rc;
      }
      i += kBatchLen;
    } else {
      WriterOp op = OpOf(w, i);
      std::string key = WriterKey(w, op.n);
      Status s;
      if (op.is_delete) {
        s = e->Delete(ks, key, &lsn);
        model.erase(key);
      } else {
        std::string v = ValueOf(key, uint64_t(i), op.size);
        s = e->Put(ks, key, v, &lsn);
        model[key] = v;
      }
      if (!s.ok())
        return Fail(ctl, slot, kExitWrite, "writer %d op %d: %s", w, i, s.ToString().c_str());
      if (i % 5 == 0) {
        if (int rc = read_back(key, i)) return rc;
      }
      i++;
    }
    if (i % 500 == 0) {
      Status s = e->Sync(lsn);
      if (!s.ok()) return Fail(ctl, slot, kExitSync, "writer %d Sync: %s", w, s.ToString().c_str());
    }
    ctl->progress[slot].store(uint64_t(i));
  }
  Status s = e->Sync(lsn);
  if (!s.ok())
    return Fail(ctl, slot, kExitSync, "writer %d final Sync: %s", w, s.ToString().c_str());
  return kExitOk;
}

int BackgroundMain(const Options& options, const Arena& arena, Control* ctl, int slot) {
  std::unique_ptr<Engine> e;
  if (int rc = OpenChildEngine(options, arena, ctl, slot, &e)) return rc;
  uint64_t rounds = 0;
  while (!ctl->stop.load()) {
    if (e->DoBackgroundWork()) {
      ctl->progress[slot].store(++rounds);
    } else {
      e->WaitForBackgroundWork(20);
    }
  }
  return kExitOk;
}

int ReaderMain(const Options& options, const Arena& arena, KeyspaceId ks, int r, Control* ctl,
               int slot) {
  std::unique_ptr<Engine> e;
  if (int rc = OpenChildEngine(options, arena, ctl, slot, &e)) return rc;
  std::mt19937_64 rng(1000 + r);
  // Highest version seen per key: versions of a key only grow, so a later read (Get or a newer
  // iterator) must never show an older one.
  std::vector<int64_t> max_seen(kWriters * kKeysPerWriter, -1);
  auto seen = [&](std::string_view key, int64_t version, const char* where) -> int {
    int w = key[1] - '0';
    int n = std::atoi(std::string(key.substr(3)).c_str());
    int64_t& m = max_seen[w * kKeysPerWriter + n];
    if (version < m) {
      return Fail(ctl, slot, kExitMonotonic, "reader %d %s: %s went back from version %lld to %lld",
                  r, where, std::string(key).c_str(), (long long)m, (long long)version);
    }
    m = version;
    return kExitOk;
  };
  std::string why, got;
  for (uint64_t round = 0; round < 100000 && !ctl->stop.load(); round++) {
    auto it = e->NewIterator(ks);
    std::string prev, start;
    if (round % 3 == 2) {
      start = WriterKey(int(rng() % kWriters), int(rng() % kKeysPerWriter));
      it->Seek(start);
    } else {
      it->SeekToFirst();
    }
    bool first = true;
    uint64_t entries = 0;
    for (; it->Valid(); it->Next(), entries++) {
      std::string key(it->key());
      if (first && key < start) {
        return Fail(ctl, slot, kExitSeek, "reader %d: Seek(%s) landed on %s", r, start.c_str(),
                    key.c_str());
      }
      if (!first && key <= prev) {
        return Fail(ctl, slot, kExitScanOrder, "reader %d scan %llu: key %s after %s", r,
                    (unsigned long long)round, key.c_str(), prev.c_str());
      }
      int64_t version = CheckValue(key, it->value(), &why);
      if (version < 0) {
        return Fail(ctl, slot, kExitScanValue, "reader %d scan %llu: %s", r,
                    (unsigned long long)round, why.c_str());
      }
      if (int rc = seen(key, version, "scan")) return rc;
      prev = std::move(key);
      first = false;
    }
    if (!it->status().ok()) {
      return Fail(ctl, slot, kExitScanStatus, "reader %d scan %llu after %llu entries: %s", r,
                  (unsigned long long)round, (unsigned long long)entries,
                  it->status().ToString().c_str());
    }
    it.reset();
    for (int g = 0; g < 100; g++) {
      std::string key = WriterKey(int(rng() % kWriters), int(rng() % kKeysPerWriter));
      Status s = e->Get(ks, key, &got);
      if (s.IsNotFound()) continue;
      if (!s.ok())
        return Fail(ctl, slot, kExitGet, "reader %d Get(%s): %s", r, key.c_str(),
                    s.ToString().c_str());
      int64_t version = CheckValue(key, got, &why);
      if (version < 0) return Fail(ctl, slot, kExitGet, "reader %d Get: %s", r, why.c_str());
      if (int rc = seen(key, version, "Get")) return rc;
    }
    ctl->progress[slot].store(round + 1);
  }
  return kExitOk;
}

// ---------------------------------------------------------------------------------------------
// Parent-side checks

// Get for every key of every writer's range and one full scan, against `model`.
void CheckAgainstModel(Engine* e, KeyspaceId ks, const std::map<std::string, std::string>& model) {
  std::string got;
  for (int w = 0; w < kWriters; w++) {
    for (int n = 0; n < kKeysPerWriter; n++) {
      std::string key = WriterKey(w, n);
      Status s = e->Get(ks, key, &got);
      auto m = model.find(key);
      if (m == model.end()) {
        ASSERT_TRUE(s.IsNotFound())
            << key << ": " << (s.ok() ? "found " + got.substr(0, 30) : s.ToString());
      } else {
        ASSERT_TRUE(s.ok()) << key << ": " << s.ToString();
        ASSERT_EQ(got, m->second) << key;
      }
    }
  }
  auto it = e->NewIterator(ks);
  auto m = model.begin();
  for (it->SeekToFirst(); it->Valid(); it->Next(), ++m) {
    ASSERT_NE(m, model.end()) << "extra key " << it->key();
    ASSERT_EQ(it->key(), m->first);
    ASSERT_EQ(it->value(), m->second) << m->first;
  }
  ASSERT_TRUE(it->status().ok()) << it->status().ToString();
  ASSERT_EQ(m, model.end()) << "missing key " << m->first;
}

TEST(MultiProcess, WritersReadersAndBackgroundWorker) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(11, &ks).ok());
  SharedControl ctl;
  const Options& o = t.options;
  const Arena& arena = t.arena;

  std::vector<Child> writers, others;
  int slot = 0;
  for (int w = 0; w < kWriters; w++, slot++) {
    int s = slot;
    writers.push_back(Spawn(s, "writer " + std::to_string(w),
                            [&, w, s] { return WriterMain(o, arena, ks, w, ctl.get(), s); }));
  }
  {
    int s = slot++;
    others.push_back(
        Spawn(s, "background", [&, s] { return BackgroundMain(o, arena, ctl.get(), s); }));
  }
  for (int r = 0; r < 2; r++, slot++) {
    int s = slot;
    others.push_back(Spawn(s, "reader " + std::to_string(r),
                           [&, r, s] { return ReaderMain(o, arena, ks, r, ctl.get(), s); }));
  }
  for (const Child& c : writers) ASSERT_GT(c.pid, 0) << "fork failed";
  for (const Child& c : others) ASSERT_GT(c.pid, 0) << "fork failed";

  // Writers that stop making progress for many seconds are blocked (they need a few seconds
  // in all): they are killed and reported, and so is any other child that then hangs.
  bool hung = false;
  std::string blocked;
  for (Child& c : writers) {
    if (!WaitWhileProgressing(&c, &ctl->progress[c.slot], 20)) {
      blocked += c.name + " made no progress for 20 s at op " +
                 std::to_string(ctl->progress[c.slot].load()) + "\n";
      kill(c.pid, SIGKILL);
      Reap(&c, 60, &hung);
    }
  }
  ctl->stop.store(1);
  for (Child& c : others) Reap(&c, blocked.empty() ? 60 : 5, &hung);

  std::string failures;
  for (const Child* list : {writers.data(), others.data()}) {
    size_t count = list == writers.data() ? writers.size() : others.size();
    for (size_t i = 0; i < count; i++) {
      std::string f = Outcome(list[i], ctl.get());
      if (!f.empty()) failures += f + "\n";
    }
  }
  ASSERT_TRUE(blocked.empty()) << blocked << "(stalls " << t->GetStats().stall_count
                               << ", background rounds with work " << ctl->progress[kWriters].load()
                               << ")\n"
                               << failures;
  ASSERT_FALSE(hung) << "a child hung and was killed\n" << failures;
  ASSERT_TRUE(failures.empty()) << failures;
  printf("background rounds with work: %llu, reader rounds: %llu and %llu\n",
         (unsigned long long)ctl->progress[kWriters].load(),
         (unsigned long long)ctl->progress[kWriters + 1].load(),
         (unsigned long long)ctl->progress[kWriters + 2].load());

  std::map<std::string, std::string> model;
  for (int w = 0; w < kWriters; w++) ApplyWriter(w, kOpsPerWriter, &model);

  CheckAgainstModel(t.engine.get(), ks, model);
  Status v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
  Stats st = t->GetStats();
  EXPECT_GT(st.compactions, 0u);

  // Everything was synced by the writers: a restart recovers the same state.
  ASSERT_TRUE(t->CompactAll().ok());
  CheckAgainstModel(t.engine.get(), ks, model);
  v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
  t.Reopen();
  ASSERT_TRUE(t->LookupKeyspace(11, &ks).ok());
  CheckAgainstModel(t.engine.get(), ks, model);
  v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
}

// ---------------------------------------------------------------------------------------------
// Iterator snapshots across processes

constexpr int kSnapKeys = 2500;

std::string SnapKey(int n) {
  char buf[32];
  snprintf(buf, sizeof(buf), "key%06d", n);
  return buf;
}

size_t SnapSize(uint64_t h) {
  static constexpr size_t kSizes[3] = {20, 400, 2500};
  return kSizes[h % 3];
}

// Fills the keyspace in two generations so that the snapshot spans levels and memtables.
void FillForSnapshot(Engine* e, KeyspaceId ks, std::map<std::string, std::string>* model) {
  for (int gen = 0; gen < 2; gen++) {
    for (int n = 0; n < kSnapKeys; n++) {
      uint64_t h = Mix(uint64_t(gen) * 1000003 + uint64_t(n));
      if (gen == 1 && h % 3 != 0) continue;  // gen 1 overwrites or deletes a third
      std::string key = SnapKey(n);
      if (gen == 1 && h % 4 == 0) {
        ASSERT_TRUE(e->Delete(ks, key).ok());
        model->erase(key);
      } else {
        std::string v = ValueOf(key, uint64_t(gen), SnapSize(h >> 8));
        ASSERT_TRUE(e->Put(ks, key, v).ok());
        (*model)[key] = v;
      }
    }
    if (gen == 0) {
      ASSERT_TRUE(e->CompactAll().ok());
    }
  }
}

// What another process does to the keyspace: overwrite or delete every key, insert new ones,
// compact everything and collect garbage, twice. Returns 0 or the code of the first failure
// (its message in ctl->message[slot]); after a failure it goes on with the rest, but calls
// CompactAll no more (so a Busy CompactAll costs its wait once). With a null engine it only
// computes the model.
int Churn(Engine* e, KeyspaceId ks, std::map<std::string, std::string>* model, Control* ctl,
          int slot) {
  int failed = kExitOk;
  for (int gen = 2; gen < 4; gen++) {
    for (int n = 0; n < kSnapKeys; n++) {
      uint64_t h = Mix(uint64_t(gen) * 1000003 + uint64_t(n));
      std::string key = SnapKey(n);
      Status s;
      if (h % 5 == 0) {
        if (e) s = e->Delete(ks, key);
        model->erase(key);
      } else {
        std::string v = ValueOf(key, uint64_t(gen), SnapSize(h >> 8));
        if (e) s = e->Put(ks, key, v);
        (*model)[key] = v;
      }
      if (s.ok() && h % 7 == 0) {  // a new key between existing ones
        std::string nk = key + "x" + std::to_string(gen);
        std::string v = ValueOf(nk, uint64_t(gen), SnapSize(h >> 16));
        if (e) s = e->Put(ks, nk, v);
        (*model)[nk] = v;
      }
      if (!s.ok())
        return Fail(ctl, slot, kExitWrite, "churn gen %d key %d: %s", gen, n, s.ToString().c_str());
    }
    if (!e) continue;
    if (failed == kExitOk) {
      Status s = e->CompactAll();
      if (!s.ok())
        failed =
            Fail(ctl, slot, kExitCompact, "CompactAll (gen %d): %s", gen, s.ToString().c_str());
    }
    Status s = e->RunGC();
    if (!s.ok()) return Fail(ctl, slot, kExitCompact, "RunGC: %s", s.ToString().c_str());
    while (e->DoBackgroundWork()) {
    }
  }
  return failed;
}

// Compares an iterator from its current position to the end with `model` from `from` on.
// Returns an empty string or a description of the first difference.
std::string CompareRest(Iterator* it, const std::map<std::string, std::string>& model,
                        std::map<std::string, std::string>::const_iterator m) {
  for (; it->Valid(); it->Next(), ++m) {
    if (m == model.end()) return "extra key " + std::string(it->key());
    if (it->key() != m->first) return "key " + std::string(it->key()) + ", expected " + m->first;
    if (it->value() != m->second) {
      return "value of " + m->first + " is '" + std::string(it->value().substr(0, 40)) +
             "' (size " + std::to_string(it->value().size()) + "), expected '" +
             m->second.substr(0, 40) + "' (size " + std::to_string(m->second.size()) + ")";
    }
  }
  if (!it->status().ok()) return "status " + it->status().ToString();
  if (m != model.end()) return "missing key " + m->first;
  return "";
}

// The iterator lives in this process; another process rewrites, compacts and GCs meanwhile.
TEST(MultiProcess, IteratorSnapshotSurvivesOtherProcessWrites) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(3, &ks).ok());
  std::map<std::string, std::string> snapshot;
  FillForSnapshot(t.engine.get(), ks, &snapshot);
  ASSERT_FALSE(HasFatalFailure());

  // it1 is half way through when the other process runs; it2 is not positioned yet.
  auto it1 = t->NewIterator(ks);
  auto it2 = t->NewIterator(ks);
  auto m = snapshot.cbegin();
  it1->SeekToFirst();
  for (size_t i = 0; i < snapshot.size() / 2; i++, ++m, it1->Next()) {
    ASSERT_TRUE(it1->Valid());
    ASSERT_EQ(it1->key(), m->first);
    ASSERT_EQ(it1->value(), m->second);
  }

  SharedControl ctl;
  std::map<std::string, std::string> after = snapshot;
  Child c = Spawn(0, "churn", [&] {
    std::unique_ptr<Engine> e;
    if (int rc = OpenChildEngine(t.options, t.arena, ctl.get(), 0, &e)) return rc;
    return Churn(e.get(), ks, &after, ctl.get(), 0);
  });
  ASSERT_GT(c.pid, 0);
  bool hung = false;
  Reap(&c, 60, &hung);
  ASSERT_FALSE(hung) << "churn child hung";
  // A failed churn (e.g. CompactAll refused) is reported; the snapshot is checked regardless.
  EXPECT_EQ(Outcome(c, ctl.get()), "");
  ASSERT_TRUE(WIFEXITED(c.status) &&
              (WEXITSTATUS(c.status) == 0 || WEXITSTATUS(c.status) == kExitCompact))
      << Outcome(c, ctl.get());
  // The parent recomputes what the child did (the child's copy of `after` died with it).
  ASSERT_EQ(Churn(nullptr, ks, &after, ctl.get(), 1), 0);

  EXPECT_EQ(CompareRest(it1.get(), snapshot, m), "");
  it2->SeekToFirst();
  EXPECT_EQ(CompareRest(it2.get(), snapshot, snapshot.cbegin()), "");
  std::string mid = SnapKey(kSnapKeys / 3);
  it2->Seek(mid);
  EXPECT_EQ(CompareRest(it2.get(), snapshot, snapshot.lower_bound(mid)), "");

  // A new iterator and Get see the new state.
  auto it3 = t->NewIterator(ks);
  it3->SeekToFirst();
  EXPECT_EQ(CompareRest(it3.get(), after, after.cbegin()), "");
  std::string got;
  for (auto& [k, v] : after) {
    ASSERT_TRUE(t->Get(ks, k, &got).ok()) << k;
    ASSERT_EQ(got, v) << k;
  }
  it1.reset();
  it2.reset();
  it3.reset();
  Status v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
  // With the snapshots gone their segments can be reused.
  ASSERT_TRUE(t->CompactAll().ok());
  ASSERT_TRUE(t->RunGC().ok());
  v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
}

// A process that looked a tag up sees another process drop its keyspace and make a new one for
// the tag (a standby replaying a TRUNCATE while backends read): lookups are checked against
// the shared table, never answered from what this process found before alone.
TEST(MultiProcess, TagLookupsSeeOtherProcessesDropAndRecreate) {
  TestEngine t;
  KeyspaceId first, found;
  ASSERT_TRUE(t->CreateKeyspace(31, &first).ok());
  ASSERT_TRUE(t->LookupKeyspace(31, &found).ok());
  ASSERT_EQ(found, first);
  SharedControl ctl;
  Child c = Spawn(0, "recreate", [&] {
    std::unique_ptr<Engine> e;
    if (int rc = OpenChildEngine(t.options, t.arena, ctl.get(), 0, &e)) return rc;
    KeyspaceId id, second;
    if (!e->LookupKeyspace(31, &id).ok() || id != first) return 2;
    if (!e->DropKeyspace(id).ok()) return 3;
    if (!e->CreateKeyspace(31, &second).ok() || second == first) return 4;
    return 0;
  });
  ASSERT_GT(c.pid, 0);
  bool hung = false;
  Reap(&c, 60, &hung);
  ASSERT_FALSE(hung) << "child hung";
  ASSERT_TRUE(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) << Outcome(c, ctl.get());
  ASSERT_TRUE(t->LookupKeyspace(31, &found).ok());
  EXPECT_NE(found, first);
  std::vector<std::pair<uint64_t, KeyspaceId>> live;
  ASSERT_TRUE(t->ListKeyspaces(&live).ok());
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0], std::make_pair(uint64_t(31), found));
}

// The iterator lives in a child; this process rewrites, compacts and GCs meanwhile.
TEST(MultiProcess, IteratorSnapshotInChildSurvivesParentWrites) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(4, &ks).ok());
  std::map<std::string, std::string> snapshot;
  FillForSnapshot(t.engine.get(), ks, &snapshot);
  ASSERT_FALSE(HasFatalFailure());

  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  SharedControl ctl;
  Child c = Spawn(0, "snapshot reader", [&]() -> int {
    close(to_parent[0]);
    close(to_child[1]);
    std::unique_ptr<Engine> e;
    if (int rc = OpenChildEngine(t.options, t.arena, ctl.get(), 0, &e)) return rc;
    auto it = e->NewIterator(ks);
    auto m = snapshot.cbegin();
    it->SeekToFirst();
    for (int i = 0; i < 100 && it->Valid(); i++, ++m, it->Next()) {
      if (it->key() != m->first || it->value() != m->second) {
        return Fail(ctl.get(), 0, kExitSnapshot, "before the writes: %s differs", m->first.c_str());
      }
    }
    auto it2 = e->NewIterator(ks);
    char go = 'r';
    if (write(to_parent[1], &go, 1) != 1) return Fail(ctl.get(), 0, kExitPipe, "write to parent");
    if (read(to_child[0], &go, 1) != 1) return Fail(ctl.get(), 0, kExitPipe, "read from parent");
    std::string diff = CompareRest(it.get(), snapshot, m);
    if (!diff.empty()) return Fail(ctl.get(), 0, kExitSnapshot, "it: %s", diff.c_str());
    it2->SeekToFirst();
    diff = CompareRest(it2.get(), snapshot, snapshot.cbegin());
    if (!diff.empty()) return Fail(ctl.get(), 0, kExitSnapshot, "it2: %s", diff.c_str());
    return kExitOk;
  });
  ASSERT_GT(c.pid, 0);
  close(to_parent[1]);
  close(to_child[0]);
  char go = 0;
  bool child_ready = read(to_parent[0], &go, 1) == 1;
  std::map<std::string, std::string> after = snapshot;
  int churn = child_ready ? Churn(t.engine.get(), ks, &after, ctl.get(), 1) : 0;
  go = 'g';
  bool sent = write(to_child[1], &go, 1) == 1;
  close(to_parent[0]);
  close(to_child[1]);
  bool hung = false;
  Reap(&c, 60, &hung);
  ASSERT_FALSE(hung) << "snapshot reader hung";
  // A failed churn (e.g. CompactAll refused) is reported; the child checked its snapshot anyway.
  EXPECT_EQ(churn, 0) << ctl->message[1];
  ASSERT_EQ(Outcome(c, ctl.get()), "");
  ASSERT_TRUE(child_ready);
  ASSERT_TRUE(sent);
  ASSERT_TRUE(churn == 0 || churn == kExitCompact) << ctl->message[1];

  auto it = t->NewIterator(ks);
  it->SeekToFirst();
  EXPECT_EQ(CompareRest(it.get(), after, after.cbegin()), "");
  it.reset();
  Status v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
  ASSERT_TRUE(t->CompactAll().ok());
  v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
}

// A long-lived iterator in one process must not stop writers in others: they write several
// memtables' worth of data while this process holds an iterator, and the snapshot holds.
TEST(MultiProcess, WritersProgressWhileOtherProcessHoldsIterator) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(5, &ks).ok());
  std::map<std::string, std::string> snapshot;
  FillForSnapshot(t.engine.get(), ks, &snapshot);
  ASSERT_FALSE(HasFatalFailure());
  auto it = t->NewIterator(ks);
  it->SeekToFirst();

  // ~4 MiB of small entries: four times l0_size, so memtables must switch several times.
  constexpr int kPuts = 50000;
  SharedControl ctl;
  Child bg =
      Spawn(0, "background", [&] { return BackgroundMain(t.options, t.arena, ctl.get(), 0); });
  Child writer = Spawn(1, "writer", [&]() -> int {
    std::unique_ptr<Engine> e;
    if (int rc = OpenChildEngine(t.options, t.arena, ctl.get(), 1, &e)) return rc;
    for (int i = 0; i < kPuts; i++) {
      std::string key = "key" + std::to_string(i % 20000) + "s";
      Status s = e->Put(ks, key, ValueOf(key, uint64_t(i), 60));
      if (!s.ok()) return Fail(ctl.get(), 1, kExitWrite, "put %d: %s", i, s.ToString().c_str());
      ctl->progress[1].store(uint64_t(i + 1));
    }
    return kExitOk;
  });
  ASSERT_GT(bg.pid, 0);
  ASSERT_GT(writer.pid, 0);

  // Liveness checks, not timing ones: the writer needs well under a second for all its puts,
  // so many seconds without a single one means it is blocked.
  constexpr int kNoProgressLimitS = 10;
  bool stuck = !WaitWhileProgressing(&writer, &ctl->progress[1], kNoProgressLimitS);
  uint64_t stuck_at = ctl->progress[1].load();
  Stats st = t->GetStats();
  EXPECT_FALSE(stuck) << "the writer made no progress for " << kNoProgressLimitS << " s after "
                      << stuck_at << " of " << kPuts
                      << " puts while this process held an iterator (stalls " << st.stall_count
                      << ", L0 entries " << st.l0_entries << ")";
  if (!stuck) {
    EXPECT_EQ(CompareRest(it.get(), snapshot, snapshot.cbegin()), "");
  }
  it.reset();  // releasing the snapshot must let a blocked writer finish
  bool still_stuck = stuck && !WaitWhileProgressing(&writer, &ctl->progress[1], kNoProgressLimitS);
  EXPECT_FALSE(still_stuck) << "the writer is still blocked " << kNoProgressLimitS
                            << " s after the iterator was released, at put "
                            << ctl->progress[1].load()
                            << " (background rounds with work: " << ctl->progress[0].load()
                            << ", stalls " << t->GetStats().stall_count
                            << "): the background worker itself may be blocked";
  bool hung = false;
  if (still_stuck) {
    kill(writer.pid, SIGKILL);
    Reap(&writer, 60, &hung);
    ctl->stop.store(1);
    Reap(&bg, 5, &hung);  // a background worker blocked inside DoBackgroundWork never sees `stop`
    return;
  }
  Reap(&writer, 60, &hung);
  ctl->stop.store(1);
  Reap(&bg, 60, &hung);
  ASSERT_FALSE(hung) << "a child hung";
  ASSERT_EQ(Outcome(writer, ctl.get()), "");
  ASSERT_EQ(Outcome(bg, ctl.get()), "");
  std::string got;
  for (int i = kPuts - 20000; i < kPuts; i++) {
    std::string key = "key" + std::to_string(i % 20000) + "s";
    ASSERT_TRUE(t->Get(ks, key, &got).ok()) << key;
    ASSERT_EQ(got, ValueOf(key, uint64_t(i), 60)) << key;
  }
  Status v = t->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
}

}  // namespace
}  // namespace slipstream::engine::test

namespace slipstream::engine::test {
namespace {

constexpr int kCounterKeys = 16;

constexpr int kIncrementsPerWriter = 40000;

// Per-key spinlocks in a MAP_SHARED page: the host's row locks (PostgreSQL's LWLocks).
struct CounterLocks {
  std::atomic<int> lock[kCounterKeys];
};

// Read-modify-write of shared counters under per-key locks, the table AM's pattern: every Get
// must return the value the last Put of that key stored, whatever the memtable switches and
// compactions done meanwhile by other processes.
int CounterMain(const Options& options, const Arena& arena, KeyspaceId ks, int w,
                CounterLocks* locks, Control* ctl, int slot, size_t value_size = 400) {
  std::unique_ptr<Engine> e;
  if (int rc = OpenChildEngine(options, arena, ctl, slot, &e)) return rc;
  std::mt19937 rng(77 + w);
  std::string padding(value_size, char('a' + w));
  for (int i = 0; i < kIncrementsPerWriter; i++) {
    int k = int(rng() % kCounterKeys);
    std::string key = "counter" + std::to_string(k);
    while (locks->lock[k].exchange(1)) {
    }
    std::string value;
    Status s = e->Get(ks, key, &value);
    uint64_t count = 0;
    if (s.ok()) {
      count = std::stoull(value.substr(0, value.find(':')));
    } else if (!s.IsNotFound()) {
      locks->lock[k].store(0);
      return Fail(ctl, slot, kExitGet, "Get %s: %s", key.c_str(), s.ToString().c_str());
    }
    std::string next = std::to_string(count + 1) + ":" + padding;
    // Like an UPDATE: the old row's new image and a new row, as one batch.
    WriteBatch batch;
    batch.Put(ks, key, next);
    batch.Put(ks, "version-" + std::to_string(w) + "-" + std::to_string(i), padding);
    s = e->Write(batch);
    std::string back;
    Status r = e->Get(ks, key, &back);
    locks->lock[k].store(0);
    if (!s.ok()) return Fail(ctl, slot, kExitWrite, "Put: %s", s.ToString().c_str());
    if (!r.ok() || back != next) {
      return Fail(ctl, slot, kExitReadBack, "read back %s after writing %s: got %s (%s)",
                  key.c_str(), next.substr(0, 12).c_str(), back.substr(0, 12).c_str(),
                  r.ToString().c_str());
    }
    ctl->progress[slot].store(uint64_t(i));
  }
  return kExitOk;
}

// Small memtables: the writers cross many memtable switches and L0 compactions.
Options TinyMemtableOptions(const std::string& dir) {
  Options o = SmallOptions(dir);
  o.l0_size = 1u << 20;
  o.memtables = 4;
  return o;
}

// Scans the whole keyspace over and over, as VACUUM and ANALYZE do beside the writers.
int ScannerMain(const Options& options, const Arena& arena, KeyspaceId ks, Control* ctl, int slot) {
  std::unique_ptr<Engine> e;
  if (int rc = OpenChildEngine(options, arena, ctl, slot, &e)) return rc;
  uint64_t rounds = 0;
  while (!ctl->stop.load()) {
    std::unique_ptr<Iterator> it = e->NewIterator(ks);
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
    }
    if (!it->status().ok()) {
      return Fail(ctl, slot, kExitScanStatus, "scan: %s", it->status().ToString().c_str());
    }
    ctl->progress[slot].store(++rounds);
  }
  return kExitOk;
}

void RunCounters(Options (*make)(const std::string&), size_t value_size) {
  TestEngine t(make);
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(21, &ks).ok());
  SharedControl ctl;
  void* page = mmap(nullptr, sizeof(CounterLocks), PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  CounterLocks* locks = new (page) CounterLocks();
  for (auto& l : locks->lock) l.store(0);
  const Options& o = t.options;
  const Arena& arena = t.arena;

  std::vector<Child> writers;
  int slot = 0;
  for (int w = 0; w < kWriters; w++, slot++) {
    int s = slot;
    writers.push_back(Spawn(s, "counter writer " + std::to_string(w), [&, w, s] {
      return CounterMain(o, arena, ks, w, locks, ctl.get(), s, value_size);
    }));
  }
  int bg_slot = slot;
  Child background =
      Spawn(bg_slot, "background", [&] { return BackgroundMain(o, arena, ctl.get(), bg_slot); });
  int scan_slot = bg_slot + 1;
  Child scanner =
      Spawn(scan_slot, "scanner", [&] { return ScannerMain(o, arena, ks, ctl.get(), scan_slot); });
  bool hung = false;
  for (Child& c : writers) Reap(&c, 120, &hung);
  ctl->stop.store(1);
  Reap(&background, 60, &hung);
  Reap(&scanner, 60, &hung);
  std::string failures;
  for (const Child& c : writers) failures += Outcome(c, ctl.get());
  failures += Outcome(background, ctl.get());
  failures += Outcome(scanner, ctl.get());
  ASSERT_FALSE(hung) << failures;
  ASSERT_TRUE(failures.empty()) << failures;

  uint64_t total = 0;
  for (int k = 0; k < kCounterKeys; k++) {
    std::string value;
    ASSERT_TRUE(t->Get(ks, "counter" + std::to_string(k), &value).ok());
    total += std::stoull(value.substr(0, value.find(':')));
  }
  EXPECT_EQ(total, uint64_t(kWriters) * kIncrementsPerWriter) << "lost updates";
  EXPECT_GT(t->GetStats().compactions, 0u);
  ASSERT_TRUE(t->Verify().ok());
  munmap(page, sizeof(CounterLocks));
}

// The table AM's shape: 8-byte keys, rows of ~130 bytes (medium), PostgreSQL's default sizes
// with a small L0, so that values also live behind medium-log pointers in upper levels.
Options TableLikeOptions(const std::string& dir) {
  Options o;
  o.directory = dir;
  o.l0_size = 1u << 20;
  o.max_device_size = 4ull << 30;
  o.use_fsync = false;
  return o;
}

TEST(MultiProcess, ReadModifyWriteCountersSurviveCompactions) {
  RunCounters(TinyMemtableOptions, 400);
}

TEST(MultiProcess, ReadModifyWriteMediumRowsLikeTheTableAm) {
  RunCounters(TableLikeOptions, 120);
}

}  // namespace
}  // namespace slipstream::engine::test
