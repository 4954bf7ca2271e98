#include "h2/core/crc32c.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#endif

namespace h2 {

namespace {

constexpr std::uint32_t poly = 0x82f63b78; // reflected Castagnoli

constexpr std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) != 0 ? (c >> 1) ^ poly : c >> 1;
    t[i] = c;
  }
  return t;
}

constexpr auto table = make_table();

std::uint32_t crc_table(const unsigned char* p, std::size_t n,
                        std::uint32_t crc) noexcept {
  while (n-- != 0)
    crc = table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t
crc_sse42(const unsigned char* p, std::size_t n, std::uint32_t crc) noexcept {
  std::uint64_t c = crc;
  while (n >= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n-- != 0)
    c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

bool has_sse42() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_SSE4_2) != 0;
}
#endif

} // namespace

std::uint32_t crc32c(const void* data, std::size_t size,
                     std::uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  static const bool fast = has_sse42();
  crc = fast ? crc_sse42(p, size, crc) : crc_table(p, size, crc);
#else
  crc = crc_table(p, size, crc);
#endif
  return ~crc;
}

} // namespace h2
