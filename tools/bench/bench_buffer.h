// A benchmark's data buffer: page-aligned and touched once at allocation, so no page fault
// lands in a timed loop (a first touch can cost ~15 us per 4 KiB page in a virtual machine).
#ifndef BRAID_TOOLS_BENCH_BENCH_BUFFER_H_
#define BRAID_TOOLS_BENCH_BENCH_BUFFER_H_

#include <stdlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>

namespace braid::bench {

struct Buffer {
  explicit Buffer(size_t bytes) : size(std::max<size_t>(bytes, 1)) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, size) != 0 || p == nullptr) {
      std::fprintf(stderr, "cannot allocate %zu bytes\n", size);
      std::abort();
    }
    std::memset(p, 0, size);
    data = static_cast<char*>(p);
  }
  ~Buffer() { free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* floats() { return reinterpret_cast<float*>(data); }

  size_t size;  // bytes (at least 1)
  char* data;
};

}  // namespace braid::bench

#endif  // BRAID_TOOLS_BENCH_BENCH_BUFFER_H_
