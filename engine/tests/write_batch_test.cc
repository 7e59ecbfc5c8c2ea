// WriteBatch: operations as views into one buffer, a Clear() that keeps the memory, and batch
// after batch through Engine::Write (which keeps its operations array between batches).
#include "slipstream/engine/write_batch.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "test_util.h"

namespace slipstream::engine {
namespace {

TEST(WriteBatch, OperationsReadBackAsAdded) {
  WriteBatch batch;
  batch.Put(3, "alpha", "one");
  batch.Delete(4, "beta");
  batch.Put(3, "", std::string(5000, 'z'));  // empty key, a value past any small buffer
  batch.Put(5, std::string("k\0y", 3), std::string("v\0\0", 3));  // embedded zeros
  ASSERT_EQ(batch.Count(), 4u);

  WriteBatch::Op op = batch.op(0);
  EXPECT_FALSE(op.is_delete);
  EXPECT_EQ(op.keyspace, 3u);
  EXPECT_EQ(op.key, "alpha");
  EXPECT_EQ(op.value, "one");
  op = batch.op(1);
  EXPECT_TRUE(op.is_delete);
  EXPECT_EQ(op.keyspace, 4u);
  EXPECT_EQ(op.key, "beta");
  EXPECT_TRUE(op.value.empty());
  op = batch.op(2);
  EXPECT_TRUE(op.key.empty());
  EXPECT_EQ(op.value, std::string(5000, 'z'));
  op = batch.op(3);
  EXPECT_EQ(op.key, std::string("k\0y", 3));
  EXPECT_EQ(op.value, std::string("v\0\0", 3));
  EXPECT_EQ(batch.ByteSize(), 5u + 3 + 4 + 5000 + 3 + 3);
}

TEST(WriteBatch, ClearKeepsTheMemoryForTheNextBatch) {
  WriteBatch batch;
  batch.Reserve(100, 100 * 200);
  size_t reserved = batch.Capacity();
  for (int i = 0; i < 100; i++) batch.Put(1, "key" + std::to_string(i), std::string(190, 'v'));
  EXPECT_EQ(batch.Capacity(), reserved);  // the reservation held every operation
  batch.Clear();
  EXPECT_EQ(batch.Count(), 0u);
  EXPECT_EQ(batch.ByteSize(), 0u);
  EXPECT_EQ(batch.Capacity(), reserved);
  batch.Put(2, "again", "x");
  EXPECT_EQ(batch.op(0).key, "again");
  EXPECT_EQ(batch.op(0).keyspace, 2u);
}

// Batches of different sizes in turn, one batch object cleared between them, the engine's
// operations array kept between them: every batch lands whole, none leaks into the next.
TEST(WriteBatch, BatchAfterBatchThroughTheEngine) {
  test::TestEngine t;
  KeyspaceId ks;
  ASSERT_TRUE(t->CreateKeyspace(7, &ks).ok());
  std::map<std::string, std::string> model;
  WriteBatch batch;
  const int kSizes[] = {500, 3, 120, 1, 700, 40};
  int next = 0;
  for (int round = 0; round < 12; round++) {
    batch.Clear();
    int size = kSizes[round % 6];
    for (int i = 0; i < size; i++, next++) {
      std::string key = "row" + std::to_string(next % 1500);
      if (next % 11 == 0) {
        batch.Delete(ks, key);
        model.erase(key);
      } else {
        // Small, medium and large values, so that large ones are encoded for the large log.
        std::string value = test::Value(next % 3 == 0 ? 1500 : (next % 3 == 1 ? 300 : 20), next);
        batch.Put(ks, key, value);
        model[key] = value;
      }
    }
    Status s = t->Write(batch);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  EXPECT_EQ(test::Contents(t.engine.get(), ks), model);
  ASSERT_TRUE(t->Sync(~uint64_t(0)).ok());
  t.Reopen();  // and recovery replays the same batches from the log
  EXPECT_EQ(test::Contents(t.engine.get(), ks), model);
}

}  // namespace
}  // namespace slipstream::engine
