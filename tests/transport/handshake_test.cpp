// The join of a node to its job (handshake.hpp): the nonce the coordinator
// hands out, the proof a node returns for it, and the digest of the job file
// both must share. The channel handshake itself is exercised over every
// backend by the conformance and fault suites.
#include "h2/transport/handshake.hpp"

#include "h2/core/random.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace h2::transport {
namespace {

bool is_hex(const std::string& s) {
  return s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST(transport_join, nonce_is_32_fresh_random_bytes_in_hex) {
  std::set<std::string> seen;
  for (int i = 0; i < 64; ++i) {
    std::string n = make_nonce();
    EXPECT_EQ(n.size(), 64u);
    EXPECT_TRUE(is_hex(n)) << n;
    seen.insert(n);
  }
  EXPECT_EQ(seen.size(), 64u);
}

TEST(transport_join, proof_is_the_hmac_of_nonce_and_rank) {
  job_secret secret("conformance-secret");
  // HMAC-SHA256("conformance-secret", "join/00ff/3"), computed elsewhere
  // (Python's hmac module): what every node of this protocol version sends.
  EXPECT_EQ(join_proof(secret, "00ff", 3),
            "f404acd0120fd17c798d2826d723b9a592adb161b7b6ace8d439fb3b26d4e329");
  // The same as proving the message directly.
  auto direct = secret.prove("join/00ff/3");
  EXPECT_EQ(join_proof(secret, "00ff", 3),
            hex_string(direct.data(), direct.size()));
}

TEST(transport_join, same_inputs_give_the_same_proof) {
  job_secret a("s3cret");
  job_secret b("s3cret");
  const std::string nonce = make_nonce();
  EXPECT_EQ(join_proof(a, nonce, 1), join_proof(a, nonce, 1));
  EXPECT_EQ(join_proof(a, nonce, 1), join_proof(b, nonce, 1));
}

TEST(transport_join, any_other_input_gives_another_proof) {
  job_secret secret("s3cret");
  const std::string nonce = make_nonce();
  const std::string proof = join_proof(secret, nonce, 1);
  EXPECT_EQ(proof.size(), 64u);
  EXPECT_TRUE(is_hex(proof));
  EXPECT_NE(join_proof(secret, make_nonce(), 1), proof); // another nonce
  EXPECT_NE(join_proof(secret, nonce, 2), proof);        // another rank
  EXPECT_NE(join_proof(job_secret("s3cret!"), nonce, 1), proof); // secret
  // The separators keep (nonce, rank) pairs apart: "ab" + 12 vs "ab1" + 2.
  EXPECT_NE(join_proof(secret, "ab", 12), join_proof(secret, "ab1", 2));
}

TEST(transport_join, only_the_right_proof_is_valid) {
  job_secret secret("s3cret");
  const std::string nonce = make_nonce();
  const std::string proof = join_proof(secret, nonce, 1);
  EXPECT_TRUE(join_proof_valid(secret, nonce, 1, proof));
  EXPECT_FALSE(join_proof_valid(secret, nonce, 2, proof));
  EXPECT_FALSE(join_proof_valid(job_secret("other"), nonce, 1, proof));
  EXPECT_FALSE(join_proof_valid(secret, nonce, 1, proof.substr(1)));
  EXPECT_FALSE(join_proof_valid(secret, nonce, 1, proof + "0"));
  EXPECT_FALSE(join_proof_valid(secret, nonce, 1, ""));
}

TEST(transport_control, a_sealed_message_is_accepted_once) {
  auto secret = std::make_shared<const job_secret>("s3cret");
  control_signer signer(secret, 2);
  control_verifier verifier(secret);
  const auto first = signer.seal("stop", "");
  const auto second = signer.seal("stop", "");
  EXPECT_EQ(first.sender, 2);
  EXPECT_LT(first.seq, second.seq);
  EXPECT_TRUE(verifier.accept("stop", first, ""));
  EXPECT_FALSE(verifier.accept("stop", first, "")); // a replay
  EXPECT_TRUE(verifier.accept("stop", second, ""));
  EXPECT_FALSE(verifier.accept("stop", first, "")); // older than accepted
}

TEST(transport_control, anything_else_is_refused) {
  auto secret = std::make_shared<const job_secret>("s3cret");
  control_signer signer(secret, 1);
  control_verifier verifier(secret);
  const auto seal = signer.seal("abort", "4/node 2 is gone");
  EXPECT_FALSE(verifier.accept("finish", seal, "4/node 2 is gone")); // type
  EXPECT_FALSE(verifier.accept("abort", seal, "4/node 3 is gone")); // payload
  auto other_sender = seal;
  other_sender.sender = 0;
  EXPECT_FALSE(verifier.accept("abort", other_sender, "4/node 2 is gone"));
  auto other_seq = seal;
  other_seq.seq += 1;
  EXPECT_FALSE(verifier.accept("abort", other_seq, "4/node 2 is gone"));
  control_signer stranger(std::make_shared<const job_secret>("guess"), 1);
  EXPECT_FALSE(
    verifier.accept("abort", stranger.seal("abort", "x"), "x")); // secret
  EXPECT_FALSE(verifier.accept("abort", control_seal{1, 1, ""}, "x"));
  // None of those raised the floor: the real one still passes.
  EXPECT_TRUE(verifier.accept("abort", seal, "4/node 2 is gone"));
}

TEST(transport_join, job_digest_is_hex_sha256) {
  EXPECT_EQ(job_digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(job_digest(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_NE(job_digest("[job]\nname = \"a\"\n"),
            job_digest("[job]\nname = \"b\"\n"));
}

} // namespace
} // namespace h2::transport
