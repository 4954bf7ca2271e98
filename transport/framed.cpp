#include "h2/transport/framed.hpp"

#include "framed_receiver.hpp"

#include "h2/core/crc32c.hpp"

#include <h2/config.hpp>
#if H2_HAS_CUDA
#include "h2/devices/cuda/context.hpp"
#endif

#include <ATen/ops/empty.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace h2::transport {

// The receive path (receive_pool, framed_channel::receiver):
// framed_receiver.hpp, framed_receiver.cpp.

// -- the channel
// ---------------------------------------------------------------

namespace {

/// A device tensor's bytes in pinned host memory, the one copy every link
/// sends a GPU chip's tensor from (docs/transport.md, "Device memory"). The
/// copy waits for the sending thread's current stream: the chip's.
at::Tensor pinned_host_copy(const at::Tensor& device_tensor) {
  auto host = at::empty(device_tensor.sizes(),
                        at::TensorOptions(device_tensor.scalar_type())
                          .device(c10::kCPU)
                          .pinned_memory(true));
  host.copy_(device_tensor.detach());
  return host;
}

} // namespace

framed_channel::framed_channel(std::unique_ptr<byte_link> link,
                               framed_options options)
    : link_(std::move(link)),
      options_(options),
      receiver_(std::make_shared<receiver>(*link_, inbox_)) {
  // Receives read the link themselves (docs/transport.md, Receiving).
  inbox_.set_progress(receiver_);
  reader_ = std::thread([this] { receiver_->serve(); });
}

framed_channel::~framed_channel() {
  close();
  if (reader_.joinable())
    reader_.join();
  // Receives still waiting hold the receiver: cut it off from the link
  // before the link goes.
  receiver_->detach();
}

std::string_view framed_channel::backend() const noexcept {
  return link_->backend();
}

void framed_channel::send(message m) {
  if (closed_.load())
    throw transport_error(transport_errc::cancelled,
                          "send on a closed " + std::string(link_->backend()) +
                            " channel");
  if (auto f = inbox_.failure(); f && f->code() != transport_errc::timeout)
    throw transport_error(f->code() == transport_errc::cancelled
                            ? transport_errc::cancelled
                            : transport_errc::peer_closed,
                          f->what());
  wire::frame_header h;
  h.kind = wire::frame_kind::data;
  h.tag = m.tag;
  h.virtual_clock = m.sent.virtual_seconds;
  h.wall_clock = m.sent.wall_seconds;
  const void* payload = m.bytes.data();
  at::Tensor t;
  // A CUDA tensor goes in device memory where the peer can map it (shm
  // between CUDA chips), or straight from the device where the link sends
  // device memory (rdma's device-direct path), else through pinned host
  // memory (docs/transport.md, "Device memory"). Checksums are computed on
  // the host.
  const bool from_device =
    m.tensor.defined() && m.tensor.is_cuda() && !options_.crc;
  if (m.tensor.defined()) {
    t = m.tensor.device().is_cpu() || from_device ? m.tensor.contiguous()
                                                  : pinned_host_copy(m.tensor);
    H2_ENFORCE(t.dim() <= wire::max_dims, "tensor of ", t.dim(), " dimensions");
    h.flags |= wire::flag::tensor;
    h.dtype = wire::code_of(t.scalar_type());
    h.ndim = static_cast<std::uint8_t>(t.dim());
    for (int i = 0; i < t.dim(); ++i)
      h.shape[static_cast<std::size_t>(i)] = t.size(i);
    payload = t.data_ptr();
    h.payload_bytes = static_cast<std::uint64_t>(t.numel()) *
                      static_cast<std::uint64_t>(t.element_size());
  } else {
    h.payload_bytes = m.bytes.size();
  }
  if (options_.crc) {
    h.flags |= wire::flag::payload_crc;
    h.payload_crc = crc32c(payload, h.payload_bytes);
  }
  buffer_view body{payload, static_cast<std::size_t>(h.payload_bytes)};
  std::byte header[wire::header_bytes];
  const auto until = std::chrono::steady_clock::now() + options_.send_timeout;
  try {
    std::lock_guard<std::mutex> guard(write_mutex_);
    std::optional<wire::placement> placed;
    bool direct = false;
    if (from_device && body.size > 0) {
      if (device_sharing_.load(std::memory_order_relaxed))
        placed = link_->place_on_device(body, t.get_device());
      direct = !placed && link_->writes_from_device(body);
#if H2_HAS_CUDA
      if (direct)
        devices::synchronize_cuda_device(t.get_device());
#endif
    }
    if (from_device && !placed && !direct) {
      t = pinned_host_copy(t); // no room, or the link cannot: staged
      body = {t.data_ptr(), body.size};
    }
    if (!placed && !direct && t.defined() && body.size > 0)
      placed = link_->place(body);
    if (placed) {
      h.flags |= wire::flag::placed;
      if (placed->on_device)
        h.flags |= wire::flag::on_device;
      wire::encode(h, header);
      std::byte record[wire::placement_bytes];
      wire::encode(*placed, record);
      link_->write({{header, sizeof(header)}, {record, sizeof(record)}}, until);
    } else {
      wire::encode(h, header);
      link_->write({{header, sizeof(header)}, body}, until);
    }
  } catch (const transport_error& e) {
    if (e.code() == transport_errc::timeout) {
      // Mid-frame: the stream cannot go on. Receives waiting on this end
      // fail with the same error, and the peer sees the link end.
      inbox_.fail(e);
      link_->shutdown();
    }
    throw;
  }
  messages_sent_ += 1;
  bytes_sent_ += h.payload_bytes;
  if (t.defined() && t.is_cuda())
    bytes_sent_on_device_ += h.payload_bytes;
}

pending_message framed_channel::recv_async(std::uint64_t tag) {
  return inbox_.receive(tag);
}

void framed_channel::close() noexcept {
  if (closed_.exchange(true))
    return;
  inbox_.cancel(std::string(link_->backend()) + " channel closed");
  link_->shutdown();
  receiver_->stop();
}

void framed_channel::share_device_memory(int device) {
  link_->set_device(device);
  device_sharing_.store(true, std::memory_order_relaxed);
}

void framed_channel::set_limits(const channel_limits& limits) {
  receiver_->set_max_payload(limits.max_payload_bytes);
  inbox_.set_max_unawaited(limits.max_unawaited);
}

channel_stats framed_channel::stats() const {
  return {messages_sent_.load(), inbox_.messages_delivered(),
          bytes_sent_.load(), inbox_.bytes_delivered(),
          bytes_sent_on_device_.load()};
}

} // namespace h2::transport
