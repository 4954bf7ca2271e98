#include "link.hpp"

#include "h2/transport/spin.hpp"
#include "h2/transport/wake_fd.hpp"

#include <h2/config.hpp>
#if H2_HAS_CUDA
#include "h2/devices/cuda/context.hpp"
#endif

#include <arpa/inet.h>
#include <cstring>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

namespace h2::transport::rdma {

namespace {

using namespace std::chrono_literals;

/// Sends from device memory below this size are staged (the lookup would
/// cost more than the copy).
constexpr std::size_t device_direct_min_bytes = std::size_t{64} << 10;
/// How long a side spins before it sleeps.
constexpr std::chrono::microseconds spin_budget{50};
/// How long close() lets posted writes land before it tells the peer.
constexpr std::chrono::milliseconds drain_budget{1000};
/// The longest wait_drain(): its wait looks at the peer's liveness itself.
constexpr std::chrono::seconds drain_interval{1};

/// What a work request was, in the top bits of its id; the rest is the
/// stream position a write ends at.
enum class wr_kind : std::uint64_t { write = 1, credit = 2, receive = 3 };
constexpr int kind_shift = 62;
constexpr std::uint64_t position_mask = (std::uint64_t{1} << kind_shift) - 1;

std::uint64_t wr_id(wr_kind k, std::uint64_t position = 0) {
  return (static_cast<std::uint64_t>(k) << kind_shift) |
         (position & position_mask);
}

wr_kind kind_of(std::uint64_t id) {
  return static_cast<wr_kind>(id >> kind_shift);
}

} // namespace

rdma_link::rdma_link(channel_ptr channel, id_ptr id, std::unique_ptr<socket_link> socket,
          std::uint64_t ring_bytes)
    : channel_(std::move(channel)),
      id_(std::move(id)),
      socket_(std::move(socket)),
      peer_(socket_->peer()),
      capacity_(ring_bytes),
      reader_(ring_bytes, ring_bytes / 4),
      wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      nudged_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (wake_.get() < 0 || nudged_.get() < 0)
    fail_setup(errno_text("eventfd"));
  ibv_context* verbs = id_->verbs;
  if (verbs == nullptr)
    fail_setup("the connection to " + peer_ + " has no device");
  pd_.reset(ibv_alloc_pd(verbs));
  if (!pd_)
    fail_setup(errno_text("ibv_alloc_pd"));
  comp_.reset(ibv_create_comp_channel(verbs));
  if (!comp_)
    fail_setup(errno_text("ibv_create_comp_channel"));
  set_nonblocking(comp_->fd);
  cq_.reset(ibv_create_cq(verbs, cq_depth, nullptr, comp_.get(), 0));
  if (!cq_)
    fail_setup(errno_text("ibv_create_cq"));
  ibv_qp_init_attr qa{};
  qa.send_cq = cq_.get();
  qa.recv_cq = cq_.get();
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 1; // every send completes visibly: it frees a slot
  qa.cap.max_send_wr = send_depth;
  qa.cap.max_recv_wr = recv_depth;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  if (rdma_create_qp(id_.get(), pd_.get(), &qa) != 0)
    fail_setup(errno_text("rdma_create_qp"));
  qp_.id = id_.get();
  in_ring_ = region(capacity_);
  in_mr_.reset(ibv_reg_mr(pd_.get(), in_ring_.data(), capacity_,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  if (!in_mr_)
    fail_setup(errno_text("ibv_reg_mr of the receive ring"));
  // Receives must be posted before the peer can write (an immediate
  // consumes one); a queue pair takes them from its INIT state on.
  for (std::uint32_t i = 0; i < recv_depth; ++i)
    if (int rc = post_receive(); rc != 0)
      fail_setup(std::string("ibv_post_recv: ") + std::strerror(rc));
}

rdma_link::~rdma_link() {
  shutdown();
}

void rdma_link::exchange_rings(deadline until) {
  send_ring(
    *socket_,
    {reinterpret_cast<std::uint64_t>(in_ring_.data()), in_mr_->rkey, capacity_},
    until);
  ring_info peer = receive_ring(*socket_, until);
  staging_ = region(peer.capacity);
  staging_mr_.reset(ibv_reg_mr(pd_.get(), staging_.data(), peer.capacity,
                               IBV_ACCESS_LOCAL_WRITE));
  if (!staging_mr_)
    fail_setup(errno_text("ibv_reg_mr of the staging ring"));
  remote_ = peer;
  chunk_bytes_ = std::max<std::uint64_t>(
    4096, std::min<std::uint64_t>(max_write_bytes, peer.capacity / 4));
  std::lock_guard<std::mutex> guard(mutex_);
  writer_.emplace(peer.capacity, max_notifications);
}

void rdma_link::write(std::initializer_list<buffer_view> parts,
                      deadline until) {
  for (const auto& part : parts) {
    if (part.size == 0)
      continue;
    if (part.size >= device_direct_min_bytes) {
      if (ibv_mr* mr = device_region(part.data, part.size)) {
        flush(until);
        write_direct(static_cast<const char*>(part.data), part.size, mr, until);
        continue;
      }
    }
    write_staged(static_cast<const char*>(part.data), part.size, until);
  }
  flush(until);
}

bool rdma_link::writes_from_device(buffer_view payload) {
  if (payload.size < device_direct_min_bytes)
    return false;
  try {
    return device_region(payload.data, payload.size) != nullptr;
  } catch (const device_error&) {
    return false; // cannot be registered: the caller stages it
  }
}

std::size_t rdma_link::read_some(void* data, std::size_t size) {
  std::uint64_t available = 0, at = 0;
  auto arrived = [&] {
    available = reader_.available();
    at = reader_.consumed();
    return available > 0;
  };
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (!look_locked(arrived))
      return 0;
  }
  // Only this thread consumes: no lock while copying.
  const std::size_t n = std::min<std::uint64_t>(available, size);
  ring::copy_out(in_ring_.data(), capacity_, at, data, n);
  std::lock_guard<std::mutex> guard(mutex_);
  reader_.consume(n);
  send_credit_locked();
  return n;
}

std::uint32_t rdma_link::wake_count() const noexcept {
  return wakes_.load(std::memory_order_seq_cst);
}

void rdma_link::wait_readable(std::uint32_t seen, deadline until) {
  wait(
    [&] {
      return reader_.available() > 0 ||
             wakes_.load(std::memory_order_seq_cst) != seen;
    },
    until);
}

void rdma_link::wait_drain(std::uint32_t seen) {
  try {
    wait_readable(seen, std::chrono::steady_clock::now() + drain_interval);
  } catch (const transport_error& e) {
    if (e.code() != transport_errc::timeout)
      throw;
  }
}

void rdma_link::nudge() noexcept {
  wakes_.fetch_add(1, std::memory_order_seq_cst);
  bool polling = false;
  {
    // Waiters on progressed_ look at wakes_ under the lock; the one on the
    // completion channel set poller_ under it before its last look.
    std::lock_guard<std::mutex> guard(mutex_);
    polling = poller_;
    progressed_.notify_all();
  }
  if (polling)
    wake(nudged_.get());
}

void rdma_link::shutdown() noexcept {
  if (shut_.exchange(true))
    return;
  // Writes already posted land before the peer hears of the close: the
  // bootstrap socket's end could otherwise overtake them.
  try {
    auto until = std::chrono::steady_clock::now() + drain_budget;
    while (std::chrono::steady_clock::now() < until) {
      {
        std::lock_guard<std::mutex> guard(mutex_);
        progress_locked();
        if (!writer_ || writer_->drained() || failure_)
          break;
      }
      if (socket_->peer_gone())
        break;
      std::this_thread::sleep_for(100us);
    }
  } catch (...) {
    // A broken link has nothing left to drain.
  }
  wake(wake_.get());
  {
    std::lock_guard<std::mutex> guard(mutex_);
    progressed_.notify_all();
  }
  rdma_disconnect(id_.get());
  socket_->shutdown();
}

void rdma_link::write_staged(const char* p, std::size_t left, deadline until) {
  while (left > 0) {
    std::uint64_t room = 0, at = 0, posted = 0;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      room = writer_->free_bytes();
      at = writer_->staged();
      posted = writer_->posted();
    }
    const std::uint64_t chunk_room = chunk_bytes_ - (at - posted);
    if (room == 0 || chunk_room == 0) {
      flush(until);
      wait([&] { return writer_->free_bytes() > 0; }, until);
      continue;
    }
    const std::size_t n = std::min<std::uint64_t>({room, chunk_room, left});
    // Free places are the writer's alone: no lock while copying.
    ring::copy_in(staging_.data(), remote_.capacity, at, p, n);
    {
      std::lock_guard<std::mutex> guard(mutex_);
      writer_->stage(n);
    }
    p += n;
    left -= n;
    if (n == chunk_room)
      flush(until);
  }
}

void rdma_link::flush(deadline until) {
  for (;;) {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      if (writer_->posted() == writer_->staged())
        return;
    }
    wait_for_send_slot(until);
    std::lock_guard<std::mutex> guard(mutex_);
    if (!send_slot_free_locked())
      continue; // a credit took the slot meanwhile
    const std::uint64_t from = writer_->posted(), to = writer_->staged();
    const auto pieces = ring::split(from, to - from, remote_.capacity);
    post_write_locked(from, to, staging_.data() + pieces.first.offset,
                      staging_.data(), staging_mr_->lkey);
    return;
  }
}

void rdma_link::write_direct(const char* p, std::size_t left, ibv_mr* mr,
                             deadline until) {
  std::uint64_t end = 0;
  while (left > 0) {
    wait([&] { return writer_->free_bytes() > 0 && send_slot_free_locked(); },
         until);
    std::lock_guard<std::mutex> guard(mutex_);
    if (!send_slot_free_locked())
      continue;
    const std::uint64_t at = writer_->staged();
    const std::size_t n =
      std::min<std::uint64_t>({writer_->free_bytes(), chunk_bytes_, left});
    writer_->stage(n);
    const auto pieces = ring::split(at, n, remote_.capacity);
    post_write_locked(at, at + n, p, p + pieces.first.bytes, mr->lkey);
    end = at + n;
    p += n;
    left -= n;
  }
  wait([&] { return writer_->completed() >= end; }, until);
}

bool rdma_link::send_slot_free_locked() const {
  return writer_->may_notify() && sq_outstanding_ + 2 <= send_depth;
}

void rdma_link::wait_for_send_slot(deadline until) {
  wait([&] { return send_slot_free_locked(); }, until);
}

void rdma_link::post_write_locked(std::uint64_t from, std::uint64_t to,
                       const void* first, const void* second,
                       std::uint32_t lkey) {
  const auto pieces = ring::split(from, to - from, remote_.capacity);
  ibv_sge sge[2] = {};
  ibv_send_wr wr[2] = {};
  const void* sources[2] = {first, second};
  const ring::piece parts[2] = {pieces.first, pieces.second};
  const int count = pieces.count();
  std::uint64_t end = from;
  for (int i = 0; i < count; ++i) {
    end += parts[i].bytes;
    sge[i].addr = reinterpret_cast<std::uint64_t>(sources[i]);
    sge[i].length = static_cast<std::uint32_t>(parts[i].bytes);
    sge[i].lkey = lkey;
    wr[i].wr_id = wr_id(wr_kind::write, end);
    wr[i].sg_list = &sge[i];
    wr[i].num_sge = 1;
    wr[i].opcode = IBV_WR_RDMA_WRITE;
    wr[i].send_flags = IBV_SEND_SIGNALED;
    wr[i].wr.rdma.remote_addr = remote_.address + parts[i].offset;
    wr[i].wr.rdma.rkey = remote_.rkey;
    if (i + 1 < count)
      wr[i].next = &wr[i + 1];
  }
  ibv_send_wr& last = wr[count - 1];
  last.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  last.imm_data = htonl(static_cast<std::uint32_t>(to - from));
  ibv_send_wr* bad = nullptr;
  // Posting returns an errno value; errno itself is not set.
  if (int rc = ibv_post_send(id_->qp, wr, &bad); rc != 0)
    throw_failure_locked(transport_errc::peer_closed,
                         "rdma link to " + peer_ +
                           ": ibv_post_send: " + std::strerror(rc));
  sq_outstanding_ += static_cast<std::uint32_t>(count);
  writer_->post(to);
}

void rdma_link::send_credit_locked() {
  const std::uint64_t due = reader_.credit_due();
  if (due == 0 || shut_.load() || failure_ || sq_outstanding_ >= send_depth)
    return;
  ibv_send_wr wr{};
  wr.wr_id = wr_id(wr_kind::credit);
  wr.opcode = IBV_WR_SEND_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(static_cast<std::uint32_t>(due));
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(id_->qp, &wr, &bad); rc != 0) {
    record_failure_locked(transport_errc::peer_closed,
                          "rdma link to " + peer_ +
                            ": ibv_post_send: " + std::strerror(rc));
    return;
  }
  ++sq_outstanding_;
  reader_.credit_sent(due);
}

int rdma_link::post_receive() {
  // Zero-length: immediates carry no data into receive buffers.
  ibv_recv_wr wr{};
  wr.wr_id = wr_id(wr_kind::receive);
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(id_->qp, &wr, &bad);
}

void rdma_link::progress_locked() {
  ibv_wc wc[32];
  bool any = false;
  for (;;) {
    int n = ibv_poll_cq(cq_.get(), 32, wc);
    if (n < 0) {
      record_failure_locked(transport_errc::peer_closed,
                            "rdma link to " + peer_ + ": ibv_poll_cq failed");
      break;
    }
    for (int i = 0; i < n; ++i)
      complete_locked(wc[i]);
    any = any || n > 0;
    if (n < 32)
      break;
  }
  send_credit_locked();
  if (any || failure_)
    progressed_.notify_all(); // the other waiter may be waiting for these
}

void rdma_link::complete_locked(const ibv_wc& wc) {
  const wr_kind kind = kind_of(wc.wr_id);
  if (kind != wr_kind::receive)
    --sq_outstanding_;
  if (wc.status != IBV_WC_SUCCESS) {
    // After a close the queue pair flushes what was posted: no news.
    if (!shut_.load())
      record_failure_locked(
        transport_errc::peer_closed,
        "rdma link to " + peer_ + ": " + ibv_wc_status_str(wc.status) +
          " (vendor error " + std::to_string(wc.vendor_err) + ")");
    return;
  }
  switch (kind) {
    case wr_kind::write:
      writer_->complete(wc.wr_id & position_mask);
      return;
    case wr_kind::credit:
      return;
    case wr_kind::receive:
      break;
  }
  const std::uint32_t imm = ntohl(wc.imm_data);
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    if (!reader_.arrive(imm))
      record_failure_locked(transport_errc::corrupt_frame,
                            "corrupt frame: rdma peer " + peer_ +
                              " wrote past the receive ring");
  } else if (wc.opcode == IBV_WC_RECV &&
             (wc.wc_flags & IBV_WC_WITH_IMM) != 0) {
    if (!writer_ || !writer_->credit(imm))
      record_failure_locked(transport_errc::corrupt_frame,
                            "corrupt frame: rdma peer " + peer_ +
                              " returned bytes it was never sent");
  } else {
    record_failure_locked(transport_errc::corrupt_frame,
                          "corrupt frame: unexpected message from rdma "
                          "peer " +
                            peer_);
  }
  if (int rc = post_receive(); rc != 0)
    record_failure_locked(transport_errc::peer_closed,
                          "rdma link to " + peer_ +
                            ": ibv_post_recv: " + std::strerror(rc));
}

void rdma_link::record_failure_locked(transport_errc code, const std::string& what) {
  if (!failure_)
    failure_.emplace(code, what);
}

void rdma_link::throw_failure_locked(transport_errc code,
                                       const std::string& what) {
  record_failure_locked(code, what);
  throw *failure_;
}

template <class Ready>
bool rdma_link::look_locked(Ready& ready) {
  if (shut_.load())
    throw transport_error(transport_errc::cancelled,
                          "rdma link to " + peer_ + " was closed");
  progress_locked();
  if (ready())
    return true;
  if (failure_)
    throw *failure_;
  return false;
}

template <class Ready>
bool rdma_link::attempt(Ready& ready) {
  std::lock_guard<std::mutex> guard(mutex_);
  return look_locked(ready);
}

template <class Ready>
void rdma_link::wait(Ready&& ready, std::optional<deadline> until) {
  if (spin_until([&] { return attempt(ready); }, spin_budget))
    return;
  using clock = std::chrono::steady_clock;
  auto next_check = clock::now() + liveness_interval;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (look_locked(ready))
      return;
    auto now = clock::now();
    if (now >= next_check) {
      next_check = now + liveness_interval;
      if (socket_->peer_gone()) {
        lock.unlock();
        peer_gone(ready);
        return;
      }
    }
    auto slice =
      std::chrono::duration_cast<std::chrono::milliseconds>(next_check - now);
    if (until) {
      if (now >= *until)
        throw transport_error(transport_errc::timeout,
                              "rdma peer " + peer_ + " sent nothing in time");
      slice = std::min(
        slice,
        std::chrono::duration_cast<std::chrono::milliseconds>(*until - now));
    }
    slice = std::max(slice, std::chrono::milliseconds(1));
    if (poller_) {
      progressed_.wait_for(lock, slice);
      continue;
    }
    poller_turn turn(*this);
    lock.unlock();
    // Arm, then look: a completion the look misses raises an event.
    ibv_req_notify_cq(cq_.get(), 0);
    lock.lock();
    if (look_locked(ready))
      return;
    lock.unlock();
    pollfd fds[3] = {{comp_->fd, POLLIN, 0},
                     {wake_.get(), POLLIN, 0},
                     {nudged_.get(), POLLIN, 0}};
    ::poll(fds, 3, static_cast<int>(slice.count()));
    // Emptied before the next look: a later nudge() writes it anew.
    if ((fds[2].revents & POLLIN) != 0)
      drain_wakes(nudged_.get());
    if ((fds[0].revents & POLLIN) != 0) {
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      if (ibv_get_cq_event(comp_.get(), &cq, &context) == 0)
        ibv_ack_cq_events(cq, 1);
    }
    lock.lock();
  }
}

template <class Ready>
void rdma_link::peer_gone(Ready& ready) {
  auto grace = std::chrono::steady_clock::now() + 10ms;
  while (std::chrono::steady_clock::now() < grace) {
    if (attempt(ready))
      return;
    std::this_thread::sleep_for(1ms);
  }
  std::lock_guard<std::mutex> guard(mutex_);
  if (look_locked(ready))
    return;
  throw_failure_locked(transport_errc::peer_closed,
                       "rdma peer " + peer_ + " closed the channel");
}

ibv_mr* rdma_link::device_region(const void* data, std::size_t size) {
#if H2_HAS_CUDA
  auto a = devices::find_cuda_allocation(data);
  if (!a)
    return nullptr;
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  if (auto it = device_mrs_.find(a->buffer_id); it != device_mrs_.end()) {
    ibv_mr* mr = it->second.get();
    if (mr != nullptr &&
        begin >= reinterpret_cast<std::uintptr_t>(mr->addr) &&
        begin + size <=
          reinterpret_cast<std::uintptr_t>(mr->addr) + mr->length)
      return mr;
    if (mr == nullptr)
      refuse_device_memory(data);
  }
  mr_ptr mr;
  if (auto buf = devices::export_cuda_dmabuf(*a)) {
    fd_guard fd(buf->fd); // the region keeps its own reference
    mr.reset(ibv_reg_dmabuf_mr(pd_.get(), 0, buf->bytes, buf->base, fd.get(),
                               IBV_ACCESS_LOCAL_WRITE));
  }
  // Cached either way: an allocation that cannot be registered is not
  // tried again.
  ibv_mr* raw = mr.get();
  device_mrs_[a->buffer_id] = std::move(mr);
  if (raw == nullptr)
    refuse_device_memory(data);
  return raw;
#else
  (void)data;
  (void)size;
  return nullptr;
#endif
}

void rdma_link::refuse_device_memory(const void* data) const {
  throw device_error(device_errc::invalid,
                     "rdma: device memory at " +
                       std::to_string(reinterpret_cast<std::uintptr_t>(data)) +
                       " cannot be registered (no dma-buf export); copy it "
                       "to host memory before sending");
}

} // namespace h2::transport::rdma
