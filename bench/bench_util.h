// Helpers shared by the benchmark programs: sizes on the command line and in tables, lists,
// timing, and a compiler barrier.
#pragma once

#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace slipstream::bench {

using Clock = std::chrono::steady_clock;

// Parses "4096", "4K", "4KiB", "1M", "1G" into bytes; false on anything else.
inline bool ParseSize(std::string_view text, uint64_t* bytes) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return false;
  std::string_view suffix(end, text.data() + text.size() - end);
  uint64_t scale = 1;
  if (suffix == "" || suffix == "B") {
    scale = 1;
  } else if (suffix == "K" || suffix == "KiB" || suffix == "k") {
    scale = 1ull << 10;
  } else if (suffix == "M" || suffix == "MiB") {
    scale = 1ull << 20;
  } else if (suffix == "G" || suffix == "GiB") {
    scale = 1ull << 30;
  } else {
    return false;
  }
  *bytes = value * scale;
  return true;
}

// Splits a comma-separated list of words (empty words are skipped).
inline std::vector<std::string> SplitWords(std::string_view text) {
  std::vector<std::string> words;
  while (!text.empty()) {
    size_t comma = text.find(',');
    if (comma != 0) words.emplace_back(text.substr(0, comma));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return words;
}

// Parses a comma-separated list of sizes; false if any entry is malformed.
inline bool ParseSizeList(std::string_view text, std::vector<uint64_t>* sizes) {
  sizes->clear();
  for (const std::string& word : SplitWords(text)) {
    uint64_t bytes = 0;
    if (!ParseSize(word, &bytes)) return false;
    sizes->push_back(bytes);
  }
  return true;
}

// Human form of a byte count: 8B, 64K, 1M, 1G.
inline std::string SizeName(uint64_t bytes) {
  char text[32];
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0) {
    std::snprintf(text, sizeof(text), "%" PRIu64 "G", bytes >> 30);
  } else if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) {
    std::snprintf(text, sizeof(text), "%" PRIu64 "M", bytes >> 20);
  } else if (bytes >= 1024 && bytes % 1024 == 0) {
    std::snprintf(text, sizeof(text), "%" PRIu64 "K", bytes >> 10);
  } else {
    std::snprintf(text, sizeof(text), "%" PRIu64 "B", bytes);
  }
  return text;
}

// Seconds since `start`.
inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Keeps the compiler from dropping or merging the memory accesses around it.
inline void CompilerBarrier() {
  asm volatile("" ::: "memory");
}

}  // namespace slipstream::bench
