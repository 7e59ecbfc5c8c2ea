// The manifest: a durable snapshot of the levels, the segment accounting and the keyspaces,
// replaced atomically after every compaction and at the end of recovery. Recovery loads it,
// then replays the logs from where it leaves off (recovery.cc).
#include <cstddef>
#include <cstring>
#include <string_view>

#include "coding.h"
#include "crc32c.h"
#include "device.h"
#include "keyspace_table.h"
#include "level_set.h"
#include "log_set.h"
#include "segment_table.h"

namespace slipstream::engine {

namespace {

constexpr uint64_t kManifestMagic = 0x31464e414d535353ull;  // "SSSMANF1"
// 2 added the first uncompacted large-log sequence, 3 the large-log accounted LSN, 4 a
// replica's import resume position, 5 each level's lineage of kept leaves, build flags, dead
// bytes and bloom filter load (LevelDesc).
constexpr uint32_t kManifestVersion = 5;

// Bounds-checked reading of the manifest image.
class ManifestReader {
 public:
  explicit ManifestReader(std::string_view data) : data_(data) {}
  bool Read(void* dst, size_t n) {
    if (pos_ + n > data_.size()) return false;
    std::memcpy(dst, data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Get(T* v) {
    return Read(v, sizeof(T));
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

template <typename T>
void Append(std::string* out, const T& v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

}  // namespace

std::string LevelSet::NextManifest(Lsn snapshot_lsn, const SegmentTable& segments,
                                   const KeyspaceTable& keyspaces, const LogSet& logs) {
  shared_->manifest_number++;
  const Version& v = shared_->current;
  std::string out;
  Append(&out, kManifestMagic);
  Append(&out, kManifestVersion);
  Append(&out, options_.segment_size);
  Append(&out, options_.node_size);
  Append(&out, options_.max_levels);
  Append(&out, shared_->manifest_number);
  Append(&out, shared_->compacted_lsn);
  Append(&out, snapshot_lsn);
  Append(&out, shared_->next_tree_id.load());
  Append(&out, keyspaces.next_id());
  Append(&out, logs.next_sequence(LogKind::kL0));
  Append(&out, logs.next_sequence(LogKind::kLarge));
  Append(&out, v.immutable_memtable >= 0 ? v.immutable_first_large_sequence
                                         : v.active_first_large_sequence);
  Append(&out, shared_->large_accounted_lsn);
  Append(&out, shared_->import_resume);
  for (uint32_t level = 1; level <= options_.max_levels; level++) Append(&out, v.levels[level]);
  std::string segs;
  uint32_t nsegs = 0;
  for (uint64_t i = 1; i < segments.count(); i++) {
    const SegmentInfo& info = segments.info(i);
    if (info.kind == uint8_t(SegmentKind::kFree) ||
        (info.flags & (kSegmentRetired | kSegmentPending))) {
      continue;
    }
    Append(&segs, uint32_t(i));
    Append(&segs, info);
    nsegs++;
  }
  Append(&out, nsegs);
  out += segs;
  std::string kss;
  uint32_t nks = 0;
  keyspaces.ForEachRecorded([&](uint64_t tag, uint32_t id, uint32_t state) {
    Append(&kss, tag);
    Append(&kss, id);
    Append(&kss, state);
    nks++;
  });
  Append(&out, nks);
  out += kss;
  uint32_t crc = crc32c::Value(out.data(), out.size());
  Append(&out, crc);
  return out;
}

Status LevelSet::WriteManifest(const std::string& image) {
  counters_->device_bytes_written += image.size();
  return WriteFileAtomically(ManifestPath(), image);
}

Status LevelSet::ReadManifest(std::string* image) const {
  return ReadWholeFile(ManifestPath(), image);
}

Status LevelSet::LoadManifest(const std::string& image, SegmentTable* segments,
                              KeyspaceTable* keyspaces, LogSet* logs, ManifestTail* tail) {
  if (image.size() < 4 || crc32c::Value(image.data(), image.size() - 4) !=
                              DecodeFixed32(image.data() + image.size() - 4)) {
    return Status::Corruption("MANIFEST checksum mismatch");
  }
  ManifestReader r(std::string_view(image.data(), image.size() - 4));
  uint64_t magic;
  uint32_t version, segment_size, node_size, max_levels;
  bool ok = r.Get(&magic) && r.Get(&version) && r.Get(&segment_size) && r.Get(&node_size) &&
            r.Get(&max_levels);
  if (!ok || magic != kManifestMagic || version < 1 || version > kManifestVersion) {
    return Status::Corruption("MANIFEST has a bad magic number or version");
  }
  if (segment_size != options_.segment_size || node_size != options_.node_size ||
      max_levels != options_.max_levels) {
    return Status::InvalidArgument(
        "segment_size, node_size and max_levels must match the "
        "values the engine was created with");
  }
  uint32_t next_tree_id = 0, next_keyspace_id = 0;
  uint64_t l0_next_sequence = 0, large_next_sequence = 0;
  ok = r.Get(&shared_->manifest_number) && r.Get(&shared_->compacted_lsn) &&
       r.Get(&tail->snapshot_lsn) && r.Get(&next_tree_id) && r.Get(&next_keyspace_id) &&
       r.Get(&l0_next_sequence) && r.Get(&large_next_sequence);
  if (ok && version >= 2) ok = r.Get(&tail->first_large_sequence);
  if (ok && version >= 3) ok = r.Get(&shared_->large_accounted_lsn);
  if (ok && version >= 4) ok = r.Get(&shared_->import_resume);
  for (uint32_t level = 1; ok && level <= max_levels; level++) {
    LevelDesc& d = shared_->current.levels[level];
    if (version >= 5) {
      ok = r.Get(&d);
    } else {  // before kept leaves: every tree was written whole
      d = LevelDesc{};
      ok = r.Read(&d, offsetof(LevelDesc, first_tree_id));
      d.first_tree_id = d.tree_id;
      d.bloom_keys = d.entries;
    }
  }
  shared_->next_tree_id.store(next_tree_id);
  keyspaces->set_next_id(next_keyspace_id);
  logs->set_next_sequence(LogKind::kL0, l0_next_sequence);
  logs->set_next_sequence(LogKind::kLarge, large_next_sequence);
  uint32_t nsegs = 0, nks = 0;
  ok = ok && r.Get(&nsegs);
  for (uint32_t i = 0; ok && i < nsegs; i++) {
    uint32_t seg;
    SegmentInfo info;
    ok = r.Get(&seg) && r.Get(&info);
    if (ok && (seg == 0 || seg >= segments->count())) {
      return Status::Corruption("MANIFEST names segment " + std::to_string(seg) +
                                " beyond the device file");
    }
    if (ok) segments->info(seg) = info;
  }
  ok = ok && r.Get(&nks);
  for (uint32_t i = 0; ok && i < nks; i++) {
    uint64_t tag;
    uint32_t id, state;
    ok = r.Get(&tag) && r.Get(&id) && r.Get(&state);
    if (!ok) break;
    // NextManifest records each live or dropped keyspace once; anything else is damage, which
    // would leave a slot no lookup, listing or later manifest accounts for.
    if (state != KeyspaceSlot::kLive && state != KeyspaceSlot::kDropped) {
      return Status::Corruption("MANIFEST keyspace " + std::to_string(id) +
                                " is in an impossible state");
    }
    if (keyspaces->Find(id) != nullptr) {
      return Status::Corruption("MANIFEST names keyspace " + std::to_string(id) + " twice");
    }
    KeyspaceSlot* slot = keyspaces->Insert(id);
    if (slot == nullptr) return Status::Corruption("MANIFEST keyspace table does not fit");
    slot->tag = tag;
    slot->state.store(state);
  }
  if (!ok) return Status::Corruption("MANIFEST is truncated");
  for (uint32_t level = 1; level <= max_levels; level++) {
    const LevelDesc& d = shared_->current.levels[level];
    if (d.tree_id != 0 && (d.root.segment >= segments->count() || d.tree_id >= next_tree_id ||
                           d.first_tree_id == 0 || d.first_tree_id > d.tree_id)) {
      return Status::Corruption("MANIFEST level " + std::to_string(level) + " is impossible");
    }
  }
  return Status::OK();
}

}  // namespace slipstream::engine
