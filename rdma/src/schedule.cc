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
// "Regions"); the strided gathers' two, added later, as the middle of three runs. verbs:
// D-RDMA's finding that DMAs below 256 bytes waste the PCIe link, and a gather entry costing
// about as much as 64 bytes of wire time; no strided gather.
TransferCosts TransferCosts::Measured(std::string_view backend) {
  if (backend == "shm") return TransferCosts{9.681, 0.0302, 3.185, 0.03029, 0.222, 0.0025};
  if (backend == "tcp") return TransferCosts{125.4, 0.2229, 3.181, 0.03252, 0.42, 0.06};
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
  // Makes the runs from `first` on a period that recurs `repeat` times in all, `stride` bytes
  // apart in the source; nothing may be placed after it.
  void SetPeriod(size_t first, uint64_t repeat, uint64_t stride) {
    Schedule& s = *schedule_;
    s.period_first = first;
    s.period_repeat = repeat;
    s.period_stride = stride;
    s.period_wire_bytes = s.runs.back().wire + s.runs.back().length - s.runs[first].wire;
  }
  // Fills in the packed flags and the totals.
  void Finish() {
    Schedule& s = *schedule_;
    for (size_t i = 0; i < s.runs.size(); i++) {
      Run& run = s.runs[i];
      run.packed = run.length < s.options.min_in_place && run.length <= kMaxBoxBytes;
      if (run.packed) {
        s.packed_bytes +=
            run.length * (s.has_period() && i >= s.period_first ? s.period_repeat : 1);
        s.max_packed_run = std::max(s.max_packed_run, run.length);
      }
    }
    s.wire_bytes = 0;
    if (!s.runs.empty()) {
      s.wire_bytes =
          s.runs.back().wire + s.runs.back().length + (s.period_repeat - 1) * s.period_wire_bytes;
    }
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
//    on the row's pattern once the row started afresh. The last row's boxes become a period
//    that recurs for the rest.
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
      builder.SetPeriod(first_run, rows - row + 1, layout.stride());
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

std::vector<Run> Schedule::Boxes() const {
  std::vector<Run> boxes;
  boxes.reserve(box_count());
  for (uint64_t i = 0; i < box_count(); i++) boxes.push_back(box(i));
  return boxes;
}

bool Schedule::period_packed() const {
  if (!has_period()) return false;
  for (size_t i = period_first; i < runs.size(); i++) {
    if (!runs[i].packed) return false;
  }
  return true;
}

namespace {

// What runs [first, last) cost sent one by one, after a packed run when `in_stretch`; leaves
// *in_stretch as the last run leaves it.
double RunsCost(const std::vector<Run>& runs, size_t first, size_t last, const TransferCosts& costs,
                bool* in_stretch) {
  double cost = 0;
  for (size_t i = first; i < last; i++) {
    const Run& run = runs[i];
    if (run.packed) {
      cost += costs.copy_call_ns + double(run.length) * costs.copy_byte_ns;
      if (!*in_stretch) cost += costs.piece_ns;
    } else {
      cost += costs.piece_ns;
    }
    *in_stretch = run.packed;
  }
  return cost;
}

}  // namespace

double ModelCost(const Schedule& schedule, const TransferCosts& costs) {
  double cost = double(schedule.wire_bytes) * costs.wire_byte_ns;
  bool in_stretch = false;
  const size_t single = schedule.has_period() ? schedule.period_first : schedule.runs.size();
  cost += RunsCost(schedule.runs, 0, single, costs, &in_stretch);
  if (!schedule.has_period()) return cost;
  const double copies = double(schedule.period_repeat);
  if (costs.period_piece_ns > 0 && schedule.period_packed()) {
    return cost + costs.piece_ns * double(schedule.period_runs()) +
           copies * (double(schedule.period_runs()) * costs.period_piece_ns +
                     double(schedule.period_wire_bytes) * costs.period_byte_ns);
  }
  cost += RunsCost(schedule.runs, single, schedule.runs.size(), costs, &in_stretch);
  const double later_copy =
      RunsCost(schedule.runs, single, schedule.runs.size(), costs, &in_stretch);
  return cost + (copies - 1) * later_copy;
}

Schedule PlanSchedule(const RegionLayout& layout, const TransferCosts& costs) {
  const ScheduleOptions greedy = ScheduleOptions::FromCosts(costs);
  ScheduleOptions bridged = greedy;
  bridged.max_bridge_packed = std::max(greedy.max_bridge_packed, greedy.max_bridge);
  ScheduleOptions in_place = greedy;
  in_place.min_in_place = 0;
  // Where the transport has strided gathers, a gap inside a period costs its bytes against
  // one more entry per period, far cheaper than a copy: bridge fewer.
  ScheduleOptions gathered = greedy;
  gathered.max_bridge_packed =
      Threshold(costs.period_piece_ns, costs.wire_byte_ns + costs.period_byte_ns);
  Schedule best = PlanSchedule(layout, greedy);
  // The other sets decide differently only where a box still short of min_in_place meets a
  // gap the greedy rule did not bridge, which leaves a packed box behind; without one they
  // would plan the same schedule.
  if (best.packed_bytes == 0) return best;
  double best_cost = ModelCost(best, costs);
  std::vector<ScheduleOptions> candidates = {bridged, in_place};
  if (costs.period_piece_ns > 0 && layout.kind() == RegionKind::kStrided &&
      gathered.max_bridge_packed != greedy.max_bridge_packed) {
    candidates.push_back(gathered);
  }
  for (const ScheduleOptions& options : candidates) {
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
  uint64_t period_wire = 0;
  for (size_t i = 0; i < schedule.runs.size(); i++) {
    const Run& run = schedule.runs[i];
    if (run.wire != wire || run.source > source_length || run.length > source_length - run.source) {
      return Status::InvalidArgument("a run of the schedule lies outside the source buffer");
    }
    if (run.packed && run.length > schedule.max_packed_run) {
      return Status::InvalidArgument("a packed run is longer than the schedule's largest");
    }
    wire += run.length;
    if (i >= schedule.period_first) period_wire += run.length;
  }
  if (schedule.period_repeat == 0) return Status::InvalidArgument("a period that never occurs");
  if (schedule.has_period()) {
    // Copies lie further on in the source the later they come: the last one bounds the rest.
    const uint64_t later = schedule.period_repeat - 1;
    if (schedule.period_first >= schedule.runs.size() ||
        period_wire != schedule.period_wire_bytes ||
        (schedule.period_stride > 0 && later > source_length / schedule.period_stride) ||
        (period_wire > 0 && later > (UINT64_MAX - wire) / period_wire)) {
      return Status::InvalidArgument("the schedule's period does not fit its runs");
    }
    const uint64_t reach = later * schedule.period_stride;
    for (size_t i = schedule.period_first; i < schedule.runs.size(); i++) {
      const Run& run = schedule.runs[i];
      if (run.source + run.length > source_length - reach) {
        return Status::InvalidArgument("a run of the schedule lies outside the source buffer");
      }
    }
    wire += later * period_wire;
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
