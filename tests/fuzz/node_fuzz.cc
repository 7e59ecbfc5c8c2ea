// Fuzzes B+-tree node decoding (node.h), which every read of a level runs on bytes from the
// device: NodeView::Open must refuse anything but a node of consistent sizes, and once a node
// is open every entry must decode within the node's used bytes or be Corruption. Both with the
// checksum verified and without: the node check cache skips the checksum on later reads of a
// node, so the structural checks alone must keep a node whose bytes changed since in bounds
// (and a fuzzer rarely forges a CRC32C). Searches must answer within the node, and for a node
// whose keys are sorted, exactly as a plain bisection does.
#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "crc32c.h"
#include "fuzz_input.h"
#include "node.h"

namespace {

using namespace slipstream::engine;
using slipstream::fuzz::FuzzFailure;

// The node sizes Options accept: powers of two up to 64 KiB.
constexpr size_t kMaxNodeSize = 64u << 10;
// Search targets tried per node at most.
constexpr size_t kMaxTargets = 24;

// Stops the run with a message naming the broken property.
[[noreturn]] void Fail(const char* what) {
  FuzzFailure("node", what);
}

// Whether `view` lies within [lo, hi).
bool Within(std::string_view view, const char* lo, const char* hi) {
  return view.data() >= lo && view.data() <= hi && size_t(hi - view.data()) >= view.size();
}

// The first index whose key is >= target among keys known to be sorted, by plain bisection.
int PlainLowerBound(const std::vector<std::string_view>& keys, std::string_view target) {
  auto it = std::lower_bound(
      keys.begin(), keys.end(), target,
      [](std::string_view a, std::string_view b) { return CompareKeys(a, b) < 0; });
  return int(it - keys.begin());
}

// Decodes every entry of an open node; `keys` gets every key if all of them decode.
bool CheckEntries(const char* node, const NodeView& view, uint32_t used,
                  std::vector<std::string_view>* keys) {
  const char* data_start = node + kNodeHeaderSize + 2 * size_t(view.count());
  const char* limit = node + used;
  bool all = true;
  for (int i = 0; i < view.count(); i++) {
    std::string_view key;
    Status k = view.KeyAt(i, &key);
    if (!k.ok() && !k.IsCorruption()) Fail("KeyAt failed with something other than Corruption");
    if (k.ok() && !Within(key, data_start, limit)) Fail("KeyAt returned a key outside the node");
    if (view.is_leaf()) {
      LeafEntry e;
      Status s = view.Leaf(i, &e);
      if (!s.ok() && !s.IsCorruption()) Fail("Leaf failed with something other than Corruption");
      if (s.ok()) {
        if (!k.ok() || key.data() != e.key.data() || key.size() != e.key.size()) {
          Fail("Leaf decoded a key KeyAt does not");
        }
        if (!IsValidValueKind(uint8_t(e.kind))) Fail("Leaf returned a bad value kind");
        if ((e.kind == ValueKind::kInline || e.kind == ValueKind::kLargePatch) &&
            !Within(e.inline_value, data_start, limit)) {
          Fail("Leaf returned a value outside the node");
        }
        if (e.kind == ValueKind::kLargePatch && (e.inline_value.size() > LargePatch::kMaxPrefix ||
                                                 e.inline_value.size() > e.ptr.value_size)) {
          Fail("Leaf returned a patch longer than the limit or its value");
        }
        if ((e.kind == ValueKind::kMediumPtr || RefersToLargeLog(e.kind)) &&
            !Within(std::string_view(e.key.data() + e.key.size(), ValuePtr::kEncodedSize),
                    data_start, limit)) {
          Fail("Leaf read a value pointer outside the node");
        }
      }
    } else {
      std::string_view index_key;
      DevPtr child;
      Status s = view.Index(i, &index_key, &child);
      if (!s.ok() && !s.IsCorruption()) Fail("Index failed with something other than Corruption");
      if (s.ok()) {
        if (!k.ok() || key.data() != index_key.data() || key.size() != index_key.size()) {
          Fail("Index decoded a key KeyAt does not");
        }
        if (!Within(std::string_view(index_key.data(), index_key.size() + 8), data_start, limit)) {
          Fail("Index read a child pointer outside the node");
        }
      }
    }
    if (k.ok()) {
      keys->push_back(key);
    } else {
      all = false;
    }
  }
  return all;
}

// Searches the node for a few targets near its keys: answers stay in [0, count], and when the
// keys are sorted they are plain bisection's, whatever bounds LowerBoundWithin is given.
void CheckSearches(const NodeView& view, const std::vector<std::string_view>& keys, bool decoded) {
  bool sorted = decoded;
  for (size_t i = 1; sorted && i < keys.size(); i++) {
    sorted = CompareKeys(keys[i - 1], keys[i]) < 0;
  }
  std::vector<std::string> targets = {std::string(), std::string(8, '\xff')};
  size_t step = std::max<size_t>(1, keys.size() / (kMaxTargets / 3));
  for (size_t i = 0; i < keys.size(); i += step) {
    targets.emplace_back(keys[i]);
    targets.push_back(std::string(keys[i]) + '\0');
    if (!keys[i].empty()) targets.emplace_back(keys[i].substr(0, keys[i].size() - 1));
  }
  for (size_t t = 0; t < targets.size(); t++) {
    const std::string& target = targets[t];
    int index = -1;
    Status s = view.LowerBound(target, &index);
    if (!s.ok() && !s.IsCorruption())
      Fail("LowerBound failed with something other than Corruption");
    if (s.ok() && (index < 0 || index > view.count())) Fail("LowerBound answered outside the node");
    if (decoded && !s.ok()) Fail("LowerBound failed on a node whose keys all decode");
    if (sorted && index != PlainLowerBound(keys, target)) Fail("LowerBound answered wrongly");
    // Bounds that are right, and bounds that are wrong (only speed may suffer).
    std::string_view low = keys.empty() ? std::string_view() : keys[t % keys.size()];
    std::string_view high = keys.empty() ? std::string_view() : keys[(t * 7 + 3) % keys.size()];
    for (auto [lo, hi] : {std::pair{low, high}, std::pair{high, low}}) {
      index = -1;
      s = view.LowerBoundWithin(target, lo, hi, &index);
      if (!s.ok() && !s.IsCorruption()) Fail("LowerBoundWithin failed with another error");
      if (s.ok() && (index < 0 || index > view.count())) Fail("LowerBoundWithin answered outside");
      if (decoded && !s.ok()) Fail("LowerBoundWithin failed on a node whose keys all decode");
      if (sorted && index != PlainLowerBound(keys, target)) Fail("LowerBoundWithin was wrong");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A node of the smallest power-of-two size that holds the input, zero-padded as the builder
  // pads; allocated to exactly that size, so that a read past the node is caught.
  size_t node_size = std::bit_ceil(std::max(std::min(size, kMaxNodeSize), kNodeHeaderSize));
  std::vector<char> node(node_size, '\0');
  std::memcpy(node.data(), data, std::min(size, node_size));
  NodeHeader h;
  std::memcpy(&h, node.data(), sizeof(h));

  NodeView checked, unchecked;
  Status with_crc = NodeView::Open(node.data(), uint32_t(node_size), true, &checked);
  Status without_crc = NodeView::Open(node.data(), uint32_t(node_size), false, &unchecked);
  if (with_crc.ok() && !without_crc.ok()) Fail("a node passed the checksum but not the structure");
  if (!without_crc.ok() && !without_crc.IsCorruption()) Fail("Open failed with another error");
  if (!with_crc.ok() && !with_crc.IsCorruption()) Fail("Open failed with another error");
  if (!without_crc.ok()) return 0;
  if (with_crc.ok() && crc32c::Value(node.data() + 8, h.used - 8) != h.crc) {
    Fail("a node with a wrong checksum was accepted");
  }
  if (h.count == 0 || h.used > node_size || kNodeHeaderSize + 2 * size_t(h.count) > h.used ||
      unchecked.count() != h.count || unchecked.is_leaf() != (h.magic == kLeafMagic) ||
      (h.magic != kLeafMagic && h.magic != kIndexMagic) || unchecked.is_leaf() != (h.height == 0)) {
    Fail("Open accepted impossible header fields");
  }
  std::vector<std::string_view> keys;
  bool decoded = CheckEntries(node.data(), unchecked, h.used, &keys);
  CheckSearches(unchecked, keys, decoded);
  return 0;
}
