// Send-Index on a replica: an index segment shipped from the primary names the primary's
// segment numbers in every pointer it holds, so before it can be stored under this node's own
// numbers each of those pointers is rewritten through maps and the node checksums recomputed.
// Offsets inside segments do not change (segment_size and node_size are equal on both nodes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "slipstream/engine/status.h"

namespace slipstream::engine {

// Maps a primary's segment number to this node's; returns Corruption/NotFound when unmapped.
using SegmentMap = std::function<Status(uint32_t primary_segment, uint32_t* local_segment)>;

// What one RewriteIndexSegment call found and rewrote (filled only when it succeeds).
struct RewriteStats {
  uint32_t leaves = 0, index_nodes = 0, bloom_dirs = 0;
  uint64_t value_pointers = 0, child_pointers = 0;
};

// Rewrites in place every device pointer of an index segment image: the used prefix a
// compaction wrote (FlushSegment), which is whole nodes of node_size from offset 0, with a
// bloom directory (BDIR) allowed only as the last node because WriteBloom takes the tree's
// final slot. Medium and large ValuePtr segments of leaves go through map_log; index children
// and the bloom segment list of the directory go through map_index. Every node is validated
// first (magic, sizes, entry bounds, tree_id, and the crc32c of LEAF/INDX nodes) and every
// pointer mapped before any byte changes, so on failure the image is left byte-identical;
// the error is Corruption naming the node's offset, or the map's own status. The checksum of
// each rewritten LEAF/INDX node is then recomputed as NodeBuilder::Finish computes it.
// InvalidArgument if node_size is not a power of two above the header, at most 65536.
Status RewriteIndexSegment(char* image, size_t size, uint32_t node_size, uint32_t tree_id,
                           const SegmentMap& map_log, const SegmentMap& map_index,
                           RewriteStats* stats);
// The same with medium and large value pointers mapped apart (a replica keeps the two logs'
// copies apart, and a pointer of one kind must not land in a copy of the other).
Status RewriteIndexSegment(char* image, size_t size, uint32_t node_size, uint32_t tree_id,
                           const SegmentMap& map_medium, const SegmentMap& map_large,
                           const SegmentMap& map_index, RewriteStats* stats);

}  // namespace slipstream::engine
