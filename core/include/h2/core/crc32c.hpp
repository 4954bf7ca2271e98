// CRC32C (Castagnoli), the checksum of DiComm frames, checkpoint files and
// token shards. Uses SSE4.2's crc32
// instruction where the CPU has it, a table otherwise.
#pragma once

#include <cstddef>
#include <cstdint>

namespace h2 {

/// Extends `crc` (0 to start) over `size` bytes at `data`.
std::uint32_t crc32c(const void* data, std::size_t size,
                     std::uint32_t crc = 0) noexcept;

} // namespace h2
