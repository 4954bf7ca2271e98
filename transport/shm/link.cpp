#include "link.hpp"

#include "h2/core/error.hpp"
#include "h2/transport/ring.hpp"
#include "h2/transport/spin.hpp"

#include <h2/config.hpp>
#if H2_HAS_CUDA
#include "h2/devices/cuda/context.hpp"
#endif

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <string>
#include <sys/socket.h>
#include <thread>

namespace h2::transport::shm {

namespace {

/// How long the writer spins before it sleeps for room.
constexpr std::chrono::microseconds spin_wanted{50};
/// The longest a writer waits for the reader to free a heap block it has
/// used before rather than take fresh memory (shm_link::allocate_block).
constexpr std::chrono::milliseconds free_wait{2};
/// The longest a closing end waits for its peer to unmap the device
/// memory it shares (shm_link::release_device_memory).
constexpr std::chrono::seconds unmap_wait{5};

/// The process at the other end of Unix socket `fd`; 0 when unknown.
int peer_process(int fd) noexcept {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return 0;
  return cred.pid;
}

/// Throws corrupt_frame unless the peer's placement `p` is a block of
/// `region` bytes (`what`: "a heap", "device memory").
void check_placement(const wire::placement& p, std::uint64_t region,
                     const char* what) {
  if (p.bytes == 0 || p.offset % block_alignment != 0 || p.offset >= region ||
      p.bytes > region - p.offset)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: the shm peer placed " +
                            std::to_string(p.bytes) + " bytes at offset " +
                            std::to_string(p.offset) + " of " + what + " of " +
                            std::to_string(region) + " bytes");
}

/// Returns `entry` (a heap offset, or a device block's marked with
/// device_block) to the writer of direction `in` through its free queue.
/// Requires the segment's free_mutex.
void push_freed(ring_control* in, std::uint64_t* queue, std::uint64_t slots,
                std::uint64_t entry) {
  auto head = in->freed_head.load(std::memory_order_relaxed);
  auto tail = in->freed_tail.load(std::memory_order_acquire);
  // Only a writer that placed more blocks than its heap holds fills the
  // queue: that block stays lost to it.
  if (head - tail >= slots)
    return;
  queue[head % slots] = entry;
  in->freed_head.store(head + 1, std::memory_order_seq_cst);
  if (in->writer_waiting.load(std::memory_order_seq_cst) != 0)
    signal(in->space_seq);
}

} // namespace

struct shm_link::device_memory {
#if H2_HAS_CUDA
  /// What this end shares (made on its first device payload).
  std::unique_ptr<devices::cuda_shared_memory> shared;
  /// The peer's, mapped on its first device placement.
  std::unique_ptr<devices::cuda_mapped_memory> mapped;
#endif
  /// Sharing failed once (no memory, IPC unsupported): this end stages.
  bool refused = false;
};

// Spins for `spin`, then sleeps on `seq`, counted in `waiting` so that
// the other side wakes it, until `ready()` or until `seq` moves from
// `seen`; checks this end's shutdown, the peer's liveness and `until`
// meanwhile.
template <class Ready>
void shm_link::wait(Ready&& ready, std::atomic<std::uint32_t>& seq,
          std::atomic<std::uint32_t>& waiting, std::uint32_t seen,
          std::optional<deadline> until, std::chrono::nanoseconds spin) {
  auto woken = [&] {
    return seq.load(std::memory_order_seq_cst) != seen;
  };
  if (spin_until([&] { return check_shut(), ready() || woken(); }, spin))
    return;
  counted_sleeper counted(waiting);
  for (;;) {
    check_shut();
    if (ready() || woken())
      return;
    auto slice = liveness_interval;
    if (until) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        *until - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        throw transport_error(transport_errc::timeout,
                              "shm peer sent nothing in time");
      slice = std::min(slice, left);
    }
    futex_wait(&seq, seen, slice);
    check_shut();
    if (ready() || woken())
      return;
    if (socket_->peer_gone())
      throw transport_error(transport_errc::peer_closed,
                            "shm peer process is gone");
  }
}

shm_link::shm_link(std::shared_ptr<segment> seg, bool acceptor,
                   std::unique_ptr<socket_link> socket, log_sink log)
    : segment_(std::move(seg)),
      socket_(std::move(socket)),
      sizes_(static_cast<segment_header*>(segment_->map)->sizes),
      heap_(sizes_.heap_bytes, block_alignment),
      device_heap_(sizes_.heap_bytes, block_alignment),
      device_(std::make_unique<device_memory>()),
      peer_pid_(peer_process(socket_->fd())),
      log_(std::move(log)) {
  auto* h = static_cast<segment_header*>(segment_->map);
  const int out = acceptor ? 0 : 1, in = 1 - out;
  out_ = &h->rings[out];
  in_ = &h->rings[in];
  out_data_ = segment_->at(sizes_.ring_at(out));
  in_data_ = segment_->at(sizes_.ring_at(in));
  out_heap_ = segment_->at(sizes_.heap_at(out));
  in_heap_ = segment_->at(sizes_.heap_at(in));
  out_free_ =
    reinterpret_cast<std::uint64_t*>(segment_->at(sizes_.free_queue_at(out)));
  in_free_ =
    reinterpret_cast<std::uint64_t*>(segment_->at(sizes_.free_queue_at(in)));
}

shm_link::~shm_link() {
  shutdown();
  release_device_memory();
}

void shm_link::write(std::initializer_list<buffer_view> parts, deadline until) {
  const std::uint64_t capacity = sizes_.ring_bytes;
  for (const auto& part : parts) {
    const char* p = static_cast<const char*>(part.data);
    std::size_t left = part.size;
    while (left > 0) {
      std::uint64_t head = out_->head.load(std::memory_order_relaxed);
      std::uint64_t free_bytes = 0;
      auto has_room = [&] {
        if (out_->reader_closed.load(std::memory_order_acquire) != 0)
          throw transport_error(transport_errc::peer_closed,
                                "shm peer " + peer() + " closed the channel");
        std::uint64_t tail = out_->tail.load(std::memory_order_acquire);
        if (!ring::consistent(head, tail, capacity))
          throw transport_error(transport_errc::corrupt_frame,
                                "corrupt frame: the shm peer moved its "
                                "ring's tail past the data");
        free_bytes = ring::free_space(head, tail, capacity);
        return free_bytes > 0;
      };
      while (!has_room()) {
        // Nobody may be reading (receives read for themselves): have the
        // peer's drain thread make room.
        signal(out_->drain_seq);
        try {
          wait(has_room, out_->space_seq, out_->writer_waiting,
               out_->space_seq.load(std::memory_order_seq_cst), until,
               spin_budget(spin_wanted));
        } catch (const transport_error& e) {
          if (e.code() != transport_errc::timeout)
            throw;
          throw transport_error(transport_errc::timeout,
                                "shm peer " + peer() +
                                  " took nothing from its full ring in time");
        }
      }
      std::size_t n = std::min<std::uint64_t>(free_bytes, left);
      ring::copy_in(out_data_, capacity, head, p, n);
      out_->head.store(head + n, std::memory_order_seq_cst);
      if (out_->readers_waiting.load(std::memory_order_seq_cst) != 0)
        signal(out_->data_seq);
      p += n;
      left -= n;
    }
  }
}

std::optional<wire::placement> shm_link::place(buffer_view payload) {
  if (payload.size < min_placed_bytes || payload.size > heap_.capacity())
    return std::nullopt;
  auto at = allocate_block(payload.size);
  if (!at)
    return std::nullopt; // no room: it streams through the ring
  std::memcpy(out_heap_ + *at, payload.data, payload.size);
  return wire::placement{*at, payload.size};
}

byte_link::adopted_payload shm_link::adopt(const wire::placement& p) {
  if (p.on_device)
    return adopt_on_device(p);
  check_placement(p, sizes_.heap_bytes, "a heap");
  {
    std::lock_guard<std::mutex> guard(segment_->free_mutex);
    if (!segment_->adopted.adopt(p.offset, p.bytes))
      throw transport_error(transport_errc::corrupt_frame,
                            "corrupt frame: the shm peer placed " +
                              std::to_string(p.bytes) + " bytes at offset " +
                              std::to_string(p.offset) +
                              ", over a block this end still holds");
  }
  return {in_heap_ + p.offset,
          [seg = segment_, in = in_, queue = in_free_,
           slots = sizes_.free_slots(), offset = p.offset] {
            std::lock_guard<std::mutex> guard(seg->free_mutex);
            seg->adopted.release(offset);
            push_freed(in, queue, slots, offset);
          }};
}

// -- device memory (CUDA IPC; docs/transport.md, "Device memory")

void shm_link::set_device(int device) {
  local_device_.store(device, std::memory_order_relaxed);
}

void shm_link::release_device_memory() noexcept {
#if H2_HAS_CUDA
  if (device_->mapped) {
    device_->mapped.reset();
    in_->device_mapped.store(2, std::memory_order_seq_cst);
  }
  if (!device_->shared)
    return;
  auto peer_alive = [&] {
    return peer_pid_ <= 0 || ::kill(peer_pid_, 0) == 0 || errno != ESRCH;
  };
  // shutdown() marked this end closed before: Dekker with
  // adopt_on_device().
  const auto until = std::chrono::steady_clock::now() + unmap_wait;
  while (out_->device_mapped.load(std::memory_order_seq_cst) == 1 &&
         peer_alive() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (out_->device_mapped.load(std::memory_order_seq_cst) == 1 &&
      peer_alive()) {
    // Freeing memory another process maps is undefined: keep it.
    if (log_)
      log_("shm channel: the peer still maps the " +
           std::to_string(device_->shared->size()) +
           " bytes of cuda:" + std::to_string(device_->shared->device()) +
           " this end shared; they stay allocated");
    (void)device_->shared.release();
  }
  device_->shared.reset();
#endif
}

void* shm_link::shared_device_memory(int device) {
#if H2_HAS_CUDA
  if (device_->refused)
    return nullptr;
  if (!device_->shared) {
    try {
      device_->shared = std::make_unique<devices::cuda_shared_memory>(
        device, static_cast<std::size_t>(sizes_.heap_bytes));
    } catch (const device_error& e) {
      device_->refused = true; // out of memory, or no IPC here: staged
      if (log_)
        log_(std::string("shm channel: ") + e.what() +
             "; its device tensors go through pinned host memory instead");
      return nullptr;
    }
    const auto& shared = *device_->shared;
    out_->device_bytes = shared.size();
    std::memset(out_->device_bus_id, 0, sizeof(out_->device_bus_id));
    std::memcpy(
      out_->device_bus_id, shared.pci_bus_id().data(),
      std::min(shared.pci_bus_id().size(), sizeof(out_->device_bus_id) - 1));
    std::memcpy(out_->device_handle, shared.handle().data(),
                sizeof(out_->device_handle));
    out_->device_state.store(1, std::memory_order_release);
  }
  if (device_->shared->device() != device)
    return nullptr; // a tensor of another GPU than the chip's: staged
  return device_->shared->data();
#else
  (void)device;
  return nullptr;
#endif
}

std::optional<wire::placement> shm_link::place_on_device(buffer_view payload,
                                                         int device) {
  if (payload.size < min_placed_bytes || payload.size > heap_.capacity())
    return std::nullopt;
  auto* base = static_cast<char*>(shared_device_memory(device));
  if (base == nullptr)
    return std::nullopt;
  auto at = allocate_device_block(payload.size);
  if (!at)
    return std::nullopt;
#if H2_HAS_CUDA
  try {
    devices::copy_device_memory(base + *at, payload.data, payload.size, device);
  } catch (...) {
    (void)device_heap_.release(*at);
    throw;
  }
#endif
  return wire::placement{*at, payload.size, true};
}

// The reader copies a device payload out as soon as it arrives, so a block
// comes back within a frame or two; a writer that finds none waits that
// long, then stages.
std::optional<std::uint64_t>
shm_link::allocate_device_block(std::uint64_t bytes) {
  take_freed_blocks();
  if (auto at = device_heap_.allocate(bytes))
    return at;
  if (!wait_for_free(std::chrono::steady_clock::now() + free_wait))
    return std::nullopt;
  take_freed_blocks();
  return device_heap_.allocate(bytes);
}

byte_link::adopted_payload shm_link::adopt_on_device(const wire::placement& p) {
  if (in_->device_state.load(std::memory_order_acquire) != 1)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: the shm peer placed a payload in "
                          "device memory it never shared");
  // Read once: the peer may write the segment meanwhile.
  const std::uint64_t shared = in_->device_bytes;
  char bus_id[sizeof(in_->device_bus_id)];
  std::memcpy(bus_id, in_->device_bus_id, sizeof(bus_id));
  if (shared != sizes_.heap_bytes ||
      std::memchr(bus_id, 0, sizeof(bus_id)) == nullptr)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: the shm peer shared device memory "
                          "of " +
                            std::to_string(shared) + " bytes (its heap is " +
                            std::to_string(sizes_.heap_bytes) +
                            ") or no GPU bus id");
  check_placement(p, shared, "device memory");
#if H2_HAS_CUDA
  if (!device_->mapped) {
    // Dekker with release_device_memory(): either the peer sees this end
    // mapping and keeps its memory, or this end sees the peer closed (it
    // frees the memory) and takes nothing.
    in_->device_mapped.store(1, std::memory_order_seq_cst);
    if (in_->writer_closed.load(std::memory_order_seq_cst) != 0) {
      in_->device_mapped.store(2, std::memory_order_seq_cst);
      throw transport_error(transport_errc::peer_closed,
                            "shm peer " + peer() +
                              " closed the channel before its device "
                              "payload was taken");
    }
    devices::cuda_ipc_handle handle;
    std::memcpy(handle.data(), in_->device_handle, handle.size());
    try {
      device_->mapped = std::make_unique<devices::cuda_mapped_memory>(
        handle, std::string(bus_id),
        local_device_.load(std::memory_order_relaxed));
    } catch (const device_error& e) {
      in_->device_mapped.store(2, std::memory_order_seq_cst);
      throw transport_error(
        transport_errc::protocol_mismatch,
        std::string("the shm peer passes GPU tensors by CUDA IPC, which this "
                    "process cannot map (") +
          e.what() +
          "); let the two GPUs access each other, make the peer's GPU "
          "visible to this process, or set transport.cuda_ipc = false");
    }
  }
  if (device_->mapped->size() != 0 && device_->mapped->size() < shared)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: the shm peer shared " +
                            std::to_string(device_->mapped->size()) +
                            " bytes of device memory and claims " +
                            std::to_string(shared));
  return {static_cast<char*>(device_->mapped->data()) + p.offset,
          [seg = segment_, in = in_, queue = in_free_,
           slots = sizes_.free_slots(), offset = p.offset] {
            std::lock_guard<std::mutex> guard(seg->free_mutex);
            push_freed(in, queue, slots, offset | device_block);
          },
          device_->mapped->device()};
#else
  throw transport_error(transport_errc::protocol_mismatch,
                        "the shm peer passes GPU tensors by CUDA IPC, and "
                        "this build has no CUDA; set transport.cuda_ipc = "
                        "false");
#endif
}

std::size_t shm_link::read_some(void* data, std::size_t size) {
  check_shut();
  const std::uint64_t capacity = sizes_.ring_bytes;
  std::uint64_t tail = in_->tail.load(std::memory_order_relaxed);
  std::uint64_t head = in_->head.load(std::memory_order_acquire);
  if (head == tail) {
    if (in_->writer_closed.load(std::memory_order_acquire) == 0)
      return 0;
    // Closed: what it wrote before it closed is delivered first.
    head = in_->head.load(std::memory_order_acquire);
    if (head == tail)
      throw transport_error(transport_errc::peer_closed,
                            "shm peer " + peer() + " closed the channel");
  }
  if (!ring::consistent(head, tail, capacity))
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: the shm peer moved its ring's "
                          "head past the ring");
  std::size_t n = std::min<std::uint64_t>(head - tail, size);
  ring::copy_out(in_data_, capacity, tail, data, n);
  in_->tail.store(tail + n, std::memory_order_seq_cst);
  if (in_->writer_waiting.load(std::memory_order_seq_cst) != 0)
    signal(in_->space_seq);
  return n;
}

std::uint32_t shm_link::wake_count() const noexcept {
  return in_->data_seq.load(std::memory_order_seq_cst);
}

void shm_link::wait_readable(std::uint32_t seen, deadline until) {
  wait([&] { return readable(); }, in_->data_seq, in_->readers_waiting, seen,
       until, std::chrono::nanoseconds(0));
}

void shm_link::nudge() noexcept {
  // As the writer does: a system call only for a sleeper (counted before
  // its last look at the sequence).
  in_->data_seq.fetch_add(1, std::memory_order_seq_cst);
  if (in_->readers_waiting.load(std::memory_order_seq_cst) != 0)
    futex_wake(&in_->data_seq);
}

void shm_link::wait_drain(std::uint32_t) {
  // Sleeps on drain_seq, not on the data: a receive taking over the ring
  // needs no nudge to this wait (docs/transport.md, Receiving).
  const std::uint32_t seen = in_->drain_seq.load(std::memory_order_seq_cst);
  check_shut();
  futex_wait(&in_->drain_seq, seen, liveness_interval);
  check_shut();
  if (!readable() && socket_->peer_gone())
    throw transport_error(transport_errc::peer_closed,
                          "shm peer process is gone");
}

void shm_link::shutdown() noexcept {
  if (shut_.exchange(true))
    return;
  out_->writer_closed.store(1, std::memory_order_seq_cst);
  in_->reader_closed.store(1, std::memory_order_seq_cst);
  for (auto* r : {out_, in_})
    for (auto* w : {&r->data_seq, &r->space_seq, &r->drain_seq})
      signal(*w);
  socket_->shutdown();
}

bool shm_link::readable() const noexcept {
  return in_->head.load(std::memory_order_acquire) !=
           in_->tail.load(std::memory_order_relaxed) ||
         in_->writer_closed.load(std::memory_order_acquire) != 0;
}

// Memory the heap used before is preferred while the reader is freeing
// blocks: a fresh page costs a fault per 4 KiB (10-17 us each on the VMs
// measured, 3-4 ms per MiB, twenty times the copy) and a streamed payload a
// second copy, so a writer that ran ahead waits up to free_wait for the
// reader to return a block first. A reader that keeps its tensors (a
// pipeline stage holding activations) stops the waiting until it frees one
// again.
std::optional<std::uint64_t> shm_link::allocate_block(std::uint64_t bytes) {
  take_freed_blocks();
  std::optional<std::chrono::steady_clock::time_point> until;
  for (;;) {
    auto at = heap_.where(bytes);
    const bool warm = at && *at + bytes <= heap_.high_water();
    if (warm || heap_.blocks() == 0 || reader_holds_)
      return heap_.allocate(bytes);
    if (!until) // only a wait reads the clock
      until = std::chrono::steady_clock::now() + free_wait;
    if (!wait_for_free(*until)) {
      reader_holds_ = true;
      return heap_.allocate(bytes);
    }
    take_freed_blocks();
  }
}

bool shm_link::wait_for_free(std::chrono::steady_clock::time_point until) {
  auto arrived = [&] {
    return out_->freed_head.load(std::memory_order_seq_cst) !=
           out_->freed_tail.load(std::memory_order_relaxed);
  };
  if (spin_until(arrived, spin_budget(spin_wanted)))
    return true;
  counted_sleeper counted(out_->writer_waiting);
  for (;;) {
    const std::uint32_t seen =
      out_->space_seq.load(std::memory_order_seq_cst);
    check_shut();
    if (arrived())
      return true;
    const auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::nanoseconds(0))
      return false;
    futex_wait(&out_->space_seq, seen, left);
  }
}

// A bad offset from the reader is ignored: it can only waste its own heap.
void shm_link::take_freed_blocks() noexcept {
  const std::uint64_t slots = sizes_.free_slots();
  std::uint64_t head = out_->freed_head.load(std::memory_order_acquire);
  std::uint64_t tail = out_->freed_tail.load(std::memory_order_relaxed);
  if (head - tail > slots) // a corrupt reader: skip what it claims
    tail = head;
  for (; tail != head; ++tail) {
    const std::uint64_t entry = out_free_[tail % slots];
    if ((entry & device_block) != 0) {
      (void)device_heap_.release(entry & ~device_block);
    } else {
      (void)heap_.release(entry);
      reader_holds_ = false;
    }
  }
  out_->freed_tail.store(tail, std::memory_order_release);
}

void shm_link::check_shut() const {
  if (shut_.load(std::memory_order_relaxed))
    throw transport_error(transport_errc::cancelled, "shm link was closed");
}

} // namespace h2::transport::shm
