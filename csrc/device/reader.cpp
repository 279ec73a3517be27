#include "reader.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "kernels/thread_pool.h"

namespace hf2q::device {

void pread_full(int fd, std::uint8_t* dst, std::size_t len, std::uint64_t off) {
  while (len > 0) {
    const std::size_t want = std::min<std::size_t>(len, 1u << 30);
    const ssize_t r = ::pread(fd, dst, want, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      CheckpointReadError e(ReadFailure::Io, "read of " + std::to_string(want) + " bytes at offset " +
                                                 std::to_string(off) + " failed: " + std::strerror(err));
      e.sys_errno = err;
      throw e;
    }
    if (r == 0) {
      throw CheckpointReadError(ReadFailure::Truncated,
                                "unexpected end of file at offset " + std::to_string(off) + " with " +
                                    std::to_string(len) + " bytes still expected (file truncated or rewritten?)");
    }
    dst += r;
    len -= static_cast<std::size_t>(r);
    off += static_cast<std::uint64_t>(r);
  }
}

void read_range(int fd, std::uint8_t* dst, std::size_t len, std::uint64_t off, std::size_t chunk) {
  std::uint64_t end = 0;
  if (__builtin_add_overflow(off, static_cast<std::uint64_t>(len), &end) ||
      end > static_cast<std::uint64_t>(LLONG_MAX)) {
    throw CheckpointReadError(ReadFailure::Io, "file range overflows");
  }
  if (chunk == 0) chunk = kReadChunkBytes;
  parallel_for(len, chunk, [&](std::size_t b, std::size_t e) { pread_full(fd, dst + b, e - b, off + b); });
}

}  // namespace hf2q::device
