// Header changes of large values (WriteBatch::PutChangedPrefix): a patch entry names the stored
// large-log record instead of writing the value again. Its reads, its survival through
// compactions, GC relocations and restarts, and the large log's accounting (Verify checks it
// byte for byte) are tested here; the model test mixes patches into random work.
#include <random>

#include "test_util.h"

namespace slipstream::engine::test {
namespace {

constexpr int kKeys = 120;
constexpr size_t kValueSize = 3000;

std::string KeyOf(int i) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "row%05d", i);
  return buf;
}

// Random bytes (LZ4 cannot shrink them, so every value takes its full size in the large log).
std::string RandomBytes(std::mt19937* rng, size_t size) {
  std::string v(size, '\0');
  for (char& c : v) c = char((*rng)());
  return v;
}

class LargePatchTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(t_->CreateKeyspace(7, &ks_).ok()); }

  void PutAll() {
    for (int i = 0; i < kKeys; i++) {
      model_[KeyOf(i)] = RandomBytes(&rng_, kValueSize);
      ASSERT_TRUE(t_->Put(ks_, KeyOf(i), model_[KeyOf(i)]).ok());
    }
  }

  // Changes the first `prefix` bytes of key i's value, as a row's header change does.
  void Patch(int i, uint32_t prefix) {
    std::string& v = model_[KeyOf(i)];
    for (uint32_t j = 0; j < prefix; j++) v[j] = char(rng_());
    WriteBatch batch;
    batch.PutChangedPrefix(ks_, KeyOf(i), v, prefix);
    Status s = t_->Write(batch);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  // Point reads, a scan and Verify (which checks each log segment's live bytes against the
  // records the entries own).
  void Check() {
    for (auto& [k, v] : model_) {
      std::string got;
      Status s = t_->Get(ks_, k, &got);
      ASSERT_TRUE(s.ok()) << k << ": " << s.ToString();
      ASSERT_TRUE(got == v) << k << " reads other bytes";
    }
    std::map<std::string, std::string> scanned = Contents(t_.engine.get(), ks_);
    ASSERT_EQ(scanned.size(), model_.size());
    for (auto& [k, v] : model_) ASSERT_TRUE(scanned[k] == v) << k << " scans other bytes";
    Status v = t_->Verify();
    ASSERT_TRUE(v.ok()) << v.ToString();
  }

  TestEngine t_;
  KeyspaceId ks_ = 0;
  std::mt19937 rng_{42};
  std::map<std::string, std::string> model_;
};

// Patches add no large-log bytes; their reads see the new prefixes through every compaction,
// GC and a restart.
TEST_F(LargePatchTest, HeaderChangesNameTheStoredRecord) {
  PutAll();
  uint64_t large_segments = t_->GetStats().large_log_segments;
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < kKeys; i++) Patch(i, 23);
  }
  Stats st = t_->GetStats();
  EXPECT_EQ(st.large_patches, uint64_t(3 * kKeys));
  EXPECT_EQ(st.large_log_segments, large_segments);  // 1 MB of values were not written again
  Check();
  ASSERT_TRUE(t_->CompactAll().ok());
  Check();
  // Shorter patches over longer ones: the bytes the older patch changed stay changed.
  for (int i = 0; i < kKeys; i += 2) Patch(i, 8);
  ASSERT_TRUE(t_->CompactAll().ok());
  Check();
  ASSERT_TRUE(t_->RunGC().ok());
  Check();
  ASSERT_TRUE(t_->Sync(t_->GetStats().last_lsn).ok());
  t_.Reopen();
  ASSERT_TRUE(t_->LookupKeyspace(7, &ks_).ok());
  Check();
}

// GC moves a patched value's record and keeps the patch's prefix; the old record is counted
// once as garbage, so the emptied segments are freed and Verify's accounting holds.
TEST_F(LargePatchTest, GarbageCollectionKeepsThePrefix) {
  PutAll();
  ASSERT_TRUE(t_->CompactAll().ok());
  for (int i = 0; i < kKeys; i++) {
    if (i % 3 == 0) {
      Patch(i, 23);
    } else {  // overwritten: the first segments become mostly garbage
      model_[KeyOf(i)] = RandomBytes(&rng_, kValueSize);
      ASSERT_TRUE(t_->Put(ks_, KeyOf(i), model_[KeyOf(i)]).ok());
    }
  }
  ASSERT_TRUE(t_->CompactAll().ok());
  Check();
  uint64_t relocated = t_->GetStats().gc_bytes_relocated;
  ASSERT_TRUE(t_->RunGC().ok());
  EXPECT_GT(t_->GetStats().gc_bytes_relocated, relocated);  // the patched values moved
  Check();
  for (int i = 0; i < kKeys; i += 3) Patch(i, 5);  // patches of relocated records
  ASSERT_TRUE(t_->CompactAll().ok());
  ASSERT_TRUE(t_->RunGC().ok());
  ASSERT_TRUE(t_->CompactAll().ok());
  Check();
  EXPECT_GT(t_->GetStats().gc_reclaimed_bytes, 0u);
}

// A GC batch of nothing but patched rows' records (the other half of their segments belonged
// to a dropped table, which GC passes over): every relocation writes a patch, whose L0 record
// is bigger than a pointer's, and the batch must have reserved the room for it.
TEST_F(LargePatchTest, RelocatedPatchesFitTheirReservation) {
  KeyspaceId dropped;
  ASSERT_TRUE(t_->CreateKeyspace(8, &dropped).ok());
  for (int i = 0; i < kKeys; i++) {
    model_[KeyOf(i)] = RandomBytes(&rng_, kValueSize);
    ASSERT_TRUE(t_->Put(ks_, KeyOf(i), model_[KeyOf(i)]).ok());
    ASSERT_TRUE(t_->Put(dropped, KeyOf(i), RandomBytes(&rng_, kValueSize)).ok());
  }
  for (int i = 0; i < kKeys; i++) Patch(i, 23);
  ASSERT_TRUE(t_->DropKeyspace(dropped).ok());
  ASSERT_TRUE(t_->CompactAll().ok());  // the dropped table's values become garbage
  uint64_t relocated = t_->GetStats().gc_bytes_relocated;
  Status s = t_->RunGC();
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(t_->GetStats().gc_bytes_relocated, relocated);
  Check();
  ASSERT_TRUE(t_->CompactAll().ok());
  Check();
}

// The owner of a record is dropped in a merge that keeps a newer patch of it; deleting the key
// then frees the record once. Verify after each step checks that no byte is counted twice.
TEST_F(LargePatchTest, OwnershipMovesToThePatch) {
  PutAll();
  ASSERT_TRUE(t_->CompactAll().ok());  // the owners in the deepest level
  for (int i = 0; i < kKeys; i++) Patch(i, 23);
  Check();
  while (t_->DoBackgroundWork()) {
  }
  ASSERT_TRUE(t_->CompactAll().ok());
  Check();
  for (int i = 0; i < kKeys; i++)
    Patch(i, 23);  // a patch, then a put and a delete, in one memtable
  for (int i = 0; i < kKeys; i += 2) {
    ASSERT_TRUE(t_->Delete(ks_, KeyOf(i)).ok());
    model_.erase(KeyOf(i));
  }
  Check();
  ASSERT_TRUE(t_->CompactAll().ok());
  Check();
  ASSERT_TRUE(t_->RunGC().ok());
  ASSERT_TRUE(t_->CompactAll().ok());
  Check();
}

// A patch of a key the same batch wrote before it is written whole: naming the record from
// before the batch would put the new prefix on the old value (or revive a deleted key).
TEST_F(LargePatchTest, APatchAfterAWriteOfItsKeyInOneBatchIsAPut) {
  PutAll();
  std::string fresh = RandomBytes(&rng_, kValueSize);
  std::string patched = fresh;
  patched[0] = char(patched[0] + 1);
  WriteBatch batch;
  batch.Put(ks_, KeyOf(1), fresh);
  batch.PutChangedPrefix(ks_, KeyOf(1), patched, 1);
  batch.Delete(ks_, KeyOf(2));
  batch.PutChangedPrefix(ks_, KeyOf(2), model_[KeyOf(2)], 1);
  ASSERT_TRUE(t_->Write(batch).ok());
  model_[KeyOf(1)] = patched;
  EXPECT_EQ(t_->GetStats().large_patches, 0u);
  Check();
}

// Small values and absent keys take plain puts; a prefix past 64 bytes is refused.
TEST_F(LargePatchTest, WhatCannotBePatchedIsPut) {
  ASSERT_TRUE(t_->Put(ks_, "small", "0123456789").ok());
  WriteBatch batch;
  batch.PutChangedPrefix(ks_, "small", "abc3456789", 3);
  batch.PutChangedPrefix(ks_, "absent", std::string(kValueSize, 'x'), 10);
  ASSERT_TRUE(t_->Write(batch).ok());
  std::string got;
  ASSERT_TRUE(t_->Get(ks_, "small", &got).ok());
  EXPECT_EQ(got, "abc3456789");
  ASSERT_TRUE(t_->Get(ks_, "absent", &got).ok());
  EXPECT_EQ(got, std::string(kValueSize, 'x'));
  EXPECT_EQ(t_->GetStats().large_patches, 0u);
  WriteBatch bad;
  bad.PutChangedPrefix(ks_, "absent", std::string(kValueSize, 'y'), 65);
  EXPECT_TRUE(t_->Write(bad).IsInvalidArgument());
  ASSERT_TRUE(t_->Get(ks_, "absent", &got).ok());
  EXPECT_EQ(got, std::string(kValueSize, 'x'));
  ASSERT_TRUE(t_->Verify().ok());
}

}  // namespace
}  // namespace slipstream::engine::test
