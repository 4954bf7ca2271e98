// DiComm's wire format: the fixed frame header every byte-stream backend
// (shm, tcp, rdma) sends before each payload. Pure encoding, no I/O; of
// libtorch only the element type (c10::ScalarType) its dtype codes map to.
// Decoding treats its input as hostile: every field is checked and
// a bad frame is a transport_error (corrupt_frame, protocol_mismatch), never
// a crash.
//
// Layout (little-endian, 128 bytes):
//   0  u32 magic "H2DC"       44 u8  dtype code      48 i64[8] shape
//   4  u16 version            45 u8  ndim            112 12 bytes reserved
//   6  u8  kind               46 u16 reserved        124 u32 header CRC32C
//   7  u8  flags              (payload follows the header)
//   8  u64 tag
//   16 f64 sender's virtual clock
//   24 f64 sender's wall clock
//   32 u64 payload bytes
//   40 u32 payload CRC32C (when flags has payload_crc)
//
// When flags has `placed`, the link carried the payload outside the stream
// (shm: in a block of the reader's part of the shared segment, or with
// `on_device` of the writer's shared device memory) and a 16-byte
// placement record follows the header instead:
//   0  u64 offset              8  u64 bytes (equal to the header's)
#pragma once

#include <c10/core/ScalarType.h>

#include <array>
#include <cstddef>
#include <cstdint>

namespace h2::transport::wire {

constexpr std::uint32_t magic = 0x43443248; // "H2DC"
/// Raised whenever frames or the shm segment change (3: `on_device` and
/// the segment's device memory records): nodes of different versions stop
/// at the handshake with protocol_mismatch naming both.
constexpr std::uint16_t version = 3;
constexpr std::size_t header_bytes = 128;
constexpr int max_dims = 8;

enum class frame_kind : std::uint8_t {
  data = 1,    ///< a message: tensor or byte buffer
  hello = 2,   ///< handshake (payload: hello_payload)
  goodbye = 3, ///< the sender closes the channel (payload: a reason code)
};

/// Bits of frame_header::flags.
namespace flag {
constexpr std::uint8_t tensor = 1;      ///< payload is a tensor's data
constexpr std::uint8_t payload_crc = 2; ///< payload_crc is set
/// A placement record follows instead of the payload (tensors only).
constexpr std::uint8_t placed = 4;
/// The placement is in the writer's shared device memory rather than in
/// host memory (shm between CUDA chips: CUDA IPC); only with `placed`, never
/// with `payload_crc` (checksums are the host's).
constexpr std::uint8_t on_device = 8;
constexpr std::uint8_t all = tensor | payload_crc | placed | on_device;
} // namespace flag

/// Element types a tensor payload may have.
enum class dtype_code : std::uint8_t {
  float32 = 1,
  bfloat16 = 2,
  float16 = 3,
  int64 = 4,
  int32 = 5,
  uint8 = 6,
  float64 = 7,
};

/// Bytes per element; 0 for an unknown code.
std::size_t element_size(dtype_code code) noexcept;

/// The wire's code for tensors of element type `type`. Throws
/// h2::internal_error for a type DiComm does not carry (complex, bool, ...):
/// H2 only sends the model's own types.
dtype_code code_of(c10::ScalarType type);

/// The element type of a valid code (decode() checked it). Throws
/// h2::internal_error for any other.
c10::ScalarType scalar_type_of(dtype_code code);

struct frame_header {
  frame_kind kind = frame_kind::data;
  std::uint8_t flags = 0;
  std::uint64_t tag = 0;
  double virtual_clock = 0;
  double wall_clock = 0;
  std::uint64_t payload_bytes = 0;
  std::uint32_t payload_crc = 0;
  dtype_code dtype = dtype_code::uint8;
  std::uint8_t ndim = 0;
  std::array<std::int64_t, max_dims> shape{};
};

/// Clock fields are seconds since the run's origin, below this (32,000
/// years: a bound, not a date); the virtual clock is never negative, the
/// wall clock of another host may be behind the origin by less than
/// max_clock_skew_seconds. Anything else in a header is a corrupt frame.
inline constexpr double max_clock_seconds = 1e12;
inline constexpr double max_clock_skew_seconds = 3600;

/// Writes `h` (and its header CRC) into `out[0, header_bytes)`.
void encode(const frame_header& h, std::byte* out) noexcept;

/// Reads and validates a header. Throws transport_error: protocol_mismatch
/// for another magic or version, corrupt_frame for a bad CRC, unknown kind,
/// dtype or flags, a clock field that is not finite or out of range
/// (max_clock_seconds), non-zero reserved bytes, more than max_dims
/// dimensions,
/// negative or overflowing shapes, a tensor shape that does not match the
/// payload size, or a payload larger than `max_payload_bytes`.
frame_header decode(const std::byte* in, std::uint64_t max_payload_bytes);

/// Where a link put a payload outside the stream; what offset means is the
/// link's (shm: bytes from the start of the reader's heap, or of the
/// writer's shared device memory when `on_device`).
struct placement {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  /// In device memory: the header's flag::on_device, not in the record.
  bool on_device = false;
};

constexpr std::size_t placement_bytes = 16;

void encode(const placement& p, std::byte* out) noexcept;

/// Throws transport_error(corrupt_frame) when `p.bytes` differs from the
/// header's `payload_bytes`. Whether the offset is valid is the link's to
/// check (byte_link::adopt).
placement decode_placement(const std::byte* in, std::uint64_t payload_bytes);

/// The handshake's payload (frame_kind::hello).
struct hello_payload {
  std::uint64_t channel = 0;   ///< which channel the connection is for
  std::uint32_t node_rank = 0; ///< the sender's node
  /// 1: the dialer's challenge, 2: the acceptor's proof and challenge,
  /// 3: the dialer's proof, 4: the acceptor accepts.
  std::uint32_t step = 0;
  std::array<std::uint8_t, 32> nonce{};
  std::array<std::uint8_t, 32> proof{};
};

constexpr std::size_t hello_bytes = 8 + 4 + 4 + 32 + 32;

void encode(const hello_payload& h, std::byte* out) noexcept;

/// Throws transport_error(corrupt_frame) for a wrong size or step.
hello_payload decode_hello(const std::byte* in, std::size_t size);

} // namespace h2::transport::wire
