// The frame decoder (transport/wire.hpp): a 128-byte frame header from a
// peer, and the 16-byte placement record that follows a placed one. Input:
// the header's bytes, then (when long enough) the record's. Each header is
// decoded as it came and, so that mutations reach the checks behind the
// header CRC, again with its CRC made to match.
#include "fuzz.hpp"

#include "h2/core/crc32c.hpp"
#include "h2/transport/wire.hpp"

#include <algorithm>
#include <array>
#include <cstring>

namespace wire = h2::transport::wire;

namespace {

/// framed_channel's default payload limit (framed.hpp).
constexpr std::uint64_t max_payload_bytes = std::uint64_t{1} << 36;

void check_frame(const std::byte* in, std::size_t size) {
  using h2::fuzz::require;
  wire::frame_header h;
  if (!h2::fuzz::decodes([&] { h = wire::decode(in, max_payload_bytes); }))
    return;

  // What the receiving side relies on once a header decoded.
  require(h.payload_bytes <= max_payload_bytes, "payload within the limit");
  if ((h.flags & wire::flag::tensor) != 0) {
    require(h.ndim <= wire::max_dims, "at most max_dims dimensions");
    unsigned __int128 numel = 1;
    for (int i = 0; i < h.ndim; ++i) {
      require(h.shape[static_cast<std::size_t>(i)] >= 0, "sizes >= 0");
      numel *=
        static_cast<unsigned __int128>(h.shape[static_cast<std::size_t>(i)]);
    }
    require(numel * wire::element_size(h.dtype) == h.payload_bytes,
            "shape times element size is the payload size");
    h2::fuzz::decodes([&] { (void)wire::scalar_type_of(h.dtype); });
  } else {
    require((h.flags & wire::flag::placed) == 0, "only tensors are placed");
  }
  if ((h.flags & wire::flag::on_device) != 0)
    require((h.flags & wire::flag::placed) != 0 &&
              (h.flags & wire::flag::payload_crc) == 0,
            "device payloads are placed and never checksummed");
  // A header that decodes is one this build could have sent: encoding it
  // again gives the same bytes (no field is ignored).
  std::byte again[wire::header_bytes];
  wire::encode(h, again);
  require(std::memcmp(again, in, wire::header_bytes) == 0,
          "a decoded header encodes to the same bytes");

  if ((h.flags & wire::flag::placed) != 0 &&
      size >= wire::header_bytes + wire::placement_bytes) {
    wire::placement p;
    if (h2::fuzz::decodes([&] {
          p = wire::decode_placement(in + wire::header_bytes, h.payload_bytes);
        }))
      require(p.bytes == h.payload_bytes, "a placement of the payload's size");
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  if (size < wire::header_bytes)
    return 0;
  const auto* in = reinterpret_cast<const std::byte*>(data);
  check_frame(in, size);
  std::array<std::byte, wire::header_bytes + wire::placement_bytes> fixed{};
  const std::size_t n = std::min(size, fixed.size());
  std::memcpy(fixed.data(), in, n);
  const std::uint32_t crc = h2::crc32c(fixed.data(), 124);
  std::memcpy(fixed.data() + 124, &crc, sizeof(crc));
  if (std::memcmp(fixed.data(), in, wire::header_bytes) != 0)
    check_frame(fixed.data(), n);
  return 0;
}
