// fuzz_input.h: what every fuzz target shares to read its input and to stop on a broken
// property. One reader for all of them, so that a field means the same bytes in every target
// and the seed writers (NAME_seeds.cc) can lay their fields out the way the reader takes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace slipstream::fuzz {

// Stops the run with "TARGET: WHAT" on stderr; libFuzzer takes the abort as a crash and keeps
// the input that caused it.
[[noreturn]] inline void FuzzFailure(const char* target, const char* what) {
  std::fprintf(stderr, "%s: %s\n", target, what);
  std::abort();
}

// As FuzzFailure, followed by the status (an engine's or a transport's) that showed the broken
// property, so the report says what the code under test answered.
template <typename StatusT>
[[noreturn]] void FuzzFailure(const char* target, const char* what, const StatusT& status) {
  FuzzFailure(target, (std::string(what) + " " + status.ToString()).c_str());
}

// Reads a fuzz input from the front: little-endian integers, bytes laid out as in memory, and
// byte strings. Reads never fail past the end (integers read zero bytes there, strings come out
// shorter), so every mutation of a seed still means something to the target.
class FuzzInput {
 public:
  // Reads libFuzzer's input.
  FuzzInput(const uint8_t* data, size_t size) : in_(reinterpret_cast<const char*>(data), size) {}
  // Reads `in` (what is left of an input another parser took its part of).
  explicit FuzzInput(std::string_view in) : in_(in) {}

  // The next `bytes` bytes (at most 8) as a little-endian integer; the bytes past the end of
  // the input count as zero.
  uint64_t Take(int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes && !in_.empty(); i++) {
      value |= uint64_t(uint8_t(in_.front())) << (8 * i);
      in_.remove_prefix(1);
    }
    return value;
  }

  // The next byte; zero past the end.
  uint8_t Byte() { return uint8_t(Take(1)); }

  // The next `bytes` bytes as a little-endian integer when that many are left. Otherwise false
  // with *value zero, and the rest of the input is taken: a field the input cut short is not
  // read as a smaller number, and nothing after it is read.
  bool TakeWhole(int bytes, uint64_t* value) {
    *value = 0;
    if (in_.size() < size_t(bytes)) {
      in_.remove_prefix(in_.size());
      return false;
    }
    *value = Take(bytes);
    return true;
  }

  // Copies the next sizeof(T) bytes as they are (a struct or integer in the host's layout, as
  // the code under test keeps it on disk or on the wire) when that many are left; otherwise
  // false, and nothing is taken.
  template <typename T>
  bool TakeRaw(T* out) {
    if (in_.size() < sizeof(T)) return false;
    std::memcpy(out, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return true;
  }

  // The next `n` bytes, or fewer at the end of the input.
  std::string_view Bytes(size_t n) {
    std::string_view bytes = in_.substr(0, n);
    in_.remove_prefix(bytes.size());
    return bytes;
  }

  // What is left, without taking it.
  std::string_view rest() const { return in_; }
  // How many bytes are left.
  size_t size() const { return in_.size(); }
  // Whether the input is used up.
  bool empty() const { return in_.empty(); }

 private:
  std::string_view in_;
};

// Appends the `bytes` low bytes of `value`, little-endian: what FuzzInput::Take reads back, for
// the seed writers.
inline void PutLittleEndian(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; i++) out->push_back(char(value >> (8 * i)));
}

}  // namespace slipstream::fuzz
