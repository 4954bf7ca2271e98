#include "h2/transport/handshake.hpp"

#include "h2/core/error.hpp"
#include "h2/core/random.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace h2::transport {

// -- the job's secret
// ----------------------------------------------------------

job_secret::job_secret(std::string bytes) : bytes_(std::move(bytes)) {
}

std::string read_token_file(const std::string& path, const std::string& key,
                            const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw config_error(key, "cannot read " + what + " \"" + path +
                              "\": " + std::strerror(errno));
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0)
    throw config_error(key, what + " \"" + path +
                              "\" is readable by group or others: chmod 600 "
                              "it");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw config_error(key, "cannot read " + what + " \"" + path + "\"");
  std::ostringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' ||
                        s.back() == ' ' || s.back() == '\t'))
    s.pop_back();
  if (s.size() < min_token_bytes)
    throw config_error(
      key, what + " \"" + path + "\" has " + std::to_string(s.size()) +
             " bytes; it needs at least " + std::to_string(min_token_bytes));
  return s;
}

job_secret job_secret::from_file(const std::string& path) {
  return job_secret(
    read_token_file(path, "security.secret_file", "the job's secret"));
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
  random_bytes(n.data(), n.size());
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

void send_hello(byte_link& link, const wire::hello_payload& h, deadline until) {
  std::byte payload[wire::hello_bytes];
  wire::encode(h, payload);
  wire::frame_header fh;
  fh.kind = wire::frame_kind::hello;
  fh.payload_bytes = wire::hello_bytes;
  std::byte header[wire::header_bytes];
  wire::encode(fh, header);
  link.write({{header, sizeof(header)}, {payload, sizeof(payload)}}, until);
}

void send_goodbye(byte_link& link, goodbye_reason reason) noexcept {
  try {
    auto code = static_cast<std::uint32_t>(reason);
    wire::frame_header fh;
    fh.kind = wire::frame_kind::goodbye;
    fh.payload_bytes = sizeof(code);
    std::byte header[wire::header_bytes];
    wire::encode(fh, header);
    link.write({{header, sizeof(header)}, {&code, sizeof(code)}},
               std::chrono::steady_clock::now() + std::chrono::seconds(1));
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
  send_hello(link, challenge, until);
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
  send_hello(link, proof, until);
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
  send_hello(link, response, until);
  auto proof = read_hello(link, until, 3);
  if (proof.channel != challenge.channel ||
      !same(proof.proof, secret.prove(proof_message("dialer", response.nonce,
                                                    challenge.channel))))
    refuse(link, "dialer");
  wire::hello_payload accepted;
  accepted.channel = challenge.channel;
  accepted.node_rank = rank;
  accepted.step = 4;
  send_hello(link, accepted, until);
  return {challenge.channel, challenge.node_rank};
}

// -- joining the job
// -------------------------------------------------------------

std::string make_nonce() {
  return random_hex(32);
}

std::string join_proof(const job_secret& secret, std::string_view nonce,
                       int rank) {
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on
  // "/" + std::to_string(rank).
  std::string message = "join/";
  message.append(nonce);
  message.push_back('/');
  message.append(std::to_string(rank));
  auto p = secret.prove(message);
  return hex_string(p.data(), p.size());
}

namespace {

/// Constant-time equality of a received hex MAC and the expected one.
bool same_hex(std::string_view received, const std::string& expected) {
  return received.size() == expected.size() &&
         CRYPTO_memcmp(received.data(), expected.data(), expected.size()) == 0;
}

} // namespace

bool join_proof_valid(const job_secret& secret, std::string_view nonce,
                      int rank, std::string_view proof) {
  return same_hex(proof, join_proof(secret, nonce, rank));
}

namespace {

std::string control_mac(const job_secret& secret, std::string_view type,
                        int sender, std::uint64_t seq,
                        std::string_view payload) {
  std::string message = "control/";
  message.append(type);
  message.push_back('/');
  message.append(std::to_string(sender));
  message.push_back('/');
  message.append(std::to_string(seq));
  message.push_back('/');
  message.append(payload);
  auto p = secret.prove(message);
  return hex_string(p.data(), p.size());
}

} // namespace

control_seal seal_control(const job_secret& secret, std::string_view type,
                          int sender, std::uint64_t seq,
                          std::string_view payload) {
  return {sender, seq, control_mac(secret, type, sender, seq, payload)};
}

control_signer::control_signer(std::shared_ptr<const job_secret> secret,
                               int sender)
    : secret_(std::move(secret)), sender_(sender) {
}

control_seal control_signer::seal(std::string_view type,
                                  std::string_view payload) {
  return seal_control(*secret_, type, sender_, next_.fetch_add(1), payload);
}

control_verifier::control_verifier(std::shared_ptr<const job_secret> secret)
    : secret_(std::move(secret)) {
}

bool control_verifier::accept(std::string_view type, const control_seal& seal,
                              std::string_view payload) {
  if (!same_hex(seal.mac,
                control_mac(*secret_, type, seal.sender, seal.seq, payload)))
    return false;
  auto floor = last_.try_emplace(seal.sender, 0).first;
  if (seal.seq <= floor->second)
    return false; // a replay, or older than one accepted
  floor->second = seal.seq;
  return true;
}

std::string job_digest(std::string_view job_text) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(job_text.data(), job_text.size(), out, &len, EVP_sha256(),
                 nullptr) != 1)
    throw internal_error("SHA-256 of the job file failed (EVP_Digest)");
  return hex_string(out, len);
}

} // namespace h2::transport
