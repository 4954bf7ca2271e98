// The coordinator's port obeys only sealed control messages (docs/
// transport.md, "Control messages"): a stop or a heartbeat without a valid
// seal, a replayed one, or any other message changes nothing and is logged;
// a sealed stop is obeyed. White-box: it drives the coordinator actor of
// actors/coordinator.cpp in one process, as a CAF client reaching its port
// would.
#include "../../actors/cluster_protocol.hpp"

#include "h2/actors/atoms.hpp"
#include "test_jobs.hpp"

#include <caf/after.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <optional>

namespace h2::test {
namespace {

using namespace std::chrono_literals;

class actors_control : public ::testing::Test {
protected:
  actors_control() : system_(configured(cfg_)) {
    options_.job = std::make_shared<const job_config>(parse_job(
      small_job_toml(3) + demo_on_two_nodes, "control.toml"));
    options_.world_size = 2;
    options_.secret = secret_;
    options_.stop = stop_;
    options_.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> guard(mutex_);
      log_.push_back(line);
    };
    coordinator_ = actors::spawn_coordinator(system_, options_,
                                             caf::actor{waiter_}, nullptr);
  }

  ~actors_control() override {
    waiter_->send_exit(coordinator_, caf::exit_reason::user_shutdown);
  }

  static caf::actor_system_config& configured(caf::actor_system_config& cfg) {
    actors::configure_actor_system(cfg);
    actors::register_cluster_types(cfg);
    return cfg;
  }

  /// Joins `coordinator` as node `rank` (hostname "host-<rank>"): its
  /// hello, then the proof of the secret for the nonce.
  void prove_secret(caf::scoped_actor& node, const caf::actor& coordinator,
                    int rank) {
    std::string nonce;
    node->request(coordinator, 10s, actors::hello_atom::value, rank)
      .receive([&](std::string& n) { nonce = std::move(n); },
               [](const caf::error& e) { ADD_FAILURE() << to_string(e); });
    actors::node_join j;
    j.rank = rank;
    j.nonce = nonce;
    j.proof = transport::join_proof(*secret_, nonce, rank);
    j.job_digest = options_.job_digest;
    j.hostname = "host-" + std::to_string(rank);
    node->request(coordinator, 10s, actors::join_atom::value, j)
      .receive([](bool) {},
               [](const caf::error& e) { ADD_FAILURE() << to_string(e); });
  }

  /// What the coordinator logged once it handled everything `from` sent
  /// before (a request after them: CAF keeps one sender's order).
  std::vector<std::string> log_after(caf::scoped_actor& from) {
    from->request(coordinator_, 10s, actors::hello_atom::value, 0)
      .receive([](const std::string&) {},
               [](const caf::error& e) { ADD_FAILURE() << to_string(e); });
    std::lock_guard<std::mutex> guard(mutex_);
    return log_;
  }

  std::shared_ptr<const transport::job_secret> secret_ =
    std::make_shared<const transport::job_secret>("the job's secret");
  std::shared_ptr<std::atomic<int>> stop_ =
    std::make_shared<std::atomic<int>>(0);
  caf::actor_system_config cfg_;
  caf::actor_system system_;
  caf::scoped_actor waiter_{system_};
  actors::node_options options_;
  caf::actor coordinator_;
  std::mutex mutex_;
  std::vector<std::string> log_;
};

TEST_F(actors_control, unsealed_forged_and_replayed_stops_change_nothing) {
  caf::scoped_actor intruder{system_};
  // No seal at all (what a bare CAF client sends), a forged one, one under
  // another secret.
  intruder->send(coordinator_, actors::stop_atom::value);
  intruder->send(coordinator_, actors::stop_atom::value,
                 transport::control_seal{1, 1, std::string(64, '0')});
  transport::control_signer stranger(
    std::make_shared<const transport::job_secret>("a guess"), 1);
  intruder->send(coordinator_, actors::stop_atom::value,
                 stranger.seal(actors::stop_request, ""));
  intruder->send(coordinator_, actors::heartbeat_atom::value,
                 stranger.seal(actors::node_heartbeat, ""));
  auto log = log_after(intruder); // the 1st, 2nd and 4th drops are logged
  ASSERT_EQ(log.size(), 3u);
  EXPECT_NE(log[0].find("an unexpected message at the coordinator"),
            std::string::npos)
    << log[0];
  EXPECT_NE(log[1].find("a stop without a valid seal"), std::string::npos)
    << log[1];
  EXPECT_NE(log[2].find("4 control messages dropped"), std::string::npos)
    << log[2];
  EXPECT_EQ(stop_->load(), 0);

  // A node's sealed stop is obeyed; the same message again is a replay.
  transport::control_signer node(secret_, 1);
  const auto sealed = node.seal(actors::stop_request, "");
  intruder->send(coordinator_, actors::stop_atom::value, sealed);
  log_after(intruder);
  EXPECT_EQ(stop_->load(), 1);
  stop_->store(0);
  intruder->send(coordinator_, actors::stop_atom::value, sealed);
  log_after(intruder);
  EXPECT_EQ(stop_->load(), 0);
}

TEST_F(actors_control, a_join_must_answer_a_nonce_handed_to_its_rank) {
  caf::scoped_actor node{system_};
  auto hello = [&](int rank) {
    std::string nonce;
    node->request(coordinator_, 10s, actors::hello_atom::value, rank)
      .receive([&](std::string& n) { nonce = std::move(n); },
               [](const caf::error& e) { ADD_FAILURE() << to_string(e); });
    return nonce;
  };
  auto join = [&](int rank, const std::string& nonce, int proof_rank) {
    actors::node_join j;
    j.rank = rank;
    j.nonce = nonce;
    j.proof = transport::join_proof(*secret_, nonce, proof_rank);
    j.job_digest = options_.job_digest;
    std::optional<actors::failure> refused;
    node->request(coordinator_, 10s, actors::join_atom::value, j)
      .receive([](bool) {},
               [&](const caf::error& e) { refused = actors::to_failure(e); });
    return refused;
  };
  const std::string for_one = hello(1);
  // Answered as another rank, or a nonce the coordinator never handed out.
  auto refused = join(0, for_one, 0);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code, actors::errc::unauthorized);
  refused = join(1, transport::make_nonce(), 1);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code, actors::errc::unauthorized);
  // The real answer joins; the same answer again does not.
  EXPECT_FALSE(join(1, for_one, 1).has_value());
  refused = join(1, for_one, 1);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code, actors::errc::unauthorized);
}

// A node attaches its node actor only after its join proved the secret,
// and only under its seal: an attach without a join, under another
// secret, or replayed is refused and logged; the real one joins the node.
TEST_F(actors_control, a_node_actor_attaches_only_after_a_join_and_sealed) {
  caf::scoped_actor node{system_};
  transport::control_signer signer(secret_, 1);
  auto attach = [&](const transport::control_seal& seal) {
    std::optional<actors::failure> refused;
    node
      ->request(coordinator_, 10s, actors::attach_atom::value, seal,
                caf::actor{node})
      .receive([](bool) {},
               [&](const caf::error& e) { refused = actors::to_failure(e); });
    return refused;
  };
  auto refused = attach(signer.seal(actors::node_attach, ""));
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code, actors::errc::unauthorized);

  prove_secret(node, coordinator_, 1);
  // Proven, not yet attached: no second join of rank 1.
  node->request(coordinator_, 10s, actors::hello_atom::value, 1)
    .receive([](const std::string&) { ADD_FAILURE() << "a second hello"; },
             [](const caf::error& e) {
               EXPECT_EQ(actors::to_failure(e).message, "node 1 joined twice");
             });

  transport::control_signer forger(
    std::make_shared<const transport::job_secret>("another secret"), 1);
  refused = attach(forger.seal(actors::node_attach, ""));
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code, actors::errc::unauthorized);
  const auto sealed = signer.seal(actors::node_attach, "");
  EXPECT_FALSE(attach(sealed).has_value());
  refused = attach(sealed);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code, actors::errc::unauthorized);

  auto log = log_after(node);
  EXPECT_EQ(std::count_if(log.begin(), log.end(),
                          [](const std::string& line) {
                            return line.find("node 1 joined (host-1") == 0;
                          }),
            1);
  EXPECT_EQ(std::count_if(log.begin(), log.end(),
                          [](const std::string& line) {
                            return line.find("a node attach without a join or "
                                             "a valid seal") !=
                                   std::string::npos;
                          }),
            2); // the drop log writes the 1st, 2nd, 4th... drop
}

// Issue 13, item 6: the coordinator waits for the nodes that did not join
// only options.join_timeout, then ends the job naming them and aborts the
// ones that joined.
TEST_F(actors_control, ranks_that_never_join_are_named_and_the_others_aborted) {
  caf::scoped_actor waiter{system_}, node{system_};
  auto options = options_;
  options.join_timeout = 200ms;
  auto coordinator =
    actors::spawn_coordinator(system_, options, caf::actor{waiter}, nullptr);
  prove_secret(node, coordinator, 1);
  transport::control_signer signer(secret_, 1);
  node
    ->request(coordinator, 10s, actors::attach_atom::value,
              signer.seal(actors::node_attach, ""), caf::actor{node})
    .receive([](bool) {},
             [](const caf::error& e) { ADD_FAILURE() << to_string(e); });
  std::optional<actors::failure> ended;
  waiter->receive(
    [&](actors::done_atom, const caf::error& e, const runtime::run_summary&,
        const std::vector<runtime::parameter_values>&) {
      ended = actors::to_failure(e);
    },
    caf::after(30s) >> [] { ADD_FAILURE() << "the coordinator waits on"; });
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->code, actors::errc::peer_lost);
  EXPECT_EQ(ended->message, "rank 0 of 2 never joined within 0.2 s");
  // Node 1 hears it, under the coordinator's seal (after its heartbeats).
  transport::control_verifier verifier(secret_);
  bool aborted = false;
  while (!aborted)
    node->receive(
      [&](actors::abort_atom, std::uint8_t code, const std::string& why,
          const transport::control_seal& seal) {
        aborted = true;
        EXPECT_EQ(static_cast<actors::errc>(code), actors::errc::peer_lost);
        EXPECT_EQ(why, ended->message);
        EXPECT_TRUE(verifier.accept(actors::abort_order, seal,
                                    actors::abort_payload(code, why)));
      },
      [](actors::heartbeat_atom, const transport::control_seal&) {},
      caf::after(10s) >>
        [&] {
          ADD_FAILURE() << "no abort reached node 1";
          aborted = true;
        });
}

TEST(actors_cluster, never_joined_names_the_missing_ranks) {
  using std::chrono::milliseconds;
  EXPECT_EQ(actors::never_joined({0, 1, 2}, {1, 0}, milliseconds(2000)),
            "rank 2 of 3 never joined within 2 s");
  EXPECT_EQ(actors::never_joined({0, 1, 2, 3}, {0}, milliseconds(5500)),
            "ranks 1, 2, 3 of 4 never joined within 5.5 s");
  // After an excluded node: the ranks the job has left.
  EXPECT_EQ(actors::never_joined({0, 2, 3}, {0, 3}, milliseconds(300000)),
            "rank 2 of 3 never joined within 300 s");
}

} // namespace
} // namespace h2::test

namespace h2::test {
namespace {

// The node side: a plan assignment must carry the coordinator's seal over
// every field, or the node refuses it (it would otherwise build chips and
// dial peers for whoever reached its actor).
TEST(actors_control_node,
     an_assignment_without_the_coordinators_seal_is_refused) {
  caf::actor_system_config cfg;
  actors::configure_actor_system(cfg);
  actors::register_cluster_types(cfg);
  caf::actor_system system{cfg};
  caf::scoped_actor self{system};
  auto secret =
    std::make_shared<const transport::job_secret>("the job's secret");
  std::vector<std::string> log;
  std::mutex mutex;
  actors::node_context ctx;
  ctx.job = std::make_shared<const job_config>(
    parse_job(small_job_toml(3) + demo_on_two_nodes, "control.toml"));
  ctx.rank = 1;
  ctx.coordinator_rank = 0;
  ctx.secret = secret;
  ctx.log = [&](const std::string& line) {
    std::lock_guard<std::mutex> guard(mutex);
    log.push_back(line);
  };
  ctx.shared = std::make_shared<actors::node_shared>();
  ctx.shared->cancel = std::make_shared<cancellation>();
  ctx.coordinator = caf::actor{self};
  ctx.waiter = caf::actor{self};
  auto node = actors::spawn_node_actor(system, ctx);

  auto refused = [&](const actors::node_assignment& a) {
    std::optional<actors::failure> out;
    self->request(node, 10s, actors::assign_atom::value, a)
      .receive([](actors::node_ready&) {},
               [&](const caf::error& e) { out = actors::to_failure(e); });
    return out;
  };
  actors::node_assignment a;
  a.plan_json = "{\"replicas\": []}";
  a.origin_system_ns = 1;
  auto r = refused(a); // no seal at all
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code, actors::errc::unauthorized);
  EXPECT_NE(r->message.find("without the coordinator's valid seal"),
            std::string::npos)
    << r->message;
  transport::control_signer stranger(
    std::make_shared<const transport::job_secret>("a guess"), 0);
  a.seal = stranger.seal(actors::assign_order, actors::assignment_payload(a));
  r = refused(a); // another secret
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code, actors::errc::unauthorized);
  transport::control_signer coordinator(secret, 0);
  a.seal =
    coordinator.seal(actors::assign_order, actors::assignment_payload(a));
  a.checkpoint_marker = "changed after sealing";
  r = refused(a);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code, actors::errc::unauthorized);
  {
    std::lock_guard<std::mutex> guard(mutex);
    ASSERT_FALSE(log.empty());
    EXPECT_NE(log[0].find("a plan assignment without the coordinator's "
                          "valid seal"),
              std::string::npos)
      << log[0];
  }
  self->send_exit(node, caf::exit_reason::user_shutdown);
}

// Issue 13, item 6: a node watches the coordinator from its join on, not
// only once the job starts: the coordinator's end ends the node.
TEST(actors_control_node, a_joined_node_ends_when_the_coordinator_dies) {
  caf::actor_system_config cfg;
  actors::configure_actor_system(cfg);
  actors::register_cluster_types(cfg);
  caf::actor_system system{cfg};
  caf::scoped_actor self{system};
  actors::node_context ctx;
  ctx.job = std::make_shared<const job_config>(
    parse_job(small_job_toml(3) + demo_on_two_nodes, "control.toml"));
  ctx.rank = 1;
  ctx.coordinator_rank = 0;
  ctx.secret =
    std::make_shared<const transport::job_secret>("the job's secret");
  ctx.shared = std::make_shared<actors::node_shared>();
  ctx.shared->cancel = std::make_shared<cancellation>();
  // A coordinator that admitted this node and then waits on other nodes.
  // (Spawned with an argument: CAF 0.17 dereferences a null argument
  // tuple for an actor spawned without any, which UBSan reports.)
  auto coordinator = system.spawn(
    [](const std::string& nonce) -> caf::behavior {
      return {[nonce](actors::hello_atom) {
        return nonce;
      }};
    },
    std::string("a nonce"));
  ctx.coordinator = coordinator;
  ctx.waiter = caf::actor{self};
  auto node = actors::spawn_node_actor(system, ctx);
  self->send(node, actors::joined_atom::value);
  self->send_exit(coordinator, caf::exit_reason::kill);
  std::optional<actors::failure> ended;
  self->receive(
    [&](actors::done_atom, const caf::error& e, const runtime::run_summary&,
        const std::vector<runtime::parameter_values>&) {
      ended = actors::to_failure(e);
    },
    caf::after(30s) >> [] { ADD_FAILURE() << "the node waits on"; });
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->code, actors::errc::peer_lost);
  EXPECT_NE(ended->message.find("lost the coordinator (node 0)"),
            std::string::npos)
    << ended->message;
}

} // namespace
} // namespace h2::test
