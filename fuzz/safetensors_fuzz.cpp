// The safetensors reader (runtime/safetensors.hpp): a layer file of a
// checkpoint, or any producer's file. Input: the file's bytes, in an
// in-memory file (memfd) the reader opens by path as it opens a real one;
// its tensors are read when the header checks out.
#include "fuzz.hpp"

#include "h2/runtime/safetensors.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <string>

namespace {

/// The in-memory file the inputs go through, made once per process.
int memory_file() {
  static const int fd = [] {
    const int f = ::memfd_create("h2-fuzz-safetensors", MFD_CLOEXEC);
    if (f < 0)
      h2::fuzz::finding("memfd_create failed (not a finding of the reader)");
    return f;
  }();
  return fd;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  using namespace h2::runtime;
  const int fd = memory_file();
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, data, size, 0) != static_cast<ssize_t>(size))
    h2::fuzz::finding("cannot write the memfd (not a finding of the reader)");
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  h2::fuzz::decodes([&] {
    safetensors_reader reader(path);
    std::uint64_t total = 0;
    for (const auto& t : reader.tensors()) {
      h2::fuzz::require(dtype_bytes(t.dtype) != 0, "a known dtype");
      for (auto d : t.shape)
        h2::fuzz::require(d >= 0, "tensor sizes >= 0");
    }
    std::uint32_t crc = 0;
    const auto tensors = reader.read_tensors(crc);
    h2::fuzz::require(tensors.size() == reader.tensors().size(),
                      "every tensor read");
    for (const auto& t : tensors)
      total += t.bytes.size();
    h2::fuzz::require(total <= size, "no more tensor bytes than the file");
  });
  return 0;
}
