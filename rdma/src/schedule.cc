// Gap analysis and the transfer optimizer: the box rule shared by sender and receiver.
#include "slipstream/rdma/schedule.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "small_copy.h"

namespace slipstream::rdma {

namespace {

// A threshold in bytes from a ratio of costs, clamped to 32 bits; 0 when either cost is unknown.
uint32_t Threshold(double numerator, double denominator) {
  if (!(numerator > 0) || !(denominator > 0)) return 0;
  const double bytes = std::floor(numerator / denominator);
  return bytes >= double(UINT32_MAX) ? UINT32_MAX : static_cast<uint32_t>(bytes);
}

}  // namespace

// Measured with `bench/region_bench --calibrate-only` on this machine type (docs/benchmarks.md,
// "Regions"). verbs: D-RDMA's finding that DMAs below 256 bytes waste the PCIe link, and a
// gather entry costing about as much as 64 bytes of wire time.
TransferCosts TransferCosts::Measured(std::string_view backend) {
  if (backend == "shm") return TransferCosts{9.681, 0.0302, 3.185, 0.03029};
  if (backend == "tcp") return TransferCosts{125.4, 0.2229, 3.181, 0.03252};
  return TransferCosts{10.0, 0.04, 2.5, 0.06};
}

ScheduleOptions ScheduleOptions::FromCosts(const TransferCosts& costs) {
  ScheduleOptions options;
  options.max_bridge = Threshold(costs.piece_ns, costs.wire_byte_ns);
  options.max_bridge_packed =
      Threshold(costs.copy_call_ns, costs.wire_byte_ns + costs.copy_byte_ns);
  options.min_in_place = Threshold(costs.piece_ns - costs.copy_call_ns, costs.copy_byte_ns);
  return options;
}

namespace {

// Collects the runs of a schedule as a walker opens and grows boxes.
class RunBuilder {
 public:
  RunBuilder(const ScheduleOptions& options, Schedule* schedule)
      : walker(options), schedule_(schedule) {}

  // Places one fragment; true when it opened a box.
  bool Place(const Fragment& fragment) {
    uint64_t wire = 0;
    const bool opened = walker.Place(fragment, &wire);
    if (opened) schedule_->runs.push_back(Run{walker.box_source(), 0, wire, false});
    schedule_->runs.back().length = walker.box_length();
    return opened;
  }
  // Grows the open box to `end` (the caller proved every fragment up to there joins it).
  void ExtendTo(uint64_t end) {
    walker.ExtendTo(end);
    schedule_->runs.back().length = walker.box_length();
  }
  // Fills in the packed flags and the totals.
  void Finish() {
    Schedule& s = *schedule_;
    for (Run& run : s.runs) {
      run.packed = run.length < s.options.min_in_place && run.length <= kMaxBoxBytes;
      if (run.packed) {
        s.packed_bytes += run.length;
        s.max_packed_run = std::max(s.max_packed_run, run.length);
      }
    }
    s.wire_bytes = s.runs.empty() ? 0 : s.runs.back().wire + s.runs.back().length;
    s.bridged_bytes = s.wire_bytes - s.payload_bytes;
  }

  std::vector<Run>& runs() { return schedule_->runs; }

  BoxWalker walker;  // not advanced by Repeat: nothing may be placed after it

 private:
  Schedule* schedule_;
};

// True when `x` (bit 0 set) has more than `limit` zeros in a row below its highest set bit.
bool HasLongInnerZeroRun(uint64_t x, uint64_t limit) {
  const int high = 63 - std::countl_zero(x);
  uint64_t ones = ~x & (high == 63 ? ~uint64_t{0} : (uint64_t{1} << high) - 1);
  const uint64_t want = limit + 1;  // a run this long is too long; want <= 63 here
  uint64_t covered = 1;
  while (covered < want && ones != 0) {
    const uint64_t step = std::min(covered, want - covered);
    ones &= ones >> step;
    covered += step;
  }
  return ones != 0;
}

// True when no run of unset bits strictly between rows `from` and `to` (both set) of a mask is
// longer than `limit` rows: a word at a time, so a column is checked in rows/64 steps.
bool ZeroRunsAtMost(const std::vector<uint64_t>& words, uint64_t from, uint64_t to,
                    uint64_t limit) {
  uint64_t run = 0;  // unset bits since the last set one
  for (uint64_t row = from + 1; row < to;) {
    const uint64_t n = std::min<uint64_t>(64 - row % 64, to - row);
    uint64_t word = words[row / 64] >> (row % 64);
    if (n < 64) word &= (uint64_t{1} << n) - 1;
    if (word == 0) {
      run += n;
    } else {
      const int low = std::countr_zero(word);
      if (run + low > limit) return false;
      if (limit < 63 && HasLongInnerZeroRun(word >> low, limit)) return false;
      run = n - 1 - (63 - std::countl_zero(word));  // unset bits above the highest set one
    }
    if (run > limit) return false;
    row += n;
  }
  return true;
}

// The last set row of a mask over `rows` rows (at least one is set).
uint64_t LastSelected(const RowMask& mask) {
  const std::vector<uint64_t>& words = mask.words();
  for (size_t i = words.size(); i-- > 0;) {
    uint64_t word = words[i];
    if (i + 1 == words.size() && mask.rows() % 64 != 0) {
      word &= (uint64_t{1} << (mask.rows() % 64)) - 1;
    }
    if (word != 0) return i * 64 + 63 - std::countl_zero(word);
  }
  return 0;
}

// Plans a bitmapped layout column by column. Rows are placed one by one until the open box
// is judged by max_bridge alone; if from there every gap up to the column's last selected row
// is at most max_bridge (checked on the mask a word at a time) and the box stays within
// kMaxBoxBytes, the box takes the rest of the column at once.
void PlanBitmapped(const RegionLayout& layout, RunBuilder& builder) {
  const uint64_t rows = layout.rows();
  const RowMask& mask = layout.mask();
  const bool masked = layout.masked();
  const uint64_t last = masked ? LastSelected(mask) : rows - 1;
  const uint64_t max_bridge = builder.walker.options().max_bridge;
  for (const Column& column : layout.columns()) {
    const uint64_t width = column.width;
    const uint64_t limit_rows = max_bridge / width;
    bool try_bulk = true;
    for (uint64_t row = 0; row < rows; row++) {
      if (masked) {  // skip to the next selected row
        uint64_t index = row / 64;
        uint64_t word = mask.words()[index] & (~uint64_t{0} << (row % 64));
        while (word == 0 && ++index < mask.words().size()) word = mask.words()[index];
        if (word == 0) break;
        row = index * 64 + std::countr_zero(word);
        if (row >= rows) break;
      }
      builder.Place(Fragment{column.base + row * width, width});
      if (try_bulk && row < last && builder.walker.InPlaceRegime()) {
        try_bulk = false;
        const uint64_t end = column.base + (last + 1) * width;
        if (end - builder.walker.box_source() <= kMaxBoxBytes &&
            (!masked || ZeroRunsAtMost(mask.words(), row, last, limit_rows))) {
          builder.ExtendTo(end);
          break;
        }
      }
    }
  }
}

// Plans an unmasked strided layout row by row, with two shortcuts.
//  * Once the open box is judged by max_bridge alone at a row's start, and every gap of the
//    row pattern (between fields, and from a row's last field to the next row's first) is at
//    most max_bridge, whole rows join the box at once for as long as they fit in kMaxBoxBytes.
//  * When two rows in a row each opened a box with their first field, every later row does
//    the same and is cut into the same boxes: the box state a row leaves behind depends only
//    on the row's pattern once the row started afresh. The rest is copied from the last row.
void PlanStrided(const RegionLayout& layout, RunBuilder& builder) {
  const std::vector<Field>& fields = layout.fields();
  const uint64_t max_bridge = builder.walker.options().max_bridge;
  bool pattern_bridged = layout.stride() - (uint64_t(fields.back().offset) + fields.back().length -
                                            fields.front().offset) <=
                         max_bridge;
  for (size_t i = 1; i < fields.size(); i++) {
    const uint64_t previous_end = uint64_t(fields[i - 1].offset) + fields[i - 1].length;
    pattern_bridged = pattern_bridged && fields[i].offset - previous_end <= max_bridge;
  }
  const uint64_t rows = layout.rows();
  const uint64_t row_end = uint64_t(fields.back().offset) + fields.back().length;
  bool previous_fresh = false;
  for (uint64_t row = 0; row < rows;) {
    const uint64_t start = layout.base() + row * layout.stride();
    if (pattern_bridged && row > 0 && builder.walker.InPlaceRegime()) {
      // Rows [row, row + fit) end at or before box_source + kMaxBoxBytes.
      const uint64_t room = builder.walker.box_source() + kMaxBoxBytes;
      uint64_t fit = 0;
      if (start + row_end <= room) {
        fit = std::min(rows - row, (room - start - row_end) / layout.stride() + 1);
      }
      if (fit > 0) {
        builder.ExtendTo(start + (fit - 1) * layout.stride() + row_end);
        row += fit;
        previous_fresh = false;
        continue;
      }
    }
    const size_t first_run = builder.runs().size();
    bool fresh = false;
    for (size_t f = 0; f < fields.size(); f++) {
      const bool opened = builder.Place(Fragment{start + fields[f].offset, fields[f].length});
      if (f == 0) fresh = opened;
    }
    row++;
    if (fresh && previous_fresh && row < rows) {
      std::vector<Run>& runs = builder.runs();
      const size_t per_row = runs.size() - first_run;
      const uint64_t row_wire = runs.back().wire + runs.back().length - runs[first_run].wire;
      runs.reserve(runs.size() + (rows - row) * per_row);
      for (uint64_t k = 1; row < rows; row++, k++) {
        for (size_t i = 0; i < per_row; i++) {
          const Run& model = runs[first_run + i];
          runs.push_back(Run{model.source + k * layout.stride(), model.length,
                             model.wire + k * row_wire, false});
        }
      }
      return;
    }
    previous_fresh = fresh;
  }
}

}  // namespace

namespace {

// Plans `layout` fragment by fragment, or through the shortcuts where `shortcuts` allows.
Schedule Plan(const RegionLayout& layout, const ScheduleOptions& options, bool shortcuts) {
  Schedule schedule;
  schedule.options = options;
  schedule.fragments = layout.fragment_count();
  schedule.payload_bytes = layout.payload_bytes();
  schedule.layout_fingerprint = layout.Fingerprint();
  if (schedule.fragments == 0) return schedule;
  RunBuilder builder(options, &schedule);
  if (shortcuts && layout.kind() == RegionKind::kBitmapped) {
    PlanBitmapped(layout, builder);
  } else if (shortcuts && layout.kind() == RegionKind::kStrided && !layout.masked()) {
    PlanStrided(layout, builder);
  } else {
    FragmentCursor cursor(layout);
    Fragment fragment;
    while (cursor.Next(&fragment)) builder.Place(fragment);
  }
  builder.Finish();
  return schedule;
}

}  // namespace

Schedule PlanScheduleByFragments(const RegionLayout& layout, const ScheduleOptions& options) {
  return Plan(layout, options, /*shortcuts=*/false);
}

Schedule PlanSchedule(const RegionLayout& layout, const ScheduleOptions& options) {
  return Plan(layout, options, /*shortcuts=*/true);
}

double ModelCost(const Schedule& schedule, const TransferCosts& costs) {
  double cost = double(schedule.wire_bytes) * costs.wire_byte_ns;
  bool in_stretch = false;
  for (const Run& run : schedule.runs) {
    if (run.packed) {
      cost += costs.copy_call_ns + double(run.length) * costs.copy_byte_ns;
      if (!in_stretch) cost += costs.piece_ns;
    } else {
      cost += costs.piece_ns;
    }
    in_stretch = run.packed;
  }
  return cost;
}

Schedule PlanSchedule(const RegionLayout& layout, const TransferCosts& costs) {
  const ScheduleOptions greedy = ScheduleOptions::FromCosts(costs);
  ScheduleOptions bridged = greedy;
  bridged.max_bridge_packed = std::max(greedy.max_bridge_packed, greedy.max_bridge);
  ScheduleOptions in_place = greedy;
  in_place.min_in_place = 0;
  Schedule best = PlanSchedule(layout, greedy);
  // The other sets decide differently only where a box still short of min_in_place meets a
  // gap the greedy rule did not bridge, which leaves a packed box behind; without one they
  // would plan the same schedule.
  if (best.packed_bytes == 0) return best;
  double best_cost = ModelCost(best, costs);
  for (const ScheduleOptions& options : {bridged, in_place}) {
    Schedule candidate = PlanSchedule(layout, options);
    const double cost = ModelCost(candidate, costs);
    if (cost < best_cost) {
      best = std::move(candidate);
      best_cost = cost;
    }
  }
  return best;
}

Status CheckSchedule(const RegionLayout& layout, const Schedule& schedule, uint64_t source_length) {
  if (schedule.fragments != layout.fragment_count() ||
      schedule.payload_bytes != layout.payload_bytes() ||
      (schedule.fragments > 0 && schedule.layout_fingerprint != layout.Fingerprint())) {
    return Status::InvalidArgument("the schedule was not planned for this layout");
  }
  if (source_length < layout.extent()) {
    return Status::InvalidArgument("the source buffer is shorter than the region's extent");
  }
  uint64_t wire = 0;
  for (const Run& run : schedule.runs) {
    if (run.wire != wire || run.source > source_length || run.length > source_length - run.source) {
      return Status::InvalidArgument("a run of the schedule lies outside the source buffer");
    }
    if (run.packed && run.length > schedule.max_packed_run) {
      return Status::InvalidArgument("a packed run is longer than the schedule's largest");
    }
    wire += run.length;
  }
  if (wire != schedule.wire_bytes) {
    return Status::InvalidArgument("the schedule's runs do not add up to its wire image");
  }
  if (schedule.max_packed_run > kMaxBoxBytes) {
    return Status::InvalidArgument("packed runs longer than a gather entry may be");
  }
  return Status::OK();
}

Status Unpack(const RegionLayout& layout, const ScheduleOptions& options, std::string_view wire,
              std::string* payload) {
  payload->resize(layout.payload_bytes());
  char* out = payload->data();
  LandingCursor cursor(layout, options);
  Fragment landed;
  while (cursor.Next(&landed)) {
    if (landed.offset > wire.size() || landed.length > wire.size() - landed.offset) {
      payload->clear();
      return Status::InvalidArgument("wire image shorter than the region's schedule");
    }
    CopyFragment(out, wire.data() + landed.offset, landed.length);
    out += landed.length;
  }
  return Status::OK();
}

uint64_t WireBytes(const RegionLayout& layout, const ScheduleOptions& options) {
  BoxWalker walker(options);
  FragmentCursor cursor(layout);
  Fragment fragment;
  uint64_t wire = 0;
  while (cursor.Next(&fragment)) walker.Place(fragment, &wire);
  return walker.wire_end();
}

}  // namespace slipstream::rdma
