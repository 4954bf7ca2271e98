// framed_channel's receive path: the receiver that turns the link's bytes
// into messages (framed_receiver.cpp; docs/transport.md, Receiving).
// Private to transport/: what framed.cpp and framed_receiver.cpp share.
#pragma once

#include "h2/transport/framed.hpp"
#include "h2/transport/spin.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

namespace h2::transport {

/// Buffers for received tensors, reused once a tensor is freed
/// (framed_receiver.cpp).
class receive_pool;

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
  receiver(byte_link& link, mailbox& inbox);

  void poll() noexcept override;

  void wait(const std::atomic<bool>& done,
            std::chrono::steady_clock::time_point until) noexcept override;

  /// The channel's reader thread, until the channel ends: drains what
  /// nobody waits for as the link says there is some, leaves the link to
  /// the receives while any waits, and fails the channel when the link
  /// fails (a dead peer).
  void serve() noexcept;

  /// The channel was closed: the reader thread returns and receives that
  /// wait for the watcher look again (their receive failed).
  void stop() noexcept;

  void set_max_payload(std::uint64_t bytes) noexcept;

  /// The channel is going away with its link: later calls do nothing.
  void detach() noexcept;

private:
  enum class phase { header, placement, payload };

  /// A wait on the link that failed otherwise than with a transport_error
  /// (out of memory, a system error), as the channel's failure.
  transport_error waiting_failed(const std::exception& e) const;

  /// take() of what the link has, unless another thread is reading.
  void try_take(const std::atomic<bool>& done) noexcept;

  /// The watching receive: sleeps on the link until bytes arrive, takes
  /// them, until `done`, `until` or the end of the channel.
  void watch(const std::atomic<bool>& done,
             std::chrono::steady_clock::time_point until) noexcept;

  /// Reads what the link has and delivers every frame completed, until the
  /// link has nothing more for now, the link failed, or `stop()` holds
  /// where the link would be read again (a receive whose message came, the
  /// reader thread once a receive waits). `by_watcher`: the caller is the
  /// watching receive. Requires mutex_.
  template <class Stop>
  void take(Stop&& stop, bool by_watcher) noexcept;

  /// Messages were delivered: receives waiting for the watcher may have
  /// theirs, and so may the watcher when another thread read. Requires
  /// mutex_ (the link is alive).
  void after_delivery(bool by_watcher) noexcept;

  /// The part of the frame being read is complete: start the next part, or
  /// deliver the message and expect the next header.
  void next();

  void start_frame();

  void adopt_payload();

  /// A payload the peer placed in device memory it shares: copied at once
  /// onto a tensor of the GPU the link mapped that memory on (the receiving
  /// chip's, unless only the sender's could map it: the runtime's take()
  /// moves it on then) and given back. Never checksummed (decode() refuses
  /// that).
  void copy_off_device(byte_link::adopted_payload& payload);

  void finish_frame(const std::byte* payload);

  std::vector<std::int64_t> shape() const;

  void expect(phase p, std::byte* into, std::uint64_t bytes);

  void expect_header();

  /// The link failed or ended: the channel's receives fail with `e` (a
  /// stream that ends inside a frame is a truncated frame), the link is
  /// ended so that the peer learns of it too, and the reader thread and
  /// the receives waiting for the watcher are told. Requires mutex_.
  void fail(const transport_error& e) noexcept;

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

} // namespace h2::transport
