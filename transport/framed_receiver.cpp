// framed_channel's receive path (docs/transport.md, Receiving): the pool of
// buffers received tensors go into, and the receiver that reads frames off
// the link and delivers them as messages (its class: framed_receiver.hpp).
#include "framed_receiver.hpp"

#include "h2/core/crc32c.hpp"

#include <h2/config.hpp>
#if H2_HAS_CUDA
#include "h2/devices/cuda/context.hpp"
#endif

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>

namespace h2::transport {

// -- receive buffers
// -------------------------------------------------------------

/// Buffers for received tensors, reused once a tensor is freed. A tensor
/// received into fresh memory pays a page fault per 4 KiB touched, most of
/// the time of a large shm message; a pipeline receives tensors of the same
/// few shapes every micro-batch, so a freed buffer of the same size is
/// nearly always there to take. Thread-safe; outlives the channel while its
/// tensors live.
class receive_pool : public std::enable_shared_from_this<receive_pool> {
public:
  ~receive_pool() {
    for (auto& [bytes, p] : free_)
      std::free(p);
  }

  /// An uninitialised tensor of `shape` and `type` holding `bytes` bytes.
  at::Tensor take(const std::vector<std::int64_t>& shape, at::ScalarType type,
                  std::size_t bytes) {
    if (bytes == 0)
      return at::empty(shape, type);
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      if (auto it = free_.find(bytes); it != free_.end()) {
        p = it->second;
        free_.erase(it);
        free_bytes_ -= bytes;
      }
    }
    if (p == nullptr) {
      p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
      if (p == nullptr)
        throw std::bad_alloc();
    }
    return at::from_blob(
      p, shape,
      [self = shared_from_this(), bytes](void* data) {
        self->give(data, bytes);
      },
      at::TensorOptions().dtype(type));
  }

private:
  /// Keeps `p` for reuse, or frees it past the cap.
  void give(void* p, std::size_t bytes) noexcept {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      if (free_bytes_ + bytes <= max_free_bytes) {
        free_.emplace(bytes, p);
        free_bytes_ += bytes;
        return;
      }
    }
    std::free(p);
  }

  /// Most bytes kept free per channel.
  static constexpr std::size_t max_free_bytes = std::size_t{256} << 20;

  std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;
  std::size_t free_bytes_ = 0;
};

// -- receiving frames
// ------------------------------------------------------------

namespace {

/// How often the reader thread looks again while receives read the link
/// themselves; it drains what nobody waits for once none waits
/// (docs/transport.md, Receiving).
constexpr std::chrono::milliseconds park_interval{1};

} // namespace

framed_channel::receiver::receiver(byte_link& link, mailbox& inbox)
    : link_(&link),
      inbox_(&inbox),
      pool_(std::make_shared<receive_pool>()),
      read_ahead_(link.read_ahead_bytes()) {
  expect_header();
}

template <class Stop>
void framed_channel::receiver::take(Stop&& stop, bool by_watcher) noexcept {
  const std::uint64_t delivered = delivered_;
  // The link had less than was asked: nothing more for now.
  bool drained = false;
  try {
    for (;;) {
      if (have_ == need_) {
        next();
        continue;
      }
      // Bytes read ahead go first: they are never left behind, as
      // nobody would wake for them.
      if (ahead_at_ < ahead_end_) {
        const std::size_t n = std::min(ahead_end_ - ahead_at_, need_ - have_);
        std::memcpy(into_ + have_, read_ahead_.data() + ahead_at_, n);
        ahead_at_ += n;
        have_ += n;
        continue;
      }
      if (drained || stop())
        break;
      const std::size_t want = need_ - have_;
      if (want >= read_ahead_.size()) {
        // Large payloads are read straight into their tensor.
        const std::size_t n = link_->read_some(into_ + have_, want);
        have_ += n;
        drained = n == 0;
      } else {
        ahead_at_ = 0;
        ahead_end_ = link_->read_some(read_ahead_.data(), read_ahead_.size());
        drained = ahead_end_ < read_ahead_.size();
      }
    }
  } catch (const transport_error& e) {
    fail(e);
  } catch (const std::exception& e) {
    fail(transport_error(transport_errc::corrupt_frame,
                         std::string("receiving from ") + link_->peer() + ": " +
                           e.what()));
  }
  if (delivered_ != delivered)
    after_delivery(by_watcher);
}

void framed_channel::receiver::poll() noexcept {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (lock.owns_lock() && link_ != nullptr && !ended_)
    take([] { return false; }, false);
}

void framed_channel::receiver::wait(
  const std::atomic<bool>& done,
  std::chrono::steady_clock::time_point until) noexcept {
  using clock = std::chrono::steady_clock;
  auto is_done = [&] {
    return done.load(std::memory_order_acquire);
  };
  const auto start = clock::now();
  // Dekker with serve(): either it sees this receive, or this receive
  // sees it waiting for bytes and sends it away (else each message would
  // wake both). Read-modify-writes, not fences, order the two sides
  // (ThreadSanitizer models these).
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  if (draining_.load(std::memory_order_seq_cst) &&
      draining_.exchange(false, std::memory_order_seq_cst)) {
    std::shared_lock<std::shared_mutex> alive(link_alive_);
    if (link_ != nullptr)
      link_->nudge();
  }
  // Poll first: a message about to arrive is taken without any thread
  // wake-up. Only this thread spins (the reader thread sleeps), so this
  // pays on two cores too.
  spin_until(
    [&] {
      if (is_done())
        return true;
      try_take(done);
      return is_done();
    },
    std::min<clock::duration>(spin_.budget(), until - start));
  while (!is_done() && clock::now() < until) {
    std::unique_lock<std::mutex> lock(turn_mutex_);
    if (is_done() || stopping_)
      break;
    if (watching_.load(std::memory_order_relaxed) == 0) {
      // Dekker with after_delivery(): it sees this watcher, or watch()
      // sees the message it delivered.
      watching_.exchange(1, std::memory_order_seq_cst);
      lock.unlock();
      bool gone = false;
      {
        // Keeps the link alive while this receive sleeps on it.
        std::shared_lock<std::shared_mutex> alive(link_alive_);
        gone = link_ == nullptr;
        if (!gone)
          watch(done, until);
      }
      lock.lock();
      watching_.store(0, std::memory_order_seq_cst);
      if (followers_.load(std::memory_order_relaxed) > 0)
        turn_.notify_all(); // one of them watches now
      if (gone)
        break;
    } else {
      // Dekker with after_delivery(), as for the watcher.
      followers_.fetch_add(1, std::memory_order_seq_cst);
      turn_.wait_until(lock, until, [&] {
        return is_done() || watching_.load(std::memory_order_relaxed) == 0 ||
               stopping_;
      });
      followers_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
  if (is_done())
    spin_.observe(clock::now() - start);
}

void framed_channel::receiver::serve() noexcept {
  for (;;) {
    std::uint32_t seen = 0;
    {
      std::unique_lock<std::mutex> lock(turn_mutex_);
      for (;;) {
        // Receives read for themselves. Looking again every
        // park_interval rather than being woken when the last one
        // leaves keeps a stream of receives free of wake-ups of this
        // thread.
        while (!stopping_ && waiters_.load(std::memory_order_seq_cst) > 0)
          park_.wait_for(lock, park_interval);
        if (stopping_)
          return;
        // Before draining_: a receive's nudge() after it counts.
        seen = link_->wake_count();
        draining_.store(true, std::memory_order_seq_cst);
        if (waiters_.fetch_add(0, std::memory_order_seq_cst) == 0)
          break;
        draining_.store(false, std::memory_order_seq_cst); // one came
      }
    }
    std::optional<transport_error> failure;
    try {
      link_->wait_drain(seen);
    } catch (const transport_error& e) {
      failure = e;
    } catch (const std::exception& e) {
      failure = waiting_failed(e);
    }
    // Sent away: a receive reads the link now.
    const bool kicked = !draining_.exchange(false, std::memory_order_seq_cst);
    if (kicked && !failure)
      continue;
    std::lock_guard<std::mutex> guard(mutex_);
    if (failure)
      fail(*failure);
    else if (!ended_)
      take([this] { return waiters_.load(std::memory_order_relaxed) > 0; },
           false);
    if (ended_)
      return;
  }
}

void framed_channel::receiver::stop() noexcept {
  std::lock_guard<std::mutex> guard(turn_mutex_);
  stopping_ = true;
  turn_.notify_all();
  park_.notify_all();
}

void framed_channel::receiver::set_max_payload(std::uint64_t bytes) noexcept {
  max_payload_.store(bytes, std::memory_order_relaxed);
}

void framed_channel::receiver::detach() noexcept {
  std::unique_lock<std::shared_mutex> alive(link_alive_);
  std::lock_guard<std::mutex> guard(mutex_);
  link_ = nullptr;
}

transport_error
framed_channel::receiver::waiting_failed(const std::exception& e) const {
  return transport_error(transport_errc::peer_closed,
                         "waiting on the " + std::string(link_->backend()) +
                           " link to " + link_->peer() + ": " + e.what());
}

void framed_channel::receiver::try_take(
  const std::atomic<bool>& done) noexcept {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (lock.owns_lock() && link_ != nullptr && !ended_)
    take([&] { return done.load(std::memory_order_acquire); }, false);
}

void framed_channel::receiver::watch(
  const std::atomic<bool>& done,
  std::chrono::steady_clock::time_point until) noexcept {
  for (;;) {
    std::optional<transport_error> failure;
    try {
      // Taken before the check: a message delivered by another thread
      // after it nudges the link (after_delivery).
      const std::uint32_t seen = link_->wake_count();
      if (done.load(std::memory_order_acquire))
        return;
      link_->wait_readable(seen, until);
    } catch (const transport_error& e) {
      if (e.code() == transport_errc::timeout) // the receive's own timeout
        return;
      failure = e;
    } catch (const std::exception& e) {
      failure = waiting_failed(e);
    }
    std::lock_guard<std::mutex> guard(mutex_);
    if (failure) {
      fail(*failure);
      return;
    }
    if (ended_)
      return;
    take([&] { return done.load(std::memory_order_acquire); }, true);
    if (ended_ || done.load(std::memory_order_acquire) ||
        std::chrono::steady_clock::now() >= until)
      return;
  }
}

void framed_channel::receiver::after_delivery(bool by_watcher) noexcept {
  // Dekker with wait(): the message's receive counted itself as a
  // follower or watcher before it last looked at its message. These
  // read-modify-writes read the latest count, and order this thread's
  // delivery before that look when they come first.
  if (followers_.fetch_add(0, std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> guard(turn_mutex_);
    turn_.notify_all();
  }
  if (!by_watcher && watching_.fetch_add(0, std::memory_order_seq_cst) > 0)
    link_->nudge();
}

void framed_channel::receiver::next() {
  switch (phase_) {
    case phase::header:
      return start_frame();
    case phase::placement:
      return adopt_payload();
    case phase::payload:
      return finish_frame(into_);
  }
}

void framed_channel::receiver::start_frame() {
  header_ =
    wire::decode(header_bytes_, max_payload_.load(std::memory_order_relaxed));
  if (header_.kind == wire::frame_kind::goodbye)
    throw transport_error(transport_errc::peer_closed,
                          "peer " + link_->peer() + " closed the channel");
  if (header_.kind != wire::frame_kind::data)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: unexpected handshake from " +
                            link_->peer());
  message_ = message{};
  message_.tag = header_.tag;
  message_.sent = {header_.virtual_clock, header_.wall_clock};
  if ((header_.flags & wire::flag::placed) != 0) {
    expect(phase::placement, placement_bytes_, wire::placement_bytes);
    return;
  }
  std::byte* into = nullptr;
  if ((header_.flags & wire::flag::tensor) != 0) {
    message_.tensor =
      pool_->take(shape(), wire::scalar_type_of(header_.dtype),
                  static_cast<std::size_t>(header_.payload_bytes));
    into = static_cast<std::byte*>(message_.tensor.data_ptr());
  } else {
    message_.bytes.resize(header_.payload_bytes);
    into = message_.bytes.data();
  }
  expect(phase::payload, into, header_.payload_bytes);
}

void framed_channel::receiver::adopt_payload() {
  auto where = wire::decode_placement(placement_bytes_, header_.payload_bytes);
  where.on_device = (header_.flags & wire::flag::on_device) != 0;
  auto payload = link_->adopt(where);
  if (payload.device >= 0)
    return copy_off_device(payload);
  try {
    message_.tensor = at::from_blob(
      payload.data, shape(), [release = payload.release](void*) { release(); },
      at::TensorOptions().dtype(wire::scalar_type_of(header_.dtype)));
  } catch (...) {
    payload.release();
    throw;
  }
  finish_frame(static_cast<std::byte*>(payload.data));
}

void framed_channel::receiver::copy_off_device(
  byte_link::adopted_payload& payload) {
  try {
#if H2_HAS_CUDA
    message_.tensor = at::empty(
      shape(),
      at::TensorOptions()
        .dtype(wire::scalar_type_of(header_.dtype))
        .device(c10::kCUDA, static_cast<c10::DeviceIndex>(payload.device)));
    devices::copy_device_memory(message_.tensor.data_ptr(), payload.data,
                                header_.payload_bytes, payload.device);
#else
    throw internal_error("a device payload in a build without CUDA");
#endif
  } catch (...) {
    payload.release();
    throw;
  }
  payload.release();
  finish_frame(nullptr);
}

void framed_channel::receiver::finish_frame(const std::byte* payload) {
  if ((header_.flags & wire::flag::payload_crc) != 0 &&
      crc32c(payload, header_.payload_bytes) != header_.payload_crc)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: payload checksum mismatch from " +
                            link_->peer());
  if (!inbox_->deliver(std::move(message_)))
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: " + link_->peer() +
                            " sent more messages than anyone waits for");
  ++delivered_;
  expect_header();
}

std::vector<std::int64_t> framed_channel::receiver::shape() const {
  return {header_.shape.begin(), header_.shape.begin() + header_.ndim};
}

void framed_channel::receiver::expect(phase p, std::byte* into,
                                      std::uint64_t bytes) {
  phase_ = p;
  into_ = into;
  have_ = 0;
  need_ = static_cast<std::size_t>(bytes);
}

void framed_channel::receiver::expect_header() {
  expect(phase::header, header_bytes_, wire::header_bytes);
}

void framed_channel::receiver::fail(const transport_error& e) noexcept {
  if (ended_)
    return;
  ended_ = true;
  bool inside_frame = phase_ != phase::header || have_ > 0;
  if (e.code() == transport_errc::peer_closed && inside_frame)
    inbox_->fail(transport_error(
      transport_errc::corrupt_frame,
      "corrupt frame: " + (link_ ? link_->peer() : std::string("peer")) +
        " ended the stream inside a frame (" + e.what() + ")"));
  else
    inbox_->fail(e);
  if (link_ != nullptr)
    link_->shutdown();
  stop();
}

} // namespace h2::transport
