// page_touch_bench: what a process pays the first time it touches a page of shared memory that
// another process already filled, against touching it again, on 4-kB pages and, where the
// kernel has them reserved, on 2-MB huge pages. A PostgreSQL backend meets this for every page
// of slipstream's arena (row cache ring, memtables, log buffers) the first time it reaches it
// (docs/benchmarks.md, "F's gap is 4-kB pages").
//
//   build/bench/page_touch_bench [--mb=N]   (N MB of shared memory, default 256)
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace {

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Writes one byte in every 4-kB page of [base, base + bytes); the microseconds a page took.
double TouchMicrosPerPage(char* base, size_t bytes) {
  double start = Seconds();
  for (size_t offset = 0; offset < bytes; offset += 4096) base[offset]++;
  return (Seconds() - start) * 1e6 / double(bytes / 4096);
}

// In a child forked after the parent filled the region (as backends are forked after the
// postmaster made shared memory): the first touch, a second one, and a first touch after
// MADV_POPULATE_WRITE, per 4-kB page, printed on one line.
void MeasureInChild(const char* label, char* base, size_t bytes) {
  std::fflush(stdout);
  pid_t child = fork();
  if (child == 0) {
    double first = TouchMicrosPerPage(base, bytes);
    double again = TouchMicrosPerPage(base, bytes);
    std::printf("%-22s first touch %8.3f us/page, again %7.3f us/page, ratio %7.1fx\n", label,
                first, again, first / again);
    std::fflush(stdout);
    _exit(0);
  }
  waitpid(child, nullptr, 0);
  child = fork();
  if (child == 0) {
    double start = Seconds();
    int rc = madvise(base, bytes, MADV_POPULATE_WRITE);
    double populate = (Seconds() - start) * 1e6 / double(bytes / 4096);
    double first = TouchMicrosPerPage(base, bytes);
    if (rc == 0)
      std::printf("%-22s populate    %8.3f us/page, then   %7.3f us/page\n", label, populate,
                  first);
    else
      std::printf("%-22s MADV_POPULATE_WRITE unsupported (%s)\n", label, std::strerror(errno));
    std::fflush(stdout);
    _exit(0);
  }
  waitpid(child, nullptr, 0);
}

}  // namespace

int main(int argc, char** argv) {
  size_t megabytes = 256;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg.rfind("--mb=", 0) == 0 && std::atoi(arg.c_str() + 5) > 0) {
      megabytes = size_t(std::atoi(arg.c_str() + 5));
    } else {
      std::fprintf(stderr, "usage: %s [--mb=N]\n", argv[0]);
      return 2;
    }
  }
  size_t bytes = megabytes << 20;
  std::printf("%zu MB of shared memory, filled by the parent, touched by forked children\n",
              megabytes);
  void* small = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (small == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  std::memset(small, 1, bytes);
  MeasureInChild("4-kB pages", static_cast<char*>(small), bytes);
  munmap(small, bytes);

  void* huge =
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
  if (huge == MAP_FAILED) {
    std::printf("2-MB pages             not reserved (sysctl vm.nr_hugepages=%zu to measure)\n",
                bytes >> 21);
    return 0;
  }
  std::memset(huge, 1, bytes);
  MeasureInChild("2-MB pages", static_cast<char*>(huge), bytes);
  munmap(huge, bytes);
  return 0;
}
