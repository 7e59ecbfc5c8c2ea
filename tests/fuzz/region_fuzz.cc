// Fuzzes the region layouts (region.h) a peer sends with every batch, and the receiver side
// they drive (schedule.h). The input is an encoded layout, then optionally the sender planner's
// three thresholds (3 x u32, little-endian) as a batch carries them. An accepted layout must be
// exactly the bytes its encoding gives, walk to the fragments, payload and extent it reports,
// plan to the same schedule with and without the planner's shortcuts, and land and unpack from
// a wire image of exactly the length the schedule gives (ASan sees every byte read).
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_input.h"
#include "slipstream/rdma/region.h"
#include "slipstream/rdma/schedule.h"

namespace {

using namespace slipstream::rdma;
using slipstream::fuzz::FuzzFailure;
using slipstream::fuzz::FuzzInput;

// Bounds as a receiver would set them, small enough that one input stays fast.
constexpr uint64_t kMaxPayload = uint64_t{1} << 16;
constexpr uint64_t kMaxFragments = uint64_t{1} << 12;
// Wire images longer than this are planned and checked, but not built and unpacked.
constexpr uint64_t kMaxWireBuilt = uint64_t{1} << 20;

// Stops the run with a message: a property of the layout code does not hold.
[[noreturn]] void Fail(const char* what) {
  FuzzFailure("region", what);
}

// The byte at `offset` of the imaginary source buffer: any position's byte is known without the
// buffer, which may be far larger than memory (the extent is up to 2^64).
uint8_t SourceByte(uint64_t offset) {
  return uint8_t((offset * 0x9E3779B97F4A7C15ull) >> 56);
}

// Two schedules are the same when every run and every total is.
bool SameSchedule(const Schedule& a, const Schedule& b) {
  if (a.box_count() != b.box_count() || a.fragments != b.fragments ||
      a.payload_bytes != b.payload_bytes || a.wire_bytes != b.wire_bytes ||
      a.bridged_bytes != b.bridged_bytes || a.packed_bytes != b.packed_bytes ||
      a.max_packed_run != b.max_packed_run || a.layout_fingerprint != b.layout_fingerprint) {
    return false;
  }
  for (uint64_t i = 0; i < a.box_count(); i++) {
    const Run x = a.box(i);
    const Run y = b.box(i);
    if (x.source != y.source || x.length != y.length || x.wire != y.wire || x.packed != y.packed) {
      return false;
    }
  }
  return true;
}

// The fragments in payload order, checked against what the layout says of itself.
std::vector<Fragment> WalkFragments(const RegionLayout& layout) {
  std::vector<Fragment> fragments;
  FragmentCursor cursor(layout);
  Fragment f;
  uint64_t payload = 0;
  while (cursor.Next(&f)) {
    if (fragments.size() == layout.fragment_count()) Fail("more fragments than fragment_count");
    uint64_t end = 0;
    if (f.length == 0) Fail("an empty fragment");
    if (__builtin_add_overflow(f.offset, f.length, &end) || end > layout.extent()) {
      Fail("a fragment beyond the layout's extent");
    }
    payload += f.length;
    fragments.push_back(f);
  }
  if (fragments.size() != layout.fragment_count()) Fail("fewer fragments than fragment_count");
  if (payload != layout.payload_bytes()) Fail("fragments do not add up to payload_bytes");
  return fragments;
}

// The receiver's view: every fragment lands inside the wire image, in order and without
// overlap, with the length the sender's cursor gives it.
void CheckLanding(const RegionLayout& layout, const ScheduleOptions& options,
                  const std::vector<Fragment>& fragments, uint64_t wire_bytes) {
  LandingCursor landing(layout, options);
  Fragment landed;
  uint64_t previous_end = 0;
  size_t i = 0;
  while (landing.Next(&landed)) {
    if (i == fragments.size()) Fail("LandingCursor yields more fragments than FragmentCursor");
    if (landed.length != fragments[i].length) Fail("a landed fragment changed length");
    if (landed.offset < previous_end) Fail("landed fragments overlap or go backwards");
    if (landed.offset > wire_bytes || landed.length > wire_bytes - landed.offset) {
      Fail("a fragment lands beyond the wire image");
    }
    previous_end = landed.offset + landed.length;
    i++;
  }
  if (i != fragments.size()) Fail("LandingCursor yields fewer fragments than FragmentCursor");
}

// Builds the wire image the sender's schedule writes (from the imaginary source), unpacks it as
// the receiver does, and compares with the fragments' bytes; one byte short must be refused.
void CheckUnpack(const RegionLayout& layout, const Schedule& schedule,
                 const std::vector<Fragment>& fragments) {
  const uint64_t n = schedule.wire_bytes;
  // Exactly n bytes on the heap, so that ASan reports any read past the image.
  std::unique_ptr<char[]> wire(new char[n == 0 ? 1 : n]);
  for (uint64_t b = 0; b < schedule.box_count(); b++) {
    const Run run = schedule.box(b);
    for (uint64_t i = 0; i < run.length; i++) wire[run.wire + i] = char(SourceByte(run.source + i));
  }
  std::string payload;
  Status s = Unpack(layout, schedule.options, std::string_view(wire.get(), n), &payload);
  if (!s.ok()) Fail("Unpack refused the wire image its own schedule writes");
  if (payload.size() != layout.payload_bytes()) Fail("Unpack's payload has the wrong length");
  size_t at = 0;
  for (const Fragment& f : fragments) {
    for (uint64_t i = 0; i < f.length; i++) {
      if (uint8_t(payload[at++]) != SourceByte(f.offset + i)) Fail("Unpack put a wrong byte");
    }
  }
  if (n == 0) return;
  std::unique_ptr<char[]> shorter(new char[n - 1 == 0 ? 1 : n - 1]);
  std::memcpy(shorter.get(), wire.get(), n - 1);
  if (Unpack(layout, schedule.options, std::string_view(shorter.get(), n - 1), &payload).ok()) {
    Fail("Unpack accepted a wire image one byte short");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view in = input;
  RegionLayout layout;
  if (!RegionLayout::DecodeFrom(&in, kMaxPayload, kMaxFragments, &layout).ok()) return 0;
  const std::string_view consumed = input.substr(0, input.size() - in.size());

  // The encoding is canonical: what was accepted is exactly what EncodeTo writes.
  std::string encoded;
  layout.EncodeTo(&encoded);
  if (encoded != consumed) Fail("DecodeFrom accepted bytes that are not the layout's encoding");
  std::string_view again = encoded;
  RegionLayout copy;
  if (!RegionLayout::DecodeFrom(&again, kMaxPayload, kMaxFragments, &copy).ok() || !again.empty() ||
      copy.Fingerprint() != layout.Fingerprint()) {
    Fail("a layout's own encoding does not decode to it");
  }
  if (layout.payload_bytes() > kMaxPayload || layout.fragment_count() > kMaxFragments) {
    Fail("DecodeFrom accepted a layout over its limits");
  }

  const std::vector<Fragment> fragments = WalkFragments(layout);

  // The thresholds the batch carries, or the planner's own for shm.
  ScheduleOptions options = ScheduleOptions::FromCosts(TransferCosts::Measured("shm"));
  FuzzInput thresholds(in);
  uint64_t bridge = 0, bridge_packed = 0, in_place = 0;
  if (thresholds.TakeWhole(4, &bridge) && thresholds.TakeWhole(4, &bridge_packed) &&
      thresholds.TakeWhole(4, &in_place)) {
    options = ScheduleOptions{uint32_t(bridge), uint32_t(bridge_packed), uint32_t(in_place)};
  }

  const Schedule schedule = PlanSchedule(layout, options);
  if (!SameSchedule(schedule, PlanScheduleByFragments(layout, options))) {
    Fail("the planner's shortcuts plan another schedule than the box rule");
  }
  if (!CheckSchedule(layout, schedule, layout.extent()).ok()) {
    Fail("a planned schedule fails CheckSchedule");
  }
  if (WireBytes(layout, options) != schedule.wire_bytes) {
    Fail("WireBytes disagrees with the schedule");
  }
  if (schedule.payload_bytes + schedule.bridged_bytes != schedule.wire_bytes) {
    Fail("the schedule's payload and bridged bytes do not add up to its wire image");
  }
  CheckLanding(layout, options, fragments, schedule.wire_bytes);
  if (schedule.wire_bytes <= kMaxWireBuilt) CheckUnpack(layout, schedule, fragments);
  return 0;
}
