#include "h2/transport/framed.hpp"

#include "h2/transport/crc32c.hpp"
#include "h2/transport/spin.hpp"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <sstream>

namespace h2::transport {

// -- links: what a backend may leave out
// ---------------------------------------------------------------

std::optional<wire::placement> byte_link::place(buffer_view) {
  return std::nullopt;
}

byte_link::adopted_payload byte_link::adopt(const wire::placement&) {
  throw transport_error(transport_errc::corrupt_frame,
                        "corrupt frame: " + std::string(backend()) + " peer " +
                          peer() +
                          " placed a payload outside the stream, which " +
                          std::string(backend()) + " links never do");
}

// -- the job's secret
// ----------------------------------------------------------

job_secret::job_secret(std::string bytes) : bytes_(std::move(bytes)) {
}

job_secret job_secret::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw config_error("security.secret_file",
                       "cannot read the job's secret \"" + path + "\"");
  std::ostringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' ||
                        s.back() == ' ' || s.back() == '\t'))
    s.pop_back();
  if (s.empty())
    throw config_error("security.secret_file",
                       "the job's secret \"" + path + "\" is empty");
  return job_secret(std::move(s));
}

std::array<std::uint8_t, 32>
job_secret::prove(const std::string& message) const {
  std::array<std::uint8_t, 32> out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), bytes_.data(), static_cast<int>(bytes_.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(),
       out.data(), &len);
  return out;
}

// -- handshake
// -----------------------------------------------------------------

namespace {

std::array<std::uint8_t, 32> random_nonce() {
  std::array<std::uint8_t, 32> n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw error("no randomness for the handshake (RAND_bytes failed)");
  return n;
}

std::string proof_message(const char* role,
                          const std::array<std::uint8_t, 32>& nonce,
                          std::uint64_t channel) {
  std::string m(role);
  m.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  m.append(reinterpret_cast<const char*>(&channel), sizeof(channel));
  return m;
}

bool same(const std::array<std::uint8_t, 32>& a,
          const std::array<std::uint8_t, 32>& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

/// Reasons in a goodbye frame's payload.
enum class goodbye_reason : std::uint32_t { closed = 0, unauthorized = 1 };

void send_hello(byte_link& link, const wire::hello_payload& h) {
  std::byte payload[wire::hello_bytes];
  wire::encode(h, payload);
  wire::frame_header fh;
  fh.kind = wire::frame_kind::hello;
  fh.payload_bytes = wire::hello_bytes;
  std::byte header[wire::header_bytes];
  wire::encode(fh, header);
  link.write({{header, sizeof(header)}, {payload, sizeof(payload)}});
}

void send_goodbye(byte_link& link, goodbye_reason reason) noexcept {
  try {
    auto code = static_cast<std::uint32_t>(reason);
    wire::frame_header fh;
    fh.kind = wire::frame_kind::goodbye;
    fh.payload_bytes = sizeof(code);
    std::byte header[wire::header_bytes];
    wire::encode(fh, header);
    link.write({{header, sizeof(header)}, {&code, sizeof(code)}});
  } catch (...) {
    // The peer learns of the refusal from the closed link instead.
  }
}

wire::hello_payload read_hello(byte_link& link, deadline until,
                               std::uint32_t expected_step) {
  std::byte header[wire::header_bytes];
  link.read(header, sizeof(header), until);
  auto fh = wire::decode(header, 1024);
  if (fh.kind == wire::frame_kind::goodbye) {
    std::uint32_t reason = 0;
    if (fh.payload_bytes == sizeof(reason))
      link.read(&reason, sizeof(reason), until);
    if (reason == static_cast<std::uint32_t>(goodbye_reason::unauthorized))
      throw transport_error(transport_errc::unauthorized,
                            "peer " + link.peer() +
                              " refused the job's secret");
    throw transport_error(transport_errc::peer_closed,
                          "peer " + link.peer() +
                            " closed during the handshake");
  }
  if (fh.kind != wire::frame_kind::hello ||
      fh.payload_bytes != wire::hello_bytes)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: expected a handshake from " +
                            link.peer());
  std::byte payload[wire::hello_bytes];
  link.read(payload, sizeof(payload), until);
  auto h = wire::decode_hello(payload, sizeof(payload));
  if (h.step != expected_step)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: handshake step " +
                            std::to_string(h.step) + " from " + link.peer());
  return h;
}

[[noreturn]] void refuse(byte_link& link, const std::string& who) {
  send_goodbye(link, goodbye_reason::unauthorized);
  link.shutdown();
  throw transport_error(transport_errc::unauthorized,
                        who + " " + link.peer() +
                          " does not know the job's secret");
}

} // namespace

handshake_result dial_handshake(byte_link& link, const job_secret& secret,
                                std::uint64_t channel, std::uint32_t rank,
                                deadline until) {
  wire::hello_payload challenge;
  challenge.channel = channel;
  challenge.node_rank = rank;
  challenge.step = 1;
  challenge.nonce = random_nonce();
  send_hello(link, challenge);
  auto response = read_hello(link, until, 2);
  if (response.channel != channel)
    throw transport_error(transport_errc::corrupt_frame,
                          "corrupt frame: handshake for another channel");
  if (!same(response.proof,
            secret.prove(proof_message("acceptor", challenge.nonce, channel))))
    refuse(link, "acceptor");
  wire::hello_payload proof;
  proof.channel = channel;
  proof.node_rank = rank;
  proof.step = 3;
  proof.proof = secret.prove(proof_message("dialer", response.nonce, channel));
  send_hello(link, proof);
  read_hello(link, until, 4);
  return {channel, response.node_rank};
}

handshake_result accept_handshake(byte_link& link, const job_secret& secret,
                                  std::uint32_t rank, deadline until) {
  auto challenge = read_hello(link, until, 1);
  wire::hello_payload response;
  response.channel = challenge.channel;
  response.node_rank = rank;
  response.step = 2;
  response.nonce = random_nonce();
  response.proof =
    secret.prove(proof_message("acceptor", challenge.nonce, challenge.channel));
  send_hello(link, response);
  auto proof = read_hello(link, until, 3);
  if (proof.channel != challenge.channel ||
      !same(proof.proof, secret.prove(proof_message("dialer", response.nonce,
                                                    challenge.channel))))
    refuse(link, "dialer");
  wire::hello_payload accepted;
  accepted.channel = challenge.channel;
  accepted.node_rank = rank;
  accepted.step = 4;
  send_hello(link, accepted);
  return {challenge.channel, challenge.node_rank};
}

// -- tensors on the wire
// ---------------------------------------------------------

namespace {

wire::dtype_code code_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return wire::dtype_code::float32;
    case at::kBFloat16:
      return wire::dtype_code::bfloat16;
    case at::kHalf:
      return wire::dtype_code::float16;
    case at::kLong:
      return wire::dtype_code::int64;
    case at::kInt:
      return wire::dtype_code::int32;
    case at::kByte:
      return wire::dtype_code::uint8;
    case at::kDouble:
      return wire::dtype_code::float64;
    default:
      throw error(std::string("DiComm cannot send tensors of type ") +
                  c10::toString(t));
  }
}

at::ScalarType scalar_type_of(wire::dtype_code c) {
  switch (c) {
    case wire::dtype_code::float32:
      return at::kFloat;
    case wire::dtype_code::bfloat16:
      return at::kBFloat16;
    case wire::dtype_code::float16:
      return at::kHalf;
    case wire::dtype_code::int64:
      return at::kLong;
    case wire::dtype_code::int32:
      return at::kInt;
    case wire::dtype_code::uint8:
      return at::kByte;
    case wire::dtype_code::float64:
      return at::kDouble;
  }
  throw internal_error("unknown dtype code");
}

} // namespace

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

/// Turns the link's bytes into messages, one frame at a time, resumably: it
/// reads what the link has, keeps a partly read frame for the next call and
/// delivers every completed one. Over a polled_link, waiting receives drive
/// it (receive_progress) and the channel's reader thread only drains what
/// nobody waits for; over any other link the reader thread blocks in read().
class framed_channel::receiver final : public receive_progress {
public:
  receiver(byte_link& link, mailbox& inbox, framed_options options)
      : link_(&link),
        polled_(dynamic_cast<polled_link*>(&link)),
        inbox_(&inbox),
        options_(options),
        pool_(std::make_shared<receive_pool>()) {
    expect_header();
  }

  /// Whether receives may read frames themselves.
  bool polled() const noexcept { return polled_ != nullptr; }

  void poll() noexcept override {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock() && link_ != nullptr && !ended_)
      take_arrived();
  }

  void wait(const std::atomic<bool>& done,
            std::chrono::steady_clock::time_point until) noexcept override {
    using clock = std::chrono::steady_clock;
    auto is_done = [&] {
      return done.load(std::memory_order_acquire);
    };
    const auto start = clock::now();
    // Poll first: a message about to arrive is taken without any thread
    // wake-up or system call. Only this thread spins (the reader thread
    // sleeps), so this pays on two cores too.
    spin_until(
      [&] {
        if (is_done())
          return true;
        poll();
        return is_done();
      },
      std::min<clock::duration>(spin_.budget(), until - start));
    while (!is_done() && clock::now() < until)
      sleep_and_take(done, until);
    if (is_done())
      spin_.observe(clock::now() - start);
  }

  /// The reader thread over a polled_link: drains when the writer needs
  /// room or once per liveness interval, until the link ends.
  void serve_polled() {
    for (;;) {
      try {
        polled_->wait_drain();
      } catch (const transport_error& e) {
        std::lock_guard<std::mutex> guard(mutex_);
        fail(e);
        return;
      }
      std::lock_guard<std::mutex> guard(mutex_);
      if (!ended_)
        take_arrived();
      if (ended_)
        return;
    }
  }

  /// The reader thread over any other link: blocks in read() until the link
  /// ends.
  void serve_blocking() {
    std::lock_guard<std::mutex> guard(mutex_);
    take([this](void* p, std::size_t n) {
      link_->read(p, n);
      return n;
    });
  }

  /// The channel is going away with its link: later calls do nothing.
  void detach() noexcept {
    std::unique_lock<std::shared_mutex> alive(link_alive_);
    std::lock_guard<std::mutex> guard(mutex_);
    link_ = nullptr;
    polled_ = nullptr;
  }

private:
  enum class phase { header, placement, payload };

  /// Sleeps on the link until it has bytes, `done` is set or `until`, then
  /// takes what arrived.
  void sleep_and_take(const std::atomic<bool>& done,
                      std::chrono::steady_clock::time_point until) noexcept {
    std::shared_lock<std::shared_mutex> alive(link_alive_);
    if (link_ == nullptr)
      return;
    std::optional<transport_error> failure;
    waiters_.fetch_add(1);
    try {
      const std::uint32_t seen = polled_->wake_count();
      if (!done.load())
        polled_->wait_readable(seen, until);
    } catch (const transport_error& e) {
      if (e.code() != transport_errc::timeout) // the receive's own timeout
        failure = e;
    }
    waiters_.fetch_sub(1);
    // Woken to read: wait for a thread that is reading now rather than spin.
    std::lock_guard<std::mutex> guard(mutex_);
    if (failure)
      fail(*failure);
    else if (link_ != nullptr && !ended_)
      take_arrived();
  }

  /// take() of what a polled_link has now. Requires mutex_.
  void take_arrived() noexcept {
    take([this](void* p, std::size_t n) { return polled_->read_some(p, n); });
  }

  /// Reads through `fill` (how many bytes it put into a buffer; 0 when none
  /// are there) and delivers every frame completed, until `fill` has no more
  /// or the link failed. Requires mutex_.
  template <class Fill>
  void take(Fill&& fill) noexcept {
    try {
      for (;;) {
        if (have_ < need_) {
          have_ += fill(into_ + have_, need_ - have_);
          if (have_ < need_)
            return;
        }
        next();
      }
    } catch (const transport_error& e) {
      fail(e);
    } catch (const std::exception& e) {
      fail(transport_error(transport_errc::corrupt_frame,
                           std::string("receiving from ") + link_->peer() +
                             ": " + e.what()));
    }
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
    header_ = wire::decode(header_bytes_, options_.max_payload_bytes);
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
        pool_->take(shape(), scalar_type_of(header_.dtype),
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
    auto payload = link_->adopt(where);
    try {
      message_.tensor = at::from_blob(
        payload.data, shape(),
        [release = payload.release](void*) { release(); },
        at::TensorOptions().dtype(scalar_type_of(header_.dtype)));
    } catch (...) {
      payload.release();
      throw;
    }
    finish_frame(static_cast<std::byte*>(payload.data));
  }

  void finish_frame(const std::byte* payload) {
    if ((header_.flags & wire::flag::payload_crc) != 0 &&
        crc32c(payload, header_.payload_bytes) != header_.payload_crc)
      throw transport_error(transport_errc::corrupt_frame,
                            "corrupt frame: payload checksum mismatch from " +
                              link_->peer());
    inbox_->deliver(std::move(message_));
    expect_header();
    // A receive asleep on the link may have just been given its message:
    // wake it (Dekker with wait(): its waiters_ before its check of done).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (polled_ != nullptr && waiters_.load() > 0)
      polled_->nudge();
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
  /// stream that ends inside a frame is a truncated frame), and the link is
  /// ended so that the peer learns of it too. Requires mutex_.
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
  }

  byte_link* link_;     ///< null once detached
  polled_link* polled_; ///< link_, when it is one
  mailbox* inbox_;      ///< valid while link_ is
  framed_options options_;
  /// Where received tensors' bytes go (buffers reused once freed).
  std::shared_ptr<receive_pool> pool_;
  /// Held (shared) by receives asleep on the link, so detach() waits for
  /// them; taken before mutex_.
  std::shared_mutex link_alive_;
  /// Held by whoever reads frames: the reader thread or a receive.
  std::mutex mutex_;
  /// Receives asleep on the link.
  std::atomic<int> waiters_{0};
  /// How long receives poll before they sleep on the link.
  adaptive_spin spin_{std::chrono::microseconds(50),
                      std::chrono::microseconds(500)};
  bool ended_ = false;

  // The frame being read.
  phase phase_ = phase::header;
  std::byte* into_ = nullptr;
  std::size_t have_ = 0;
  std::size_t need_ = 0;
  std::byte header_bytes_[wire::header_bytes];
  std::byte placement_bytes_[wire::placement_bytes];
  wire::frame_header header_;
  message message_;
};

// -- the channel
// ---------------------------------------------------------------

framed_channel::framed_channel(std::unique_ptr<byte_link> link,
                               framed_options options)
    : link_(std::move(link)),
      options_(options),
      receiver_(std::make_shared<receiver>(*link_, inbox_, options)) {
  if (receiver_->polled())
    inbox_.set_progress(receiver_);
  reader_ = std::thread([this] { read_loop(); });
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
  if (m.tensor.defined()) {
    t = m.tensor.device().is_cpu() ? m.tensor.contiguous()
                                   : m.tensor.to(at::kCPU).contiguous();
    H2_ENFORCE(t.dim() <= wire::max_dims, "tensor of ", t.dim(), " dimensions");
    h.flags |= wire::flag::tensor;
    h.dtype = code_of(t.scalar_type());
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
  const buffer_view body{payload, static_cast<std::size_t>(h.payload_bytes)};
  std::byte header[wire::header_bytes];
  {
    std::lock_guard<std::mutex> guard(write_mutex_);
    std::optional<wire::placement> placed;
    if (t.defined() && body.size > 0)
      placed = link_->place(body);
    if (placed) {
      h.flags |= wire::flag::placed;
      wire::encode(h, header);
      std::byte record[wire::placement_bytes];
      wire::encode(*placed, record);
      link_->write({{header, sizeof(header)}, {record, sizeof(record)}});
    } else {
      wire::encode(h, header);
      link_->write({{header, sizeof(header)}, body});
    }
  }
  messages_sent_ += 1;
  bytes_sent_ += h.payload_bytes;
}

pending_message framed_channel::recv_async(std::uint64_t tag) {
  return inbox_.receive(tag);
}

void framed_channel::close() noexcept {
  if (closed_.exchange(true))
    return;
  inbox_.cancel(std::string(link_->backend()) + " channel closed");
  link_->shutdown();
}

channel_stats framed_channel::stats() const {
  return {messages_sent_.load(), inbox_.messages_delivered(),
          bytes_sent_.load(), inbox_.bytes_delivered()};
}

void framed_channel::read_loop() {
  if (receiver_->polled())
    receiver_->serve_polled();
  else
    receiver_->serve_blocking();
}

} // namespace h2::transport
