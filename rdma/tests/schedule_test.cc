// The planner's fast paths (whole columns of bitmapped layouts, whole rows of strided ones)
// against the rule's definition, fragment by fragment, on random layouts and options.
#include "slipstream/rdma/schedule.h"

#include <gtest/gtest.h>

#include <random>

namespace slipstream::rdma {
namespace {

// Two schedules are the same when every box and every total is.
void ExpectSameSchedule(const Schedule& fast, const Schedule& slow, const std::string& what) {
  ASSERT_EQ(fast.box_count(), slow.box_count()) << what;
  for (uint64_t i = 0; i < fast.box_count(); i++) {
    const Run f = fast.box(i);
    const Run s = slow.box(i);
    ASSERT_EQ(f.source, s.source) << what << " run " << i;
    ASSERT_EQ(f.length, s.length) << what << " run " << i;
    ASSERT_EQ(f.wire, s.wire) << what << " run " << i;
    ASSERT_EQ(f.packed, s.packed) << what << " run " << i;
  }
  EXPECT_EQ(fast.wire_bytes, slow.wire_bytes) << what;
  EXPECT_EQ(fast.packed_bytes, slow.packed_bytes) << what;
  EXPECT_EQ(fast.max_packed_run, slow.max_packed_run) << what;
  EXPECT_EQ(fast.bridged_bytes, slow.bridged_bytes) << what;
}

// A mask with clusters and holes of random lengths, so zero runs straddle word boundaries
// and some exceed any bridge.
RowMask ClusteredMask(std::mt19937_64& rng, uint64_t rows) {
  RowMask mask(rows);
  bool set = rng() % 2 == 0;
  for (uint64_t row = 0; row < rows;) {
    const uint64_t length = 1 + rng() % (rng() % 4 == 0 ? 300 : 20);
    for (uint64_t i = row; i < std::min(rows, row + length); i++) {
      if (set || rng() % 16 == 0) mask.Set(i);
    }
    row += length;
    set = !set;
  }
  return mask;
}

// Random options around the thresholds that matter for small widths and gaps.
ScheduleOptions RandomOptions(std::mt19937_64& rng) {
  const uint32_t picks[] = {0, 1, 3, 4, 8, 12, 31, 64, 100, 256, 320, 1000, 4096, UINT32_MAX};
  ScheduleOptions o;
  o.max_bridge = picks[rng() % 14];
  o.max_bridge_packed = picks[rng() % 14];
  o.min_in_place = picks[rng() % 14];
  return o;
}

// Bitmapped layouts (masked and not, contiguous and scattered columns): the column bulk path
// and the word-at-a-time gap check give exactly the fragment-by-fragment schedule.
TEST(SchedulePlanner, BitmappedFastPathMatchesTheRule) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 3000; round++) {
    const uint64_t rows = rng() % 2000;
    std::vector<Column> columns;
    uint64_t at = rng() % 64;
    for (uint64_t c = 0, n = 1 + rng() % 5; c < n; c++) {
      const uint32_t width = 1 + uint32_t(rng() % (rng() % 3 == 0 ? 40 : 8));
      columns.push_back(Column{at, width});
      at += rows * width + (rng() % 2 ? 0 : rng() % 500);
    }
    RegionLayout layout;
    ASSERT_TRUE(RegionLayout::Bitmapped(columns, rows, &layout).ok());
    if (rng() % 4 != 0) {
      ASSERT_TRUE(layout.WithMask(ClusteredMask(rng, rows), &layout).ok());
    }
    const ScheduleOptions options = RandomOptions(rng);
    ExpectSameSchedule(PlanSchedule(layout, options), PlanScheduleByFragments(layout, options),
                       "round " + std::to_string(round));
  }
}

// Unmasked strided layouts: the whole-row bulk path gives the fragment-by-fragment schedule,
// including where a box reaches kMaxBoxBytes in the middle of a row.
TEST(SchedulePlanner, StridedFastPathMatchesTheRule) {
  std::mt19937_64 rng(12);
  for (int round = 0; round < 3000; round++) {
    std::vector<Field> fields;
    uint32_t at = uint32_t(rng() % 16);
    for (int f = 0, n = 1 + int(rng() % 5); f < n; f++) {
      const uint32_t length = 1 + uint32_t(rng() % 24);
      fields.push_back(Field{at, length});
      at += length + uint32_t(rng() % 2 ? 0 : rng() % 80);
    }
    const uint64_t stride = at + rng() % 200;
    RegionLayout layout;
    ASSERT_TRUE(RegionLayout::Strided(rng() % 100, stride, rng() % 3000, fields, &layout).ok());
    const ScheduleOptions options = RandomOptions(rng);
    ExpectSameSchedule(PlanSchedule(layout, options), PlanScheduleByFragments(layout, options),
                       "round " + std::to_string(round));
  }
  // Rows of 1 MiB: boxes break at kMaxBoxBytes, inside a row when the row straddles it.
  RegionLayout big;
  ASSERT_TRUE(RegionLayout::Strided(7, 1 << 20, 3000, {{0, 1000}, {600000, 300000}}, &big).ok());
  const ScheduleOptions options{UINT32_MAX, 0, 0};
  Schedule fast = PlanSchedule(big, options);
  ExpectSameSchedule(fast, PlanScheduleByFragments(big, options), "1 MiB rows");
  EXPECT_GT(fast.box_count(), 2u);
  for (const rdma::Run& run : fast.Boxes()) EXPECT_LE(run.length, kMaxBoxBytes);
}

// The word-at-a-time gap check on hand-made masks: runs inside a word, across words, at the
// ends, and exactly at the limit.
TEST(SchedulePlanner, GapCheckFindsTheLongRun) {
  for (uint64_t hole : {1, 5, 62, 63, 64, 65, 130}) {
    for (uint64_t where : {0, 3, 60, 63, 64, 100}) {
      RowMask mask(400);
      for (uint64_t row = 0; row < 400; row++) {
        if (row < 10 + where || row >= 10 + where + hole) mask.Set(row);
      }
      RegionLayout layout;
      ASSERT_TRUE(RegionLayout::Bitmapped({{0, 1}}, 400, &layout).ok());
      ASSERT_TRUE(layout.WithMask(mask, &layout).ok());
      for (uint32_t bridge : {uint32_t(hole - 1), uint32_t(hole), uint32_t(hole + 1)}) {
        const ScheduleOptions options{bridge, 0, 0};
        Schedule fast = PlanSchedule(layout, options);
        ExpectSameSchedule(fast, PlanScheduleByFragments(layout, options),
                           "hole " + std::to_string(hole) + " at " + std::to_string(where));
        EXPECT_EQ(fast.runs.size(), bridge >= hole ? 1u : 2u);
      }
    }
  }
}

// PlanSchedule(layout, costs) returns the cheapest of its three threshold sets, and when the
// greedy set leaves no packed box the other two plan the very same schedule (the shortcut it
// takes then), on random layouts of every kind and random costs.
TEST(SchedulePlanner, CostBasedPlanningPicksTheCheapestSet) {
  std::mt19937_64 rng(13);
  int shortcuts = 0;
  for (int round = 0; round < 2000; round++) {
    RegionLayout layout;
    if (round % 2 == 0) {
      const uint64_t rows = rng() % 1500;
      std::vector<Column> columns{{0, 4}, {rows * 4 + rng() % 300, 8}};
      ASSERT_TRUE(RegionLayout::Bitmapped(columns, rows, &layout).ok());
      if (rng() % 2) {
        ASSERT_TRUE(layout.WithMask(ClusteredMask(rng, rows), &layout).ok());
      }
    } else {
      std::vector<Field> fields{{0, uint32_t(1 + rng() % 16)}, {40, uint32_t(1 + rng() % 30)}};
      ASSERT_TRUE(RegionLayout::Strided(0, 70 + rng() % 400, rng() % 2000, fields, &layout).ok());
    }
    TransferCosts costs{1.0 + double(rng() % 200), 0.01 + double(rng() % 100) / 200,
                        1.0 + double(rng() % 5), 0.01 + double(rng() % 10) / 100};
    if (round % 4 >= 2) {  // a transport with strided gathers
      costs.period_piece_ns = 0.05 + double(rng() % 100) / 100;
      costs.period_byte_ns = double(rng() % 10) / 100;
    }
    const ScheduleOptions greedy = ScheduleOptions::FromCosts(costs);
    ScheduleOptions bridged = greedy;
    bridged.max_bridge_packed = std::max(greedy.max_bridge_packed, greedy.max_bridge);
    ScheduleOptions in_place = greedy;
    in_place.min_in_place = 0;
    ScheduleOptions gathered = greedy;
    gathered.max_bridge_packed =
        costs.period_piece_ns > 0
            ? uint32_t(costs.period_piece_ns / (costs.wire_byte_ns + costs.period_byte_ns))
            : greedy.max_bridge_packed;
    const Schedule a = PlanSchedule(layout, greedy);
    const Schedule b = PlanSchedule(layout, bridged);
    const Schedule c = PlanSchedule(layout, in_place);
    const Schedule d = PlanSchedule(layout, gathered);
    const Schedule chosen = PlanSchedule(layout, costs);
    double cheapest = std::min({ModelCost(a, costs), ModelCost(b, costs), ModelCost(c, costs)});
    if (layout.kind() == RegionKind::kStrided) cheapest = std::min(cheapest, ModelCost(d, costs));
    EXPECT_DOUBLE_EQ(ModelCost(chosen, costs), a.packed_bytes == 0 ? ModelCost(a, costs) : cheapest)
        << "round " << round;
    if (a.packed_bytes == 0) {
      shortcuts++;
      ExpectSameSchedule(b, a, "bridged, round " + std::to_string(round));
      ExpectSameSchedule(c, a, "in place, round " + std::to_string(round));
    }
  }
  EXPECT_GT(shortcuts, 50);
}

// D-RDMA's narrow projection (columns 0, 1 and 5 of 16 eight-byte ones): where the transport
// has strided gathers, the planner cuts each row into its two field groups, unbridged, as one
// packed period; where it has none (verbs), it keeps the greedy choice. A period costs what
// its copies would under ModelCost unless the transport gathers it.
TEST(SchedulePlanner, NarrowProjectionBecomesAStridedGather) {
  RegionLayout layout;
  ASSERT_TRUE(RegionLayout::Strided(0, 128, 65536, {{0, 16}, {40, 8}}, &layout).ok());
  const Schedule shm = PlanSchedule(layout, TransferCosts::Measured("shm"));
  ASSERT_TRUE(shm.has_period());
  EXPECT_TRUE(shm.period_packed());
  EXPECT_EQ(shm.period_runs(), 2u);
  EXPECT_EQ(shm.period_wire_bytes, 24u);
  EXPECT_EQ(shm.period_stride, 128u);
  EXPECT_EQ(shm.wire_bytes, 65536u * 24);
  EXPECT_EQ(shm.box_count(), 2u * 65536);
  EXPECT_LE(shm.runs.size(), 6u);  // a row or two before the period, then the period once
  EXPECT_TRUE(CheckSchedule(layout, shm, layout.extent()).ok());
  const Schedule verbs = PlanSchedule(layout, TransferCosts::Measured("verbs"));
  EXPECT_FALSE(verbs.period_packed() && verbs.period_wire_bytes == 24);

  // The same schedule's cost with and without strided gathers.
  TransferCosts flat = TransferCosts::Measured("shm");
  flat.period_piece_ns = flat.period_byte_ns = 0;
  Schedule expanded = shm;
  expanded.runs = shm.Boxes();
  expanded.period_repeat = 1;
  expanded.period_first = 0;
  expanded.period_stride = expanded.period_wire_bytes = 0;
  EXPECT_NEAR(ModelCost(shm, flat), ModelCost(expanded, flat), 1e-6 * ModelCost(expanded, flat));
  EXPECT_LT(ModelCost(shm, TransferCosts::Measured("shm")), ModelCost(shm, flat) / 4);
}

// CheckSchedule takes a period for what it claims: copies past the source, a period that
// does not add up, or one that never occurs are refused.
TEST(SchedulePlanner, CheckScheduleRefusesABadPeriod) {
  RegionLayout layout;
  ASSERT_TRUE(RegionLayout::Strided(8, 100, 1000, {{0, 10}, {50, 4}}, &layout).ok());
  const Schedule plan = PlanSchedule(layout, ScheduleOptions{0, 0, 64});
  ASSERT_TRUE(plan.has_period());
  ASSERT_TRUE(CheckSchedule(layout, plan, layout.extent()).ok());
  EXPECT_FALSE(CheckSchedule(layout, plan, layout.extent() - 1).ok());
  Schedule bad = plan;
  bad.period_repeat++;
  EXPECT_FALSE(CheckSchedule(layout, bad, layout.extent() + 1000).ok());  // wire adds up wrong
  bad = plan;
  bad.period_wire_bytes++;
  EXPECT_FALSE(CheckSchedule(layout, bad, layout.extent()).ok());
  bad = plan;
  bad.period_stride = UINT64_MAX / 2;
  EXPECT_FALSE(CheckSchedule(layout, bad, layout.extent()).ok());
  bad = plan;
  bad.period_repeat = 0;
  EXPECT_FALSE(CheckSchedule(layout, bad, layout.extent()).ok());
  bad = plan;
  bad.period_first = bad.runs.size();
  EXPECT_FALSE(CheckSchedule(layout, bad, layout.extent()).ok());
}

}  // namespace
}  // namespace slipstream::rdma
