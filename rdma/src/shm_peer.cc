// ShmPeerWriter: see slipstream/rdma/shm_peer.h.
#include "slipstream/rdma/shm_peer.h"

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>

#include "shm_heap.h"

namespace slipstream::rdma {

ShmPeerWriter::~ShmPeerWriter() {
  if (heap_ != nullptr) ::munmap(heap_, ref_.heap_size);
  if (pidfd_ >= 0) ::close(pidfd_);
}

Status ShmPeerWriter::Open(const ShmPeerRef& ref, std::unique_ptr<ShmPeerWriter>* writer) {
  ShmHeapDescription theirs{};
  theirs.magic = kShmHeapMagic;
  theirs.version = kShmVersion;
  theirs.pid = ref.pid;
  theirs.memfd = ref.memfd;
  theirs.table_entries = kShmTableEntries;
  theirs.heap_size = ref.heap_size;
  theirs.region_space = ref.region_space;
  theirs.ring_bytes = kShmRingBytes;
  theirs.token[0] = ref.token[0];
  theirs.token[1] = ref.token[1];
  // The process first, then its file: a pid reused in between names another process, whose
  // file does not carry the description's token.
#ifdef SYS_pidfd_open
  const int pidfd = int(::syscall(SYS_pidfd_open, ref.pid, 0));
#else
  const int pidfd = -1;
#endif
  char* heap = nullptr;
  Status s = MapShmPeerHeap(theirs, &heap);
  if (!s.ok()) {
    if (pidfd >= 0) ::close(pidfd);
    return s;
  }
  std::unique_ptr<ShmPeerWriter> opened(new ShmPeerWriter());
  opened->ref_ = ref;
  opened->heap_ = heap;
  opened->pidfd_ = pidfd;
  *writer = std::move(opened);
  return Status::OK();
}

bool ShmPeerWriter::Maps(const ShmPeerRef& ref) const {
  return ref.pid == ref_.pid && ref.memfd == ref_.memfd && ref.token[0] == ref_.token[0] &&
         ref.token[1] == ref_.token[1] && ref.heap_size == ref_.heap_size;
}

Status ShmPeerWriter::Write(uint64_t rkey, uint64_t remote_addr, const void* data, size_t length) {
  if (rkey == 0) return Status::RemoteAccess("no key");
  const auto* header = reinterpret_cast<const ShmHeapHeader*>(heap_);
  const auto* table = reinterpret_cast<const ShmTableEntry*>(heap_ + kShmTableOffset);
  const uint32_t used =
      std::min<uint32_t>(header->table_used.load(std::memory_order_acquire), kShmTableEntries);
  EntrySnapshot entry;
  bool found = cached_slot_ < used && ReadEntry(table[cached_slot_], &entry) &&
               entry.rkey == rkey && entry.state == kShmEntryValid;
  for (uint32_t slot = 0; !found && slot < used; slot++) {
    if (table[slot].rkey.load(std::memory_order_relaxed) != rkey) continue;
    if (ReadEntry(table[slot], &entry) && entry.rkey == rkey && entry.state == kShmEntryValid) {
      cached_slot_ = slot;
      found = true;
    }
  }
  if (!found) return Status::RemoteAccess("the peer holds no region with that key");
  char* target = ResolveInShmHeap(heap_, ref_.heap_size, entry, remote_addr, length, kRemoteWrite);
  if (target == nullptr) return Status::RemoteAccess("the WRITE leaves the region or its rights");
  CopyAscending(target, static_cast<const char*>(data), length);
  // A later WRITE's bytes must never become visible before this one's. Then the key is looked
  // at again: the peer revokes its regions before it reads them for the last time (a fence,
  // or the end of the connection), so a WRITE that still finds its key valid here landed
  // before that read and counts; one that does not may have landed too late.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  EntrySnapshot again;
  if (!ReadEntry(table[cached_slot_], &again) || again.rkey != rkey ||
      again.state != kShmEntryValid || again.offset != entry.offset) {
    return Status::RemoteAccess("the peer revoked the region during the WRITE");
  }
  // A peer that died keeps its keys: only its exit tells that nobody holds these bytes.
  if (!PeerAlive()) return Status::Disconnected("the peer's process has exited");
  return Status::OK();
}

bool ShmPeerWriter::PeerAlive() const {
  if (pidfd_ >= 0) {
    pollfd p{pidfd_, POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;  // readable once the process has exited
  }
  return ::kill(ref_.pid, 0) == 0 || errno == EPERM;
}

}  // namespace slipstream::rdma
