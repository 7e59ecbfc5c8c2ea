// Options: range checks generated from settings.def, the rules that tie fields together, and
// the arena size (which is 0 for options Engine::Open would refuse).
#include <cstdio>
#include <limits>
#include <string>
#include <type_traits>

#include "arena_layout.h"
#include "format.h"
#include "node.h"
#include "options_internal.h"
#include "shared_state.h"
#include "slipstream/engine/engine.h"

namespace slipstream::engine {

static_assert(kMaxLevels == SS_SETTINGS_MAX_LEVELS, "kMaxLevels comes from settings.def");
static_assert(kMaxMemtables == SS_SETTINGS_MAX_MEMTABLES, "memtables' bound is settings.def's");

// A host may offer a narrower range (or another default) than the engine accepts, never a
// wider one: every value a host accepts must open the engine.
#define SS_SETTING(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, CONTEXT, DESCRIPTION)
#define SS_SETTING_HOST(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, HOST_DEFAULT, HOST_MIN,   \
                        HOST_MAX, CONTEXT, DESCRIPTION)                                       \
  static_assert((HOST_MIN) >= (MIN) && (HOST_MAX) <= (MAX) && (HOST_DEFAULT) >= (HOST_MIN) && \
                    (HOST_DEFAULT) <= (HOST_MAX),                                             \
                "the host range of " NAME " must lie inside the engine's");
#include "slipstream/engine/settings.def"

namespace {

bool IsPowerOfTwo(uint64_t v) {
  return v && !(v & (v - 1));
}

// Whether a field holds a value from min to max (counted in the table's unit) inclusive; NaN
// is in no range.
template <typename T, typename Bound>
bool InRange(T value, Bound min, Bound max, uint64_t scale) {
  if constexpr (std::is_floating_point_v<T>) {
    return value >= double(min) * double(scale) && value <= double(max) * double(scale);
  } else {
    return uint64_t(value) >= uint64_t(min) * scale && uint64_t(value) <= uint64_t(max) * scale;
  }
}

// A bound as the table writes it (the smallest positive double reads "0 (exclusive)").
template <typename Bound>
std::string BoundText(Bound b) {
  if constexpr (std::is_floating_point_v<Bound>) {
    if (b == std::numeric_limits<double>::denorm_min()) return "0 (exclusive)";
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", double(b));
    return buf;
  } else {
    return std::to_string(uint64_t(b));
  }
}

// The message for a setting outside its range.
template <typename Bound>
Status OutOfRange(const char* name, Bound min, Bound max, const char* unit) {
  return Status::InvalidArgument(std::string(name) + " must be in " + BoundText(min) + ".." +
                                 BoundText(max) + unit);
}

}  // namespace

// Every limit a user can set, with the reason it exists: first each setting's own range
// (settings.def), then the rules between fields.
Status ValidateOptions(const Options& o) {
  auto bad = [](const std::string& m) { return Status::InvalidArgument(m); };
  if (o.directory.empty()) return bad("directory is empty");
#define SS_SETTING(NAME, FIELD, KIND, UNIT, DEFAULT, MIN, MAX, CONTEXT, DESCRIPTION) \
  if (!InRange(o.FIELD, MIN, MAX, SS_SCALE_##UNIT)) {                                \
    return OutOfRange(NAME, MIN, MAX, SS_UNIT_NAME_##UNIT);                          \
  }
#include "slipstream/engine/settings.def"
  if (!IsPowerOfTwo(o.segment_size)) return bad("segment_size must be a power of two");
  if (!IsPowerOfTwo(o.node_size) || o.node_size > o.segment_size / 8) {
    return bad("node_size must be a power of two and at most segment_size/8");
  }
  if (o.max_key_size < 1 || o.max_key_size > 4096) return bad("max_key_size must be 1..4096");
  if (o.small_threshold >= o.large_threshold) {
    return bad("small_threshold must be below large_threshold");
  }
  // Three of the biggest in-place entries (a medium value just below large_threshold, or a
  // pointer) must fit in one node, so that every B+-tree layer shrinks.
  uint64_t biggest = 16 + o.max_key_size + kKeyspacePrefix + o.large_threshold + 16;
  if (3 * biggest + kNodeHeaderSize > o.node_size) {
    return bad("node_size too small for max_key_size and large_threshold (3 entries must fit)");
  }
  if (o.max_value_size < 1 || o.max_value_size > o.segment_size / 2) {
    return bad("max_value_size must be 1..segment_size/2 (a large value lives in one segment)");
  }
  if (o.medium_inplace_level > o.max_levels) {
    return bad("medium_inplace_level must be 0..max_levels");
  }
  if (o.max_device_size % o.segment_size != 0 || o.max_device_size / o.segment_size < 16 ||
      o.max_device_size / o.segment_size > (1ull << 31)) {
    return bad("max_device_size must be a multiple of segment_size, 16..2^31 segments");
  }
  return Status::OK();
}

size_t Engine::ArenaSize(const Options& options) {
  if (!ValidateOptions(options).ok()) return 0;
  return ArenaLayout::For(options).total;
}

}  // namespace slipstream::engine
