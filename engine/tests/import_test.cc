// Index shipping (Send-Index) between two engines: a primary's observer feeds a replica's
// import calls, and the replica, which never compacts, must hold the same contents as the
// primary after every compaction it installed, pass Verify, and keep them across a restart.
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "slipstream/engine/engine.h"
#include "test_util.h"

namespace slipstream::engine::test {
namespace {

// Feeds the primary's events to the replica as they happen (what a transport does later).
class Forwarder : public EngineObserver {
 public:
  explicit Forwarder(Engine** replica) : replica_(replica) {}

  void OnLogWrite(const LogWriteEvent& e) override {
    if (capture_ != nullptr && e.log == ObservedLog::kLarge) {
      std::string bytes(e.bytes);
      capture_->push_back([e, bytes](Engine* r) {
        LogWriteEvent copy = e;
        copy.bytes = bytes;
        return r->ImportLogBytes(copy);
      });
      return;
    }
    if (enabled_ && e.log == ObservedLog::kLarge) {
      std::string bytes(e.bytes);
      Journal([e, bytes](Engine* r) {
        LogWriteEvent copy = e;
        copy.bytes = bytes;
        return r->ImportLogBytes(copy);
      });
      Record((*replica_)->ImportLogBytes(e), "log bytes");
    }
  }
  void OnSeedBegin() override {
    if (capture_ != nullptr) {
      marker_at_ = capture_->size();
      capture_->push_back([](Engine*) { return Status::OK(); });  // the marker
    }
  }
  void OnSeedEnd(const std::vector<uint32_t>& level_trees) override {
    if (capture_ != nullptr) {
      capture_->push_back([level_trees](Engine* r) { return r->ImportLevels(level_trees); });
      return;
    }
    if (enabled_) Record((*replica_)->ImportLevels(level_trees), "seed end");
  }
  void OnCompactionBegin(const CompactionBeginEvent& e) override {
    if (capture_ != nullptr) {
      capture_->push_back([e](Engine* r) { return r->BeginImport(e); });
      return;
    }
    if (!enabled_) return;
    Journal([e](Engine* r) { return r->BeginImport(e); });
    Record((*replica_)->BeginImport(e), "begin");
  }
  void OnCompactionSegment(const CompactionSegmentEvent& e) override {
    if (capture_ != nullptr) {
      std::string bytes(e.bytes);
      capture_->push_back([e, bytes](Engine* r) {
        CompactionSegmentEvent copy = e;
        copy.bytes = bytes;
        return r->ImportSegment(copy);
      });
      return;
    }
    if (!enabled_) return;
    if (crash_after_segments_ > 0 && --crash_after_segments_ == 0) {
      // The replica dies in the middle of this compaction's import; restarted, it is fed
      // again from its last installed compaction on, as the index stream resumes there.
      crash_();
      crashed_compaction_ = e.compaction;
      for (auto& replay : journal_) Record(replay(*replica_), "replayed");
    }
    std::string bytes(e.bytes);
    Journal([e, bytes](Engine* r) {
      CompactionSegmentEvent copy = e;
      copy.bytes = bytes;
      return r->ImportSegment(copy);
    });
    if (drop_next_index_ && e.kind == CompactionSegmentKind::kIndex) {
      drop_next_index_ = false;  // a segment lost on the way
      return;
    }
    Record((*replica_)->ImportSegment(e), "segment");
  }
  void OnCompactionInstalled(const CompactionInstalledEvent& e) override {
    if (capture_ != nullptr) {
      capture_->push_back([e](Engine* r) { return r->InstallImport(e); });
      return;
    }
    if (!enabled_) return;
    Status s = (*replica_)->InstallImport(e);
    if (expect_install_failure_ && !s.ok()) {
      expect_install_failure_ = false;
      install_refused_ = s;
      return;
    }
    Record(s, "install");
    if (s.ok()) installed_++;
    journal_.clear();  // durable on the replica now
  }
  // As the extension's observer: trees are shipped whole only while a replica listens (a seed
  // rewrites the levels that kept leaves meanwhile).
  bool WantsWholeTrees() const override { return enabled_ || capture_ != nullptr; }
  // Keeps an event until the compaction after it is installed (what a replica's stream keeps).
  void Journal(std::function<Status(Engine*)> replay) {
    if (crash_) journal_.push_back(std::move(replay));
  }
  void OnCompactionAbandoned(uint64_t compaction) override {
    if (capture_ != nullptr) {
      capture_->push_back([compaction](Engine* r) {
        r->AbandonImport(compaction);
        return Status::OK();
      });
      return;
    }
    (*replica_)->AbandonImport(compaction);
  }

  void Record(const Status& s, const char* what) {
    if (!s.ok()) errors_.push_back(std::string(what) + ": " + s.ToString());
  }

  Engine** replica_;
  bool enabled_ = true;  // false: the replica does not exist yet
  // When set, events are kept here (as the stream would hold them) instead of applied.
  std::vector<std::function<Status(Engine*)>>* capture_ = nullptr;
  size_t marker_at_ = 0;  // where in *capture_ the last seed began
  int crash_after_segments_ = 0;
  std::function<void()> crash_;
  uint64_t crashed_compaction_ = 0;
  std::vector<std::function<Status(Engine*)>> journal_;
  std::vector<std::string> errors_;
  uint64_t installed_ = 0;
  bool drop_next_index_ = false;
  bool expect_install_failure_ = false;
  Status install_refused_;
};

// A value of one of the three classes (small, medium, large) chosen by `r`.
std::string MixedValue(std::mt19937& rng, int seed) {
  switch (rng() % 3) {
    case 0:
      return Value(10 + rng() % 80, seed);  // small: in the leaves
    case 1:
      return Value(150 + rng() % 700, seed);  // medium: medium log until the last level
    default:
      return Value(1500 + rng() % 6000, seed);  // large: large log
  }
}

struct Pair {
  TestEngine primary, replica;
  Engine* replica_handle = nullptr;
  std::shared_ptr<Forwarder> forwarder = std::make_shared<Forwarder>(&replica_handle);
  KeyspaceId ks = 0, replica_ks = 0;

  Pair() {
    primary.options.observer = forwarder;
    primary.Reopen();
    replica_handle = replica.engine.get();
    EXPECT_TRUE(primary->CreateKeyspace(7, &ks).ok());
    EXPECT_TRUE(replica->CreateKeyspace(7, &replica_ks).ok());
    EXPECT_EQ(ks, replica_ks);
  }
  void RestartReplica() {
    replica.Reopen();
    replica_handle = replica.engine.get();
  }
};

TEST(Import, ReplicaEqualsPrimaryAfterEveryFullCompaction) {
  Pair p;
  std::mt19937 rng(42);
  std::map<std::string, std::string> model;
  for (int round = 0; round < 8; round++) {
    for (int i = 0; i < 3000; i++) {
      std::string key = "k" + std::to_string(rng() % 6000);
      if (rng() % 10 == 0) {
        ASSERT_TRUE(p.primary->Delete(p.ks, key).ok());
        model.erase(key);
      } else {
        std::string v = MixedValue(rng, i + round * 3000);
        ASSERT_TRUE(p.primary->Put(p.ks, key, v).ok());
        model[key] = v;
      }
    }
    while (p.primary->DoBackgroundWork()) {
    }
    if (round % 3 == 2) {
      ASSERT_TRUE(p.primary->RunGC().ok());
    }
    ASSERT_TRUE(p.primary->CompactAll().ok());
    for (const std::string& e : p.forwarder->errors_) ADD_FAILURE() << e;
    ASSERT_TRUE(p.forwarder->errors_.empty());
    auto replica = Contents(p.replica.engine.get(), p.replica_ks);
    ASSERT_EQ(Contents(p.primary.engine.get(), p.ks), model);
    ASSERT_EQ(replica.size(), model.size()) << "round " << round;
    ASSERT_TRUE(replica == model) << "round " << round;
    Status v = p.replica->Verify();
    ASSERT_TRUE(v.ok()) << v.ToString();
  }
  EXPECT_GE(p.forwarder->installed_, 8u);
  EXPECT_EQ(p.replica->GetStats().compactions, p.forwarder->installed_);

  // The levels and the log map survive a restart of the replica.
  p.RestartReplica();
  EXPECT_TRUE(Contents(p.replica.engine.get(), p.replica_ks) == model);
  Status v = p.replica->Verify();
  EXPECT_TRUE(v.ok()) << v.ToString();
  std::string value;
  for (const auto& [key, expect] : model) {
    ASSERT_TRUE(p.replica->Get(p.replica_ks, key, &value).ok()) << key;
    ASSERT_EQ(value, expect) << key;
    if (rng() % 8 != 0) continue;  // a sample of the keys is enough for point reads
  }
}

TEST(Import, AReplicaTakesThePrimarysKeyspaceTable) {
  Pair p;
  KeyspaceId dropped = 0, kept = 0;
  ASSERT_TRUE(p.primary->CreateKeyspace(100, &dropped).ok());
  ASSERT_TRUE(p.primary->CreateKeyspace(200, &kept).ok());
  ASSERT_TRUE(p.primary->DropKeyspace(dropped).ok());
  std::map<std::string, std::string> model;
  for (int i = 0; i < 2000; i++) {
    std::string key = "r" + std::to_string(i);
    model[key] = Value(40, i);
    ASSERT_TRUE(p.primary->Put(kept, key, model[key]).ok());
  }
  ASSERT_TRUE(p.primary->CompactAll().ok());
  for (const std::string& e : p.forwarder->errors_) ADD_FAILURE() << e;
  // The replica created none of these: its table is the primary's, ids and all.
  for (int pass = 0; pass < 2; pass++) {
    KeyspaceId id = 0;
    ASSERT_TRUE(p.replica->LookupKeyspace(200, &id).ok()) << "pass " << pass;
    EXPECT_EQ(id, kept);
    EXPECT_TRUE(p.replica->LookupKeyspace(100, &id).IsNotFound());
    EXPECT_TRUE(Contents(p.replica.engine.get(), kept) == model);
    p.RestartReplica();  // and the manifest keeps it
  }
  // After a promotion, a new keyspace takes an id the primary never gave.
  KeyspaceId fresh = 0;
  ASSERT_TRUE(p.replica->CreateKeyspace(300, &fresh).ok());
  EXPECT_GT(fresh, kept);
}

TEST(Import, ACompactionWithAMissingSegmentIsRefusedAndLeavesNothing) {
  Pair p;
  std::mt19937 rng(7);
  for (int i = 0; i < 4000; i++) {
    ASSERT_TRUE(p.primary->Put(p.ks, "k" + std::to_string(i), MixedValue(rng, i)).ok());
  }
  ASSERT_TRUE(p.primary->CompactAll().ok());
  ASSERT_TRUE(p.forwarder->errors_.empty()) << p.forwarder->errors_[0];
  auto before = Contents(p.replica.engine.get(), p.replica_ks);
  ASSERT_FALSE(before.empty());
  Stats stats_before = p.replica->GetStats();

  // The next compaction loses an index segment on the way: its end is refused.
  p.forwarder->drop_next_index_ = true;
  p.forwarder->expect_install_failure_ = true;
  for (int i = 0; i < 4000; i++) {
    ASSERT_TRUE(p.primary->Put(p.ks, "j" + std::to_string(i), MixedValue(rng, i)).ok());
  }
  ASSERT_TRUE(p.primary->CompactAll().ok());
  EXPECT_FALSE(p.forwarder->install_refused_.ok()) << "a damaged compaction was installed";
  EXPECT_EQ(p.forwarder->install_refused_.code(), Status::Code::kCorruption);
  // Nothing of it is left: the replica's contents and segments are those of before.
  EXPECT_TRUE(Contents(p.replica.engine.get(), p.replica_ks) == before);
  Stats after = p.replica->GetStats();
  // (Large-log bytes of the new values did arrive: they belong to the log, not the compaction.)
  EXPECT_EQ(after.segments_in_use - after.large_log_segments,
            stats_before.segments_in_use - stats_before.large_log_segments);
  EXPECT_EQ(after.medium_log_segments, stats_before.medium_log_segments);
  Status v = p.replica->Verify();
  EXPECT_TRUE(v.ok()) << v.ToString();
}

TEST(Import, AReplicaSeededFromThePrimarysLevelsFollowsItsCompactions) {
  Pair p;
  p.forwarder->enabled_ = false;  // the primary runs alone for a while: several levels
  std::mt19937 rng(11);
  std::map<std::string, std::string> model;
  auto work = [&](int n, int seed, bool small_only = false) {
    for (int i = 0; i < n; i++) {
      std::string key = "k" + std::to_string(rng() % 8000);
      std::string v = small_only ? Value(30 + rng() % 40, seed + i) : MixedValue(rng, seed + i);
      ASSERT_TRUE(p.primary->Put(p.ks, key, v).ok());
      model[key] = v;
    }
    while (p.primary->DoBackgroundWork()) {
    }
  };
  work(12000, 0);
  ASSERT_TRUE(p.primary->CompactAll().ok());
  work(30000, 50000, true);  // small values: a level 1 that stays above the last
  int levels = 0;
  std::string shape;
  for (const LevelStats& l : p.primary->GetStats().levels) {
    levels += l.entries > 0;
    shape += " L" + std::to_string(l.level) + "=" + std::to_string(l.entries);
  }
  ASSERT_GE(levels, 2) << "the seed should ship more than one level:" << shape;

  // Seed: live events from now on, then the levels as they stand.
  p.forwarder->enabled_ = true;
  Status s = p.primary->ShipLevels(p.forwarder.get());
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (const std::string& e : p.forwarder->errors_) ADD_FAILURE() << e;
  ASSERT_TRUE(p.forwarder->errors_.empty());
  EXPECT_EQ(p.forwarder->installed_, uint64_t(levels));
  Status v = p.replica->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();

  // Then it follows the primary's compactions.
  for (int round = 0; round < 3; round++) {
    work(4000, 100000 * (round + 1));
    ASSERT_TRUE(p.primary->CompactAll().ok());
    ASSERT_TRUE(p.forwarder->errors_.empty()) << p.forwarder->errors_[0];
    ASSERT_TRUE(Contents(p.replica.engine.get(), p.replica_ks) == model) << "round " << round;
    v = p.replica->Verify();
    ASSERT_TRUE(v.ok()) << v.ToString();
  }
}

// Before a replica listens, the primary's compactions keep leaves (a load in key order), so
// its levels use leaves of older trees; the seed ships them as trees written whole.
TEST(Import, ASeedShipsLevelsThatKeptLeavesOfOlderTrees) {
  Pair p;
  p.forwarder->enabled_ = false;
  std::mt19937 rng(5);
  std::map<std::string, std::string> model;
  int next = 0;
  auto load = [&](int n) {
    for (int i = 0; i < n; i++, next++) {
      char key[16];
      std::snprintf(key, sizeof(key), "k%08d", next);
      std::string v = MixedValue(rng, next);
      ASSERT_TRUE(p.primary->Put(p.ks, key, v).ok());
      model[key] = v;
    }
    while (p.primary->DoBackgroundWork()) {
    }
  };
  load(20000);
  ASSERT_TRUE(p.primary->CompactAll().ok());  // every row in the levels the seed ships
  ASSERT_GT(p.primary->GetStats().compaction_leaves_kept, 0u) << "nothing to test: no leaf kept";

  // A replica starts listening: the stream exists from here on, the seed follows, and the
  // replica applies the stream from the seed's marker (the rewrites of the levels that kept
  // leaves come before it).
  std::vector<std::function<Status(Engine*)>> stream;
  p.forwarder->capture_ = &stream;
  Status s = p.primary->ShipLevels(p.forwarder.get());
  ASSERT_TRUE(s.ok()) << s.ToString();
  p.forwarder->capture_ = nullptr;
  EXPECT_GT(p.forwarder->marker_at_, 0u) << "no level was rewritten before the seed";
  for (size_t i = p.forwarder->marker_at_; i < stream.size(); i++) {
    s = stream[i](p.replica.engine.get());
    ASSERT_TRUE(s.ok()) << "event " << i << ": " << s.ToString();
  }
  p.forwarder->enabled_ = true;
  ASSERT_TRUE(Contents(p.replica.engine.get(), p.replica_ks) == model);
  Status v = p.replica->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
  v = p.primary->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();

  // While it listens, compactions write whole trees, and it follows them.
  uint64_t kept = p.primary->GetStats().compaction_leaves_kept;
  load(8000);
  ASSERT_TRUE(p.primary->CompactAll().ok());
  EXPECT_EQ(p.primary->GetStats().compaction_leaves_kept, kept);
  ASSERT_TRUE(p.forwarder->errors_.empty()) << p.forwarder->errors_[0];
  ASSERT_TRUE(Contents(p.replica.engine.get(), p.replica_ks) == model);
  v = p.replica->Verify();
  ASSERT_TRUE(v.ok()) << v.ToString();
}

TEST(Import, ASeedEmptiesTheLevelsThePrimaryEmptiedWhileTheReplicaWasAway) {
  Pair p;
  std::mt19937 rng(21);
  std::map<std::string, std::string> model;
  auto work = [&](int n, int seed) {
    for (int i = 0; i < n; i++) {
      std::string key = "k" + std::to_string(rng() % 4000);
      std::string v = Value(30 + rng() % 40, seed + i);
      ASSERT_TRUE(p.primary->Put(p.ks, key, v).ok());
      model[key] = v;
    }
    while (p.primary->DoBackgroundWork()) {
    }
  };
  // Both hold a level 1 of old versions.
  work(20000, 0);
  ASSERT_TRUE(p.forwarder->errors_.empty()) << p.forwarder->errors_[0];
  bool replica_has_l1 = false;
  for (const LevelStats& l : p.replica->GetStats().levels)
    replica_has_l1 |= l.level == 1 && l.entries > 0;
  ASSERT_TRUE(replica_has_l1) << "the workload should leave a level 1";
  // Away, the replica misses new versions and the compactions that move level 1 down, until
  // the primary's level 1 is empty and a deeper level holds everything.
  p.forwarder->enabled_ = false;
  work(20000, 100000);  // new versions of every key
  auto l1_empty_deeper_full = [&p] {
    uint64_t l1 = 0, deeper = 0;
    for (const LevelStats& l : p.primary->GetStats().levels) {
      (l.level == 1 ? l1 : deeper) += l.entries;
    }
    return l1 == 0 && deeper > 0;
  };
  bool found = false;
  for (int i = 0; i < 400 && !found; i++) {
    for (int j = 0; j < 500; j++) {
      std::string key = "u" + std::to_string(i * 500 + j);
      model[key] = Value(60, i * 500 + j);
      ASSERT_TRUE(p.primary->Put(p.ks, key, model[key]).ok());
    }
    while (!found && p.primary->DoBackgroundWork()) found = l1_empty_deeper_full();
  }
  ASSERT_TRUE(l1_empty_deeper_full()) << "the primary never emptied level 1";
  // The seed brings the last level; its end empties the replica's stale level 1, whose old
  // versions would otherwise shadow the new ones.
  p.forwarder->enabled_ = true;
  Status s = p.primary->ShipLevels(p.forwarder.get());
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (const std::string& e : p.forwarder->errors_) ADD_FAILURE() << e;
  // The versions the replica missed are in the primary's deeper level now; a stale level 1
  // on the replica would shadow them. (The newest keys are still in the primary's memtable.)
  for (const LevelStats& l : p.replica->GetStats().levels) {
    if (l.level == 1) {
      EXPECT_EQ(l.entries, 0u) << "the replica kept its stale level 1";
    }
  }
  std::string value;
  for (const auto& [key, expect] : model) {
    if (key[0] != 'k') continue;
    ASSERT_TRUE(p.replica->Get(p.replica_ks, key, &value).ok()) << key;
    ASSERT_EQ(value, expect) << key << ": an old version shadows the new one";
  }
  Status v = p.replica->Verify();
  EXPECT_TRUE(v.ok()) << v.ToString();
  p.RestartReplica();  // and the emptied level stays empty
  ASSERT_TRUE(p.replica->Get(p.replica_ks, "k1", &value).ok());
  EXPECT_EQ(value, model["k1"]);
  // Then it follows the primary again.
  ASSERT_TRUE(p.primary->CompactAll().ok());
  for (const std::string& e : p.forwarder->errors_) ADD_FAILURE() << e;
  EXPECT_TRUE(Contents(p.replica.engine.get(), p.replica_ks) == model);
}

TEST(Import, AReplicaKilledInTheMiddleOfAnImportRecoversAndCatchesUp) {
  Pair p;
  p.forwarder->crash_ = [&p] { p.RestartReplica(); };
  std::mt19937 rng(5);
  std::map<std::string, std::string> model;
  for (int round = 0; round < 4; round++) {
    if (round == 1) p.forwarder->crash_after_segments_ = 3;
    for (int i = 0; i < 4000; i++) {
      std::string key = "k" + std::to_string(rng() % 6000);
      std::string v = MixedValue(rng, i + round * 4000);
      ASSERT_TRUE(p.primary->Put(p.ks, key, v).ok());
      model[key] = v;
    }
    ASSERT_TRUE(p.primary->CompactAll().ok());
    if (round == 1) {
      ASSERT_NE(p.forwarder->crashed_compaction_, 0u) << "the replica never crashed";
    }
    for (const std::string& e : p.forwarder->errors_)
      ADD_FAILURE() << "round " << round << ": " << e;
    ASSERT_TRUE(p.forwarder->errors_.empty());
    ASSERT_TRUE(Contents(p.replica.engine.get(), p.replica_ks) == model) << "round " << round;
    Status v = p.replica->Verify();
    ASSERT_TRUE(v.ok()) << v.ToString();
  }
}

// The live stream and a seed taken in the middle of it: a new replica applies the stream from
// the seed's marker on, and events raised before the marker (reflected in the seed) are not
// needed, however the segment numbers they name were reused since.
TEST(Import, ANewReplicaAppliesTheStreamFromTheSeedsMarker) {
  Pair p;
  p.forwarder->enabled_ = false;
  std::mt19937 rng(21);
  std::map<std::string, std::string> model;
  auto work = [&](int n, int seed) {
    for (int i = 0; i < n; i++) {
      std::string key = "k" + std::to_string(rng() % 6000);
      std::string v = MixedValue(rng, seed + i);
      ASSERT_TRUE(p.primary->Put(p.ks, key, v).ok());
      model[key] = v;
    }
    while (p.primary->DoBackgroundWork()) {
    }
  };
  std::vector<std::function<Status(Engine*)>> stream;
  p.forwarder->capture_ = &stream;  // the live stream, from the start
  work(6000, 0);
  ASSERT_TRUE(p.primary->RunGC().ok());
  work(6000, 10000);
  size_t before_seed = stream.size();
  Status s = p.primary->ShipLevels(p.forwarder.get());
  ASSERT_TRUE(s.ok()) << s.ToString();
  work(6000, 20000);
  ASSERT_TRUE(p.primary->CompactAll().ok());
  p.forwarder->capture_ = nullptr;
  ASSERT_GT(before_seed, 0u);
  ASSERT_LT(before_seed, stream.size());
  // The marker is the first event ShipLevels raised.
  ASSERT_EQ(p.forwarder->marker_at_, before_seed);
  for (size_t i = before_seed; i < stream.size(); i++) {
    s = stream[i](p.replica.engine.get());
    ASSERT_TRUE(s.ok()) << "event " << i << ": " << s.ToString();
  }
  EXPECT_TRUE(Contents(p.replica.engine.get(), p.replica_ks) == model);
  Status v = p.replica->Verify();
  EXPECT_TRUE(v.ok()) << v.ToString();
}

// The importing process dies in the middle of an import while shared memory survives (a
// PostgreSQL worker that exits): Verify elsewhere meanwhile ignores the import in flight, and
// the restarted importer, fed the compaction again, frees what was left and installs it.
TEST(Import, AnImporterThatDiesLeavesNothingInTheWay) {
  Pair p;
  std::mt19937 rng(31);
  std::map<std::string, std::string> model;
  auto work = [&](int n, int seed) {
    for (int i = 0; i < n; i++) {
      std::string key = "k" + std::to_string(rng() % 6000);
      std::string v = MixedValue(rng, seed + i);
      ASSERT_TRUE(p.primary->Put(p.ks, key, v).ok());
      model[key] = v;
    }
  };
  work(4000, 0);
  ASSERT_TRUE(p.primary->CompactAll().ok());
  std::vector<std::function<Status(Engine*)>> events;
  p.forwarder->capture_ = &events;
  work(4000, 10000);
  ASSERT_TRUE(p.primary->CompactAll().ok());
  p.forwarder->capture_ = nullptr;
  ASSERT_GE(events.size(), 4u);
  // Half of the stream reaches the importer, then it dies (its handle goes, the arena stays).
  for (size_t i = 0; i < events.size() / 2; i++) {
    Status s = events[i](p.replica.engine.get());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::unique_ptr<Engine> other;
  ASSERT_TRUE(
      Engine::Open(p.replica.options, p.replica.arena.base(), p.replica.arena.size(), &other).ok());
  Status v = other->Verify();
  EXPECT_TRUE(v.ok()) << "an import in flight seen as damage: " << v.ToString();
  p.replica.engine.reset();
  p.replica.engine = std::move(other);  // the restarted importer
  p.replica_handle = p.replica.engine.get();
  for (auto& event : events) {
    Status s = event(p.replica.engine.get());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_TRUE(Contents(p.replica.engine.get(), p.replica_ks) == model);
  v = p.replica->Verify();
  EXPECT_TRUE(v.ok()) << v.ToString();
}

TEST(Import, AReplicaThatCompactsForItselfIsRefused) {
  TestEngine replica;
  KeyspaceId ks;
  ASSERT_TRUE(replica->CreateKeyspace(7, &ks).ok());
  for (int i = 0; i < 3000; i++)
    ASSERT_TRUE(replica->Put(ks, "k" + std::to_string(i), Value(300, i)).ok());
  ASSERT_TRUE(replica->CompactAll().ok());
  CompactionBeginEvent e{1000, true, 0, 1, replica.options.segment_size, replica.options.node_size};
  Status s = replica->BeginImport(e);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
}

TEST(Import, RefusesShapesThatDiffer) {
  TestEngine replica;
  CompactionBeginEvent e{
      5, true, 0, 1, replica.options.segment_size * 2, replica.options.node_size};
  Status s = replica->BeginImport(e);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  CompactionSegmentEvent seg{5, 1, CompactionSegmentKind::kIndex, 3, "xyz"};
  EXPECT_EQ(replica->ImportSegment(seg).code(), Status::Code::kCorruption);
  LogWriteEvent l0{ObservedLog::kL0, 3, 1, 0, "abc"};
  EXPECT_EQ(replica->ImportLogBytes(l0).code(), Status::Code::kInvalidArgument);
  LogWriteEvent gap{ObservedLog::kLarge, 3, 1, 4096, "abc"};
  EXPECT_EQ(replica->ImportLogBytes(gap).code(), Status::Code::kCorruption);
}

}  // namespace
}  // namespace slipstream::engine::test
