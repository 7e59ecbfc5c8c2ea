// The model test: random puts, overwrites and deletes across the three size classes, with
// compactions and GC forced between phases, compared against std::map after every phase.
#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "test_util.h"

namespace slipstream::engine::test {
namespace {

class Model {
 public:
  Model(TestEngine* t, KeyspaceId ks, uint32_t seed) : t_(t), ks_(ks), rng_(seed) {}

  // One phase of `ops` random operations over a key space of `keys` keys.
  void RunPhase(int ops, int keys) {
    for (int i = 0; i < ops; i++) {
      std::string key = "key" + std::to_string(rng_() % keys);
      uint32_t dice = rng_() % 100;
      if (dice < 10) {
        ASSERT_TRUE((*t_)->Delete(ks_, key).ok());
        map_.erase(key);
      } else if (dice < 25 && map_.count(key)) {
        // A header change: the first bytes of the stored value, alone or beside a put of
        // another key in one batch (an UPDATE's old and new versions).
        std::string v = map_[key];
        uint32_t prefix = uint32_t(std::min<size_t>(v.size(), 1 + rng_() % 24));
        for (uint32_t j = 0; j < prefix; j++) v[j] = char(rng_());
        WriteBatch batch;
        batch.PutChangedPrefix(ks_, key, v, prefix);
        std::string other = "key" + std::to_string(rng_() % keys);
        if (other != key && rng_() % 2) {
          std::string w = RandomValue();
          batch.Put(ks_, other, w);
          map_[other] = w;
        }
        ASSERT_TRUE((*t_)->Write(batch).ok());
        map_[key] = v;
      } else if (dice < 30) {
        WriteBatch batch;
        for (int j = 0; j < 4; j++) {
          std::string k = "key" + std::to_string(rng_() % keys);
          if (j == 3) {
            batch.Delete(ks_, k);
            map_.erase(k);
          } else {
            std::string v = RandomValue();
            batch.Put(ks_, k, v);
            map_[k] = v;
          }
        }
        ASSERT_TRUE((*t_)->Write(batch).ok());
      } else {
        std::string v = RandomValue();
        ASSERT_TRUE((*t_)->Put(ks_, key, v).ok());
        map_[key] = v;
      }
    }
  }

  // Gets every model key, probes absent keys, and compares a full scan and random seeks.
  void Check() {
    for (auto& [k, v] : map_) {
      std::string got;
      Status s = (*t_)->Get(ks_, k, &got);
      ASSERT_TRUE(s.ok()) << k << ": " << s.ToString();
      ASSERT_EQ(got, v) << k;
    }
    for (int i = 0; i < 200; i++) {
      std::string k = "absent" + std::to_string(i);
      std::string got;
      ASSERT_TRUE((*t_)->Get(ks_, k, &got).IsNotFound());
    }
    auto it = (*t_)->NewIterator(ks_);
    auto m = map_.begin();
    for (it->SeekToFirst(); it->Valid(); it->Next(), ++m) {
      ASSERT_NE(m, map_.end()) << "extra key " << it->key();
      ASSERT_EQ(it->key(), m->first);
      ASSERT_EQ(it->value(), m->second);
    }
    ASSERT_TRUE(it->status().ok()) << it->status().ToString();
    ASSERT_EQ(m, map_.end()) << "missing key " << m->first;
    for (int i = 0; i < 50; i++) {
      std::string target = "key" + std::to_string(rng_() % 100000);
      it->Seek(target);
      auto expect = map_.lower_bound(target);
      if (expect == map_.end()) {
        ASSERT_FALSE(it->Valid());
      } else {
        ASSERT_TRUE(it->Valid());
        ASSERT_EQ(it->key(), expect->first);
      }
    }
    CheckBoundedRanges(it.get());
    Status v = (*t_)->Verify();
    ASSERT_TRUE(v.ok()) << v.ToString();
  }

  // Short ranges read with an upper bound: exactly the model's keys in [lo, hi), deleted keys
  // included in the runs the bound cuts short; then the bound removed again.
  void CheckBoundedRanges(Iterator* it) {
    for (int i = 0; i < 50; i++) {
      std::string lo = "key" + std::to_string(rng_() % 1600);
      std::string hi = lo + std::to_string(rng_() % 10);
      it->SetUpperBound(hi);
      auto m = map_.lower_bound(lo);
      for (it->Seek(lo); it->Valid(); it->Next(), ++m) {
        ASSERT_TRUE(m != map_.end() && m->first < hi) << "key past the bound: " << it->key();
        ASSERT_EQ(it->key(), m->first);
      }
      ASSERT_TRUE(it->status().ok()) << it->status().ToString();
      ASSERT_TRUE(m == map_.end() || m->first >= hi) << "missing key " << m->first;
    }
    it->SetUpperBound({});
    it->Seek("key");
    auto first = map_.lower_bound("key");
    ASSERT_EQ(it->Valid(), first != map_.end());
    if (first != map_.end()) {
      ASSERT_EQ(it->key(), first->first);
    }
  }

 private:
  // Small (5 B), medium (150-800 B) or large (1-20 KB) values, compressible or not.
  std::string RandomValue() {
    static const size_t kSizes[] = {5, 40, 150, 800, 1500, 20000};
    size_t size = kSizes[rng_() % 6];
    std::string v(size, '\0');
    bool compressible = rng_() % 2;
    for (size_t i = 0; i < size; i++) v[i] = compressible ? char('a' + (i % 7)) : char(rng_());
    if (size >= 8) std::memcpy(v.data(), &size, 8);
    return v;
  }

  TestEngine* t_;
  KeyspaceId ks_;
  std::mt19937 rng_;
  std::map<std::string, std::string> map_;
};

class ModelTest : public ::testing::TestWithParam<uint32_t> {};

// Random operations, background work, forced compactions, GC and restarts: always the model.
TEST_P(ModelTest, MatchesStdMap) {
  TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  Model model(&t, ks, GetParam());
  for (int phase = 0; phase < 6; phase++) {
    model.RunPhase(4000, 1500);
    while (t->DoBackgroundWork()) {
    }
    model.Check();
    if (phase % 2 == 1) {
      ASSERT_TRUE(t->CompactAll().ok());
      model.Check();
      ASSERT_TRUE(t->RunGC().ok());
      model.Check();
      ASSERT_TRUE(t->CompactAll().ok());
      model.Check();
    }
    if (phase == 3) {
      ASSERT_TRUE(t->Sync(t->GetStats().last_lsn).ok());
      t.Reopen();
      ASSERT_TRUE(t->LookupKeyspace(1, &ks).ok());
      model.Check();
    }
  }
  Stats st = t->GetStats();
  EXPECT_GT(st.compactions, 0u);
  EXPECT_GT(st.large_patches, 0u);
  EXPECT_GT(st.gc_runs, 0u);
  EXPECT_GT(st.gc_reclaimed_bytes, 0u);
}

INSTANTIATE_TEST_SUITE_P(Seeds, ModelTest, ::testing::Values(1u, 2u, 3u));

// Medium values placed in place from a fixed level rather than the last level in use.
TEST(ModelTest, FixedMediumInPlaceLevel) {
  TestEngine t([](const std::string& dir) {
    Options o = SmallOptions(dir);
    o.medium_inplace_level = 3;
    o.compress_large = false;
    return o;
  });
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(1, &ks).ok());
  Model model(&t, ks, 99);
  for (int phase = 0; phase < 4; phase++) {
    model.RunPhase(5000, 3000);
    while (t->DoBackgroundWork()) {
    }
    model.Check();
  }
  ASSERT_TRUE(t->CompactAll().ok());
  model.Check();
}

}  // namespace
}  // namespace slipstream::engine::test
