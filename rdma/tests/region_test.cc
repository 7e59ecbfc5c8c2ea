// Declarative non-contiguous regions (region.h, schedule.h, transfer.h): the builders' checks,
// Encode/Decode, the transfer optimizer and the receiver's view against an independent
// reference on random layouts, and real region transfers (one target, scatters to up to 8,
// bad input, staging reuse, more pieces than max_sge) on the shm and tcp backends.
#include "slipstream/rdma/region.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "slipstream/rdma/schedule.h"
#include "slipstream/rdma/transfer.h"
#include "slipstream/rdma/transport.h"
#include "test_util.h"

namespace slipstream::rdma {
namespace {

using namespace test;  // NOLINT: the shared helpers (test_util.h)

constexpr char kSecret[] = "region-test-secret";
// The seed of every random test; a failure names the case, which reseeds from this.
constexpr uint64_t kSeed = 0x5eed2024d8da0001ull;
constexpr uint64_t kMax64 = UINT64_MAX;

#define ASSERT_OK(expr)                                                                 \
  do {                                                                                  \
    Status assert_ok_status = (expr);                                                   \
    ASSERT_TRUE(assert_ok_status.ok()) << #expr << ": " << assert_ok_status.ToString(); \
  } while (0)

// The seed of random case `index`.
uint64_t CaseSeed(uint64_t salt, uint64_t index) {
  uint64_t x = kSeed ^ (salt * 0x9e3779b97f4a7c15ull) ^ (index * 0xbf58476d1ce4e5b9ull);
  x ^= x >> 31;
  return x;
}

// A few random draws over std::mt19937_64.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  // Uniform in [lo, hi].
  uint64_t Uniform(uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(engine_);
  }
  // True with probability p.
  bool Chance(double p) { return std::bernoulli_distribution(p)(engine_); }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};

// ScheduleOptions with every threshold named.
ScheduleOptions Options(uint32_t max_bridge, uint32_t max_bridge_packed, uint32_t min_in_place) {
  ScheduleOptions options;
  options.max_bridge = max_bridge;
  options.max_bridge_packed = max_bridge_packed;
  options.min_in_place = min_in_place;
  return options;
}

// ---------------------------------------------------------------------------------------------
// The reference: a layout's parameters as the test chose them, and the fragments, payload and
// schedule computed from them by plain loops (never through FragmentCursor or PlanSchedule).

struct Spec {
  RegionKind kind = RegionKind::kPointerMapped;
  uint64_t base = 0;    // strided
  uint64_t stride = 0;  // strided
  uint64_t rows = 0;    // strided and bitmapped (pointer-mapped: items.size())
  std::vector<Field> fields;
  std::vector<Column> columns;
  std::vector<Fragment> items;
  bool masked = false;
  std::vector<bool> mask;  // one per row (item) when masked: the rows every layer selects
  // When not empty, Build applies these masks one after another (WithMask on a masked layout
  // selects the rows both select); `mask` is then their intersection.
  std::vector<std::vector<bool>> layers;
};

// Rows of a strided or bitmapped spec, items of a pointer-mapped one.
uint64_t SpecRows(const Spec& spec) {
  return spec.kind == RegionKind::kPointerMapped ? spec.items.size() : spec.rows;
}

// Whether row (item) `row` of `spec` is selected.
bool Selected(const Spec& spec, uint64_t row) {
  return !spec.masked || spec.mask[row];
}

// The fragments of `spec` in payload order.
std::vector<Fragment> ReferenceFragments(const Spec& spec) {
  std::vector<Fragment> out;
  switch (spec.kind) {
    case RegionKind::kStrided:
      if (spec.fields.empty()) break;
      for (uint64_t row = 0; row < spec.rows; row++) {
        if (!Selected(spec, row)) continue;
        for (const Field& field : spec.fields) {
          out.push_back({spec.base + row * spec.stride + field.offset, field.length});
        }
      }
      break;
    case RegionKind::kBitmapped:
      for (const Column& column : spec.columns) {
        for (uint64_t row = 0; row < spec.rows; row++) {
          if (Selected(spec, row)) out.push_back({column.base + row * column.width, column.width});
        }
      }
      break;
    case RegionKind::kPointerMapped:
      for (uint64_t i = 0; i < spec.items.size(); i++) {
        if (Selected(spec, i)) out.push_back(spec.items[i]);
      }
      break;
  }
  return out;
}

// The payload: the fragments' bytes of `source`, one after another.
std::string ReferencePayload(const std::vector<Fragment>& fragments, std::string_view source) {
  std::string out;
  for (const Fragment& f : fragments) {
    for (uint64_t i = 0; i < f.length; i++) out.push_back(source[f.offset + i]);
  }
  return out;
}

// The schedule's boxes as schedule.h defines them, with their totals.
struct ReferencePlan {
  std::vector<Run> runs;
  uint64_t payload = 0;
  uint64_t bridged = 0;
  uint64_t wire = 0;
  uint64_t packed = 0;
  uint64_t max_packed_run = 0;
};

// Groups `fragments` into boxes: one joins the open box when it starts at or after the box's
// end, the box stays within kMaxBoxBytes, and the gap is at most max_bridge_packed when the
// grown box would still be packed (shorter than min_in_place), max_bridge otherwise.
ReferencePlan PlanByHand(const std::vector<Fragment>& fragments, const ScheduleOptions& options) {
  ReferencePlan plan;
  for (const Fragment& f : fragments) {
    plan.payload += f.length;
    if (!plan.runs.empty()) {
      Run& box = plan.runs.back();
      uint64_t box_end = box.source + box.length;
      uint64_t grown = f.offset + f.length - box.source;
      uint64_t limit =
          grown < options.min_in_place ? options.max_bridge_packed : options.max_bridge;
      if (f.offset >= box_end && f.offset - box_end <= limit && grown <= kMaxBoxBytes) {
        plan.bridged += f.offset - box_end;
        box.length = f.offset + f.length - box.source;
        continue;
      }
    }
    Run run;
    run.source = f.offset;
    run.length = f.length;
    run.wire = plan.runs.empty() ? 0 : plan.runs.back().wire + plan.runs.back().length;
    plan.runs.push_back(run);
  }
  for (Run& run : plan.runs) {
    run.packed = run.length < options.min_in_place;
    plan.wire += run.length;
    if (run.packed) {
      plan.packed += run.length;
      plan.max_packed_run = std::max(plan.max_packed_run, run.length);
    }
  }
  return plan;
}

// The wire image of `plan` over `source`: the boxes' bytes one after another.
std::string WireImage(const ReferencePlan& plan, std::string_view source) {
  std::string out;
  for (const Run& run : plan.runs) out.append(source.substr(run.source, run.length));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Building layouts from specs, reading specs back, and describing both for failure messages.

// A RowMask with the bits of `bits`.
RowMask ToRowMask(const std::vector<bool>& bits) {
  RowMask mask(bits.size());
  for (uint64_t i = 0; i < bits.size(); i++) {
    if (bits[i]) mask.Set(i);
  }
  return mask;
}

// Builds `spec` through the public builders (and WithMask when masked).
Status Build(const Spec& spec, RegionLayout* out) {
  RegionLayout plain;
  Status s;
  switch (spec.kind) {
    case RegionKind::kStrided:
      s = RegionLayout::Strided(spec.base, spec.stride, spec.rows, spec.fields, &plain);
      break;
    case RegionKind::kBitmapped:
      s = RegionLayout::Bitmapped(spec.columns, spec.rows, &plain);
      break;
    case RegionKind::kPointerMapped:
      s = RegionLayout::PointerMapped(spec.items, &plain);
      break;
  }
  if (!s.ok()) return s;
  if (!spec.masked) {
    *out = std::move(plain);
    return s;
  }
  if (spec.layers.empty()) return plain.WithMask(ToRowMask(spec.mask), out);
  for (const std::vector<bool>& layer : spec.layers) {
    s = plain.WithMask(ToRowMask(layer), &plain);
    if (!s.ok()) return s;
  }
  *out = std::move(plain);
  return s;
}

// The parameters a layout reports through its accessors.
Spec SpecOf(const RegionLayout& layout) {
  Spec spec;
  spec.kind = layout.kind();
  spec.rows = layout.rows();
  switch (layout.kind()) {
    case RegionKind::kStrided:
      spec.base = layout.base();
      spec.stride = layout.stride();
      spec.fields = layout.fields();
      break;
    case RegionKind::kBitmapped:
      spec.columns = layout.columns();
      break;
    case RegionKind::kPointerMapped:
      spec.items = layout.items();
      break;
  }
  spec.masked = layout.masked();
  if (spec.masked) {
    spec.mask.resize(layout.mask().rows());
    for (uint64_t i = 0; i < spec.mask.size(); i++) spec.mask[i] = layout.mask().Test(i);
  }
  return spec;
}

// A short description of `spec`, enough to see what kind of case failed.
std::string Describe(const Spec& spec) {
  std::ostringstream out;
  const size_t kShown = 12;
  switch (spec.kind) {
    case RegionKind::kStrided:
      out << "strided base=" << spec.base << " stride=" << spec.stride << " rows=" << spec.rows
          << " fields=";
      for (const Field& f : spec.fields) out << "{" << f.offset << "," << f.length << "}";
      break;
    case RegionKind::kBitmapped:
      out << "bitmapped rows=" << spec.rows << " columns=";
      for (const Column& c : spec.columns) out << "{" << c.base << "," << c.width << "}";
      break;
    case RegionKind::kPointerMapped:
      out << "pointer-mapped items(" << spec.items.size() << ")=";
      for (size_t i = 0; i < spec.items.size() && i < kShown; i++) {
        out << "{" << spec.items[i].offset << "," << spec.items[i].length << "}";
      }
      if (spec.items.size() > kShown) out << "...";
      break;
  }
  if (spec.masked) {
    out << " mask=";
    for (size_t i = 0; i < spec.mask.size() && i < 64; i++) out << (spec.mask[i] ? '1' : '0');
    if (spec.mask.size() > 64) out << "...";
  }
  return out.str();
}

// "max_bridge=.. min_in_place=..".
std::string Describe(const ScheduleOptions& options) {
  return "max_bridge=" + std::to_string(options.max_bridge) +
         " max_bridge_packed=" + std::to_string(options.max_bridge_packed) +
         " min_in_place=" + std::to_string(options.min_in_place);
}

// "{offset,length}".
std::string Describe(const Fragment& f) {
  return "{" + std::to_string(f.offset) + "," + std::to_string(f.length) + "}";
}

// "{source,length,wire,packed}".
std::string Describe(const Run& r) {
  return "{" + std::to_string(r.source) + "," + std::to_string(r.length) + "," +
         std::to_string(r.wire) + "," + (r.packed ? "packed" : "in place") + "}";
}

// All fragments a FragmentCursor yields.
std::vector<Fragment> CursorFragments(const RegionLayout& layout) {
  std::vector<Fragment> out;
  FragmentCursor cursor(layout);
  Fragment f;
  while (cursor.Next(&f)) out.push_back(f);
  return out;
}

// Compares two fragment lists; "" when equal.
std::string CompareFragments(const std::vector<Fragment>& got, const std::vector<Fragment>& want,
                             const char* what) {
  if (got.size() != want.size()) {
    return std::string(what) + ": " + std::to_string(got.size()) + " fragments, want " +
           std::to_string(want.size());
  }
  for (size_t i = 0; i < got.size(); i++) {
    if (got[i].offset != want[i].offset || got[i].length != want[i].length) {
      return std::string(what) + ": fragment " + std::to_string(i) + " is " + Describe(got[i]) +
             ", want " + Describe(want[i]);
    }
  }
  return "";
}

// Checks that `layout` reports exactly the parameters of `spec` and the summary the reference
// computes (selected rows, fragments, payload, extent), and that FragmentCursor yields the
// reference fragments; "" when it does.
std::string CheckLayout(const Spec& spec, const RegionLayout& layout) {
  std::ostringstream err;
  Spec got = SpecOf(layout);
  if (got.kind != spec.kind) return "kind differs";
  if (got.rows != SpecRows(spec)) err << "rows " << got.rows << " want " << SpecRows(spec) << "; ";
  switch (spec.kind) {
    case RegionKind::kStrided:
      if (got.base != spec.base || got.stride != spec.stride) err << "base/stride differ; ";
      if (got.fields.size() != spec.fields.size()) {
        err << "field count differs; ";
      } else {
        for (size_t i = 0; i < spec.fields.size(); i++) {
          if (got.fields[i].offset != spec.fields[i].offset ||
              got.fields[i].length != spec.fields[i].length) {
            err << "field " << i << " differs; ";
          }
        }
      }
      break;
    case RegionKind::kBitmapped:
      if (got.columns.size() != spec.columns.size()) {
        err << "column count differs; ";
      } else {
        for (size_t i = 0; i < spec.columns.size(); i++) {
          if (got.columns[i].base != spec.columns[i].base ||
              got.columns[i].width != spec.columns[i].width) {
            err << "column " << i << " differs; ";
          }
        }
      }
      break;
    case RegionKind::kPointerMapped: {
      std::string items = CompareFragments(got.items, spec.items, "items");
      if (!items.empty()) err << items << "; ";
      break;
    }
  }
  if (got.masked != spec.masked) err << "masked " << got.masked << " want " << spec.masked << "; ";
  if (spec.masked && got.mask != spec.mask) err << "mask bits differ; ";
  if (!err.str().empty()) return err.str();

  std::vector<Fragment> want = ReferenceFragments(spec);
  uint64_t selected = 0, payload = 0, extent = 0;
  for (uint64_t row = 0; row < SpecRows(spec); row++) selected += Selected(spec, row);
  for (const Fragment& f : want) {
    payload += f.length;
    extent = std::max(extent, f.offset + f.length);
  }
  if (layout.selected_rows() != selected) {
    err << "selected_rows " << layout.selected_rows() << " want " << selected << "; ";
  }
  if (layout.payload_bytes() != payload) {
    err << "payload_bytes " << layout.payload_bytes() << " want " << payload << "; ";
  }
  if (layout.fragment_count() != want.size()) {
    err << "fragment_count " << layout.fragment_count() << " want " << want.size() << "; ";
  }
  if (layout.extent() != extent) err << "extent " << layout.extent() << " want " << extent << "; ";
  if (!err.str().empty()) return err.str();
  return CompareFragments(CursorFragments(layout), want, "FragmentCursor");
}

// What CheckPlan found out, for the transfer tests.
struct Expected {
  std::string payload;  // the reference payload
  std::string wire;     // the reference wire image
  Schedule schedule;    // PlanSchedule's
};

// Checks PlanSchedule, WireBytes, LandingCursor and Unpack for `layout` (built from `spec`)
// over `source` against the reference; "" when all agree, else what differed.
std::string CheckPlan(const Spec& spec, const RegionLayout& layout, std::string_view source,
                      const ScheduleOptions& options, Expected* expected) {
  std::ostringstream err;
  std::vector<Fragment> fragments = ReferenceFragments(spec);
  ReferencePlan want = PlanByHand(fragments, options);
  Schedule plan = PlanSchedule(layout, options);
  const std::vector<Run> boxes = plan.Boxes();  // a period written out

  // The totals and every run, exactly.
  if (plan.options.max_bridge != options.max_bridge ||
      plan.options.max_bridge_packed != options.max_bridge_packed ||
      plan.options.min_in_place != options.min_in_place) {
    err << "options not kept; ";
  }
  if (plan.fragments != fragments.size()) {
    err << "fragments " << plan.fragments << " want " << fragments.size() << "; ";
  }
  if (plan.payload_bytes != want.payload) {
    err << "payload_bytes " << plan.payload_bytes << " want " << want.payload << "; ";
  }
  if (plan.wire_bytes != want.wire) {
    err << "wire_bytes " << plan.wire_bytes << " want " << want.wire << "; ";
  }
  if (plan.bridged_bytes != want.bridged) {
    err << "bridged_bytes " << plan.bridged_bytes << " want " << want.bridged << "; ";
  }
  if (plan.packed_bytes != want.packed) {
    err << "packed_bytes " << plan.packed_bytes << " want " << want.packed << "; ";
  }
  if (plan.max_packed_run != want.max_packed_run) {
    err << "max_packed_run " << plan.max_packed_run << " want " << want.max_packed_run << "; ";
  }
  if (boxes.size() != want.runs.size()) {
    err << boxes.size() << " runs, want " << want.runs.size() << "; ";
  } else {
    for (size_t i = 0; i < boxes.size(); i++) {
      const Run& g = boxes[i];
      const Run& w = want.runs[i];
      if (g.source != w.source || g.length != w.length || g.wire != w.wire ||
          g.packed != w.packed) {
        err << "run " << i << " is " << Describe(g) << ", want " << Describe(w) << "; ";
        break;
      }
    }
  }
  // The invariants, stated on PlanSchedule's own output.
  uint64_t wire = 0, packed = 0, max_packed = 0;
  for (size_t i = 0; i < boxes.size(); i++) {
    const Run& r = boxes[i];
    if (r.wire != wire) err << "run " << i << " is not contiguous in the wire image; ";
    if (r.length == 0) err << "run " << i << " is empty; ";
    if (r.source + r.length > layout.extent() || r.source + r.length < r.source) {
      err << "run " << i << " reads outside the extent; ";
    }
    if (r.packed != (r.length < options.min_in_place)) err << "run " << i << " packing wrong; ";
    wire += r.length;
    if (r.packed) {
      packed += r.length;
      max_packed = std::max(max_packed, r.length);
    }
  }
  if (wire != plan.wire_bytes || plan.wire_bytes != plan.payload_bytes + plan.bridged_bytes) {
    err << "wire_bytes disagrees with the runs or with payload + bridged; ";
  }
  if (packed != plan.packed_bytes || max_packed != plan.max_packed_run) {
    err << "packed totals disagree with the runs; ";
  }
  Status checked = CheckSchedule(layout, plan, layout.extent());
  if (!checked.ok())
    err << "CheckSchedule refuses PlanSchedule's own schedule: " << checked.ToString() << "; ";
  uint64_t wire_bytes = WireBytes(layout, options);
  if (wire_bytes != want.wire) err << "WireBytes " << wire_bytes << " want " << want.wire << "; ";
  if (!err.str().empty()) return err.str();

  // The receiver's view: fragment k lands inside exactly the run that carries its bytes.
  std::string image = WireImage(want, source);
  std::string payload = ReferencePayload(fragments, source);
  LandingCursor landing(layout, options);
  Fragment landed;
  size_t k = 0;
  std::string gathered;
  while (landing.Next(&landed)) {
    if (k >= fragments.size()) return "LandingCursor yields more fragments than the layout";
    const Fragment& f = fragments[k];
    if (landed.length != f.length) {
      return "landing " + std::to_string(k) + " has length " + std::to_string(landed.length);
    }
    auto run = std::upper_bound(want.runs.begin(), want.runs.end(), landed.offset,
                                [](uint64_t offset, const Run& r) { return offset < r.wire; });
    if (run == want.runs.begin()) return "landing " + std::to_string(k) + " before the image";
    --run;
    if (landed.offset + landed.length > run->wire + run->length ||
        run->source + (landed.offset - run->wire) != f.offset) {
      return "fragment " + std::to_string(k) + " " + Describe(f) + " landed at " +
             std::to_string(landed.offset) + ", not where its run " + Describe(*run) + " puts it";
    }
    gathered.append(image, landed.offset, landed.length);
    k++;
  }
  if (k != fragments.size()) {
    return "LandingCursor yields " + std::to_string(k) + " fragments, want " +
           std::to_string(fragments.size());
  }
  if (gathered != payload) return "the landed bytes are not the payload";

  std::string unpacked = "garbage";
  Status s = Unpack(layout, options, image, &unpacked);
  if (!s.ok()) return "Unpack: " + s.ToString();
  if (unpacked != payload) return "Unpack's payload differs from the reference";
  if (!image.empty()) {
    std::string_view short_image(image.data(), image.size() - 1);
    if (Unpack(layout, options, short_image, &unpacked).ok()) {
      return "Unpack accepted a wire image one byte short";
    }
  }
  if (expected != nullptr) {
    expected->payload = std::move(payload);
    expected->wire = std::move(image);
    expected->schedule = std::move(plan);
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Random layouts and options.

// A random strided spec with extent at most `limit` (>= 8192).
Spec RandomStrided(Rng& r, uint64_t limit) {
  Spec spec;
  spec.kind = RegionKind::kStrided;
  switch (r.Uniform(0, 3)) {
    case 0:
      spec.stride = r.Uniform(1, 8);
      break;
    case 1:
      spec.stride = r.Uniform(1, 64);
      break;
    case 2:
      spec.stride = r.Uniform(1, 512);
      break;
    default:
      spec.stride = r.Uniform(1024, 4096);
      break;
  }
  uint64_t want = r.Uniform(1, 6), pos = 0;
  while (spec.fields.size() < want && pos < spec.stride) {
    uint64_t room = spec.stride - pos;
    uint64_t gap = r.Chance(0.4) ? 0 : r.Uniform(0, std::min<uint64_t>(room - 1, 300));
    uint64_t length = r.Chance(0.3) ? 1 : r.Uniform(1, std::min<uint64_t>(room - gap, 64));
    spec.fields.push_back({uint32_t(pos + gap), uint32_t(length)});
    pos += gap + length;
  }
  spec.base = r.Chance(0.5) ? 0 : r.Uniform(0, 200);
  uint64_t end = spec.fields.back().offset + spec.fields.back().length;
  uint64_t max_rows = (limit - spec.base - end) / spec.stride + 1;
  uint64_t most = r.Chance(0.5) ? 8 : r.Chance(0.85) ? 120 : 2000;
  spec.rows = r.Uniform(0, std::min<uint64_t>(max_rows, most));
  return spec;
}

// A random bitmapped spec with extent at most `limit`: adjacent, disjoint or overlapping
// columns in any order.
Spec RandomBitmapped(Rng& r, uint64_t limit) {
  Spec spec;
  spec.kind = RegionKind::kBitmapped;
  uint64_t count = r.Uniform(1, 5), widest = 1;
  std::vector<uint32_t> widths;
  for (uint64_t i = 0; i < count; i++) {
    uint64_t width = r.Chance(0.3) ? 1 : r.Chance(0.2) ? r.Uniform(17, 64) : r.Uniform(1, 16);
    widths.push_back(uint32_t(width));
    widest = std::max(widest, width);
  }
  uint64_t most = r.Chance(0.5) ? 16 : r.Chance(0.85) ? 300 : 3000;
  spec.rows = r.Uniform(0, std::min<uint64_t>(limit / widest, most));
  uint64_t next = r.Uniform(0, 64);
  for (uint32_t width : widths) {
    uint64_t bytes = spec.rows * width;
    uint64_t base;
    if (r.Chance(0.4) && next + bytes <= limit) {
      base = next;  // right after the previous column
    } else {
      base = r.Uniform(0, limit - bytes);
    }
    spec.columns.push_back({base, width});
    next = base + bytes;
  }
  return spec;
}

// A random pointer-mapped spec with extent at most `limit`: items adjacent, with small or huge
// gaps, anywhere (overlapping), descending, or repeated.
Spec RandomPointerMapped(Rng& r, uint64_t limit) {
  Spec spec;
  spec.kind = RegionKind::kPointerMapped;
  uint64_t count = r.Uniform(0, r.Chance(0.3) ? 8 : 100);
  uint64_t mode = r.Uniform(0, 5);
  uint64_t pos = r.Uniform(0, 100), high = limit;
  for (uint64_t i = 0; i < count; i++) {
    uint64_t length = r.Chance(0.3) ? 1 : r.Uniform(1, 64);
    if (!spec.items.empty() && r.Chance(0.05)) {
      spec.items.push_back(spec.items.back());  // the same bytes twice
      continue;
    }
    uint64_t how = mode == 5 ? r.Uniform(0, 4) : mode;
    uint64_t offset = 0;
    switch (how) {
      case 0:
        offset = pos;
        break;  // adjacent
      case 1:
        offset = pos + r.Uniform(0, 300);
        break;  // small gaps
      case 2:
        offset = r.Uniform(0, limit - length);
        break;  // anywhere
      case 3:
        offset = high >= length + 100 ? high - length - r.Uniform(0, 100) : 0;
        break;
      default:
        offset = pos + r.Uniform(4000, limit / 4);
        break;  // huge gaps
    }
    if (offset + length > limit) offset = r.Uniform(0, limit - length);
    spec.items.push_back({offset, length});
    pos = offset + length;
    high = offset;
  }
  return spec;
}

// `rows` random mask bits: of a random density, or runs of set and unset bits of random
// lengths (a few, about a word, up to a few words).
std::vector<bool> RandomBits(Rng& r, uint64_t rows) {
  static const double kDensity[] = {0, 0.05, 0.5, 0.95, 1};
  std::vector<bool> bits(rows);
  if (r.Chance(0.6)) {
    double density = kDensity[r.Uniform(0, 4)];
    for (uint64_t i = 0; i < rows; i++) bits[i] = r.Chance(density);
    return bits;
  }
  bool on = r.Chance(0.5);
  for (uint64_t i = 0; i < rows; on = !on) {
    uint64_t length;
    switch (r.Uniform(0, 3)) {
      case 0:
        length = r.Uniform(1, 3);
        break;
      case 1:
        length = r.Uniform(60, 70);
        break;
      case 2:
        length = r.Uniform(120, 136);
        break;
      default:
        length = r.Uniform(1, 200);
        break;
    }
    for (uint64_t j = 0; j < length && i < rows; j++) bits[i++] = on;
  }
  return bits;
}

// A random mask over the rows of `spec`, applied to it; sometimes two, one after the other.
void RandomMask(Rng& r, Spec* spec) {
  uint64_t rows = SpecRows(*spec);
  spec->masked = true;
  spec->mask.assign(rows, true);
  int layers = r.Chance(0.25) ? 2 : 1;
  for (int layer = 0; layer < layers; layer++) {
    std::vector<bool> bits = RandomBits(r, rows);
    for (uint64_t i = 0; i < rows; i++) spec->mask[i] = spec->mask[i] && bits[i];
    if (layers > 1) spec->layers.push_back(std::move(bits));
  }
}

// A random spec of any kind, masked half of the time.
Spec RandomSpec(Rng& r, uint64_t limit) {
  Spec spec;
  switch (r.Uniform(0, 2)) {
    case 0:
      spec = RandomStrided(r, limit);
      break;
    case 1:
      spec = RandomBitmapped(r, limit);
      break;
    default:
      spec = RandomPointerMapped(r, limit);
      break;
  }
  if (r.Chance(0.5)) RandomMask(r, &spec);
  return spec;
}

// A threshold for ScheduleOptions: 0, 1, small, 64, 256, 4096 or UINT32_MAX.
uint32_t RandomThreshold(Rng& r) {
  switch (r.Uniform(0, 6)) {
    case 0:
      return 0;
    case 1:
      return 1;
    case 2:
      return uint32_t(r.Uniform(2, 40));
    case 3:
      return 64;
    case 4:
      return 256;
    case 5:
      return 4096;
    default:
      return UINT32_MAX;
  }
}

// Random ScheduleOptions.
ScheduleOptions RandomOptions(Rng& r) {
  ScheduleOptions options;
  options.max_bridge = RandomThreshold(r);
  options.max_bridge_packed = RandomThreshold(r);
  options.min_in_place = RandomThreshold(r);
  return options;
}

// `length` random bytes.
std::string RandomBytes(Rng& r, size_t length) {
  std::string out(length, '\0');
  for (char& c : out) c = char(r.Uniform(0, 255));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Validation.

// Expects `s` to be InvalidArgument.
::testing::AssertionResult IsInvalid(const Status& s) {
  if (s.code() == Status::Code::kInvalidArgument) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "want InvalidArgument, got " << s.ToString();
}

// Expects `layout` to select nothing: no payload, no fragments, extent 0.
void ExpectEmpty(const RegionLayout& layout) {
  EXPECT_EQ(layout.payload_bytes(), 0u);
  EXPECT_EQ(layout.fragment_count(), 0u);
  EXPECT_EQ(layout.extent(), 0u);
  EXPECT_TRUE(CursorFragments(layout).empty());
  Schedule plan = PlanSchedule(layout, Options(64, 64, 64));
  EXPECT_TRUE(plan.runs.empty());
  EXPECT_EQ(plan.wire_bytes, 0u);
}

// The strided builder refuses empty, unordered, overlapping and out-of-stride fields and
// overflowing offsets, and accepts the boundary cases next to each.
TEST(RegionLayoutTest, StridedRefusesBadInput) {
  RegionLayout layout;
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(0, 16, 4, {{0, 0}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(0, 16, 4, {{0, 4}, {8, 0}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(0, 16, 4, {{8, 4}, {0, 4}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(0, 16, 4, {{0, 8}, {4, 8}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(0, 16, 4, {{0, 8}, {7, 1}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(0, 16, 4, {{4, 4}, {4, 4}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(0, 16, 4, {{12, 8}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(0, 16, 4, {{16, 1}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(0, 16, 4, {{0, 17}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(0, 16, 4, {{4, UINT32_MAX}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(0, 0, 2, {{0, 1}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(kMax64 - 10, 16, 2, {{0, 8}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Strided(kMax64 - 4, 16, 1, {{0, 8}}, &layout)));
  EXPECT_TRUE(
      IsInvalid(RegionLayout::Strided(0, uint64_t{1} << 40, uint64_t{1} << 30, {{0, 1}}, &layout)));
  EXPECT_TRUE(IsInvalid(
      RegionLayout::Strided(0, uint64_t{1} << 32, uint64_t{1} << 33, {{0, UINT32_MAX}}, &layout)));

  // Adjacent fields, a field ending at the stride, and an extent of exactly UINT64_MAX are fine.
  ASSERT_OK(RegionLayout::Strided(100, 16, 3, {{0, 4}, {4, 4}, {12, 4}}, &layout));
  EXPECT_EQ(layout.payload_bytes(), 36u);
  EXPECT_EQ(layout.fragment_count(), 9u);
  EXPECT_EQ(layout.extent(), 148u);
  ASSERT_OK(RegionLayout::Strided(kMax64 - 16, 8, 2, {{0, 8}}, &layout));
  EXPECT_EQ(layout.extent(), kMax64);
  ASSERT_OK(RegionLayout::Strided(5, 1, 4, {{0, 1}}, &layout));
  EXPECT_EQ(layout.extent(), 9u);
  // No rows: nothing to move.
  ASSERT_OK(RegionLayout::Strided(1000, 16, 0, {{0, 4}}, &layout));
  ExpectEmpty(layout);
}

// The bitmapped builder refuses zero-width columns and overflowing offsets; zero rows are an
// empty layout.
TEST(RegionLayoutTest, BitmappedRefusesBadInput) {
  RegionLayout layout;
  EXPECT_TRUE(IsInvalid(RegionLayout::Bitmapped({{0, 0}}, 4, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Bitmapped({{0, 4}, {100, 0}}, 4, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Bitmapped({{kMax64 - 3, 4}}, 2, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Bitmapped({{0, 4}, {kMax64 - 8, 8}}, 2, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Bitmapped({{0, 8}}, uint64_t{1} << 62, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::Bitmapped({{0, UINT32_MAX}}, uint64_t{1} << 33, &layout)));

  ASSERT_OK(RegionLayout::Bitmapped({{1000, 4}, {0, 2}}, 10, &layout));
  EXPECT_EQ(layout.payload_bytes(), 60u);
  EXPECT_EQ(layout.fragment_count(), 20u);
  EXPECT_EQ(layout.extent(), 1040u);
  ASSERT_OK(RegionLayout::Bitmapped({{kMax64 - 8, 4}}, 2, &layout));
  EXPECT_EQ(layout.extent(), kMax64);
  ASSERT_OK(RegionLayout::Bitmapped({{64, 4}}, 0, &layout));
  ExpectEmpty(layout);
}

// The pointer-mapped builder refuses empty items and items or payloads past UINT64_MAX; no
// items is an empty layout.
TEST(RegionLayoutTest, PointerMappedRefusesBadInput) {
  RegionLayout layout;
  EXPECT_TRUE(IsInvalid(RegionLayout::PointerMapped({{0, 0}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::PointerMapped({{0, 4}, {100, 0}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::PointerMapped({{kMax64, 1}}, &layout)));
  EXPECT_TRUE(IsInvalid(RegionLayout::PointerMapped({{8, kMax64}}, &layout)));
  EXPECT_TRUE(IsInvalid(
      RegionLayout::PointerMapped({{0, uint64_t{1} << 63}, {0, uint64_t{1} << 63}}, &layout)));

  ASSERT_OK(RegionLayout::PointerMapped({{500, 3}, {0, 10}, {2, 4}}, &layout));
  EXPECT_EQ(layout.payload_bytes(), 17u);
  EXPECT_EQ(layout.fragment_count(), 3u);
  EXPECT_EQ(layout.extent(), 503u);
  ASSERT_OK(RegionLayout::PointerMapped({{kMax64 - 1, 1}}, &layout));
  EXPECT_EQ(layout.extent(), kMax64);
  ASSERT_OK(RegionLayout::PointerMapped({}, &layout));
  ExpectEmpty(layout);
}

// WithMask refuses a mask of another row count on each kind, and an all-zero mask (or none
// over zero rows) gives an empty layout.
TEST(RegionLayoutTest, MasksMustCoverTheRows) {
  RegionLayout strided, bitmapped, pointer, out;
  ASSERT_OK(RegionLayout::Strided(0, 16, 10, {{0, 4}}, &strided));
  ASSERT_OK(RegionLayout::Bitmapped({{0, 4}}, 10, &bitmapped));
  ASSERT_OK(RegionLayout::PointerMapped(std::vector<Fragment>(10, Fragment{0, 4}), &pointer));
  for (const RegionLayout* layout : {&strided, &bitmapped, &pointer}) {
    SCOPED_TRACE(int(layout->kind()));
    EXPECT_TRUE(IsInvalid(layout->WithMask(RowMask(9), &out)));
    EXPECT_TRUE(IsInvalid(layout->WithMask(RowMask(11), &out)));
    EXPECT_TRUE(IsInvalid(layout->WithMask(RowMask(64), &out)));
    EXPECT_TRUE(IsInvalid(layout->WithMask(RowMask(), &out)));
    ASSERT_OK(layout->WithMask(RowMask(10), &out));
    EXPECT_TRUE(out.masked());
    EXPECT_EQ(out.selected_rows(), 0u);
    ExpectEmpty(out);
    RowMask one(10);
    one.Set(9);
    ASSERT_OK(layout->WithMask(one, &out));
    EXPECT_EQ(out.selected_rows(), 1u);
    EXPECT_EQ(out.payload_bytes(), 4u);
    EXPECT_EQ(out.fragment_count(), 1u);
  }
  RegionLayout none;
  ASSERT_OK(RegionLayout::Strided(0, 16, 0, {{0, 4}}, &none));
  ASSERT_OK(none.WithMask(RowMask(0), &out));
  ExpectEmpty(out);
}

// RowMask counts its bits, and MasksByOwner gives each target exactly the rows it owns (a row
// whose owner is not below the target count to none).
TEST(RegionLayoutTest, MasksByOwnerPartitionsTheRows) {
  RowMask mask(130);
  EXPECT_EQ(mask.Count(), 0u);
  for (uint64_t row : {0, 63, 64, 127, 129}) mask.Set(row);
  EXPECT_EQ(mask.Count(), 5u);
  EXPECT_TRUE(mask.Test(63) && mask.Test(64) && mask.Test(129) && !mask.Test(128));

  Rng r(kSeed);
  for (uint32_t targets = 1; targets <= 9; targets++) {
    std::vector<uint32_t> owner(r.Uniform(0, 300));
    uint64_t owned = 0;
    for (uint32_t& o : owner) {
      o = r.Chance(0.1) ? (r.Chance(0.5) ? targets : UINT32_MAX)
                        : uint32_t(r.Uniform(0, targets - 1));
      owned += o < targets;
    }
    std::vector<RowMask> masks = MasksByOwner(owner, targets);
    ASSERT_EQ(masks.size(), targets);
    uint64_t total = 0;
    for (uint32_t t = 0; t < targets; t++) {
      ASSERT_EQ(masks[t].rows(), owner.size());
      uint64_t count = 0;
      for (uint64_t i = 0; i < owner.size(); i++) {
        ASSERT_EQ(masks[t].Test(i), owner[i] == t) << "row " << i << " target " << t;
        count += owner[i] == t;
      }
      EXPECT_EQ(masks[t].Count(), count);
      total += masks[t].Count();
    }
    EXPECT_EQ(total, owned);
  }
}

// Boxes stop at kMaxBoxBytes: a box of exactly that length is one run, one byte more opens a
// new box, whatever max_bridge allows.
TEST(RegionScheduleTest, BoxesStopAtMaxBoxBytes) {
  const uint64_t half = kMaxBoxBytes / 2;
  struct Case {
    std::vector<Fragment> items;
    uint32_t max_bridge;
    std::vector<uint64_t> run_lengths;
  };
  const Case cases[] = {
      {{{0, half}, {half, half}, {2 * half, 1}}, 0, {kMaxBoxBytes, 1}},
      {{{0, half}, {half + 10, half - 10}}, 64, {kMaxBoxBytes}},
      {{{0, half}, {half + 10, half - 9}}, 64, {half, half - 9}},
      {{{0, half}, {half + 10, half - 9}}, UINT32_MAX, {half, half - 9}},
      {{{7, 1}, {8, kMaxBoxBytes - 1}}, 0, {kMaxBoxBytes}},
      {{{7, 1}, {8, kMaxBoxBytes}}, 0, {1, kMaxBoxBytes}},
  };
  for (const Case& c : cases) {
    RegionLayout layout;
    ASSERT_OK(RegionLayout::PointerMapped(c.items, &layout));
    Schedule plan = PlanSchedule(layout, Options(c.max_bridge, c.max_bridge, 0));
    ASSERT_EQ(plan.runs.size(), c.run_lengths.size()) << c.items[1].offset;
    uint64_t wire = 0;
    for (size_t i = 0; i < plan.runs.size(); i++) {
      EXPECT_EQ(plan.runs[i].length, c.run_lengths[i]) << i;
      EXPECT_EQ(plan.runs[i].wire, wire);
      wire += plan.runs[i].length;
    }
    EXPECT_EQ(plan.wire_bytes, wire);
    EXPECT_EQ(WireBytes(layout, Options(c.max_bridge, c.max_bridge, 0)), wire);
  }
}

// A fragment longer than kMaxBoxBytes (no memory behind it: planning only) gives a schedule
// with the right wire image and landings that CheckSchedule (what WriteRegion checks) accepts,
// whatever min_in_place is.
TEST(RegionScheduleTest, FragmentsLongerThanABox) {
  const uint64_t big = 3 * kMaxBoxBytes + 5;
  RegionLayout layout;
  ASSERT_OK(RegionLayout::PointerMapped({{0, 10}, {100, big}, {100 + big + 1, 7}}, &layout));
  for (uint32_t min_in_place : {0u, 64u, UINT32_MAX}) {
    SCOPED_TRACE("min_in_place " + std::to_string(min_in_place));
    ScheduleOptions options = Options(0, 0, min_in_place);
    Schedule plan = PlanSchedule(layout, options);
    uint64_t wire = 0;
    for (const rdma::Run& run : plan.runs) {
      EXPECT_EQ(run.wire, wire);
      wire += run.length;
    }
    EXPECT_EQ(wire, 17 + big);
    EXPECT_EQ(plan.wire_bytes, wire);
    EXPECT_EQ(WireBytes(layout, options), wire);
    Status s = CheckSchedule(layout, plan, layout.extent());
    EXPECT_TRUE(s.ok()) << s.ToString();
    // The receiver finds the three fragments one after another.
    LandingCursor landing(layout, options);
    Fragment landed;
    std::vector<uint64_t> offsets;
    while (landing.Next(&landed)) offsets.push_back(landed.offset);
    EXPECT_EQ(offsets, (std::vector<uint64_t>{0, 10, 10 + big}));
  }
}

// ---------------------------------------------------------------------------------------------
// Encode/Decode.

// A fixed set of layouts: every kind, with and without masks, and empty ones.
std::vector<Spec> FixedSpecs() {
  std::vector<Spec> specs;
  Spec s;
  s.kind = RegionKind::kStrided;
  s.base = 40;
  s.stride = 24;
  s.rows = 70;
  s.fields = {{0, 4}, {4, 2}, {10, 14}};
  specs.push_back(s);
  s.masked = true;
  s.mask.assign(70, false);
  for (int i = 0; i < 70; i += 3) s.mask[i] = true;
  specs.push_back(s);
  s = Spec();
  s.kind = RegionKind::kBitmapped;
  s.rows = 130;
  s.columns = {{5000, 8}, {0, 1}, {1000, 4}};
  specs.push_back(s);
  s.masked = true;
  s.mask.assign(130, false);
  for (int i = 0; i < 130; i += 7) s.mask[i] = true;
  s.mask[129] = true;
  specs.push_back(s);
  s = Spec();
  s.kind = RegionKind::kPointerMapped;
  s.items = {{300, 7}, {0, 1}, {kMax64 - 8, 8}, {20, 1000}, {20, 1000}};
  specs.push_back(s);
  s.masked = true;
  s.mask = {true, false, true, false, true};
  specs.push_back(s);
  s = Spec();
  s.kind = RegionKind::kPointerMapped;
  specs.push_back(s);
  s.kind = RegionKind::kStrided;
  s.stride = 8;
  s.fields = {{0, 8}};
  specs.push_back(s);
  return specs;
}

// Encodes `layout` on its own.
std::string Encode(const RegionLayout& layout) {
  std::string out;
  layout.EncodeTo(&out);
  return out;
}

// Every fixed layout and 2,000 random ones decode to the same parameters and fragments, several
// encodings in one string decode one after another, and the input advances by exactly one.
TEST(RegionEncodingTest, RoundTrips) {
  std::vector<Spec> specs = FixedSpecs();
  Rng r(CaseSeed(1, 0));
  for (int i = 0; i < 2000; i++) specs.push_back(RandomSpec(r, 1 << 16));
  std::string all;
  std::vector<size_t> ends;
  for (size_t i = 0; i < specs.size(); i++) {
    SCOPED_TRACE("seed " + std::to_string(kSeed) + " spec " + std::to_string(i) + ": " +
                 Describe(specs[i]));
    RegionLayout layout, decoded;
    ASSERT_OK(Build(specs[i], &layout));
    ASSERT_EQ(CheckLayout(specs[i], layout), "");
    std::string encoding = Encode(layout);
    std::string_view in = encoding;
    ASSERT_OK(RegionLayout::DecodeFrom(&in, kMax64, kMax64, &decoded));
    EXPECT_TRUE(in.empty()) << in.size() << " bytes left";
    ASSERT_EQ(CheckLayout(specs[i], decoded), "");
    EXPECT_EQ(Encode(decoded), encoding);
    // Appending to a non-empty string keeps what was there.
    size_t before = all.size();
    layout.EncodeTo(&all);
    ASSERT_EQ(all.substr(before), encoding);
    ends.push_back(all.size());
  }
  std::string_view in = all;
  for (size_t i = 0; i < specs.size(); i++) {
    RegionLayout decoded;
    ASSERT_OK(RegionLayout::DecodeFrom(&in, kMax64, kMax64, &decoded));
    ASSERT_EQ(all.size() - in.size(), ends[i]) << "spec " << i;
    ASSERT_EQ(CheckLayout(specs[i], decoded), "") << "spec " << i;
  }
  EXPECT_TRUE(in.empty());
}

// Every proper prefix of a valid encoding is refused.
TEST(RegionEncodingTest, TruncationsAreRefused) {
  std::vector<Spec> specs = FixedSpecs();
  Rng r(CaseSeed(2, 0));
  for (int i = 0; i < 100; i++) specs.push_back(RandomSpec(r, 1 << 16));
  for (size_t i = 0; i < specs.size(); i++) {
    RegionLayout layout;
    ASSERT_OK(Build(specs[i], &layout));
    std::string encoding = Encode(layout);
    for (size_t length = 0; length < encoding.size(); length++) {
      std::string prefix = encoding.substr(0, length);  // its own buffer: ASan sees overreads
      std::string_view in = prefix;
      RegionLayout decoded;
      ASSERT_FALSE(RegionLayout::DecodeFrom(&in, kMax64, kMax64, &decoded).ok())
          << "spec " << i << " (" << Describe(specs[i]) << ") prefix " << length << " of "
          << encoding.size();
    }
  }
}

// Checks a layout Decode accepted from arbitrary bytes: it is one the builders accept, its
// summary is what its own parameters give, and it is within the limits Decode was given.
std::string CheckAccepted(const RegionLayout& decoded, uint64_t max_payload,
                          uint64_t max_fragments) {
  if (decoded.payload_bytes() > max_payload) return "payload over the limit";
  if (decoded.fragment_count() > max_fragments) return "fragments over the limit";
  if (decoded.masked() && decoded.mask().rows() != decoded.rows()) {
    return "mask of " + std::to_string(decoded.mask().rows()) + " rows over " +
           std::to_string(decoded.rows());
  }
  // Count the fragments arithmetically first: enumerating a layout that lies about its size
  // could take forever.
  uint64_t selected = decoded.rows();
  if (decoded.masked()) {
    selected = 0;
    for (uint64_t i = 0; i < decoded.rows(); i++) selected += decoded.mask().Test(i);
  }
  uint64_t parts = decoded.kind() == RegionKind::kStrided     ? decoded.fields().size()
                   : decoded.kind() == RegionKind::kBitmapped ? decoded.columns().size()
                                                              : 1;
  if (parts != 0 && selected > max_fragments / parts) {
    return "accepted " + std::to_string(selected) + " rows of " + std::to_string(parts) +
           " fragments each over a limit of " + std::to_string(max_fragments);
  }
  Spec spec = SpecOf(decoded);
  RegionLayout rebuilt;
  Status s = Build(spec, &rebuilt);
  if (!s.ok()) return "Decode accepted what the builders refuse (" + s.ToString() + ")";
  return CheckLayout(spec, decoded);
}

// Thousands of random strings and of mutated encodings are refused or decode to a consistent
// layout; nothing reads past the input.
TEST(RegionEncodingTest, GarbageIsRefusedOrConsistent) {
  constexpr uint64_t kMaxPayload = 1 << 20, kMaxFragments = 1 << 14;
  std::vector<std::string> valid;
  for (const Spec& spec : FixedSpecs()) {
    RegionLayout layout;
    ASSERT_OK(Build(spec, &layout));
    valid.push_back(Encode(layout));
  }
  Rng r(CaseSeed(3, 0));
  int accepted = 0;
  for (int i = 0; i < 20000; i++) {
    std::string input;
    if (i % 2 == 0) {
      input = RandomBytes(r, r.Uniform(0, i % 10 == 0 ? 400 : 40));
      if (!input.empty() && r.Chance(0.5)) input[0] = char(r.Uniform(1, 3));  // a real kind
    } else {
      input = valid[r.Uniform(0, valid.size() - 1)];
      int flips = int(r.Uniform(1, 3));
      for (int f = 0; f < flips && !input.empty(); f++) {
        input[r.Uniform(0, input.size() - 1)] = char(r.Uniform(0, 255));
      }
      if (r.Chance(0.3)) input.resize(r.Uniform(0, input.size()));
    }
    std::string_view in = input;
    RegionLayout decoded;
    if (!RegionLayout::DecodeFrom(&in, kMaxPayload, kMaxFragments, &decoded).ok()) continue;
    accepted++;
    ASSERT_LE(in.size(), input.size());
    ASSERT_EQ(in.data(), input.data() + (input.size() - in.size()));
    ASSERT_EQ(CheckAccepted(decoded, kMaxPayload, kMaxFragments), "")
        << "seed " << kSeed << " input " << i << " (" << input.size() << " bytes)";
  }
  // Mutations of valid encodings sometimes stay valid; that the check above ran is the point.
  EXPECT_GT(accepted, 0);
}

// A layout has one encoding: the same layout with a varint written overlong (0x80 0x00 for 0,
// or a value's last group followed by a zero group) is refused, as is any other byte string that
// is not what EncodeTo writes. Found by tests/fuzz/region_fuzz (regressions/region/).
TEST(RegionEncodingTest, OverlongVarintsAreRefused) {
  RegionLayout empty, decoded;
  ASSERT_OK(RegionLayout::PointerMapped({}, &empty));
  ASSERT_EQ(Encode(empty), std::string("\x03\x00\x00", 3));
  std::string_view in("\x03\x00\x80\x00", 4);  // zero rows, written in two bytes
  EXPECT_FALSE(RegionLayout::DecodeFrom(&in, kMax64, kMax64, &decoded).ok());
  // One item at offset 5 of length 200 (0xc8 0x01). An offset travels as its distance from
  // the previous item's end, zigzagged: 5 is 0x0a, here written overlong as 0x8a 0x00.
  in = std::string_view("\x03\x00\x01\x8a\x00\xc8\x01", 7);
  EXPECT_FALSE(RegionLayout::DecodeFrom(&in, kMax64, kMax64, &decoded).ok());
  in = std::string_view("\x03\x00\x01\x0a\xc8\x01", 6);
  ASSERT_OK(RegionLayout::DecodeFrom(&in, kMax64, kMax64, &decoded));
  EXPECT_EQ(decoded.items()[0].offset, 5u);
  EXPECT_EQ(decoded.items()[0].length, 200u);
  // The largest value still decodes: ten bytes, the last one 0x01 (2^63 - 1 zigzags to
  // 2^64 - 2).
  RegionLayout far;
  ASSERT_OK(RegionLayout::PointerMapped({{INT64_MAX, 1}}, &far));
  std::string encoding = Encode(far);
  ASSERT_EQ(encoding.size(), 3u + 10 + 1);
  EXPECT_EQ(encoding[12], '\x01');
  in = encoding;
  ASSERT_OK(RegionLayout::DecodeFrom(&in, kMax64, kMax64, &decoded));
  EXPECT_EQ(decoded.items()[0].offset, uint64_t{INT64_MAX});
}

// A masked layout of nearly 2^64 rows needs nearly 2^58 mask words, which no input holds: it is
// refused, not taken with a mask of no words (found by fuzzing the exchange's batches).
TEST(RegionEncodingTest, AMaskTooLargeForTheInputIsRefused) {
  RegionLayout decoded;
  // Bitmapped, masked, 2^64 - 54 rows (a ten-byte varint), one column (base 0, width 1), and
  // no mask words.
  std::string_view in("\x02\x01\xca\xff\xff\xff\xff\xff\xff\xff\xff\x01\x01\x00\x01", 15);
  EXPECT_FALSE(RegionLayout::DecodeFrom(&in, kMax64, kMax64, &decoded).ok());
  // The same with 65 rows and its two mask words decodes, one row selected.
  std::string two_words("\x02\x01\x41\x01\x00\x01", 6);
  two_words += std::string("\x00\x00\x00\x00\x00\x00\x00\x00", 8);
  two_words += std::string("\x01\x00\x00\x00\x00\x00\x00\x00", 8);
  in = two_words;
  ASSERT_OK(RegionLayout::DecodeFrom(&in, kMax64, kMax64, &decoded));
  EXPECT_EQ(decoded.rows(), 65u);
  EXPECT_EQ(decoded.selected_rows(), 1u);
}

// Items that lie back to back take a byte for their offset; items before their predecessor's
// end (a negative distance) and far ones round-trip too.
TEST(RegionEncodingTest, PointerMappedOffsetsTravelAsDistances) {
  std::vector<Fragment> rows;
  uint64_t offset = 1 << 20;
  for (int i = 0; i < 1000; i++) {
    rows.push_back(Fragment{offset, 60});
    offset += 60;
  }
  RegionLayout batch, decoded;
  ASSERT_OK(RegionLayout::PointerMapped(rows, &batch));
  // Kind, flags, 1000 rows (2 bytes), the first item's distance (2^20, zigzagged 2^21: 4
  // bytes) and length, then one byte per offset and length.
  EXPECT_EQ(Encode(batch).size(), 2u + 2 + 4 + 1 + 999 * 2);
  RegionLayout scattered;
  ASSERT_OK(RegionLayout::PointerMapped({{500, 10}, {0, 7}, {UINT64_MAX - 3, 3}, {40, 1}, {41, 2}},
                                        &scattered));
  std::string encoding = Encode(scattered);
  std::string_view in = encoding;
  ASSERT_OK(RegionLayout::DecodeFrom(&in, kMax64, kMax64, &decoded));
  EXPECT_TRUE(in.empty());
  EXPECT_EQ(decoded.items(), scattered.items());
  EXPECT_EQ(decoded.Fingerprint(), scattered.Fingerprint());
}

// Decode refuses layouts over max_payload or max_fragments, accepts them at the limit, and
// refuses huge layouts without enumerating them.
TEST(RegionEncodingTest, LimitsAreEnforced) {
  for (const Spec& spec : FixedSpecs()) {
    RegionLayout layout, decoded;
    ASSERT_OK(Build(spec, &layout));
    std::string encoding = Encode(layout);
    uint64_t payload = layout.payload_bytes(), fragments = layout.fragment_count();
    std::string_view in = encoding;
    ASSERT_OK(RegionLayout::DecodeFrom(&in, payload, fragments, &decoded));
    if (payload > 0) {
      in = encoding;
      EXPECT_FALSE(RegionLayout::DecodeFrom(&in, payload - 1, kMax64, &decoded).ok())
          << Describe(spec);
    }
    if (fragments > 0) {
      in = encoding;
      EXPECT_FALSE(RegionLayout::DecodeFrom(&in, kMax64, fragments - 1, &decoded).ok())
          << Describe(spec);
    }
  }
  RegionLayout huge, decoded;
  ASSERT_OK(RegionLayout::Strided(0, 1, uint64_t{1} << 40, {{0, 1}}, &huge));
  EXPECT_EQ(huge.fragment_count(), uint64_t{1} << 40);
  std::string encoding = Encode(huge);
  std::string_view in = encoding;
  EXPECT_FALSE(RegionLayout::DecodeFrom(&in, 1 << 20, kMax64, &decoded).ok());
  in = encoding;
  EXPECT_FALSE(RegionLayout::DecodeFrom(&in, kMax64, 1 << 20, &decoded).ok());
  in = encoding;
  ASSERT_OK(RegionLayout::DecodeFrom(&in, kMax64, kMax64, &decoded));
  EXPECT_EQ(decoded.payload_bytes(), uint64_t{1} << 40);
}

// ---------------------------------------------------------------------------------------------
// The optimizer and the receiver's view on random layouts, in memory.

// 12,000 random layouts of every kind, masked or not, under random options: the layout's
// summary and fragments, the schedule's runs and totals, where each fragment lands and what
// Unpack returns all agree with the reference.
TEST(RegionScheduleTest, RandomLayoutsMatchTheReference) {
  constexpr uint64_t kLimit = 64 << 10;
  constexpr int kCases = 12000;
  Rng fill(kSeed);
  std::string source = RandomBytes(fill, kLimit);
  uint64_t fragments = 0, runs = 0, packed = 0;
  for (int i = 0; i < kCases; i++) {
    uint64_t seed = CaseSeed(4, i);
    Rng r(seed);
    Spec spec = RandomSpec(r, kLimit);
    ScheduleOptions options = RandomOptions(r);
    std::string context = "seed " + std::to_string(kSeed) + " case " + std::to_string(i) + ": " +
                          Describe(spec) + " " + Describe(options);
    RegionLayout layout;
    Status s = Build(spec, &layout);
    ASSERT_TRUE(s.ok()) << context << ": " << s.ToString();
    ASSERT_EQ(CheckLayout(spec, layout), "") << context;
    Expected expected;
    ASSERT_EQ(CheckPlan(spec, layout, source, options, &expected), "") << context;
    fragments += expected.schedule.fragments;
    runs += expected.schedule.box_count();
    for (const rdma::Run& run : expected.schedule.Boxes()) packed += run.packed;
  }
  // The generator really produced work of every sort.
  EXPECT_GT(fragments, uint64_t{kCases} * 20);
  EXPECT_GT(packed, 0u);
  EXPECT_LT(packed, runs);
}

// ---------------------------------------------------------------------------------------------
// Real transfers.

// Options for `backend` with the test secret.
TransportOptions OptionsFor(const std::string& backend) {
  TransportOptions options;
  options.backend = backend;
  options.secret = kSecret;
  options.connect_timeout_ms = kTimeoutMs;
  return options;
}

// A region of `length` bytes starting `offset` bytes into `region`, for handing a smaller
// buffer (source or staging) to a transfer.
LocalRegion Slice(const LocalRegion& region, size_t offset, size_t length) {
  LocalRegion out = region;
  out.addr = region.addr + offset;
  out.length = length;
  return out;
}

// Checks what `target` holds after a transfer of `expected` to `offset`: zeros before, the
// wire image, zeros after; and that Unpack gets the payload back; "" when it does.
std::string CheckTarget(const LocalRegion& target, uint64_t offset, const RegionLayout& layout,
                        const Expected& expected) {
  const char* bytes = target.addr;
  size_t wire = expected.wire.size();
  if (!AllZero(bytes, offset)) return "bytes before the wire image were written";
  if (std::memcmp(bytes + offset, expected.wire.data(), wire) != 0) {
    size_t at = 0;
    while (bytes[offset + at] == expected.wire[at]) at++;
    return "the wire image differs at byte " + std::to_string(at) + " of " + std::to_string(wire);
  }
  if (!AllZero(bytes + offset + wire, target.length - offset - wire)) {
    return "bytes after the wire image were written";
  }
  std::string payload;
  Status s =
      Unpack(layout, expected.schedule.options, std::string_view(bytes + offset, wire), &payload);
  if (!s.ok()) return "Unpack: " + s.ToString();
  if (payload != expected.payload) return "the unpacked payload differs from the reference";
  return "";
}

// A connection as a transport without strided gathers sees it (verbs: max_repeat 1), so that
// the transfer layer's expansion of a period into single boxes runs on shm and tcp too:
// ForwardingConnection keeps Connection's default max_repeat.
using FlatGatherConnection = ForwardingConnection;

class RegionTransferTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Connects `count` pairs of the backend under test.
  void ConnectPairs(size_t count) {
    for (size_t i = 0; i < count; i++) {
      pairs_.push_back(MakePair(OptionsFor(GetParam())));
      ASSERT_NE(pairs_.back().client, nullptr) << GetParam() << " did not connect";
      ASSERT_NE(pairs_.back().server, nullptr);
    }
  }

  // Allocates a region on `connection`, failing the test when that fails.
  LocalRegion Allocate(Connection* connection, size_t length, uint32_t access) {
    LocalRegion region;
    Status s = connection->AllocateRegion(length, access, &region);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return region;
  }

  // Registers caller memory on `connection`, failing the test when that fails.
  LocalRegion Register(Connection* connection, std::string* memory) {
    LocalRegion region;
    Status s = connection->RegisterLocal(memory->data(), memory->size(), &region);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(region.addr, memory->data());
    EXPECT_EQ(region.length, memory->size());
    return region;
  }

  std::vector<Pair> pairs_;
};

// 10,000 random layouts (every kind, masked or not, random options, random staging sizes no
// smaller than the largest packed run, random remote offsets) each arrive as exactly the
// reference wire image, unpack to the reference payload, and touch no other target byte. Every
// third goes through a connection without strided gathers, where periods are expanded.
TEST_P(RegionTransferTest, RandomLayoutsArriveIntact) {
  constexpr uint64_t kSource = 16 << 10, kWireCap = 32 << 10, kSlack = 512;
  constexpr int kCases = 10000;
  ConnectPairs(1);
  Connection* client = pairs_[0].client.get();
  Connection* server = pairs_[0].server.get();
  std::string memory(kSource, '\0');
  LocalRegion source = Register(client, &memory);
  LocalRegion staging = Allocate(client, kSource, kLocalOnly);
  LocalRegion target = Allocate(server, kWireCap + kSlack, kRemoteWrite);
  ASSERT_FALSE(HasFailure());
  RemoteRegion remote = server->Describe(target);
  uint64_t wire_total = 0, packed_total = 0, gathered_total = 0, expanded_periods = 0;
  FlatGatherConnection flat(client);
  for (int i = 0; i < kCases; i++) {
    Rng r(CaseSeed(5, i));
    Spec spec;
    ScheduleOptions options;
    do {
      spec = RandomSpec(r, kSource);
      options = RandomOptions(r);
    } while (PlanByHand(ReferenceFragments(spec), options).wire > kWireCap);
    std::string context = GetParam() + " seed " + std::to_string(kSeed) + " case " +
                          std::to_string(i) + ": " + Describe(spec) + " " + Describe(options);
    RegionLayout layout;
    Status s = Build(spec, &layout);
    ASSERT_TRUE(s.ok()) << context << ": " << s.ToString();
    FillPattern(memory.data(), layout.extent(), uint32_t(i));
    Expected expected;
    ASSERT_EQ(CheckPlan(spec, layout, memory, options, &expected), "") << context;

    RegionTarget t;
    t.connection = i % 3 == 2 ? static_cast<Connection*>(&flat) : client;
    t.source = Slice(source, 0, r.Uniform(layout.extent(), kSource));
    t.layout = &layout;
    t.schedule = &expected.schedule;
    t.staging = Slice(staging, 0, r.Uniform(expected.schedule.max_packed_run, kSource));
    t.remote = remote;
    t.remote_offset = r.Uniform(0, kSlack);
    TransferStats stats;
    s = WriteRegion(t, kTimeoutMs, &stats);
    ASSERT_TRUE(s.ok()) << context << ": " << s.ToString();
    ASSERT_EQ(CheckTarget(target, t.remote_offset, layout, expected), "") << context;
    EXPECT_EQ(stats.wire_bytes, expected.schedule.wire_bytes) << context;
    // Packed boxes are copied into staging, or gathered straight from the source when they
    // form a period (shm and tcp have strided gathers).
    EXPECT_EQ(stats.packed_bytes + stats.gathered_bytes, expected.schedule.packed_bytes) << context;
    if (expected.schedule.period_packed() && t.connection == client) {
      EXPECT_GT(stats.gathered_bytes, 0u) << context;
    }
    if (t.connection == &flat) {
      EXPECT_EQ(stats.gathered_bytes, 0u) << context;
      expanded_periods += expected.schedule.period_packed();
    }
    EXPECT_LE(stats.pieces, stats.requests * uint64_t{client->max_sge()}) << context;
    std::memset(target.addr + t.remote_offset, 0, expected.wire.size());
    wire_total += expected.schedule.wire_bytes;
    packed_total += expected.schedule.packed_bytes;
    gathered_total += stats.gathered_bytes;
  }
  EXPECT_GT(packed_total, 0u);
  EXPECT_GT(gathered_total, 0u);
  EXPECT_GT(expanded_periods, 0u);
  EXPECT_GT(wire_total, packed_total);
}

// A random layout whose rows (items) are disjoint and each start with 4 bytes to hold the
// row's number, so that every row can be told apart where it arrives.
Spec RandomNumberedSpec(Rng& r, uint64_t limit) {
  Spec spec;
  switch (r.Uniform(0, 2)) {
    case 0:
      spec = RandomStrided(r, limit);
      if (spec.fields[0].length < 4) {
        spec.stride = std::max<uint64_t>(spec.stride, 4);
        spec.fields = {{0, 4}};
        if (r.Chance(0.5) && spec.stride > 6) spec.fields.push_back({6, 1});
      }
      spec.rows = std::min<uint64_t>(spec.rows, (limit - spec.base) / spec.stride);
      break;
    case 1:
      spec = RandomBitmapped(r, limit);
      if (spec.columns[0].width < 4) {
        spec.columns[0].width = 4;
        spec.rows = std::min<uint64_t>(spec.rows, limit / 4);
        spec.columns[0].base = std::min<uint64_t>(spec.columns[0].base, limit - spec.rows * 4);
      }
      break;
    default: {
      spec.kind = RegionKind::kPointerMapped;
      uint64_t pos = 0, count = r.Uniform(0, 150);
      for (uint64_t i = 0; i < count; i++) {
        uint64_t gap = r.Chance(0.4) ? 0 : r.Uniform(1, 200);
        uint64_t length = r.Uniform(4, 40);
        if (pos + gap + length > limit) break;
        spec.items.push_back({pos + gap, length});
        pos += gap + length;
      }
      if (r.Chance(0.5)) std::shuffle(spec.items.begin(), spec.items.end(), r.engine());
      if (r.Chance(0.3)) std::reverse(spec.items.begin(), spec.items.end());
      break;
    }
  }
  return spec;
}

// Where the number of row (item) `row` of a numbered spec sits in the source.
uint64_t NumberOffset(const Spec& spec, uint64_t row) {
  switch (spec.kind) {
    case RegionKind::kStrided:
      return spec.base + row * spec.stride + spec.fields[0].offset;
    case RegionKind::kBitmapped:
      return spec.columns[0].base + row * spec.columns[0].width;
    default:
      return spec.items[row].offset;
  }
}

// The row numbers in the payload of a numbered spec, in payload order.
std::vector<uint32_t> NumbersInPayload(const Spec& spec, const std::string& payload) {
  std::vector<uint32_t> out;
  uint64_t at = 0, row_bytes = 0;
  for (const Field& f : spec.fields) row_bytes += f.length;
  for (uint64_t row = 0; row < SpecRows(spec); row++) {
    if (!Selected(spec, row)) continue;
    if (at + 4 > payload.size()) break;
    uint32_t number;
    std::memcpy(&number, payload.data() + at, 4);
    out.push_back(number);
    switch (spec.kind) {
      case RegionKind::kStrided:
        at += row_bytes;
        break;
      case RegionKind::kBitmapped:
        at += spec.columns[0].width;
        break;
      default:
        at += spec.items[row].length;
        break;
    }
  }
  return out;
}

// For 1 to 8 targets, rows assigned by a hash through MasksByOwner reach their owner in one
// ScatterRegions call: each target receives exactly the reference for its rows, and every row
// number arrives exactly once, at its owner.
TEST_P(RegionTransferTest, ScatterByHashReachesEachOwnerOnce) {
  constexpr uint64_t kSource = 16 << 10, kWireCap = 128 << 10, kSlack = 256;
  constexpr uint32_t kMaxTargets = 8;
  constexpr int kRounds = 120;
  ConnectPairs(kMaxTargets);
  ASSERT_FALSE(HasFailure());
  std::string memory(kSource, '\0');
  std::vector<LocalRegion> sources, stagings, targets;
  std::vector<RemoteRegion> remotes;
  for (Pair& pair : pairs_) {
    sources.push_back(Register(pair.client.get(), &memory));
    stagings.push_back(Allocate(pair.client.get(), kSource, kLocalOnly));
    targets.push_back(Allocate(pair.server.get(), kWireCap + kSlack, kRemoteWrite));
    remotes.push_back(pair.server->Describe(targets.back()));
  }
  ASSERT_FALSE(HasFailure());
  uint64_t rows_moved = 0;
  for (uint32_t count = 1; count <= kMaxTargets; count++) {
    for (int round = 0; round < kRounds; round++) {
      Rng r(CaseSeed(6, count * 1000 + round));
      std::string context = GetParam() + " seed " + std::to_string(kSeed) + " targets " +
                            std::to_string(count) + " round " + std::to_string(round);
      Spec spec = RandomNumberedSpec(r, kSource);
      context += ": " + Describe(spec);
      RegionLayout whole;
      Status s = Build(spec, &whole);
      ASSERT_TRUE(s.ok()) << context << ": " << s.ToString();
      std::string fill = RandomBytes(r, whole.extent());
      std::memcpy(memory.data(), fill.data(), fill.size());
      uint64_t rows = SpecRows(spec);
      std::vector<uint32_t> owner(rows);
      for (uint64_t row = 0; row < rows; row++) {
        uint32_t number = uint32_t(row);
        std::memcpy(memory.data() + NumberOffset(spec, row), &number, 4);
        uint64_t h = (row + 1) * 0x9e3779b97f4a7c15ull ^ CaseSeed(7, round);
        owner[row] = uint32_t((h ^ (h >> 29)) % count);
      }
      std::vector<RowMask> masks = MasksByOwner(owner, count);
      ASSERT_EQ(masks.size(), count) << context;

      std::vector<Spec> specs(count, spec);
      std::vector<RegionLayout> layouts(count);
      std::vector<Expected> expected(count);
      std::vector<RegionTarget> request(count);
      uint64_t selected = 0, wire = 0;
      for (uint32_t t = 0; t < count; t++) {
        specs[t].masked = true;
        specs[t].mask.assign(rows, false);
        for (uint64_t row = 0; row < rows; row++) specs[t].mask[row] = owner[row] == t;
        s = whole.WithMask(masks[t], &layouts[t]);
        ASSERT_TRUE(s.ok()) << context << ": " << s.ToString();
        ASSERT_EQ(CheckLayout(specs[t], layouts[t]), "") << context << " target " << t;
        selected += layouts[t].selected_rows();
        ScheduleOptions options = RandomOptions(r);
        ASSERT_EQ(CheckPlan(specs[t], layouts[t], memory, options, &expected[t]), "")
            << context << " target " << t << " " << Describe(options);
        if (expected[t].wire.size() > kWireCap) {
          options.max_bridge = options.max_bridge_packed = 0;  // keep the image in the target
          ASSERT_EQ(CheckPlan(specs[t], layouts[t], memory, options, &expected[t]), "");
        }
        ASSERT_LE(expected[t].wire.size(), kWireCap) << context;
        request[t].connection = pairs_[t].client.get();
        request[t].source = sources[t];
        request[t].layout = &layouts[t];
        request[t].schedule = &expected[t].schedule;
        request[t].staging = stagings[t];
        request[t].remote = remotes[t];
        request[t].remote_offset = r.Uniform(0, kSlack);
        wire += expected[t].wire.size();
      }
      ASSERT_EQ(selected, rows) << context;
      TransferStats stats;
      s = ScatterRegions(request.data(), count, kTimeoutMs, &stats);
      ASSERT_TRUE(s.ok()) << context << ": " << s.ToString();
      EXPECT_EQ(stats.wire_bytes, wire) << context;

      std::vector<int> seen(rows, 0);
      for (uint32_t t = 0; t < count; t++) {
        ASSERT_EQ(CheckTarget(targets[t], request[t].remote_offset, layouts[t], expected[t]), "")
            << context << " target " << t;
        std::string payload;
        ASSERT_OK(Unpack(
            layouts[t], expected[t].schedule.options,
            std::string_view(targets[t].addr + request[t].remote_offset, expected[t].wire.size()),
            &payload));
        for (uint32_t number : NumbersInPayload(specs[t], payload)) {
          ASSERT_LT(number, rows) << context << " target " << t;
          ASSERT_EQ(owner[number], t) << context << " row " << number;
          seen[number]++;
        }
        std::memset(targets[t].addr + request[t].remote_offset, 0, expected[t].wire.size());
      }
      for (uint64_t row = 0; row < rows; row++) {
        ASSERT_EQ(seen[row], 1) << context << " row " << row;
      }
      rows_moved += rows;
    }
  }
  EXPECT_GT(rows_moved, uint64_t{kMaxTargets} * kRounds * 20);
}

// Several targets on one connection (different remote regions of one peer, each with its own
// staging buffer) in one ScatterRegions call all arrive intact: single-batch layouts and ones
// needing many batches (more pieces than a batch carries, packed runs beyond their staging).
TEST_P(RegionTransferTest, ScatterToTargetsSharingAConnection) {
  constexpr uint64_t kSource = 64 << 10, kWireCap = 128 << 10;
  constexpr uint32_t kTargets = 4;
  constexpr int kRounds = 150;
  ConnectPairs(1);
  ASSERT_FALSE(HasFailure());
  Connection* client = pairs_[0].client.get();
  Connection* server = pairs_[0].server.get();
  std::string memory(kSource, '\0');
  LocalRegion source = Register(client, &memory);
  std::vector<LocalRegion> stagings, targets;
  for (uint32_t t = 0; t < kTargets; t++) {
    stagings.push_back(Allocate(client, kSource, kLocalOnly));
    targets.push_back(Allocate(server, kWireCap, kRemoteWrite));
  }
  ASSERT_FALSE(HasFailure());
  for (int round = 0; round < kRounds; round++) {
    Rng r(CaseSeed(9, round));
    FillPattern(memory.data(), memory.size(), uint32_t(round));
    uint32_t count = uint32_t(r.Uniform(2, kTargets));
    std::vector<Spec> specs(count);
    std::vector<RegionLayout> layouts(count);
    std::vector<Expected> expected(count);
    std::vector<RegionTarget> request(count);
    std::string context =
        GetParam() + " seed " + std::to_string(kSeed) + " round " + std::to_string(round);
    for (uint32_t t = 0; t < count; t++) {
      ScheduleOptions options;
      if (round % 3 == 0) {  // many batches: thousands of 1-byte runs, some packed
        specs[t].kind = RegionKind::kPointerMapped;
        uint64_t items = r.Uniform(3000, 6000);
        for (uint64_t i = 0; i < items; i++) specs[t].items.push_back({i * 3, 1 + i % 2});
        options = Options(0, 0, r.Chance(0.5) ? 0 : 2);
      } else {
        do {
          specs[t] = RandomSpec(r, kSource);
          options = RandomOptions(r);
        } while (PlanByHand(ReferenceFragments(specs[t]), options).wire > kWireCap);
      }
      Status s = Build(specs[t], &layouts[t]);
      ASSERT_TRUE(s.ok()) << context << ": " << s.ToString();
      ASSERT_EQ(CheckPlan(specs[t], layouts[t], memory, options, &expected[t]), "") << context;
      request[t].connection = client;
      request[t].source = source;
      request[t].layout = &layouts[t];
      request[t].schedule = &expected[t].schedule;
      // Staging of a few packed runs only, so that packed layouts need several batches.
      uint64_t max_packed = expected[t].schedule.max_packed_run;
      request[t].staging = Slice(stagings[t], 0, std::max<uint64_t>(max_packed, 64));
      request[t].remote = server->Describe(targets[t]);
    }
    TransferStats stats;
    Status s = ScatterRegions(request.data(), count, kTimeoutMs, &stats);
    ASSERT_TRUE(s.ok()) << context << ": " << s.ToString();
    for (uint32_t t = 0; t < count; t++) {
      ASSERT_EQ(CheckTarget(targets[t], 0, layouts[t], expected[t]), "")
          << context << " target " << t << ": " << Describe(specs[t]);
      std::memset(targets[t].addr, 0, expected[t].wire.size());
    }
  }
}

// The fixtures of the bad-input tests: a pointer-mapped layout with packed and in-place runs.
struct BadInputCase {
  std::string memory;
  RegionLayout layout;
  Expected expected;
};

// Items of 10 bytes every 100 bytes, then one of 300: with min_in_place 64 and no bridging,
// 40 packed runs of 10 bytes and one in-place run of 300.
void MakeBadInputCase(BadInputCase* c) {
  Spec spec;
  spec.kind = RegionKind::kPointerMapped;
  for (uint64_t i = 0; i < 40; i++) spec.items.push_back({i * 100, 10});
  spec.items.push_back({5000, 300});
  c->memory.assign(8192, '\0');
  FillPattern(c->memory.data(), c->memory.size(), 99);
  ASSERT_OK(Build(spec, &c->layout));
  ASSERT_EQ(CheckPlan(spec, c->layout, c->memory, Options(0, 0, 64), &c->expected), "");
  ASSERT_EQ(c->expected.schedule.max_packed_run, 10u);
  ASSERT_EQ(c->expected.schedule.packed_bytes, 400u);
  ASSERT_EQ(c->expected.wire.size(), 700u);
}

// Source shorter than the extent, staging smaller than the largest packed run, a remote
// region too small (or an offset running past it), a schedule of another layout, and missing
// pieces are all refused with InvalidArgument, also when only one of several targets is bad,
// and write nothing; the connection then still works.
TEST_P(RegionTransferTest, BadInputWritesNothing) {
  ConnectPairs(2);
  ASSERT_FALSE(HasFailure());
  BadInputCase c;
  MakeBadInputCase(&c);
  ASSERT_FALSE(HasFailure());
  const Schedule& schedule = c.expected.schedule;
  Connection* client = pairs_[0].client.get();
  Connection* server = pairs_[0].server.get();
  LocalRegion source = Register(client, &c.memory);
  LocalRegion staging = Allocate(client, 4096, kLocalOnly);
  LocalRegion target = Allocate(server, 4096, kRemoteWrite);
  LocalRegion small = Allocate(server, schedule.wire_bytes - 1, kRemoteWrite);
  ASSERT_FALSE(HasFailure());
  RegionTarget good;
  good.connection = client;
  good.source = source;
  good.layout = &c.layout;
  good.schedule = &schedule;
  good.staging = staging;
  good.remote = server->Describe(target);
  good.remote_offset = 0;

  RegionLayout other;
  ASSERT_OK(RegionLayout::PointerMapped({{0, 10}, {100, 11}}, &other));
  Schedule other_schedule = PlanSchedule(other, schedule.options);
  RowMask fewer(c.layout.rows());
  for (uint64_t i = 1; i < c.layout.rows(); i++) fewer.Set(i);
  RegionLayout masked;
  ASSERT_OK(c.layout.WithMask(fewer, &masked));

  std::vector<std::pair<std::string, RegionTarget>> bad;
  auto add = [&](const std::string& what, auto change) {
    RegionTarget t = good;
    change(t);
    bad.emplace_back(what, t);
  };
  add("source one byte short",
      [&](RegionTarget& t) { t.source = Slice(source, 0, c.layout.extent() - 1); });
  add("staging below max_packed_run",
      [&](RegionTarget& t) { t.staging = Slice(staging, 0, schedule.max_packed_run - 1); });
  add("no staging", [&](RegionTarget& t) { t.staging = LocalRegion(); });
  add("remote region too small", [&](RegionTarget& t) { t.remote = server->Describe(small); });
  add("remote offset past the image's room",
      [&](RegionTarget& t) { t.remote_offset = target.length - schedule.wire_bytes + 1; });
  add("remote offset overflowing", [&](RegionTarget& t) { t.remote_offset = kMax64 - 100; });
  add("schedule of another layout", [&](RegionTarget& t) { t.schedule = &other_schedule; });
  add("schedule of the unmasked layout", [&](RegionTarget& t) { t.layout = &masked; });
  add("no layout", [&](RegionTarget& t) { t.layout = nullptr; });
  add("no schedule", [&](RegionTarget& t) { t.schedule = nullptr; });
  add("no connection", [&](RegionTarget& t) { t.connection = nullptr; });

  // A second, good target on another pair, listed first: it must not be written either.
  LocalRegion source2 = Register(pairs_[1].client.get(), &c.memory);
  LocalRegion staging2 = Allocate(pairs_[1].client.get(), 4096, kLocalOnly);
  LocalRegion target2 = Allocate(pairs_[1].server.get(), 4096, kRemoteWrite);
  ASSERT_FALSE(HasFailure());
  RegionTarget good2 = good;
  good2.connection = pairs_[1].client.get();
  good2.source = source2;
  good2.staging = staging2;
  good2.remote = pairs_[1].server->Describe(target2);

  for (const auto& [what, t] : bad) {
    RegionTarget one = t;
    EXPECT_TRUE(IsInvalid(WriteRegion(one, kTimeoutMs))) << what;
    RegionTarget two[2] = {good2, t};
    EXPECT_TRUE(IsInvalid(ScatterRegions(two, 2, kTimeoutMs))) << what << " (second of two)";
    ASSERT_TRUE(AllZero(target.addr, target.length)) << what;
    ASSERT_TRUE(AllZero(small.addr, small.length)) << what;
    ASSERT_TRUE(AllZero(target2.addr, target2.length)) << what;
  }
  EXPECT_TRUE(client->state().ok());
  EXPECT_TRUE(server->state().ok());
  // Nothing was posted, so the connections still work, at the very limits that were refused.
  RegionTarget tight = good;
  tight.source = Slice(source, 0, c.layout.extent());
  tight.staging = Slice(staging, 0, schedule.max_packed_run);
  tight.remote_offset = target.length - schedule.wire_bytes;
  ASSERT_OK(WriteRegion(tight, kTimeoutMs));
  EXPECT_EQ(CheckTarget(target, tight.remote_offset, c.layout, c.expected), "");
  RegionTarget two[2] = {good2, good};
  std::memset(target.addr, 0, target.length);
  ASSERT_OK(ScatterRegions(two, 2, kTimeoutMs));
  EXPECT_EQ(CheckTarget(target, 0, c.layout, c.expected), "");
  EXPECT_EQ(CheckTarget(target2, 0, c.layout, c.expected), "");
}

// A layout of only in-place runs needs no staging at all, and an empty layout moves nothing.
TEST_P(RegionTransferTest, NoPackedRunsNeedNoStaging) {
  ConnectPairs(1);
  ASSERT_FALSE(HasFailure());
  Connection* client = pairs_[0].client.get();
  Connection* server = pairs_[0].server.get();
  std::string memory(4096, '\0');
  FillPattern(memory.data(), memory.size(), 5);
  LocalRegion source = Register(client, &memory);
  LocalRegion target = Allocate(server, 4096, kRemoteWrite);
  ASSERT_FALSE(HasFailure());
  Spec spec;
  spec.kind = RegionKind::kStrided;
  spec.base = 3;
  spec.stride = 100;
  spec.rows = 30;
  spec.fields = {{0, 20}, {50, 30}};
  RegionLayout layout;
  ASSERT_OK(Build(spec, &layout));
  Expected expected;
  ASSERT_EQ(CheckPlan(spec, layout, memory, Options(0, 0, 20), &expected), "");
  ASSERT_EQ(expected.schedule.packed_bytes, 0u);
  RegionTarget t;
  t.connection = client;
  t.source = source;
  t.layout = &layout;
  t.schedule = &expected.schedule;
  t.remote = server->Describe(target);
  TransferStats stats;
  ASSERT_OK(WriteRegion(t, kTimeoutMs, &stats));
  EXPECT_EQ(CheckTarget(target, 0, layout, expected), "");
  EXPECT_EQ(stats.pieces, 60u);
  EXPECT_EQ(stats.packed_bytes, 0u);

  RegionLayout empty;
  ASSERT_OK(RegionLayout::PointerMapped({}, &empty));
  Schedule none = PlanSchedule(empty, ScheduleOptions{});
  std::memset(target.addr, 0, target.length);
  t.layout = &empty;
  t.schedule = &none;
  ASSERT_OK(WriteRegion(t, kTimeoutMs, &stats));
  EXPECT_TRUE(AllZero(target.addr, target.length));
}

// Packed runs whose total is far larger than the staging buffer (each run fitting) arrive
// intact, with staging exactly the largest packed run and a little more, and with packed and
// in-place runs interleaved.
TEST_P(RegionTransferTest, StagingIsReusedInChunks) {
  ConnectPairs(1);
  ASSERT_FALSE(HasFailure());
  Connection* client = pairs_[0].client.get();
  Connection* server = pairs_[0].server.get();
  std::string memory(1 << 20, '\0');
  FillPattern(memory.data(), memory.size(), 17);
  LocalRegion source = Register(client, &memory);
  LocalRegion staging = Allocate(client, 4096, kLocalOnly);
  LocalRegion target = Allocate(server, 1 << 20, kRemoteWrite);
  ASSERT_FALSE(HasFailure());
  Rng r(CaseSeed(8, 0));
  for (int layout_case = 0; layout_case < 4; layout_case++) {
    Spec spec;
    spec.kind = RegionKind::kPointerMapped;
    uint64_t pos = 0;
    for (int i = 0; i < 3000; i++) {
      uint64_t length = layout_case == 0 ? 10 : r.Uniform(1, 63);
      if (layout_case >= 2 && i % 3 == 0) length = r.Uniform(64, 200);  // in place
      spec.items.push_back({pos, length});
      pos += length + r.Uniform(1, 100);
    }
    if (layout_case == 3) std::reverse(spec.items.begin(), spec.items.end());
    RegionLayout layout;
    ASSERT_OK(Build(spec, &layout));
    Expected expected;
    ASSERT_EQ(CheckPlan(spec, layout, memory, Options(0, 0, 64), &expected), "");
    const Schedule& schedule = expected.schedule;
    ASSERT_GT(schedule.packed_bytes, 20 * schedule.max_packed_run);
    for (uint64_t staging_length : {schedule.max_packed_run, schedule.max_packed_run + 1,
                                    2 * schedule.max_packed_run + 3, uint64_t{4096}}) {
      SCOPED_TRACE("case " + std::to_string(layout_case) + " staging " +
                   std::to_string(staging_length));
      RegionTarget t;
      t.connection = client;
      t.source = source;
      t.layout = &layout;
      t.schedule = &schedule;
      t.staging = Slice(staging, 0, staging_length);
      t.remote = server->Describe(target);
      t.remote_offset = 8;
      TransferStats stats;
      ASSERT_OK(WriteRegion(t, kTimeoutMs, &stats));
      ASSERT_EQ(CheckTarget(target, 8, layout, expected), "");
      EXPECT_EQ(stats.packed_bytes, schedule.packed_bytes);
      EXPECT_EQ(stats.wire_bytes, schedule.wire_bytes);
      std::memset(target.addr, 0, expected.wire.size() + 8);
    }
  }
}

// Layouts of thousands of in-place runs, more than max_sge per request and, for the largest,
// more requests than max_outstanding, arrive intact.
TEST_P(RegionTransferTest, MorePiecesThanMaxSge) {
  ConnectPairs(1);
  ASSERT_FALSE(HasFailure());
  Connection* client = pairs_[0].client.get();
  Connection* server = pairs_[0].server.get();
  const uint64_t max_sge = client->max_sge();
  ASSERT_GT(max_sge, 0u);
  std::string memory(1 << 20, '\0');
  FillPattern(memory.data(), memory.size(), 23);
  LocalRegion source = Register(client, &memory);
  LocalRegion staging = Allocate(client, 4096, kLocalOnly);
  LocalRegion target = Allocate(server, 1 << 20, kRemoteWrite);
  ASSERT_FALSE(HasFailure());
  for (uint64_t runs : {max_sge - 1, max_sge, max_sge + 1, uint64_t{3000}, 300 * max_sge + 7}) {
    for (uint32_t min_in_place : {0u, 3u}) {
      SCOPED_TRACE("runs " + std::to_string(runs) + " min_in_place " +
                   std::to_string(min_in_place));
      // 1- or 2-byte items, one byte apart; with min_in_place 3 every run is packed but no two
      // packed runs are neighbours in the source.
      Spec spec;
      spec.kind = RegionKind::kPointerMapped;
      for (uint64_t i = 0; i < runs; i++) spec.items.push_back({i * 3, 1 + i % 2});
      RegionLayout layout;
      ASSERT_OK(Build(spec, &layout));
      Expected expected;
      ASSERT_EQ(CheckPlan(spec, layout, memory, Options(0, 0, min_in_place), &expected), "");
      ASSERT_EQ(expected.schedule.box_count(), runs);
      RegionTarget t;
      t.connection = client;
      t.source = source;
      t.layout = &layout;
      t.schedule = &expected.schedule;
      t.staging = staging;
      t.remote = server->Describe(target);
      TransferStats stats;
      ASSERT_OK(WriteRegion(t, kTimeoutMs, &stats));
      ASSERT_EQ(CheckTarget(target, 0, layout, expected), "");
      if (min_in_place == 0) {
        EXPECT_GE(stats.pieces, runs);
        EXPECT_GE(stats.requests, (runs + max_sge - 1) / max_sge);
        if (runs > 256 * max_sge) {
          EXPECT_GT(stats.requests, TransportOptions().max_outstanding);
        }
      }
      EXPECT_LE(stats.pieces, stats.requests * max_sge);
      std::memset(target.addr, 0, expected.wire.size());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, RegionTransferTest, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace slipstream::rdma
