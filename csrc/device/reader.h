// The one checkpoint reader: every byte hf2q reads from a checkpoint file
// goes through here (header bytes and tensor data alike), by pread, in
// parallel bounded chunks on the shared thread pool. Facts:
// docs/SAFETENSORS.md (reading).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend.h"

namespace hf2q::device {

// Why a read failed; crosses the binding as FileReadError.code.
enum class ReadFailure { Io, Truncated };

// FileReadError carrying its cause: kTruncated when the file ended before
// the bytes expected (it shrank or was rewritten), kIo for an OS error.
class CheckpointReadError : public FileReadError {
 public:
  CheckpointReadError(ReadFailure why, const std::string& what) : FileReadError(what), why_(why) {}
  ReadFailure why() const { return why_; }

 private:
  ReadFailure why_;
};

// Bytes per parallel chunk of a large read (and of a raw upload).
inline constexpr std::size_t kReadChunkBytes = 8u << 20;

// Reads exactly `len` bytes at `off` into `dst`; retries EINTR and short
// reads. Throws CheckpointReadError.
void pread_full(int fd, std::uint8_t* dst, std::size_t len, std::uint64_t off);

// pread_full over [off, off + len) split into `chunk`-byte pieces (0: the
// default) served in parallel; the first failure is rethrown after every
// piece has finished (no worker writes into dst afterwards).
void read_range(int fd, std::uint8_t* dst, std::size_t len, std::uint64_t off, std::size_t chunk = 0);

}  // namespace hf2q::device
