// shm_heap.h: a peer's heap as the shm backend's connections and ShmPeerWriter see it.
#include "shm_heap.h"

#include <emmintrin.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

namespace slipstream::rdma {

namespace {

// A table entry that stays mid-update this many reads is treated as absent.
constexpr int kMaxSeqlockRetries = 1 << 16;
constexpr uint64_t kPageBytes = 4096;

// Keeps the compiler from merging, reordering or turning into memcpy the stores around it.
inline void CompilerBarrier() {
  asm volatile("" ::: "memory");
}

// Text of errno for messages.
std::string ErrnoText(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

}  // namespace

// Reads an entry under its seqlock; false if the owner kept it mid-update for too long.
bool ReadEntry(const ShmTableEntry& entry, EntrySnapshot* out) {
  for (int attempt = 0; attempt < kMaxSeqlockRetries; attempt++) {
    const uint64_t before = entry.sequence.load(std::memory_order_acquire);
    if ((before & 1) != 0) continue;
    out->rkey = entry.rkey.load(std::memory_order_relaxed);
    out->base = entry.base.load(std::memory_order_relaxed);
    out->offset = entry.offset.load(std::memory_order_relaxed);
    out->length = entry.length.load(std::memory_order_relaxed);
    out->access = entry.access.load(std::memory_order_relaxed);
    out->state = entry.state.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (entry.sequence.load(std::memory_order_relaxed) == before) return true;
  }
  return false;
}

Status MapShmPeerHeap(const ShmHeapDescription& theirs, char** heap_out) {
  if (theirs.magic != kShmHeapMagic || theirs.version != kShmVersion ||
      theirs.table_entries != kShmTableEntries || theirs.ring_bytes != kShmRingBytes) {
    return Status::InvalidArgument("shm heap description of another format");
  }
  if (theirs.region_space == 0 || theirs.region_space > kShmMaxRegionSpace ||
      theirs.region_space % kPageBytes != 0 ||
      theirs.heap_size != kShmRegionOffset + theirs.region_space) {
    return Status::InvalidArgument("shm heap description with impossible sizes");
  }
  if (theirs.pid <= 0 || theirs.memfd < 0) {
    return Status::InvalidArgument("shm heap description names no process or file");
  }
  const std::string path =
      "/proc/" + std::to_string(theirs.pid) + "/fd/" + std::to_string(theirs.memfd);
  int peer_fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (peer_fd < 0) return Status::InvalidArgument(ErrnoText(("open " + path).c_str()));
  struct stat info {};
  Status s;
  if (::fstat(peer_fd, &info) != 0) {
    s = Status::IOError(ErrnoText("fstat of the peer's heap"));
  } else if (!S_ISREG(info.st_mode) || info.st_uid != ::geteuid() ||
             uint64_t(info.st_size) != theirs.heap_size) {
    s = Status::InvalidArgument("the peer's heap file does not match its description");
  } else {
    int seals = ::fcntl(peer_fd, F_GET_SEALS);
    if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
      s = Status::InvalidArgument("the peer's heap is not sealed against shrinking");
    }
  }
  if (!s.ok()) {
    ::close(peer_fd);
    return s;
  }
  void* heap = ::mmap(nullptr, theirs.heap_size, PROT_READ | PROT_WRITE, MAP_SHARED, peer_fd, 0);
  ::close(peer_fd);  // the mapping keeps the file alive
  if (heap == MAP_FAILED) return Status::IOError(ErrnoText("mmap of the peer's heap"));
  const auto* header = static_cast<const ShmHeapHeader*>(heap);
  if (header->magic != kShmHeapMagic || header->version != kShmVersion ||
      header->table_entries != kShmTableEntries || header->heap_size != theirs.heap_size ||
      header->region_space != theirs.region_space || header->ring_bytes != kShmRingBytes ||
      header->token[0] != theirs.token[0] || header->token[1] != theirs.token[1]) {
    ::munmap(heap, theirs.heap_size);
    return Status::InvalidArgument("the peer's heap does not carry its description");
  }
  *heap_out = static_cast<char*>(heap);
  return Status::OK();
}

char* ResolveInShmHeap(char* heap, uint64_t heap_size, const EntrySnapshot& entry,
                       uint64_t remote_addr, uint64_t length, uint32_t right) {
  if ((entry.access & right) != right) return nullptr;
  if (entry.offset < kShmRegionOffset || entry.offset > heap_size ||
      entry.length > heap_size - entry.offset) {
    return nullptr;
  }
  if (remote_addr < entry.base) return nullptr;
  const uint64_t offset = remote_addr - entry.base;
  if (offset > entry.length || length > entry.length - offset) return nullptr;
  return heap + entry.offset + offset;
}

// Copies with plain stores in strictly increasing address order. glibc's memcpy does not
// promise that (it stores the head of a large copy last, and may use non-temporal stores), but
// a torn WRITE must leave exactly a prefix behind, so placement uses this. Whole 16-byte
// stores go to 16-byte-aligned addresses, so no store straddles a cache line.
void CopyAscending(char* dst, const char* src, size_t length) {
  while (length > 0 && (reinterpret_cast<uintptr_t>(dst) & 15) != 0) {
    *dst++ = *src++;
    length--;
    CompilerBarrier();
  }
#if defined(__SSE2__)
  while (length >= 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_store_si128(reinterpret_cast<__m128i*>(dst), a);
    CompilerBarrier();
    _mm_store_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    CompilerBarrier();
    _mm_store_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    CompilerBarrier();
    _mm_store_si128(reinterpret_cast<__m128i*>(dst + 48), d);
    CompilerBarrier();
    dst += 64;
    src += 64;
    length -= 64;
  }
  while (length >= 16) {
    _mm_store_si128(reinterpret_cast<__m128i*>(dst),
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    CompilerBarrier();
    dst += 16;
    src += 16;
    length -= 16;
  }
#else
  // Without SSE2 (not an x86 build) the hardware may reorder plain stores: fence each 16 bytes.
  while (length >= 16) {
    for (int i = 0; i < 16; i++) dst[i] = src[i];
    std::atomic_thread_fence(std::memory_order_release);
    dst += 16;
    src += 16;
    length -= 16;
  }
#endif
  while (length > 0) {
    *dst++ = *src++;
    length--;
    CompilerBarrier();
  }
}

}  // namespace slipstream::rdma
