#include "h2/transport/framed.hpp"

#include "h2/core/crc32c.hpp"
#include "h2/transport/spin.hpp"

#include <h2/config.hpp>
#if H2_HAS_CUDA
#include "h2/devices/cuda/context.hpp"
#endif

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
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

/// Turns the link's bytes into messages, one frame at a time, resumably: it
/// reads what the link has, keeps a partly read frame for the next call and
/// delivers every completed one. The same path serves every link
/// (docs/transport.md, Receiving): whoever holds `mutex_` reads, and that
/// is a receive waiting for its message (receive_progress), a poll(), or
/// the channel's reader thread. Of the waiting receives one watches the
/// link (sleeps in wait_readable(), then reads what arrived), the others
/// wait for it to deliver their message or to leave. The reader thread
/// leaves the link to them while any waits; otherwise it waits for
/// something to drain (byte_link::wait_drain), drains it, and so notices a
/// dead peer.
class framed_channel::receiver final : public receive_progress {
public:
  receiver(byte_link& link, mailbox& inbox)
      : link_(&link),
        inbox_(&inbox),
        pool_(std::make_shared<receive_pool>()),
        read_ahead_(link.read_ahead_bytes()) {
    expect_header();
  }

  void poll() noexcept override {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock() && link_ != nullptr && !ended_)
      take([] { return false; }, false);
  }

  void wait(const std::atomic<bool>& done,
            std::chrono::steady_clock::time_point until) noexcept override {
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

  /// The channel's reader thread, until the channel ends: drains what
  /// nobody waits for as the link says there is some, leaves the link to
  /// the receives while any waits, and fails the channel when the link
  /// fails (a dead peer).
  void serve() noexcept {
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

  /// The channel was closed: the reader thread returns and receives that
  /// wait for the watcher look again (their receive failed).
  void stop() noexcept {
    std::lock_guard<std::mutex> guard(turn_mutex_);
    stopping_ = true;
    turn_.notify_all();
    park_.notify_all();
  }

  void set_max_payload(std::uint64_t bytes) noexcept {
    max_payload_.store(bytes, std::memory_order_relaxed);
  }

  /// The channel is going away with its link: later calls do nothing.
  void detach() noexcept {
    std::unique_lock<std::shared_mutex> alive(link_alive_);
    std::lock_guard<std::mutex> guard(mutex_);
    link_ = nullptr;
  }

private:
  enum class phase { header, placement, payload };

  /// A wait on the link that failed otherwise than with a transport_error
  /// (out of memory, a system error), as the channel's failure.
  transport_error waiting_failed(const std::exception& e) const {
    return transport_error(transport_errc::peer_closed,
                           "waiting on the " + std::string(link_->backend()) +
                             " link to " + link_->peer() + ": " + e.what());
  }

  /// take() of what the link has, unless another thread is reading.
  void try_take(const std::atomic<bool>& done) noexcept {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock() && link_ != nullptr && !ended_)
      take([&] { return done.load(std::memory_order_acquire); }, false);
  }

  /// The watching receive: sleeps on the link until bytes arrive, takes
  /// them, until `done`, `until` or the end of the channel.
  void watch(const std::atomic<bool>& done,
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

  /// Reads what the link has and delivers every frame completed, until the
  /// link has nothing more for now, the link failed, or `stop()` holds
  /// where the link would be read again (a receive whose message came, the
  /// reader thread once a receive waits). `by_watcher`: the caller is the
  /// watching receive. Requires mutex_.
  template <class Stop>
  void take(Stop&& stop, bool by_watcher) noexcept {
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
                           std::string("receiving from ") + link_->peer() +
                             ": " + e.what()));
    }
    if (delivered_ != delivered)
      after_delivery(by_watcher);
  }

  /// Messages were delivered: receives waiting for the watcher may have
  /// theirs, and so may the watcher when another thread read. Requires
  /// mutex_ (the link is alive).
  void after_delivery(bool by_watcher) noexcept {
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

  /// The part of the frame being read is complete: start the next part, or
  /// deliver the message and expect the next header.
  void next() {
    switch (phase_) {
      case phase::header:
        return start_frame();
      case phase::placement:
        return adopt_payload();
      case phase::payload:
        return finish_frame(into_);
    }
  }

  void start_frame() {
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

  void adopt_payload() {
    auto where =
      wire::decode_placement(placement_bytes_, header_.payload_bytes);
    where.on_device = (header_.flags & wire::flag::on_device) != 0;
    auto payload = link_->adopt(where);
    if (payload.device >= 0)
      return copy_off_device(payload);
    try {
      message_.tensor = at::from_blob(
        payload.data, shape(),
        [release = payload.release](void*) { release(); },
        at::TensorOptions().dtype(wire::scalar_type_of(header_.dtype)));
    } catch (...) {
      payload.release();
      throw;
    }
    finish_frame(static_cast<std::byte*>(payload.data));
  }

  /// A payload the peer placed in device memory it shares: copied at once
  /// onto a tensor of the GPU the link mapped that memory on (the receiving
  /// chip's, unless only the sender's could map it: the runtime's take()
  /// moves it on then) and given back. Never checksummed (decode() refuses
  /// that).
  void copy_off_device(byte_link::adopted_payload& payload) {
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

  void finish_frame(const std::byte* payload) {
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

  std::vector<std::int64_t> shape() const {
    return {header_.shape.begin(), header_.shape.begin() + header_.ndim};
  }

  void expect(phase p, std::byte* into, std::uint64_t bytes) {
    phase_ = p;
    into_ = into;
    have_ = 0;
    need_ = static_cast<std::size_t>(bytes);
  }

  void expect_header() {
    expect(phase::header, header_bytes_, wire::header_bytes);
  }

  /// The link failed or ended: the channel's receives fail with `e` (a
  /// stream that ends inside a frame is a truncated frame), the link is
  /// ended so that the peer learns of it too, and the reader thread and
  /// the receives waiting for the watcher are told. Requires mutex_.
  void fail(const transport_error& e) noexcept {
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

  byte_link* link_; ///< null once detached
  mailbox* inbox_;  ///< valid while link_ is
  /// Larger payloads are corrupt frames (channel_limits).
  std::atomic<std::uint64_t> max_payload_{channel_limits{}.max_payload_bytes};
  /// Where received tensors' bytes go (buffers reused once freed).
  std::shared_ptr<receive_pool> pool_;
  /// Held (shared) by receives while they use the link outside mutex_
  /// (watch, nudge), so detach() waits for them; taken before mutex_.
  std::shared_mutex link_alive_;
  /// The read role: held by whoever reads the link (a receive, a poll(),
  /// the reader thread). Taken before turn_mutex_.
  std::mutex mutex_;
  bool ended_ = false;

  // Who waits, and how. The atomics are read without turn_mutex_ on the
  // way of every message; watching_ and followers_ change under it.
  std::mutex turn_mutex_;
  /// Receives waiting for the watcher to leave or to deliver theirs.
  std::condition_variable turn_;
  /// The reader thread, while receives read for themselves.
  std::condition_variable park_;
  /// Receives inside wait().
  std::atomic<int> waiters_{0};
  /// Of them, those waiting on turn_.
  std::atomic<int> followers_{0};
  /// 1 while a receive sleeps on the link (wait_readable) or reads it.
  std::atomic<int> watching_{0};
  /// The reader thread waits in wait_drain() for bytes nobody waits for.
  std::atomic<bool> draining_{false};
  /// The channel was closed or failed (under turn_mutex_).
  bool stopping_ = false;

  /// How long receives poll before they sleep on the link.
  adaptive_spin spin_{std::chrono::microseconds(50),
                      std::chrono::microseconds(500)};

  // The frame being read (under mutex_).
  phase phase_ = phase::header;
  std::byte* into_ = nullptr;
  std::size_t have_ = 0;
  std::size_t need_ = 0;
  std::byte header_bytes_[wire::header_bytes];
  std::byte placement_bytes_[wire::placement_bytes];
  wire::frame_header header_;
  message message_;
  /// Bytes read from the link ahead of the frame being read:
  /// [ahead_at_, ahead_end_) of read_ahead_ (byte_link::read_ahead_bytes;
  /// empty where the link's reads are plain copies). Reads smaller than it
  /// go through it.
  std::vector<std::byte> read_ahead_;
  std::size_t ahead_at_ = 0;
  std::size_t ahead_end_ = 0;
  /// Messages delivered so far.
  std::uint64_t delivered_ = 0;
};

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
