// Seeds for index_stream_fuzz: streams of frames from the primary's encoders (a seed, large-log
// bytes, a compaction with plain and compressed segments, its install, a horizon, an abandoned
// compaction), each behind the fuzzer's feeding directions (see index_stream_fuzz.cc).
#include <string>
#include <vector>

#include "seeds.h"
#include "slipstream/replication/index_stream.h"

namespace slipstream::fuzz {
namespace {

using namespace replication;

// `n` bytes of a segment's contents: compressible, as index nodes are.
std::string Contents(size_t n, char base) {
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; i++) bytes[i] = char(base + (i / 16) % 8);
  return bytes;
}

// A compaction from begin to install, as IndexEventEncoder frames it (`lz4`: its segments
// compressed).
std::string Compaction(uint64_t id, bool lz4) {
  const std::string index = Contents(600, 'a');
  const std::string bloom = Contents(200, 'k');
  std::string s = EncodeCompactionBegin({id, true, 0, 1, 4096, 512});
  engine::CompactionSegmentEvent segment{id, 1, engine::CompactionSegmentKind::kIndex, 12, index};
  s += lz4 ? EncodeCompactionSegmentLz4(segment) : EncodeCompactionSegment(segment);
  segment.kind = engine::CompactionSegmentKind::kBloom;
  segment.segment = 13;
  segment.bytes = bloom;
  s += lz4 ? EncodeCompactionSegmentLz4(segment) : EncodeCompactionSegment(segment);
  engine::CompactionInstalledEvent installed;
  installed.compaction = id;
  installed.from_l0 = true;
  installed.dest_level = 1;
  installed.tree_id = uint32_t(id);
  installed.height = 2;
  installed.root_segment = 12;
  installed.root_offset = 512;
  installed.bloom_segment = 13;
  installed.entries = 100;
  installed.segments = 2;
  installed.manifest_number = 9;
  installed.retired_segments = {3, 4};
  installed.medium_segments = {20};
  installed.retired_log_segments = {5};
  installed.retired_trees = {uint32_t(id - 1)};
  installed.keyspaces = {{77, 1, 1}, {78, 2, 2}};
  installed.next_keyspace_id = 3;
  return s + EncodeCompactionInstalled(installed);
}

// A primary's connection: a seed of its levels, then live events.
std::string Session() {
  const std::string large = Contents(300, 'p');
  std::string s = EncodeSeedBegin();
  s += EncodeLogWrite({engine::ObservedLog::kLarge, 40, 2, 4096, large});
  s += Compaction(5, false);
  s += EncodeSeedEnd({0, 5, 0});
  s += EncodeHorizon(123456);
  s += EncodeLogWrite({engine::ObservedLog::kLarge, 40, 2, 4396, large});
  s += Compaction(6, true);
  s += EncodeCompactionBegin({7, false, 1, 2, 4096, 512});
  s += EncodeCompactionAbandoned(7);
  return s;
}

// The fuzzer's directions: flags, then `cuts` (with their order keys and jitter bytes).
std::string Directions(uint8_t flags, const std::vector<uint16_t>& cuts,
                       const std::vector<uint8_t>& keys, const std::vector<uint8_t>& jitter) {
  std::string d;
  d.push_back(char(flags));
  d.push_back(char(cuts.size()));
  for (uint16_t cut : cuts) {
    d.push_back(char(cut));
    d.push_back(char(cut >> 8));
  }
  for (uint8_t key : keys) d.push_back(char(key));
  for (uint8_t j : jitter) d.push_back(char(j));
  return d;
}

// The stream whole, cut and reordered, awaiting a seed, and with reconnecting sessions.
std::vector<Seed> IndexStreamSeeds() {
  const std::string session = Session();
  return {
      {"whole", Directions(0, {}, {0}, {0}) + session},
      {"cut_in_order", Directions(0, {100, 700, 1500}, {0, 1, 2, 3}, {0, 0, 0, 0}) + session},
      {"cut_reordered",
       Directions(0, {50, 400, 900, 2000}, {4, 2, 3, 0, 1}, {1, 0, 1, 0, 0}) + session},
      {"await_seed", Directions(1, {300}, {1, 0}, {0, 0}) + EncodeHorizon(5) + session},
      {"sessions", Directions(2, {200, 1200}, {1, 0, 3}, {128, 100, 140}) + session + session},
      {"single_frame", Directions(0, {}, {0}, {0}) + EncodeHorizon(99)},
  };
}

}  // namespace
SLIPSTREAM_FUZZ_SEEDS(index_stream, IndexStreamSeeds);
}  // namespace slipstream::fuzz
