// Gap analysis and the transfer optimizer: how a region's fragments travel.
//
// The optimizer walks a layout's fragments in payload order and groups them into boxes
// (D-RDMA's bounding boxes). The wire image is the boxes one after another. A box shorter than
// `min_in_place` is packed (copied into a staging buffer, where consecutive packed boxes form
// one gather entry); a longer one is sent in place (a gather entry pointing into the source:
// zero copy). A fragment joins the open box when it starts at or after the box's end and the
// gap is small enough that moving the gap's bytes costs less than what a new box would:
// `max_bridge_packed` bytes while the grown box would still be packed (the alternative is one
// more copy), `max_bridge` bytes otherwise (the alternative is one more gather entry).
//
// Packing changes how bytes reach the wire, never the wire image itself, so the receiver
// finds every fragment from the layout and the options alone (LandingCursor): it can read
// the fragments where they landed (zero copy) or Unpack them.
//
// The thresholds come from TransferCosts, per-transport constants that
// `bench/region_bench --calibrate-only` measures (docs/benchmarks.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "slipstream/rdma/region.h"
#include "slipstream/rdma/status.h"

namespace slipstream::rdma {

// What a transfer costs on one transport, in nanoseconds.
struct TransferCosts {
  double piece_ns = 0;      // one more gather entry (Sge) in a request
  double wire_byte_ns = 0;  // one more byte moved by the transport
  double copy_call_ns = 0;  // one more packing copy
  double copy_byte_ns = 0;  // one more byte packed
  // A strided gather (WorkRequest::repeat): per entry and period, and per byte on top of
  // wire_byte_ns. 0 and 0 where the transport has none (Connection::max_repeat() is 1).
  double period_piece_ns = 0;
  double period_byte_ns = 0;

  // The constants measured on this machine type for "shm", "tcp" or "verbs" (docs/benchmarks.md,
  // "Regions"); verbs has no measurement here and uses D-RDMA's published figures.
  static TransferCosts Measured(std::string_view backend);
};

struct ScheduleOptions {
  uint32_t max_bridge = 0;         // gaps up to this many bytes travel inside an in-place box
  uint32_t max_bridge_packed = 0;  // ... inside a box that stays packed
  uint32_t min_in_place = 0;       // boxes shorter than this are packed
  // The thresholds that minimise `costs`: bridge a gap while its bytes cost less than a piece
  // (or, in a packed box, than a copy), pack a box while copying it costs less than a piece.
  static ScheduleOptions FromCosts(const TransferCosts& costs);
};

// The longest box: a gather entry's length is 32 bits.
constexpr uint64_t kMaxBoxBytes = uint64_t{1} << 30;

// A box: `length` bytes from `source` of the source buffer, at `wire` in the wire image.
struct Run {
  uint64_t source = 0;
  uint64_t length = 0;
  uint64_t wire = 0;
  bool packed = false;
};

// The boxes of a region in wire order. A strided layout whose rows all cut into the same boxes
// keeps them once, as a period: runs [period_first, runs.size()) are its first copy, and it
// recurs period_repeat times in all, copy k lying k * period_stride further on in the source
// and k * period_wire_bytes further on in the wire image. Planning and sending then cost a
// period, not a row, and a transport with strided gathers sends it as one work request.
struct Schedule {
  ScheduleOptions options;
  std::vector<Run> runs;
  uint64_t period_repeat = 1;  // 1: no period
  size_t period_first = 0;
  uint64_t period_stride = 0;
  uint64_t period_wire_bytes = 0;  // the period's runs' lengths, added up
  uint64_t fragments = 0;
  uint64_t payload_bytes = 0;  // the fragments' bytes
  uint64_t wire_bytes = 0;     // payload plus bridged gaps
  uint64_t bridged_bytes = 0;
  uint64_t packed_bytes = 0;        // bytes of packed boxes (copied into staging, or gathered)
  uint64_t max_packed_run = 0;      // staging must hold at least this much
  uint64_t layout_fingerprint = 0;  // RegionLayout::Fingerprint of the layout planned

  bool has_period() const { return period_repeat > 1; }
  // How many runs the period holds (0 without one).
  size_t period_runs() const { return has_period() ? runs.size() - period_first : 0; }
  // The boxes, a period's copies included.
  uint64_t box_count() const { return runs.size() + (period_repeat - 1) * period_runs(); }
  // Box `i` (< box_count()).
  Run box(uint64_t i) const {
    if (i < runs.size()) return runs[i];
    const uint64_t relative = i - period_first;
    const uint64_t copy = relative / period_runs();
    Run run = runs[period_first + relative % period_runs()];
    run.source += copy * period_stride;
    run.wire += copy * period_wire_bytes;
    return run;
  }
  // Every box, the period written out (for tests and small schedules).
  std::vector<Run> Boxes() const;
  // Whether the period's boxes are all packed: then a transport with strided gathers sends the
  // period with one work request, straight from the source.
  bool period_packed() const;
};

// Plans the transfer of `layout` under `options`. Strided and bitmapped layouts skip over
// fragments that provably join the open box (whole columns, whole rows), so planning costs
// about a box, not a fragment, where gaps are bridged.
Schedule PlanSchedule(const RegionLayout& layout, const ScheduleOptions& options);
// Plans `layout` for a transport with `costs`: the greedy box rule sees one gap at a time, so
// a box that would pay for itself only once it is large (bridging a whole table of short rows
// and sending it in place) is never started by it. This tries the thresholds FromCosts gives,
// the same with gaps bridged as in-place boxes even while small, and everything in place, and
// returns the schedule ModelCost ranks cheapest; its `options` go to the receiver.
Schedule PlanSchedule(const RegionLayout& layout, const TransferCosts& costs);
// What a schedule costs under `costs`, in nanoseconds: a gather entry per in-place box and per
// stretch of packed boxes, a copy per packed box, and every byte on the wire; a packed period,
// where the transport has strided gathers, costs one entry and the gather's per-entry and
// per-byte costs instead of its copies.
double ModelCost(const Schedule& schedule, const TransferCosts& costs);
// The same schedule, planned fragment by fragment: the rule's definition, for tests.
Schedule PlanScheduleByFragments(const RegionLayout& layout, const ScheduleOptions& options);

// The box rule, fragment by fragment: PlanSchedule (sender) and LandingCursor (receiver) both
// place fragments through it, so they agree on every fragment's wire offset.
class BoxWalker {
 public:
  explicit BoxWalker(const ScheduleOptions& options) : options_(options) {}

  // Puts `fragment` into the open box or a new one; returns true when it opened a box.
  // *wire is where the fragment's first byte lands in the wire image.
  bool Place(const Fragment& fragment, uint64_t* wire) {
    if (open_) {
      if (fragment.offset >= end_) {
        const uint64_t gap = fragment.offset - end_;
        const uint64_t grown = fragment.offset + fragment.length - source_;
        const uint64_t limit =
            grown < options_.min_in_place ? options_.max_bridge_packed : options_.max_bridge;
        if (grown <= kMaxBoxBytes && gap <= limit) {
          end_ = fragment.offset + fragment.length;
          *wire = wire_ + (fragment.offset - source_);
          return false;
        }
      }
      wire_ += end_ - source_;
    }
    open_ = true;
    source_ = fragment.offset;
    end_ = fragment.offset + fragment.length;
    *wire = wire_;
    return true;
  }

  // Grows the open box to end at `end` without looking at the fragments in between: for
  // callers that proved Place would have taken each of them.
  void ExtendTo(uint64_t end) { end_ = end; }
  // Whether growing the open box is judged by max_bridge alone (it is at least min_in_place).
  bool InPlaceRegime() const { return open_ && end_ - source_ >= options_.min_in_place; }
  const ScheduleOptions& options() const { return options_; }

  uint64_t box_source() const { return source_; }
  uint64_t box_length() const { return end_ - source_; }
  // The wire image's length so far (the open box included).
  uint64_t wire_end() const { return open_ ? wire_ + (end_ - source_) : 0; }

 private:
  ScheduleOptions options_;
  bool open_ = false;
  uint64_t source_ = 0;  // the open box's first source byte
  uint64_t end_ = 0;     // one past its last source byte
  uint64_t wire_ = 0;    // where it starts in the wire image
};

// Checks that `schedule` fits `layout` and a source buffer of `source_length` bytes: it was
// planned for this layout (by its fingerprint), its runs (every copy of a period) lie inside
// the source and add up to its wire image, and no packed run is longer than the schedule's
// largest or than a box.
Status CheckSchedule(const RegionLayout& layout, const Schedule& schedule, uint64_t source_length);

// Walks where each fragment of a layout lands in the wire image of its schedule (the
// receiver's view): the same fragments as FragmentCursor, with `offset` in the wire image.
class LandingCursor {
 public:
  LandingCursor(const RegionLayout& layout, const ScheduleOptions& options)
      : fragments_(layout), walker_(options) {}
  bool Next(Fragment* landed) {
    Fragment fragment;
    if (!fragments_.Next(&fragment)) return false;
    walker_.Place(fragment, &landed->offset);
    landed->length = fragment.length;
    return true;
  }

 private:
  FragmentCursor fragments_;
  BoxWalker walker_;
};

// Copies the payload of `layout` out of a received wire image into *payload. Fails when the
// wire image is shorter than the schedule's.
Status Unpack(const RegionLayout& layout, const ScheduleOptions& options, std::string_view wire,
              std::string* payload);

// The wire image's length for `layout` under `options`.
uint64_t WireBytes(const RegionLayout& layout, const ScheduleOptions& options);

}  // namespace slipstream::rdma
