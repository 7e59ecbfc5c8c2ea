// Fuzzes the readers of a level's B+-tree on the device (btree.h): point lookups (TreeGet, with
// and without a leaf finger), the iterator, size estimates (TreeRangeBytes) and the bloom
// filter probe (TreeMayContain), over index and bloom segments and a level descriptor taken
// from the input, with node checksums verified and not (the node check cache skips them on
// later reads). Every reader must end, within bounds, with its answer or Corruption; and on a
// tree that passes a structural check like Engine::Verify's, they must agree with each other.
//
// Input: a LevelDesc as stored in the manifest, then the image of index segment 1 (owned by
// tree kTreeId) and bloom segment 2, each kSegmentSize bytes, zero-padded. Segment 3 holds a
// copy of segment 1 owned by another tree, segment 4 is a large-log segment.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "btree.h"
#include "coding.h"
#include "engine_fixture.h"
#include "fuzz_input.h"
#include "shared_state.h"

namespace {

using namespace slipstream::engine;
using slipstream::fuzz::DeviceFile;
using slipstream::fuzz::FuzzFailure;
using slipstream::fuzz::FuzzInput;

constexpr uint32_t kNodeSize = 512;
constexpr uint32_t kSegmentSize = 8192;
constexpr uint32_t kDeviceSegments = 6;
constexpr uint32_t kTreeId = 7;
constexpr uint32_t kIndexSegment = 1;
constexpr uint32_t kBloomSegment = 2;
constexpr uint32_t kForeignSegment = 3;
constexpr uint32_t kLargeSegment = 4;
// The most entries a tree in one index segment can hold: every slot a leaf of as many entries as
// a node has room for offsets. An iterator that yields more has visited a leaf twice.
constexpr size_t kMaxEntries = (kSegmentSize / kNodeSize) * ((kNodeSize - kNodeHeaderSize) / 2);
// Node visits the structural check makes at most (a sound tree has one per slot).
constexpr size_t kMaxVisits = 4 * (kSegmentSize / kNodeSize);
// Lookup targets per input at most.
constexpr size_t kMaxTargets = 24;

// Stops the run with a message naming the broken property.
[[noreturn]] void Fail(const char* what, const Status& s = Status::OK()) {
  FuzzFailure("tree", what, s);
}

// Fails unless `s` is OK or Corruption.
void ExpectOkOrCorruption(const Status& s, const char* who) {
  if (!s.ok() && !s.IsCorruption()) Fail(who, s);
}

// A device file in a private directory (engine_fixture.h) with the segments above, and their
// table; made once per process, its two fuzzed segments rewritten for every input.
class Store {
 public:
  // Makes the device file and the segment table.
  Store() : file_("tree", "tree-fuzz", kSegmentSize, kDeviceSegments) {
    table_.assign(kDeviceSegments, SegmentInfo{});
    table_[0].kind = uint8_t(SegmentKind::kReserved);
    table_[kIndexSegment] = SegmentInfo{uint8_t(SegmentKind::kIndex), 1, 0, kTreeId, 0, 0, 0};
    table_[kBloomSegment] = SegmentInfo{uint8_t(SegmentKind::kBloom), 1, 0, kTreeId, 0, 0, 0};
    table_[kForeignSegment] = SegmentInfo{uint8_t(SegmentKind::kIndex), 2, 0, kTreeId + 1, 0, 0, 0};
    table_[kLargeSegment].kind = uint8_t(SegmentKind::kLargeLog);
    image_.assign(2 * kSegmentSize, '\0');
  }
  // Writes the index and bloom segments (and the foreign copy of the index segment).
  void Place(std::string_view image) {
    size_t n = std::min<size_t>(image.size(), image_.size());
    size_t span = std::max(n, dirty_);
    std::memcpy(image_.data(), image.data(), n);
    std::memset(image_.data() + n, 0, span - n);
    file_.Write(kIndexSegment, image_.data(), span);
    file_.Write(kForeignSegment, image_.data(), std::min<size_t>(span, kSegmentSize));
    dirty_ = n;
  }

  // A reader's context over the device, verifying node checksums or not.
  TreeContext Context(bool verify_crc) const {
    return TreeContext{file_.device(), table_.data(), kDeviceSegments, kNodeSize,
                       kSegmentSize,   verify_crc,    nullptr};
  }

 private:
  DeviceFile file_;
  std::vector<SegmentInfo> table_;
  std::string image_;
  size_t dirty_ = 0;
};

// The structural check of verify.cc's TreeChecker, on a budget of node visits: heights match
// depths, keys increase within nodes and across leaves, each child starts with its pivot and
// stays below the next one, every entry decodes. Collects the leaf keys in order.
class Checker {
 public:
  Checker(const TreeContext& ctx, const LevelDesc& desc) : ctx_(ctx), desc_(desc) {}

  // True if the tree is sound; its leaf keys, in order, go to `keys`.
  bool Run(std::vector<std::string>* keys) {
    keys_ = keys;
    return Walk(desc_.root, desc_.height, std::string_view(), nullptr);
  }

 private:
  // Checks the subtree at p, whose keys must lie in [low, high) and whose root is at `height`.
  bool Walk(DevPtr p, uint32_t height, std::string_view low, const std::string* high) {
    if (++visits_ > kMaxVisits) return false;
    NodeView node;
    if (!ctx_.OpenNode(p, desc_, &node).ok() || node.height() != height) return false;
    std::string prev;
    for (int i = 0; i < node.count(); i++) {
      std::string_view key;
      if (!node.KeyAt(i, &key).ok()) return false;
      if ((i > 0 && key <= prev) || key < low || (high && key >= *high)) return false;
      if (i == 0 && !low.empty() && key != low) return false;
      prev.assign(key);
      if (node.is_leaf()) {
        LeafEntry e;
        if (!node.Leaf(i, &e).ok()) return false;
        if (!keys_->empty() && e.key <= keys_->back()) return false;
        keys_->emplace_back(e.key);
        continue;
      }
      DevPtr child;
      std::string_view pivot;
      if (!node.Index(i, &pivot, &child).ok()) return false;
      std::string next;
      const std::string* child_high = high;
      if (i + 1 < node.count()) {
        std::string_view np;
        if (!node.KeyAt(i + 1, &np).ok()) return false;
        next.assign(np);
        child_high = &next;
      }
      if (!Walk(child, height - 1, std::string(pivot), child_high)) return false;
    }
    return true;
  }

  const TreeContext& ctx_;
  const LevelDesc& desc_;
  std::vector<std::string>* keys_ = nullptr;
  size_t visits_ = 0;
};

// Runs every reader over the tree in one context.
void CheckTree(const TreeContext& ctx, const LevelDesc& desc) {
  std::vector<std::string> sound_keys;
  bool sound = desc.tree_id != 0 && Checker(ctx, desc).Run(&sound_keys);

  // The iterator: a sound tree's keys, or Corruption; keys strictly increasing, and never more
  // of them than the tree has room for.
  std::vector<std::string> iterated;
  TreeIterator it(ctx, desc);
  for (it.SeekToFirst(); it.Valid(); it.Next()) {
    if (iterated.size() == kMaxEntries)
      Fail("the iterator yields more entries than the tree holds");
    if (!iterated.empty() && it.entry().key <= iterated.back()) Fail("the iterator went backwards");
    iterated.emplace_back(it.entry().key);
  }
  ExpectOkOrCorruption(it.status(), "the iterator failed with something other than Corruption");
  if (sound && (!it.status().ok() || iterated != sound_keys)) {
    Fail("the iterator disagrees with the structural check", it.status());
  }

  // Lookups of keys seen, of keys between them, and at both ends.
  std::vector<std::string> targets = {std::string(), std::string(12, '\xff')};
  size_t step = std::max<size_t>(1, iterated.size() / (kMaxTargets / 2));
  for (size_t i = 0; i < iterated.size(); i += step) {
    targets.push_back(iterated[i]);
    targets.push_back(iterated[i] + '\0');
  }
  LeafFinger finger;
  for (const std::string& target : targets) {
    for (LeafFinger* f : {static_cast<LeafFinger*>(nullptr), &finger}) {
      bool found = false;
      LeafEntry entry;
      Status s = TreeGet(ctx, desc, target, &found, &entry, f);
      ExpectOkOrCorruption(s, "TreeGet failed with something other than Corruption");
      if (s.ok() && found && entry.key != target) Fail("TreeGet found another key");
      if (sound) {
        bool present = std::binary_search(sound_keys.begin(), sound_keys.end(), target);
        if (!s.ok() || found != present) Fail("TreeGet disagrees with the structural check", s);
      }
    }
    TreeMayContain(ctx, desc, HashKey(target));
  }

  // Size estimates: finite and non-negative.
  for (size_t i = 0; i + 1 < targets.size(); i += 2) {
    double bytes = -1;
    Status s = TreeRangeBytes(ctx, desc, targets[i], targets[i + 1], &bytes);
    ExpectOkOrCorruption(s, "TreeRangeBytes failed with something other than Corruption");
    if (s.ok() && !(std::isfinite(bytes) && bytes >= 0)) Fail("TreeRangeBytes estimated nonsense");
    if (sound && !s.ok()) Fail("TreeRangeBytes failed on a sound tree", s);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Destroyed at exit, which removes its directory.
  static Store instance;
  Store* store = &instance;
  FuzzInput in(data, size);
  LevelDesc desc;
  if (!in.TakeRaw(&desc)) return 0;
  store->Place(in.rest());
  CheckTree(store->Context(true), desc);
  CheckTree(store->Context(false), desc);
  return 0;
}
