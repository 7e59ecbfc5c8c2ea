// Gap analysis and the transfer optimizer: the box rule shared by sender and receiver.
#include "slipstream/rdma/schedule.h"

#include <algorithm>
#include <cmath>

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
  if (backend == "shm") return TransferCosts{20.0, 0.08, 2.5, 0.06};
  if (backend == "tcp") return TransferCosts{30.0, 0.25, 2.5, 0.06};
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

Schedule PlanSchedule(const RegionLayout& layout, const ScheduleOptions& options) {
  Schedule schedule;
  schedule.options = options;
  schedule.fragments = layout.fragment_count();
  schedule.payload_bytes = layout.payload_bytes();
  BoxWalker walker(options);
  FragmentCursor cursor(layout);
  Fragment fragment;
  uint64_t wire = 0;
  while (cursor.Next(&fragment)) {
    if (walker.Place(fragment, &wire)) {
      schedule.runs.push_back(Run{walker.box_source(), 0, wire, false});
    }
    schedule.runs.back().length = walker.box_length();
  }
  for (Run& run : schedule.runs) {
    run.packed = run.length < options.min_in_place;
    if (run.packed) {
      schedule.packed_bytes += run.length;
      schedule.max_packed_run = std::max(schedule.max_packed_run, run.length);
    }
  }
  schedule.wire_bytes = walker.wire_end();
  schedule.bridged_bytes = schedule.wire_bytes - schedule.payload_bytes;
  return schedule;
}

Status CheckSchedule(const RegionLayout& layout, const Schedule& schedule, uint64_t source_length) {
  if (schedule.fragments != layout.fragment_count() ||
      schedule.payload_bytes != layout.payload_bytes()) {
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
  payload->clear();
  payload->reserve(layout.payload_bytes());
  LandingCursor cursor(layout, options);
  Fragment landed;
  while (cursor.Next(&landed)) {
    if (landed.offset > wire.size() || landed.length > wire.size() - landed.offset) {
      return Status::InvalidArgument("wire image shorter than the region's schedule");
    }
    payload->append(wire.data() + landed.offset, landed.length);
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
