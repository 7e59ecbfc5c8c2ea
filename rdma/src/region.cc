// Declarative regions: building and checking layouts, their encoding, and the fragment walk.
#include "slipstream/rdma/region.h"

#include <bit>
#include <cstring>
#include <utility>

namespace slipstream::rdma {

namespace {

// a + b into *out; false on overflow.
bool Add(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

// a * b into *out; false on overflow.
bool Mul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

// The bits of the last mask word that lie below `rows`.
uint64_t TailBits(uint64_t rows) {
  return rows % 64 == 0 ? ~uint64_t{0} : (uint64_t{1} << (rows % 64)) - 1;
}

// Appends `value` as a LEB128 varint.
void PutVarint(std::string* out, uint64_t value) {
  if (value < 0x80) {  // the common case of a batch's layout
    out->push_back(static_cast<char>(value));
    return;
  }
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// Reads a LEB128 varint from the front of *in; false when truncated, longer than 64 bits, or
// overlong (a last byte of 0 after others): PutVarint writes each value one way only, so a
// layout has one encoding and Decode accepts nothing else.
bool GetVarint(std::string_view* in, uint64_t* value) {
  if (!in->empty() && static_cast<uint8_t>(in->front()) < 0x80) {  // one byte
    *value = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    return true;
  }
  uint64_t result = 0;
  for (int shift = 0; shift < 64 && !in->empty(); shift += 7) {
    uint8_t byte = static_cast<uint8_t>(in->front());
    in->remove_prefix(1);
    if (shift == 63 && byte > 1) return false;
    result |= uint64_t(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      if (byte == 0 && shift > 0) return false;
      *value = result;
      return true;
    }
  }
  return false;
}

// A signed difference as an unsigned varint value: small magnitudes of either sign stay small.
uint64_t ZigZag(uint64_t difference) {
  return (difference << 1) ^ (0 - (difference >> 63));
}

// The difference ZigZag encoded (modulo 2^64).
uint64_t UnZigZag(uint64_t value) {
  return (value >> 1) ^ (0 - (value & 1));
}

// Reads a varint that must fit 32 bits.
bool GetVarint32(std::string_view* in, uint32_t* value) {
  uint64_t v = 0;
  if (!GetVarint(in, &v) || v > UINT32_MAX) return false;
  *value = static_cast<uint32_t>(v);
  return true;
}

constexpr uint8_t kMaskedFlag = 1;

}  // namespace

uint64_t RowMask::Count() const {
  uint64_t count = 0;
  for (size_t i = 0; i < words_.size(); i++) {
    uint64_t word = words_[i];
    if (i + 1 == words_.size()) word &= TailBits(rows_);
    count += std::popcount(word);
  }
  return count;
}

std::vector<RowMask> MasksByOwner(const std::vector<uint32_t>& owner, uint32_t targets) {
  std::vector<RowMask> masks(targets, RowMask(owner.size()));
  for (size_t row = 0; row < owner.size(); row++) {
    if (owner[row] < targets) masks[owner[row]].Set(row);
  }
  return masks;
}

Status RegionLayout::Strided(uint64_t base, uint64_t stride, uint64_t rows,
                             std::vector<Field> fields, RegionLayout* out) {
  if (fields.empty()) return Status::InvalidArgument("a strided region needs at least one field");
  uint64_t end = 0;
  for (const Field& field : fields) {
    if (field.length == 0) return Status::InvalidArgument("empty field in a strided region");
    if (field.offset < end) {
      return Status::InvalidArgument("fields of a strided region must ascend without overlap");
    }
    end = uint64_t(field.offset) + field.length;
  }
  if (stride == 0 || end > stride) {
    return Status::InvalidArgument("every field must lie inside the stride");
  }
  RegionLayout layout;
  layout.kind_ = RegionKind::kStrided;
  layout.base_ = base;
  layout.stride_ = stride;
  layout.rows_ = rows;
  layout.fields_ = std::move(fields);
  if (!layout.Summarize()) return Status::InvalidArgument("strided region overflows 64 bits");
  *out = std::move(layout);
  return Status::OK();
}

Status RegionLayout::Bitmapped(std::vector<Column> columns, uint64_t rows, RegionLayout* out) {
  if (columns.empty()) return Status::InvalidArgument("a bitmapped region needs a column");
  for (const Column& column : columns) {
    if (column.width == 0) return Status::InvalidArgument("zero-width column");
  }
  RegionLayout layout;
  layout.kind_ = RegionKind::kBitmapped;
  layout.rows_ = rows;
  layout.columns_ = std::move(columns);
  if (!layout.Summarize()) return Status::InvalidArgument("bitmapped region overflows 64 bits");
  *out = std::move(layout);
  return Status::OK();
}

Status RegionLayout::PointerMapped(std::vector<Fragment> items, RegionLayout* out) {
  for (const Fragment& item : items) {
    if (item.length == 0) return Status::InvalidArgument("empty item in a pointer-mapped region");
  }
  RegionLayout layout;
  layout.kind_ = RegionKind::kPointerMapped;
  layout.rows_ = items.size();
  layout.items_ = std::move(items);
  if (!layout.Summarize()) return Status::InvalidArgument("pointer-mapped region overflows");
  *out = std::move(layout);
  return Status::OK();
}

Status RegionLayout::WithMask(RowMask mask, RegionLayout* out) const {
  if (mask.rows() != rows_) {
    return Status::InvalidArgument("the mask covers " + std::to_string(mask.rows()) +
                                   " rows, the region has " + std::to_string(rows_));
  }
  RegionLayout layout = *this;
  if (masked_) {  // a mask on a masked layout selects the rows both select
    RowMask both(rows_);
    for (uint64_t row = 0; row < rows_; row++) {
      if (mask_.Test(row) && mask.Test(row)) both.Set(row);
    }
    mask = std::move(both);
  }
  layout.masked_ = true;
  layout.mask_ = std::move(mask);
  if (!layout.Summarize()) return Status::InvalidArgument("masked region overflows 64 bits");
  *out = std::move(layout);
  return Status::OK();
}

// Every count is checked for overflow, so a layout that exists can be walked without any.
bool RegionLayout::Summarize() {
  fingerprint_ = ComputeFingerprint();
  selected_ = masked_ ? mask_.Count() : rows_;
  payload_bytes_ = fragments_ = extent_ = 0;
  if (selected_ == 0) return true;
  uint64_t last = rows_ - 1;  // the last selected row
  if (masked_) {
    const std::vector<uint64_t>& words = mask_.words();
    for (size_t i = words.size(); i-- > 0;) {
      uint64_t word = words[i] & (i + 1 == words.size() ? TailBits(rows_) : ~uint64_t{0});
      if (word != 0) {
        last = i * 64 + 63 - std::countl_zero(word);
        break;
      }
    }
  }
  switch (kind_) {
    case RegionKind::kStrided: {
      uint64_t row_bytes = 0;
      for (const Field& field : fields_) row_bytes += field.length;
      uint64_t row_start = 0;
      return Mul(selected_, row_bytes, &payload_bytes_) &&
             Mul(selected_, fields_.size(), &fragments_) && Mul(last, stride_, &row_start) &&
             Add(base_, row_start, &row_start) &&
             Add(row_start, uint64_t(fields_.back().offset) + fields_.back().length, &extent_);
    }
    case RegionKind::kBitmapped: {
      for (const Column& column : columns_) {
        uint64_t bytes = 0;
        uint64_t end = 0;
        if (!Mul(selected_, column.width, &bytes) || !Add(payload_bytes_, bytes, &payload_bytes_) ||
            !Mul(last + 1, column.width, &end) || !Add(column.base, end, &end)) {
          return false;
        }
        extent_ = std::max(extent_, end);
      }
      return Mul(selected_, columns_.size(), &fragments_);
    }
    case RegionKind::kPointerMapped:
      for (uint64_t i = 0; i < rows_; i++) {
        if (masked_ && !mask_.Test(i)) continue;
        uint64_t end = 0;
        if (!Add(items_[i].offset, items_[i].length, &end) ||
            !Add(payload_bytes_, items_[i].length, &payload_bytes_)) {
          return false;
        }
        extent_ = std::max(extent_, end);
      }
      fragments_ = selected_;
      return true;
  }
  return false;
}

// FNV-1a over the parameters, 64 bits at a time: cheap, and any change of kind, shape, offset
// or mask changes it (it guards against mistakes, not against an adversary).
uint64_t RegionLayout::ComputeFingerprint() const {
  uint64_t hash = 0xcbf29ce484222325ull;
  auto mix = [&hash](uint64_t value) {
    hash ^= value;
    hash *= 0x100000001b3ull;
    hash ^= hash >> 29;
  };
  mix(uint64_t(kind_));
  mix(rows_);
  mix(base_);
  mix(stride_);
  for (const Field& field : fields_) mix(uint64_t(field.offset) << 32 | field.length);
  for (const Column& column : columns_) {
    mix(column.base);
    mix(column.width);
  }
  // One mix per item, the length folded in by an odd multiplier: this runs for every row of a
  // batch. Some pairs collide (offset ^ length * K alike), which a fingerprint that catches
  // mistakes rather than adversaries can afford.
  for (const Fragment& item : items_) mix(item.offset ^ (item.length * 0x9e3779b97f4a7c15ull));
  mix(masked_);
  if (masked_) {
    for (size_t i = 0; i < mask_.words().size(); i++) {
      uint64_t word = mask_.words()[i];
      if (i + 1 == mask_.words().size()) word &= TailBits(rows_);
      mix(word);
    }
  }
  return hash;
}

void RegionLayout::EncodeTo(std::string* out) const {
  out->push_back(static_cast<char>(kind_));
  out->push_back(static_cast<char>(masked_ ? kMaskedFlag : 0));
  PutVarint(out, rows_);
  switch (kind_) {
    case RegionKind::kStrided:
      PutVarint(out, base_);
      PutVarint(out, stride_);
      PutVarint(out, fields_.size());
      for (const Field& field : fields_) {
        PutVarint(out, field.offset);
        PutVarint(out, field.length);
      }
      break;
    case RegionKind::kBitmapped:
      PutVarint(out, columns_.size());
      for (const Column& column : columns_) {
        PutVarint(out, column.base);
        PutVarint(out, column.width);
      }
      break;
    case RegionKind::kPointerMapped: {
      // Each item's offset as its distance from the previous item's end: items that lie back
      // to back (a batch of rows) take a byte for it.
      out->reserve(out->size() + 2 * items_.size());
      uint64_t previous_end = 0;
      for (const Fragment& item : items_) {
        PutVarint(out, ZigZag(item.offset - previous_end));
        PutVarint(out, item.length);
        previous_end = item.offset + item.length;
      }
      break;
    }
  }
  if (masked_) {
    for (uint64_t word : mask_.words()) {
      char bytes[8];
      for (int i = 0; i < 8; i++) bytes[i] = static_cast<char>(word >> (8 * i));
      out->append(bytes, 8);
    }
  }
}

Status RegionLayout::DecodeFrom(std::string_view* in, uint64_t max_payload, uint64_t max_fragments,
                                RegionLayout* out) {
  const Status bad = Status::InvalidArgument("malformed region layout");
  if (in->size() < 2) return bad;
  const uint8_t kind = static_cast<uint8_t>((*in)[0]);
  const uint8_t flags = static_cast<uint8_t>((*in)[1]);
  in->remove_prefix(2);
  if ((flags & ~kMaskedFlag) != 0) return bad;
  uint64_t rows = 0;
  if (!GetVarint(in, &rows)) return bad;
  RegionLayout layout;
  Status s;
  // Counts are bounded by the bytes left before anything is allocated for them.
  switch (kind) {
    case uint8_t(RegionKind::kStrided): {
      uint64_t base = 0, stride = 0, count = 0;
      if (!GetVarint(in, &base) || !GetVarint(in, &stride) || !GetVarint(in, &count) ||
          count > in->size() / 2) {
        return bad;
      }
      std::vector<Field> fields(count);
      for (Field& field : fields) {
        if (!GetVarint32(in, &field.offset) || !GetVarint32(in, &field.length)) return bad;
      }
      s = Strided(base, stride, rows, std::move(fields), &layout);
      break;
    }
    case uint8_t(RegionKind::kBitmapped): {
      uint64_t count = 0;
      if (!GetVarint(in, &count) || count > in->size() / 2) return bad;
      std::vector<Column> columns(count);
      for (Column& column : columns) {
        if (!GetVarint(in, &column.base) || !GetVarint32(in, &column.width)) return bad;
      }
      s = Bitmapped(std::move(columns), rows, &layout);
      break;
    }
    case uint8_t(RegionKind::kPointerMapped): {
      if (rows > in->size() / 2) return bad;
      std::vector<Fragment> items(rows);
      uint64_t previous_end = 0;
      for (Fragment& item : items) {
        uint64_t distance = 0;
        if (!GetVarint(in, &distance) || !GetVarint(in, &item.length)) return bad;
        item.offset = previous_end + UnZigZag(distance);  // overflows are PointerMapped's to refuse
        previous_end = item.offset + item.length;
      }
      s = PointerMapped(std::move(items), &layout);
      break;
    }
    default:
      return bad;
  }
  if (!s.ok()) return Status::InvalidArgument("malformed region layout: " + s.message());
  if (flags & kMaskedFlag) {
    // Not (rows + 63) / 64: near 2^64 rows that wraps to no words at all, and a cursor would
    // read a mask word that does not exist.
    const uint64_t words = rows / 64 + (rows % 64 != 0);
    if (words > in->size() / 8) return bad;
    RowMask mask(rows);
    for (uint64_t i = 0; i < words; i++) {
      uint64_t word = 0;
      for (int b = 0; b < 8; b++) word |= uint64_t(static_cast<uint8_t>((*in)[b])) << (8 * b);
      in->remove_prefix(8);
      if (i + 1 == words && (word & ~TailBits(rows)) != 0) return bad;  // bits past the rows
      for (; word != 0; word &= word - 1) mask.Set(i * 64 + std::countr_zero(word));
    }
    s = layout.WithMask(std::move(mask), &layout);
    if (!s.ok()) return Status::InvalidArgument("malformed region layout: " + s.message());
  }
  if (layout.payload_bytes() > max_payload || layout.fragment_count() > max_fragments) {
    return Status::InvalidArgument("region layout larger than allowed");
  }
  *out = std::move(layout);
  return Status::OK();
}

FragmentCursor::FragmentCursor(const RegionLayout& layout) : layout_(layout) {}

bool FragmentCursor::SeekSelected() {
  const uint64_t rows = layout_.rows();
  if (row_ >= rows) return false;
  if (!layout_.masked()) return true;
  const std::vector<uint64_t>& words = layout_.mask().words();
  size_t index = row_ / 64;
  uint64_t word = words[index] & (~uint64_t{0} << (row_ % 64));
  while (word == 0) {
    if (++index == words.size()) {
      row_ = rows;
      return false;
    }
    word = words[index];
  }
  row_ = index * 64 + std::countr_zero(word);
  if (row_ >= rows) {
    row_ = rows;
    return false;
  }
  return true;
}

bool FragmentCursor::NextOfAnyLayout(Fragment* fragment) {
  switch (layout_.kind()) {
    case RegionKind::kStrided: {
      const std::vector<Field>& fields = layout_.fields();
      if (part_ == 0 && !SeekSelected()) return false;
      const Field& field = fields[part_];
      fragment->offset = layout_.base() + row_ * layout_.stride() + field.offset;
      fragment->length = field.length;
      if (++part_ == fields.size()) {
        part_ = 0;
        row_++;
      }
      return true;
    }
    case RegionKind::kBitmapped: {
      const std::vector<Column>& columns = layout_.columns();
      while (part_ < columns.size()) {
        if (SeekSelected()) {
          const Column& column = columns[part_];
          fragment->offset = column.base + row_ * column.width;
          fragment->length = column.width;
          row_++;
          return true;
        }
        part_++;
        row_ = 0;
      }
      return false;
    }
    case RegionKind::kPointerMapped:
      if (!SeekSelected()) return false;
      *fragment = layout_.items()[row_++];
      return true;
  }
  return false;
}

}  // namespace slipstream::rdma
