// Node encoding and bounds-checked decoding.
#include "node.h"

#include <algorithm>
#include <cstring>

#include "coding.h"
#include "crc32c.h"

namespace slipstream::engine {

size_t NodeBuilder::LeafEntrySize(const LeafEntry& e) {
  size_t n = 1 + VarintLength(uint32_t(e.key.size())) + e.key.size();
  if (e.kind == ValueKind::kInline) {
    n += VarintLength(uint32_t(e.inline_value.size())) + e.inline_value.size();
  } else if (e.kind == ValueKind::kLargePatch) {
    n += VarintLength(uint32_t(e.inline_value.size())) + LargePatch::kFixedSize +
         e.inline_value.size();
  } else if (e.kind != ValueKind::kTombstone) {
    n += ValuePtr::kEncodedSize;
  }
  return n;
}

void NodeBuilder::AddLeaf(const LeafEntry& e) {
  offsets_.push_back(uint32_t(data_.size()));
  char buf[16];
  data_.push_back(char(e.kind));
  data_.append(buf, EncodeVarint32(buf, uint32_t(e.key.size())) - buf);
  if (e.kind == ValueKind::kInline) {
    data_.append(buf, EncodeVarint32(buf, uint32_t(e.inline_value.size())) - buf);
  } else if (e.kind == ValueKind::kLargePatch) {
    data_.append(buf, EncodeVarint32(buf, uint32_t(e.inline_value.size())) - buf);
  }
  data_.append(e.key);
  if (e.kind == ValueKind::kInline) {
    data_.append(e.inline_value);
  } else if (e.kind == ValueKind::kLargePatch) {
    e.ptr.EncodeTo(buf);
    data_.append(buf, ValuePtr::kEncodedSize);
    data_.push_back(e.owner ? 1 : 0);
    data_.append(e.inline_value);
  } else if (e.kind != ValueKind::kTombstone) {
    e.ptr.EncodeTo(buf);
    data_.append(buf, ValuePtr::kEncodedSize);
  }
}

void NodeBuilder::AddIndex(std::string_view key, DevPtr child) {
  offsets_.push_back(uint32_t(data_.size()));
  char buf[16];
  data_.append(buf, EncodeVarint32(buf, uint32_t(key.size())) - buf);
  data_.append(key);
  EncodeFixed32(buf, child.segment);
  EncodeFixed32(buf + 4, child.offset);
  data_.append(buf, 8);
}

// Header, offsets rebased to the node start, entries, zero padding, CRC last.
void NodeBuilder::Finish(char* dst, uint16_t height, uint32_t tree_id) {
  uint32_t data_start = uint32_t(kNodeHeaderSize + 2 * offsets_.size());
  NodeHeader h{};
  h.magic = leaf_ ? kLeafMagic : kIndexMagic;
  h.count = uint16_t(offsets_.size());
  h.height = height;
  h.used = uint32_t(data_start + data_.size());
  h.tree_id = tree_id;
  for (size_t i = 0; i < offsets_.size(); i++) {
    auto off = uint16_t(data_start + offsets_[i]);
    std::memcpy(dst + kNodeHeaderSize + 2 * i, &off, 2);
  }
  std::memcpy(dst + data_start, data_.data(), data_.size());
  std::memset(dst + h.used, 0, node_size_ - h.used);
  std::memcpy(dst, &h, sizeof(h));
  h.crc = crc32c::Value(dst + 8, h.used - 8);
  std::memcpy(dst, &h, sizeof(h));
  offsets_.clear();
  data_.clear();
}

Status NodeView::Open(const char* node, uint32_t node_size, bool verify_crc, NodeView* view) {
  std::memcpy(&view->header_, node, sizeof(NodeHeader));
  const NodeHeader& h = view->header_;
  if (h.magic != kLeafMagic && h.magic != kIndexMagic) return Status::Corruption("bad node magic");
  view->data_start_ = uint32_t(kNodeHeaderSize + 2 * uint32_t(h.count));
  if (h.used > node_size || h.used < view->data_start_ || h.count == 0) {
    return Status::Corruption("impossible node sizes");
  }
  if ((h.magic == kLeafMagic) != (h.height == 0)) return Status::Corruption("bad node height");
  if (verify_crc && crc32c::Value(node + 8, h.used - 8) != h.crc) {
    return Status::Corruption("bad node checksum");
  }
  view->node_ = node;
  return Status::OK();
}

Status NodeView::Leaf(int i, LeafEntry* e) const {
  uint16_t off = DecodeFixed16(node_ + kNodeHeaderSize + 2 * i);
  const char* p = node_ + off;
  const char* limit = node_ + header_.used;
  if (off < data_start_ || p >= limit) return Status::Corruption("leaf entry out of node");
  uint8_t kind = uint8_t(*p++);
  if (!IsValidValueKind(kind)) return Status::Corruption("bad value kind");
  e->kind = static_cast<ValueKind>(kind);
  uint32_t key_size, value_size = 0;
  p = DecodeVarint32(p, limit, &key_size);
  if (p && (e->kind == ValueKind::kInline || e->kind == ValueKind::kLargePatch))
    p = DecodeVarint32(p, limit, &value_size);
  if (!p || uint64_t(limit - p) < uint64_t(key_size))
    return Status::Corruption("leaf key out of node");
  e->key = std::string_view(p, key_size);
  p += key_size;
  e->owner = true;
  if (e->kind == ValueKind::kInline) {
    if (uint64_t(limit - p) < value_size) return Status::Corruption("leaf value out of node");
    e->inline_value = std::string_view(p, value_size);
  } else if (e->kind == ValueKind::kLargePatch) {
    if (uint64_t(limit - p) < LargePatch::kFixedSize + uint64_t(value_size) ||
        !LargePatch::DecodeFrom(std::string_view(p, LargePatch::kFixedSize + value_size), &e->ptr,
                                &e->owner, &e->inline_value)) {
      return Status::Corruption("leaf patch out of node");
    }
  } else if (e->kind != ValueKind::kTombstone) {
    if (limit - p < ptrdiff_t(ValuePtr::kEncodedSize))
      return Status::Corruption("leaf pointer out of node");
    e->ptr = ValuePtr::DecodeFrom(p);
  }
  return Status::OK();
}

Status NodeView::Index(int i, std::string_view* key, DevPtr* child) const {
  uint16_t off = DecodeFixed16(node_ + kNodeHeaderSize + 2 * i);
  const char* p = node_ + off;
  const char* limit = node_ + header_.used;
  if (off < data_start_ || p >= limit) return Status::Corruption("index entry out of node");
  uint32_t key_size;
  p = DecodeVarint32(p, limit, &key_size);
  if (!p || uint64_t(limit - p) < uint64_t(key_size) + 8) {
    return Status::Corruption("index key out of node");
  }
  *key = std::string_view(p, key_size);
  child->segment = DecodeFixed32(p + key_size);
  child->offset = DecodeFixed32(p + key_size + 4);
  return Status::OK();
}

// Decodes entry i only as far as its key, which is all a search compares.
Status NodeView::KeyAt(int i, std::string_view* key) const {
  uint16_t off = DecodeFixed16(node_ + kNodeHeaderSize + 2 * i);
  const char* p = node_ + off;
  const char* limit = node_ + header_.used;
  bool leaf = is_leaf();
  if (off < data_start_ || p >= limit) {
    return Status::Corruption(leaf ? "leaf entry out of node" : "index entry out of node");
  }
  uint32_t key_size;
  if (leaf) {
    uint8_t kind = uint8_t(*p++);
    if (!IsValidValueKind(kind)) return Status::Corruption("bad value kind");
    p = DecodeVarint32(p, limit, &key_size);
    uint32_t value_size;
    if (p && (static_cast<ValueKind>(kind) == ValueKind::kInline ||
              static_cast<ValueKind>(kind) == ValueKind::kLargePatch))
      p = DecodeVarint32(p, limit, &value_size);
  } else {
    p = DecodeVarint32(p, limit, &key_size);
  }
  if (!p || uint64_t(limit - p) < uint64_t(key_size)) {
    return Status::Corruption(leaf ? "leaf key out of node" : "index key out of node");
  }
  *key = std::string_view(p, key_size);
  return Status::OK();
}

namespace {

// The 8 bytes of `key` from `at` on as a big-endian number (zeroes past its end), so that
// numbers compare as the keys' bytes do there.
uint64_t KeyBitsAt(std::string_view key, size_t at) {
  uint64_t bits = 0;
  for (size_t i = 0; i < 8; i++) {
    bits <<= 8;
    if (at + i < key.size()) bits |= uint8_t(key[at + i]);
  }
  return bits;
}

// Where `target` would sit among `count` keys spread evenly from `first` to `last` (both
// sharing every byte before the first one they differ in, as any key between them does).
int Interpolate(std::string_view first, std::string_view last, std::string_view target, int count) {
  size_t common = 0;
  size_t shorter = std::min(first.size(), last.size());
  while (common < shorter && first[common] == last[common]) common++;
  uint64_t lo = KeyBitsAt(first, common);
  uint64_t hi = KeyBitsAt(last, common);
  uint64_t at = KeyBitsAt(target, common);
  if (hi <= lo || at <= lo) return 0;
  if (at >= hi) return count - 1;
  return int(double(at - lo) / double(hi - lo) * double(count - 1));
}

}  // namespace

// Keys of a node are mostly evenly spread (row ids are dense), so the search starts where
// interpolation between the first and last keys puts the target, gallops out from there until
// the answer is bracketed and finishes by bisection: two or three probes of a leaf of dense
// keys instead of log2(count), each a likely cache miss, and never more than twice a plain
// bisection's for keys spread any other way.
Status NodeView::LowerBound(std::string_view target, int* index) const {
  int count = header_.count;
  std::string_view first, last;
  Status s = KeyAt(0, &first);
  if (s.ok()) s = KeyAt(count - 1, &last);
  if (!s.ok()) return s;
  if (CompareKeys(first, target) >= 0) {
    *index = 0;
    return Status::OK();
  }
  if (CompareKeys(last, target) < 0) {
    *index = count;
    return Status::OK();
  }
  return Search(target, Interpolate(first, last, target, count), index);
}

Status NodeView::LowerBoundWithin(std::string_view target, std::string_view low,
                                  std::string_view high, int* index) const {
  return Search(target, Interpolate(low, high, target, header_.count), index);
}

// Keeps the answer in [lo, hi] (hi = count: none so far is >= target), probing from the guess
// outwards by doubling steps, then bisects.
Status NodeView::Search(std::string_view target, int guess, int* index) const {
  int lo = 0, hi = header_.count;
  std::string_view key;
  Status s;
  guess = std::clamp(guess, 0, hi - 1);
  if (!(s = KeyAt(guess, &key)).ok()) return s;
  if (CompareKeys(key, target) >= 0) {
    hi = guess;
    for (int step = 1; hi - step >= lo; step *= 2) {
      if (!(s = KeyAt(hi - step, &key)).ok()) return s;
      if (CompareKeys(key, target) < 0) {
        lo = hi - step + 1;
        break;
      }
      hi -= step;
    }
  } else {
    lo = guess + 1;
    for (int step = 1; lo + step - 1 < hi; step *= 2) {
      int probe = lo + step - 1;
      if (!(s = KeyAt(probe, &key)).ok()) return s;
      if (CompareKeys(key, target) >= 0) {
        hi = probe;
        break;
      }
      lo = probe + 1;
    }
  }
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (!(s = KeyAt(mid, &key)).ok()) return s;
    if (CompareKeys(key, target) < 0) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  *index = lo;
  return Status::OK();
}

}  // namespace slipstream::engine
