// The transport handshake (transport/handshake.hpp) over a link whose peer
// sends the input: the first byte's low bit picks the side (0: this end
// accepts, 1: it dials channel 7), the rest is what the peer sends, frame
// after frame. With the first byte's bit 1 set, each header's CRC is made
// to match first, so that mutations reach the checks behind it. No input can
// prove the secret (the nonces are fresh), so every run ends in a
// transport_error; what matters is how: which frame fails how, and that nothing
// is read past a frame or trusted before its check.
#include "fuzz.hpp"

#include "h2/core/crc32c.hpp"
#include "h2/transport/handshake.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace h2::transport {
namespace {

/// A byte_link whose peer has sent `bytes` and then closed.
class replay_link final : public byte_link {
public:
  explicit replay_link(std::span<const std::byte> bytes) : bytes_(bytes) {}

  void write(std::initializer_list<buffer_view>, deadline) override {
    // What this end sends is not looked at: the peer's bytes are fixed.
    if (shut_)
      throw transport_error(transport_errc::cancelled, "link shut down");
  }

  std::size_t read_some(void* data, std::size_t size) override {
    if (shut_)
      throw transport_error(transport_errc::cancelled, "link shut down");
    if (bytes_.empty())
      throw transport_error(transport_errc::peer_closed, "peer closed");
    // One byte short of what was asked where possible: reads must loop.
    const std::size_t n = std::min(bytes_.size(), size > 1 ? size - 1 : size);
    std::memcpy(data, bytes_.data(), n);
    bytes_ = bytes_.subspan(n);
    return n;
  }

  std::uint32_t wake_count() const noexcept override { return 0; }

  void wait_readable(std::uint32_t, deadline) override {
    // read_some() never returns 0: a read never waits.
    fuzz::finding("the handshake waited on a link with bytes or an end");
  }

  void nudge() noexcept override {}

  void wait_drain(std::uint32_t) override {}

  void shutdown() noexcept override { shut_ = true; }

  std::string_view backend() const noexcept override { return "fuzz"; }

  std::string peer() const override { return "fuzz peer"; }

private:
  std::span<const std::byte> bytes_;
  bool shut_ = false;
};

/// `stream` with the CRC of each frame header made to match, walking it as
/// the handshake reads it: a header, then its payload when it is small.
std::vector<std::byte> with_matching_crcs(std::span<const std::byte> stream) {
  std::vector<std::byte> out(stream.begin(), stream.end());
  std::size_t at = 0;
  while (out.size() - at >= wire::header_bytes) {
    const std::uint32_t crc = crc32c(out.data() + at, 124);
    std::memcpy(out.data() + at + 124, &crc, sizeof(crc));
    std::uint64_t payload = 0;
    std::memcpy(&payload, out.data() + at + 32, sizeof(payload));
    at += wire::header_bytes;
    at += static_cast<std::size_t>(
      std::min<std::uint64_t>(payload, out.size() - at));
  }
  return out;
}

} // namespace
} // namespace h2::transport

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  using namespace h2::transport;
  if (size < 1)
    return 0;
  static const job_secret secret("fuzzing-secret-0123456789");
  auto stream = h2::fuzz::as_bytes(data + 1, size - 1);
  std::vector<std::byte> fixed;
  if ((data[0] & 2) != 0) {
    fixed = with_matching_crcs(stream);
    stream = fixed;
  }
  replay_link link(stream);
  const auto until = deadline::max();
  const bool returned = h2::fuzz::decodes([&] {
    if ((data[0] & 1) == 0)
      accept_handshake(link, secret, 0, until);
    else
      dial_handshake(link, secret, 7, 1, until);
  });
  h2::fuzz::require(!returned, "a handshake completed without the secret");
  return 0;
}
