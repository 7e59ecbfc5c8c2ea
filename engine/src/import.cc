// Index shipping on a replica (Anthus Send-Index): the primary's compactions installed here
// without compacting. See engine.h ("Index shipping") and docs/replication.md.
//
// A replica stores every shipped segment under a number of its own. Index and bloom segments
// keep the primary's tree id as their owner (so node headers need no change, and a replica
// holds only imported trees: BeginImport refuses a node that compacts for itself); log
// segments (the medium runs compactions write, the large log) are marked kSegmentImported with
// the primary's number as their owner, which is how later levels find them, and how the map
// survives a restart (the manifest holds the segment table). Segments of an import that is not
// installed yet are kSegmentPending: no manifest names them, so a crash or an abandon frees
// them, and the level appears only with the manifest InstallImport writes.
#include <algorithm>
#include <string>

#include "engine_impl.h"
#include "segment_rewrite.h"

namespace slipstream::engine {

namespace {

bool IsLogKind(uint8_t kind) {
  return kind == uint8_t(SegmentKind::kMediumLog) || kind == uint8_t(SegmentKind::kLargeLog) ||
         kind == uint8_t(SegmentKind::kL0Log);
}

std::string Seg(uint32_t segment) {
  return "primary segment " + std::to_string(segment);
}

}  // namespace

// The installed copy of the primary's log segment `primary_segment` of `kind` (0: none). A
// Pending copy (of an import in flight) is not one: its number may be reused by the primary
// for another log once that import is abandoned.
uint32_t EngineImpl::ImportedLogSegment(uint32_t primary_segment, SegmentKind kind) {
  SharedLock a(segments_.mutex());
  for (uint64_t seg = 1; seg < segments_.count(); seg++) {
    const SegmentInfo& info = segments_.info(seg);
    if ((info.flags & kSegmentImported) && !(info.flags & (kSegmentRetired | kSegmentPending)) &&
        info.kind == uint8_t(kind) && info.owner == primary_segment) {
      return uint32_t(seg);
    }
  }
  return 0;
}

// Frees every Pending segment: what an importer that died (or restarted) left of an import
// in flight. Only one process imports, and it has none open when it calls this.
void EngineImpl::FreeOrphanedImports() {
  std::vector<uint32_t> orphans;
  {
    SharedLock a(segments_.mutex());
    for (uint64_t seg = 1; seg < segments_.count(); seg++) {
      if (segments_.info(seg).flags & kSegmentPending) orphans.push_back(uint32_t(seg));
    }
  }
  for (uint32_t seg : orphans) segments_.Free(seg);
}

// Allocates a segment for an import, Pending until its level is installed.
Status EngineImpl::AllocatePending(SegmentKind kind, uint32_t owner, uint32_t* segment) {
  Status s = segments_.Allocate(kind, owner, segment);
  if (!s.ok()) return s;
  SharedLock a(segments_.mutex());
  segments_.info(*segment).flags |= kSegmentPending | kSegmentImported;
  return Status::OK();
}

// Appends (or writes again: the same bytes) a range of a primary's large-log segment; the
// first range of a segment starts at 0 and creates this node's copy.
Status EngineImpl::ImportLogBytes(const LogWriteEvent& event) {
  if (event.log != ObservedLog::kLarge) {
    return Status::InvalidArgument("only the large log is imported; L0 is replayed from the WAL");
  }
  if (uint64_t(event.offset) + event.bytes.size() > options_.segment_size) {
    return Status::Corruption("log bytes of " + Seg(event.segment) + " end beyond a segment");
  }
  uint32_t local = ImportedLogSegment(event.segment, SegmentKind::kLargeLog);
  if (local == 0) {
    if (event.offset != 0) {
      return Status::Corruption("log bytes of " + Seg(event.segment) + " at offset " +
                                std::to_string(event.offset) + " arrive before its start");
    }
    Status s = segments_.Allocate(SegmentKind::kLargeLog, event.segment, &local);
    if (!s.ok()) return s;
    {
      SharedLock a(segments_.mutex());
      SegmentInfo& info = segments_.info(local);
      info.flags |= kSegmentImported;
      info.sequence = event.sequence;
    }
    s = device_.ZeroSegment(local);
    if (!s.ok()) {
      segments_.Free(local);
      return s;
    }
  }
  {
    SharedLock a(segments_.mutex());
    SegmentInfo& info = segments_.info(local);
    if (event.offset > info.bytes_written) {
      return Status::Corruption("log bytes of " + Seg(event.segment) + " at offset " +
                                std::to_string(event.offset) + " leave a gap after " +
                                std::to_string(info.bytes_written));
    }
  }
  Status s = device_.Write({WriteRequest{uint64_t(local) * options_.segment_size + event.offset,
                                         event.bytes.data(), uint32_t(event.bytes.size())}},
                           false);
  if (!s.ok()) return s;
  shared_->counters.device_bytes_written += event.bytes.size();
  SharedLock a(segments_.mutex());
  SegmentInfo& info = segments_.info(local);
  info.bytes_written = std::max<uint64_t>(info.bytes_written, event.offset + event.bytes.size());
  return Status::OK();
}

// Starts an import; one still open (its end never came) is abandoned first, and what a dead
// importer left is freed. A compaction this node installed already, or one older than a
// compaction it installed (a seed covers every compaction up to its newest tree), is skipped
// whole: its segments and end are then accepted and ignored.
Status EngineImpl::BeginImport(const CompactionBeginEvent& event) {
  if (import_ != nullptr) AbandonImport(import_->begin.compaction);
  FreeOrphanedImports();
  if (event.segment_size != options_.segment_size || event.node_size != options_.node_size) {
    return Status::InvalidArgument(
        "the primary's segment and node sizes (" + std::to_string(event.segment_size) + ", " +
        std::to_string(event.node_size) + ") differ from this node's (" +
        std::to_string(options_.segment_size) + ", " + std::to_string(options_.node_size) + ")");
  }
  if (event.dest_level < 1 || event.dest_level > options_.max_levels ||
      event.replaced_level > options_.max_levels || event.compaction == 0 ||
      event.compaction > UINT32_MAX) {
    return Status::Corruption("a compaction begins with impossible levels or id");
  }
  if (Covered(event.compaction)) return Status::OK();
  {
    SharedLock a(segments_.mutex());
    for (uint64_t seg = 1; seg < segments_.count(); seg++) {
      const SegmentInfo& info = segments_.info(seg);
      if (info.kind != uint8_t(SegmentKind::kIndex) ||
          (info.flags & (kSegmentRetired | kSegmentPending))) {
        continue;
      }
      if (!(info.flags & kSegmentImported)) {
        return Status::InvalidArgument(
            "this node holds levels of its own (it compacts for "
            "itself): a Send-Index replica starts empty");
      }
      if (info.owner == uint32_t(event.compaction)) {
        return Status::Corruption("compaction " + std::to_string(event.compaction) +
                                  " was imported already");
      }
    }
  }
  import_ = std::make_unique<Import>();
  import_->begin = event;
  return Status::OK();
}

// Stores one segment: rewrites an index segment's pointers into this node's numbers, copies
// bloom and medium segments as they are (they hold no pointers).
Status EngineImpl::ImportSegment(const CompactionSegmentEvent& event) {
  if ((import_ == nullptr || import_->begin.compaction != event.compaction) &&
      Covered(event.compaction)) {
    return Status::OK();
  }
  if (import_ == nullptr || import_->begin.compaction != event.compaction) {
    return Status::Corruption("a segment of compaction " + std::to_string(event.compaction) +
                              ", which is not being imported");
  }
  Import& im = *import_;
  if (event.dest_level != im.begin.dest_level || event.bytes.size() > options_.segment_size ||
      im.arrived.count(event.segment)) {
    return Status::Corruption(Seg(event.segment) + " of compaction " +
                              std::to_string(event.compaction) +
                              " arrives twice, too large, or for another level");
  }
  const uint32_t tree = uint32_t(im.begin.compaction);
  // This node's segment for a primary's index or bloom segment of this compaction.
  auto index_local = [&](uint32_t primary, SegmentKind kind, uint32_t* local) -> Status {
    auto it = im.index.find(primary);
    if (it != im.index.end()) {
      *local = it->second;
      return Status::OK();
    }
    Status s = AllocatePending(kind, tree, local);
    if (s.ok()) im.index[primary] = *local;
    return s;
  };
  // This node's copy of a log segment: an older one, or a medium segment of this compaction
  // that a leaf may name before it arrives (the run is written after the leaves).
  auto log_local = [&](uint32_t primary, uint32_t* local) -> Status {
    auto it = im.medium.find(primary);
    if (it != im.medium.end()) {
      *local = it->second;
      return Status::OK();
    }
    auto known = im.older.find(primary);
    if (known != im.older.end()) {
      *local = known->second;
      return Status::OK();
    }
    *local = ImportedLogSegment(primary, SegmentKind::kMediumLog);
    if (*local != 0) {
      im.older[primary] = *local;
      return Status::OK();
    }
    Status s = AllocatePending(SegmentKind::kMediumLog, primary, local);
    if (s.ok()) im.medium[primary] = *local;
    return s;
  };

  uint32_t local = 0;
  Status s;
  std::string image(event.bytes);
  switch (event.kind) {
    case CompactionSegmentKind::kIndex: {
      s = index_local(event.segment, SegmentKind::kIndex, &local);
      if (!s.ok()) return s;
      SegmentMap map_index = [&](uint32_t primary, uint32_t* out) {
        auto it = im.index.find(primary);
        if (it == im.index.end()) {
          return Status::Corruption("a child pointer names " + Seg(primary) +
                                    ", which has not arrived (children come before parents)");
        }
        *out = it->second;
        return Status::OK();
      };
      SegmentMap map_medium = [&](uint32_t primary, uint32_t* out) {
        return log_local(primary, out);
      };
      // A large value's copy exists already: the large log arrives before the levels.
      SegmentMap map_large = [&](uint32_t primary, uint32_t* out) {
        *out = ImportedLogSegment(primary, SegmentKind::kLargeLog);
        return *out != 0 ? Status::OK()
                         : Status::Corruption("a large value in " + Seg(primary) +
                                              ", whose log bytes never arrived");
      };
      RewriteStats stats;
      s = RewriteIndexSegment(image.data(), image.size(), options_.node_size, tree, map_medium,
                              map_large, map_index, &stats);
      // A slot of zeros after the image: the bytes beyond it are of an earlier use of the
      // segment, and whoever reads node headers from offset 0 (ShipLevels) stops here.
      if (s.ok() && image.size() + options_.node_size <= options_.segment_size) {
        image.append(options_.node_size, '\0');
      }
      break;
    }
    case CompactionSegmentKind::kBloom:
      s = index_local(event.segment, SegmentKind::kBloom, &local);
      break;
    case CompactionSegmentKind::kMedium:
      s = log_local(event.segment, &local);
      if (s.ok() && im.medium.count(event.segment) == 0) {
        s = Status::Corruption(Seg(event.segment) +
                               " is shipped as a new medium run but is "
                               "an older log segment here");
      }
      break;
    default:
      s = Status::Corruption("a shipped segment of unknown kind");
  }
  if (!s.ok()) return s;
  s = device_.Write(
      {WriteRequest{uint64_t(local) * options_.segment_size, image.data(), uint32_t(image.size())}},
      false);
  if (!s.ok()) return s;
  shared_->counters.device_bytes_written += image.size();
  im.arrived.insert(event.segment);
  if (event.kind == CompactionSegmentKind::kMedium) {
    SharedLock a(segments_.mutex());
    segments_.info(local).bytes_written = image.size();
  }
  return Status::OK();
}

// Installs the imported level: data fsync, then under the write and allocation mutexes the
// Pending marks cleared, what the primary retired retired here, the level swapped in, and the
// manifest written; then retirement as a compaction of this node's would do it.
Status EngineImpl::InstallImport(const CompactionInstalledEvent& event, uint64_t resume_at) {
  if ((import_ == nullptr || import_->begin.compaction != event.compaction) &&
      Covered(event.compaction)) {
    // The resume position stays where the manifest has it: the host prunes the stream's
    // images below it, and one moved in memory alone would not survive a restart.
    return Status::OK();
  }
  if (import_ == nullptr || import_->begin.compaction != event.compaction) {
    return Status::Corruption("the end of compaction " + std::to_string(event.compaction) +
                              ", which is not being imported");
  }
  Import& im = *import_;
  SharedLock compacting(&shared_->compaction_mu);  // no compaction of this node meanwhile
  Status s;
  for (const auto& [primary, local] : im.index) {
    if (!im.arrived.count(primary)) s = Status::Corruption(Seg(primary) + " never arrived");
  }
  for (const auto& [primary, local] : im.medium) {
    if (!im.arrived.count(primary)) s = Status::Corruption(Seg(primary) + " never arrived");
  }
  DevPtr root{}, bloom_dir{};
  if (s.ok() && event.tree_id != 0) {
    auto root_it = im.index.find(event.root_segment);
    auto bloom_it = im.index.find(event.bloom_segment);
    if (event.tree_id != uint32_t(event.compaction) || root_it == im.index.end() ||
        (event.bloom_segment != 0 && bloom_it == im.index.end())) {
      s = Status::Corruption(
          "the installed level's root or bloom filter lies outside what "
          "compaction " +
          std::to_string(event.compaction) + " shipped");
    } else {
      root = DevPtr{root_it->second, event.root_offset};
      if (event.bloom_segment != 0) bloom_dir = DevPtr{bloom_it->second, event.bloom_offset};
    }
  }
  if (s.ok() && (event.dest_level != im.begin.dest_level ||
                 event.replaced_level != im.begin.replaced_level)) {
    s = Status::Corruption("compaction " + std::to_string(event.compaction) +
                           " ends at other levels than it began");
  }
  if (s.ok()) s = device_.Sync();
  if (!s.ok()) {
    AbandonImport(event.compaction);
    return s;
  }
  std::vector<uint32_t> retired_segments;
  std::vector<uint32_t> retired_trees;
  std::string image;
  {
    SharedLock w(&shared_->write_mu);
    SharedLock a(segments_.mutex());
    for (const auto& map : {im.index, im.medium}) {
      for (const auto& [primary, local] : map) {
        SegmentInfo& info = segments_.info(local);
        info.flags &= ~kSegmentPending;
        if (info.kind == uint8_t(SegmentKind::kMediumLog)) info.flags |= kSegmentSealed;
      }
    }
    // The primary's retired log segments, by their copies here (those not imported, e.g. its
    // L0 log, have none).
    for (uint32_t primary : event.retired_log_segments) {
      for (uint64_t seg = 1; seg < segments_.count(); seg++) {
        SegmentInfo& info = segments_.info(seg);
        if ((info.flags & kSegmentImported) && !(info.flags & kSegmentRetired) &&
            IsLogKind(info.kind) && info.owner == primary) {
          info.flags |= kSegmentRetired;
          retired_segments.push_back(uint32_t(seg));
          break;
        }
      }
    }
    Version before = levels_.Current();
    std::vector<uint32_t> retired_tree_segments;
    MarkTreesRetired(before, event.replaced_level, event.dest_level, &retired_trees,
                     &retired_tree_segments);
    LevelDesc out{};
    if (event.tree_id != 0) {
      out.tree_id = event.tree_id;
      out.height = event.height;
      out.root = root;
      out.bloom_dir = bloom_dir;
      out.bloom_blocks = event.bloom_blocks;
      out.entries = event.entries;
      out.bytes = event.bytes;
      out.small_entries = event.small_entries;
      out.medium_entries = event.medium_entries;
      out.large_entries = event.large_entries;
      out.tombstones = event.tombstones;
      out.segments = event.segments;
      out.first_tree_id = event.tree_id;  // a shipped tree is written whole
      out.bloom_keys = event.entries;
      levels_.ReserveTreeId(event.tree_id);
    }
    levels_.ReserveTreeId(uint32_t(event.compaction));
    levels_.Apply([&](Version& next) {
      if (event.replaced_level != 0) next.levels[event.replaced_level] = LevelDesc{};
      next.levels[event.dest_level] = out;
    });
    if (resume_at != 0) levels_.set_import_resume(resume_at);
    if (event.next_keyspace_id != 0 &&
        !keyspaces_.Mirror(event.keyspaces, event.next_keyspace_id)) {
      s = Status::Corruption("compaction " + std::to_string(event.compaction) +
                             " names more keyspaces than this node's table holds");
    }
    image = levels_.NextManifest(logs_.last_lsn(), segments_, keyspaces_, logs_);
  }
  import_.reset();
  // A table the primary's own (of the same size) held cannot overflow here unless the frame
  // lies: the install is then not made durable, and a restart feeds it again.
  if (!s.ok()) return s;
  s = levels_.WriteManifest(image);
  if (!s.ok()) return s;  // as for a compaction of this node: nothing is freed early
  for (uint32_t tree : retired_trees) reclaimer_.Retire(RetiredItem::kTree, tree);
  for (uint32_t seg : retired_segments) reclaimer_.Retire(RetiredItem::kSegment, seg);
  shared_->counters.compactions++;
  reclaimer_.Reclaim();
  row_cache_.InvalidateAll();  // the levels changed under the cached values
  return Status::OK();
}

// Where the host feeds imports again after a restart.
uint64_t EngineImpl::ImportResumePosition() {
  return levels_.import_resume();
}

// Frees every segment the import of `compaction` allocated; none was named by a manifest.
void EngineImpl::AbandonImport(uint64_t compaction) {
  if (import_ == nullptr || import_->begin.compaction != compaction) return;
  for (const auto& map : {import_->index, import_->medium}) {
    for (const auto& [primary, local] : map) segments_.Free(local);
  }
  import_.reset();
}

// Under the compaction lock as an install: the stale levels are swapped out, the manifest
// written, then their trees retired as a compaction's are.
Status EngineImpl::ImportLevels(const std::vector<uint32_t>& level_trees) {
  if (import_ != nullptr) AbandonImport(import_->begin.compaction);  // a seed ends no compaction
  SharedLock compacting(&shared_->compaction_mu);
  std::vector<uint32_t> retired_trees;
  std::vector<uint32_t> retired_segments;
  std::string image;
  {
    SharedLock w(&shared_->write_mu);
    SharedLock a(segments_.mutex());
    Version before = levels_.Current();
    std::vector<uint32_t> stale;
    for (uint32_t level = 1; level <= options_.max_levels; level++) {
      uint32_t want = level < level_trees.size() ? level_trees[level] : 0;
      uint32_t have = before.levels[level].tree_id;
      if (want != 0 && want != have) {
        return Status::Corruption("the seed has tree " + std::to_string(want) + " at level " +
                                  std::to_string(level) + ", this node tree " +
                                  std::to_string(have));
      }
      if (want == 0 && have != 0) stale.push_back(level);
    }
    if (stale.empty()) return Status::OK();
    for (uint32_t level : stale) {
      MarkTreesRetired(before, 0, level, &retired_trees, &retired_segments);
    }
    levels_.Apply([&](Version& next) {
      for (uint32_t level : stale) next.levels[level] = LevelDesc{};
    });
    image = levels_.NextManifest(logs_.last_lsn(), segments_, keyspaces_, logs_);
  }
  Status s = levels_.WriteManifest(image);
  if (!s.ok()) return s;
  for (uint32_t tree : retired_trees) reclaimer_.Retire(RetiredItem::kTree, tree);
  for (uint32_t seg : retired_segments) reclaimer_.Retire(RetiredItem::kSegment, seg);
  reclaimer_.Reclaim();
  row_cache_.InvalidateAll();  // the levels changed under the cached values
  return Status::OK();
}

}  // namespace slipstream::engine
