// Strided gathers (see gather.h).
#include "gather.h"

#include <algorithm>
#include <cstring>

namespace slipstream::rdma {

namespace {

// About this many output bytes per block: the block's output stays in L1 while every entry's
// column is copied into it.
constexpr uint64_t kBlockBytes = 4096;

// One entry's bytes from `periods` periods. A width known at compile time (kWidth > 0) makes
// each copy one or two moves; kWidth 0 copies `width` bytes.
template <size_t kWidth>
void CopyColumn(char* out, uint64_t out_step, const char* from, uint64_t stride, uint64_t periods,
                uint64_t width = kWidth) {
  for (uint64_t k = 0; k < periods; k++) {
    std::memcpy(out, from, kWidth > 0 ? kWidth : width);
    out += out_step;
    from += stride;
  }
}

// Dispatches on the entry's width once per block, not once per copy.
void CopyEntry(char* out, uint64_t out_step, const char* from, uint64_t stride, uint64_t periods,
               uint64_t width) {
  switch (width) {
    case 0:
      return;
    case 1:
      return CopyColumn<1>(out, out_step, from, stride, periods);
    case 2:
      return CopyColumn<2>(out, out_step, from, stride, periods);
    case 4:
      return CopyColumn<4>(out, out_step, from, stride, periods);
    case 8:
      return CopyColumn<8>(out, out_step, from, stride, periods);
    case 12:
      return CopyColumn<12>(out, out_step, from, stride, periods);
    case 16:
      return CopyColumn<16>(out, out_step, from, stride, periods);
    case 24:
      return CopyColumn<24>(out, out_step, from, stride, periods);
    case 32:
      return CopyColumn<32>(out, out_step, from, stride, periods);
    default:
      return CopyColumn<0>(out, out_step, from, stride, periods, width);
  }
}

}  // namespace

uint64_t PeriodBytes(const Sge* sges, size_t count) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < count; i++) bytes += sges[i].length;
  return bytes;
}

void GatherPeriods(const Sge* sges, size_t count, uint64_t stride, uint64_t first, uint64_t periods,
                   char* out) {
  const uint64_t period_bytes = PeriodBytes(sges, count);
  if (period_bytes == 0) return;
  const uint64_t block = std::max<uint64_t>(1, kBlockBytes / period_bytes);
  for (uint64_t done = 0; done < periods; done += block) {
    const uint64_t n = std::min(block, periods - done);
    const uint64_t k = first + done;
    char* at = out + done * period_bytes;
    for (size_t i = 0; i < count; i++) {
      const char* from = static_cast<const char*>(sges[i].addr) + k * stride;
      CopyEntry(at, period_bytes, from, stride, n, sges[i].length);
      at += sges[i].length;
    }
  }
}

void GatherPrefix(const Sge* sges, size_t count, uint64_t stride, uint64_t limit, char* out) {
  if (PeriodBytes(sges, count) == 0) return;
  for (uint64_t k = 0; limit > 0; k++) {
    for (size_t i = 0; i < count && limit > 0; i++) {
      const uint64_t piece = std::min<uint64_t>(sges[i].length, limit);
      std::memcpy(out, static_cast<const char*>(sges[i].addr) + k * stride, piece);
      out += piece;
      limit -= piece;
    }
  }
}

}  // namespace slipstream::rdma
