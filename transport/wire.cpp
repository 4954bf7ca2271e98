#include "h2/transport/wire.hpp"

#include "h2/core/crc32c.hpp"
#include "h2/core/error.hpp"

#include <cstring>
#include <limits>
#include <string>

namespace h2::transport::wire {

static_assert(std::numeric_limits<double>::is_iec559);

namespace {

template <class T>
void put(std::byte* out, std::size_t at, T v) noexcept {
  std::memcpy(out + at, &v, sizeof(T));
}

template <class T>
T get(const std::byte* in, std::size_t at) noexcept {
  T v;
  std::memcpy(&v, in + at, sizeof(T));
  return v;
}

[[noreturn]] void corrupt(const std::string& why) {
  throw transport_error(transport_errc::corrupt_frame, "corrupt frame: " + why);
}

} // namespace

std::size_t element_size(dtype_code code) noexcept {
  switch (code) {
    case dtype_code::float32:
    case dtype_code::int32:
      return 4;
    case dtype_code::bfloat16:
    case dtype_code::float16:
      return 2;
    case dtype_code::int64:
    case dtype_code::float64:
      return 8;
    case dtype_code::uint8:
      return 1;
  }
  return 0;
}

dtype_code code_of(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
      return dtype_code::float32;
    case c10::ScalarType::BFloat16:
      return dtype_code::bfloat16;
    case c10::ScalarType::Half:
      return dtype_code::float16;
    case c10::ScalarType::Long:
      return dtype_code::int64;
    case c10::ScalarType::Int:
      return dtype_code::int32;
    case c10::ScalarType::Byte:
      return dtype_code::uint8;
    case c10::ScalarType::Double:
      return dtype_code::float64;
    default:
      throw internal_error(std::string("DiComm cannot send tensors of type ") +
                           c10::toString(type));
  }
}

c10::ScalarType scalar_type_of(dtype_code code) {
  switch (code) {
    case dtype_code::float32:
      return c10::ScalarType::Float;
    case dtype_code::bfloat16:
      return c10::ScalarType::BFloat16;
    case dtype_code::float16:
      return c10::ScalarType::Half;
    case dtype_code::int64:
      return c10::ScalarType::Long;
    case dtype_code::int32:
      return c10::ScalarType::Int;
    case dtype_code::uint8:
      return c10::ScalarType::Byte;
    case dtype_code::float64:
      return c10::ScalarType::Double;
  }
  throw internal_error("unknown dtype code " +
                       std::to_string(static_cast<int>(code)));
}

void encode(const frame_header& h, std::byte* out) noexcept {
  std::memset(out, 0, header_bytes);
  put<std::uint32_t>(out, 0, magic);
  put<std::uint16_t>(out, 4, version);
  put<std::uint8_t>(out, 6, static_cast<std::uint8_t>(h.kind));
  put<std::uint8_t>(out, 7, h.flags);
  put<std::uint64_t>(out, 8, h.tag);
  put<double>(out, 16, h.virtual_clock);
  put<double>(out, 24, h.wall_clock);
  put<std::uint64_t>(out, 32, h.payload_bytes);
  put<std::uint32_t>(out, 40, h.payload_crc);
  if ((h.flags & flag::tensor) != 0) {
    put<std::uint8_t>(out, 44, static_cast<std::uint8_t>(h.dtype));
    put<std::uint8_t>(out, 45, h.ndim);
    for (int i = 0; i < h.ndim && i < max_dims; ++i)
      put<std::int64_t>(out, 48 + 8 * static_cast<std::size_t>(i),
                        h.shape[static_cast<std::size_t>(i)]);
  }
  put<std::uint32_t>(out, 124, crc32c(out, 124));
}

frame_header decode(const std::byte* in, std::uint64_t max_payload_bytes) {
  if (get<std::uint32_t>(in, 0) != magic)
    throw transport_error(transport_errc::protocol_mismatch,
                          "not a DiComm frame (bad magic): the peer speaks "
                          "another protocol");
  auto v = get<std::uint16_t>(in, 4);
  if (v != version)
    throw transport_error(transport_errc::protocol_mismatch,
                          "peer speaks DiComm protocol version " +
                            std::to_string(v) + ", this build speaks " +
                            std::to_string(version));
  if (get<std::uint32_t>(in, 124) != crc32c(in, 124))
    corrupt("header checksum mismatch");
  frame_header h;
  auto kind = get<std::uint8_t>(in, 6);
  if (kind < 1 || kind > 3)
    corrupt("unknown frame kind " + std::to_string(kind));
  h.kind = static_cast<frame_kind>(kind);
  h.flags = get<std::uint8_t>(in, 7);
  if ((h.flags & ~flag::all) != 0)
    corrupt("unknown flags");
  if ((h.flags & flag::on_device) != 0 &&
      ((h.flags & flag::placed) == 0 || (h.flags & flag::payload_crc) != 0))
    corrupt("a device payload that is not placed, or with a checksum");
  h.tag = get<std::uint64_t>(in, 8);
  h.virtual_clock = get<double>(in, 16);
  h.wall_clock = get<double>(in, 24);
  // Clocks are seconds since the run's origin: a NaN, an infinity, a
  // negative (virtual) or an absurd value would corrupt the receiving
  // chip's clock. Another host's wall clock may run a little behind the
  // origin (skew between hosts), not more than max_clock_skew_seconds.
  if (!(h.virtual_clock >= 0 && h.virtual_clock < max_clock_seconds))
    corrupt("virtual clock of " + std::to_string(h.virtual_clock) +
            " s (expected 0 to " + std::to_string(max_clock_seconds) +
            " s since the run's origin)");
  if (!(h.wall_clock > -max_clock_skew_seconds &&
        h.wall_clock < max_clock_seconds))
    corrupt("wall clock of " + std::to_string(h.wall_clock) + " s (expected " +
            std::to_string(-max_clock_skew_seconds) + " to " +
            std::to_string(max_clock_seconds) + " s since the run's origin)");
  h.payload_bytes = get<std::uint64_t>(in, 32);
  h.payload_crc = get<std::uint32_t>(in, 40);
  if (h.payload_bytes > max_payload_bytes)
    corrupt("payload of " + std::to_string(h.payload_bytes) +
            " bytes exceeds the limit of " +
            std::to_string(max_payload_bytes));
  for (std::size_t i = 46; i < 48; ++i)
    if (in[i] != std::byte{0})
      corrupt("reserved bytes set");
  for (std::size_t i = 112; i < 124; ++i)
    if (in[i] != std::byte{0})
      corrupt("reserved bytes set");
  h.ndim = get<std::uint8_t>(in, 45);
  auto dtype = get<std::uint8_t>(in, 44);
  if ((h.flags & flag::tensor) == 0) {
    bool shaped = h.ndim != 0 || dtype != 0;
    for (int i = 0; i < max_dims; ++i)
      shaped = shaped ||
               get<std::int64_t>(in, 48 + 8 * static_cast<std::size_t>(i)) != 0;
    if (shaped)
      corrupt("byte payload with a tensor shape");
    if ((h.flags & flag::placed) != 0)
      corrupt("a placed byte payload");
    return h;
  }
  h.dtype = static_cast<dtype_code>(dtype);
  std::size_t elem = element_size(h.dtype);
  if (elem == 0)
    corrupt("unknown dtype code " + std::to_string(dtype));
  if (h.ndim > max_dims)
    corrupt(std::to_string(h.ndim) + " dimensions (at most " +
            std::to_string(max_dims) + ")");
  unsigned __int128 numel = 1;
  for (int i = 0; i < max_dims; ++i) {
    auto d = get<std::int64_t>(in, 48 + 8 * static_cast<std::size_t>(i));
    if (i >= h.ndim) {
      if (d != 0)
        corrupt("shape beyond ndim");
      continue;
    }
    if (d < 0)
      corrupt("negative dimension");
    h.shape[static_cast<std::size_t>(i)] = d;
    numel *= static_cast<unsigned __int128>(d);
    if (numel > max_payload_bytes)
      corrupt("shape too large");
  }
  if (numel * elem != h.payload_bytes)
    corrupt("tensor shape does not match the payload size");
  return h;
}

void encode(const placement& p, std::byte* out) noexcept {
  put<std::uint64_t>(out, 0, p.offset);
  put<std::uint64_t>(out, 8, p.bytes);
}

placement decode_placement(const std::byte* in, std::uint64_t payload_bytes) {
  placement p{get<std::uint64_t>(in, 0), get<std::uint64_t>(in, 8)};
  if (p.bytes != payload_bytes)
    corrupt("placement of " + std::to_string(p.bytes) +
            " bytes for a payload of " + std::to_string(payload_bytes));
  return p;
}

void encode(const hello_payload& h, std::byte* out) noexcept {
  put<std::uint64_t>(out, 0, h.channel);
  put<std::uint32_t>(out, 8, h.node_rank);
  put<std::uint32_t>(out, 12, h.step);
  std::memcpy(out + 16, h.nonce.data(), 32);
  std::memcpy(out + 48, h.proof.data(), 32);
}

hello_payload decode_hello(const std::byte* in, std::size_t size) {
  if (size != hello_bytes)
    corrupt("handshake of " + std::to_string(size) + " bytes");
  hello_payload h;
  h.channel = get<std::uint64_t>(in, 0);
  h.node_rank = get<std::uint32_t>(in, 8);
  h.step = get<std::uint32_t>(in, 12);
  if (h.step < 1 || h.step > 4)
    corrupt("handshake step " + std::to_string(h.step));
  std::memcpy(h.nonce.data(), in + 16, 32);
  std::memcpy(h.proof.data(), in + 48, 32);
  return h;
}

} // namespace h2::transport::wire
