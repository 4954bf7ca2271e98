#include "h2/transport/link.hpp"

#include "h2/core/error.hpp"

namespace h2::transport {

// -- links: what a backend may leave out
// ---------------------------------------------------------------

std::optional<wire::placement> byte_link::place(buffer_view) {
  return std::nullopt;
}

std::optional<wire::placement> byte_link::place_on_device(buffer_view, int) {
  return std::nullopt;
}

bool byte_link::writes_from_device(buffer_view) {
  return false;
}

void byte_link::read(void* data, std::size_t size,
                     std::optional<deadline> until) {
  auto* p = static_cast<std::byte*>(data);
  const std::byte* start = p;
  try {
    while (size > 0) {
      const std::uint32_t seen = wake_count();
      const std::size_t n = read_some(p, size);
      if (n == 0) {
        wait_readable(seen, until.value_or(deadline::max()));
        continue;
      }
      p += n;
      size -= n;
    }
  } catch (const transport_error& e) {
    if (e.code() != transport_errc::peer_closed || p == start)
      throw;
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: " + std::string(backend()) +
                            " peer " + peer() +
                            " ended the stream inside a frame (" + e.what() +
                            ")");
  }
}

byte_link::adopted_payload byte_link::adopt(const wire::placement&) {
  throw transport_error(transport_errc::corrupt_frame,
                        "corrupt frame: " + std::string(backend()) + " peer " +
                          peer() +
                          " placed a payload outside the stream, which " +
                          std::string(backend()) + " links never do");
}

} // namespace h2::transport
