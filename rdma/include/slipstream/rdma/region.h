// Declarative non-contiguous regions (D-RDMA's NCRs): a compact description of data scattered
// over one buffer, so that a transfer can be planned as a whole instead of fragment by fragment.
//
// A layout names fragments (byte ranges of a source buffer) in payload order; the payload is
// their concatenation. Three kinds, each optionally restricted by a row mask:
//  * strided: `rows` rows of `stride` bytes from `base`, and from each row some fields
//    (a projection of row-major data). Payload order: row by row, fields in order.
//  * bitmapped: columns, element i of a column being `width` bytes at base + i*width, and a
//    mask choosing rows (a selection of columnar data). Payload order: column by column, the
//    selected rows of each in order, so the receiver gets columnar data back.
//  * pointer-mapped: an array of items (offset, length) in any order (varlena values, rows
//    of a row store that are not adjacent). Payload order: item order.
// A mask on a strided or pointer-mapped layout is a projection under a selection.
//
// Layouts are plain values: building one checks it (no empty field, fields ascending and
// inside the stride, no overflow), and Encode/Decode carry one to the receiver, which needs it
// to find the fragments in what arrives (schedule.h). Decode refuses anything malformed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "slipstream/rdma/status.h"

namespace slipstream::rdma {

// `length` bytes at `offset` of a buffer.
struct Fragment {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const Fragment&) const = default;
};

// A field of a strided row: `length` bytes at `offset` from the row's start.
struct Field {
  uint32_t offset = 0;
  uint32_t length = 0;
};

// A column of a bitmapped layout: element i is `width` bytes at base + i*width.
struct Column {
  uint64_t base = 0;
  uint32_t width = 0;
};

// Which rows (or items) of a layout are selected: bit i of word i/64.
class RowMask {
 public:
  RowMask() = default;
  explicit RowMask(uint64_t rows) : rows_(rows), words_(rows / 64 + (rows % 64 != 0), 0) {}
  // Selects `row`; a row past rows() is ignored (a mask never reaches outside its layout).
  void Set(uint64_t row) {
    if (row < rows_) words_[row / 64] |= uint64_t{1} << (row % 64);
  }
  bool Test(uint64_t row) const { return (words_[row / 64] >> (row % 64)) & 1; }
  uint64_t rows() const { return rows_; }
  const std::vector<uint64_t>& words() const { return words_; }
  uint64_t Count() const;

 private:
  uint64_t rows_ = 0;
  std::vector<uint64_t> words_;
};

// One mask per target: row i goes to target owner[i]; a row whose owner is not below
// `targets` is in no mask. The masks of a hash partitioning, for ScatterRegions (transfer.h).
std::vector<RowMask> MasksByOwner(const std::vector<uint32_t>& owner, uint32_t targets);

enum class RegionKind : uint8_t { kStrided = 1, kBitmapped = 2, kPointerMapped = 3 };

class RegionLayout {
 public:
  static Status Strided(uint64_t base, uint64_t stride, uint64_t rows, std::vector<Field> fields,
                        RegionLayout* out);
  static Status Bitmapped(std::vector<Column> columns, uint64_t rows, RegionLayout* out);
  static Status PointerMapped(std::vector<Fragment> items, RegionLayout* out);
  // This layout restricted to the rows (items) `mask` selects; the mask covers rows() rows.
  // On a masked layout, the rows both masks select.
  Status WithMask(RowMask mask, RegionLayout* out) const;

  RegionKind kind() const { return kind_; }
  uint64_t rows() const { return rows_; }  // rows, or items of a pointer-mapped layout
  uint64_t selected_rows() const { return selected_; }
  bool masked() const { return masked_; }
  uint64_t payload_bytes() const { return payload_bytes_; }
  uint64_t fragment_count() const { return fragments_; }
  // One past the highest byte any fragment touches: the source buffer must be this long.
  uint64_t extent() const { return extent_; }

  uint64_t base() const { return base_; }
  uint64_t stride() const { return stride_; }
  const std::vector<Field>& fields() const { return fields_; }
  const std::vector<Column>& columns() const { return columns_; }
  const std::vector<Fragment>& items() const { return items_; }
  const RowMask& mask() const { return mask_; }

  // A 64-bit hash of everything that decides the fragments: a schedule remembers the
  // fingerprint of the layout it was planned for. Computed once, when the layout is built.
  uint64_t Fingerprint() const { return fingerprint_; }

  // Appends a self-delimiting encoding of the layout to *out.
  void EncodeTo(std::string* out) const;
  // Reads a layout Encode wrote from the front of *in and advances it; refuses malformed or
  // truncated input, and layouts larger than `max_payload` bytes or `max_fragments` fragments.
  static Status DecodeFrom(std::string_view* in, uint64_t max_payload, uint64_t max_fragments,
                           RegionLayout* out);

 private:
  // Counts selected rows, fragments, payload bytes and the extent, and takes the
  // fingerprint; false on overflow.
  bool Summarize();
  // The hash Fingerprint returns.
  uint64_t ComputeFingerprint() const;

  RegionKind kind_ = RegionKind::kPointerMapped;
  uint64_t base_ = 0;
  uint64_t stride_ = 0;
  uint64_t rows_ = 0;
  std::vector<Field> fields_;
  std::vector<Column> columns_;
  std::vector<Fragment> items_;
  bool masked_ = false;
  RowMask mask_;
  uint64_t selected_ = 0;
  uint64_t payload_bytes_ = 0;
  uint64_t fragments_ = 0;
  uint64_t extent_ = 0;
  uint64_t fingerprint_ = 0;
};

// Walks a layout's fragments in payload order. The layout must outlive the cursor.
class FragmentCursor {
 public:
  explicit FragmentCursor(const RegionLayout& layout);
  // The next fragment; false after the last. Inline for the items of an unmasked
  // pointer-mapped layout (a shuffle batch's rows), which every row of a batch walks twice.
  bool Next(Fragment* fragment) {
    if (layout_.kind() == RegionKind::kPointerMapped && !layout_.masked()) {
      if (row_ >= layout_.rows()) return false;
      *fragment = layout_.items()[row_++];
      return true;
    }
    return NextOfAnyLayout(fragment);
  }

 private:
  // Next for every kind of layout.
  bool NextOfAnyLayout(Fragment* fragment);
  // Moves row_ to the next selected row at or after it; false past the end.
  bool SeekSelected();

  const RegionLayout& layout_;
  uint64_t row_ = 0;
  size_t part_ = 0;  // field (strided) or column (bitmapped)
};

}  // namespace slipstream::rdma
