// The run's control plane without actors (runtime/run_controller.hpp,
// docs/admin.md "States and commands"): every admin command in every phase
// (running, paused, saving, rebalancing, stopping), what each leaves for
// the next step boundary, and the order of the boundary's actions.
#include "h2/runtime/run_controller.hpp"
#include "test_jobs.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <memory>

namespace h2::runtime {
namespace {

using kind = boundary_action::kind;

const run_phase every_phase[] = {run_phase::running, run_phase::paused,
                                 run_phase::saving, run_phase::rebalancing,
                                 run_phase::stopping};

std::shared_ptr<const job_config>
controlled_job(const std::string& extra = "") {
  return std::make_shared<job_config>(parse_job(
    test::small_job_toml(1) + extra +
      "[[nodes]]\nchips = [\"emulated:h100-sxm\", \"emulated:mi250x\"]\n",
    "control.toml"));
}

admin_command command(const std::string& name,
                      const std::vector<std::string>& args = {}) {
  return parse_admin_command(name, args);
}

class runtime_run_controller : public ::testing::Test {
protected:
  /// A run of 10 steps on [0, 3) 0:0 and [3, 6) 0:1, at step 4.
  run_controller make(bool checkpoints = true,
                      std::map<int, plan> replans = {}) {
    stop_ = std::make_shared<std::atomic<int>>(0);
    return run_controller(
      {job_, start_, 4, 10, std::move(replans), stop_, checkpoints, true});
  }

  /// A controller brought into `phase` the way a run gets there.
  run_controller in(run_phase phase, bool checkpoints = true) {
    auto c = make(checkpoints);
    switch (phase) {
      case run_phase::running:
        break;
      case run_phase::paused:
        c.execute(command("pause"), start_);
        EXPECT_EQ(c.at_boundary().what, kind::hold);
        break;
      case run_phase::saving:
        c.save_started();
        break;
      case run_phase::rebalancing:
        c.replan_started();
        break;
      case run_phase::stopping:
        c.execute(command("stop"), start_);
        break;
    }
    EXPECT_EQ(c.phase(), phase);
    return c;
  }

  /// Runs `cmd` on a controller in `phase`: its answer, or the refusal's
  /// message prefixed with "refused: ".
  std::string outcome_of(run_controller& c, const admin_command& cmd,
                         bool* release = nullptr) {
    try {
      auto o = c.execute(cmd, start_);
      if (release != nullptr)
        *release = o.release;
      return o.json;
    } catch (const std::exception& e) {
      return std::string("refused: ") + e.what();
    }
  }

  /// The boundary's action after a command that left work for it: a
  /// paused run does it at once (the command released the hold), then
  /// holds again.
  boundary_action next_boundary(run_controller& c) {
    EXPECT_NE(c.phase(), run_phase::paused);
    return c.at_boundary();
  }

  std::shared_ptr<const job_config> job_ = controlled_job();
  plan start_ = test::one_replica_plan(*job_, {3, 3}, 2, 4);
  std::shared_ptr<std::atomic<int>> stop_;
};

TEST_F(runtime_run_controller, status_and_plan_answer_in_every_phase) {
  for (const auto phase : every_phase) {
    SCOPED_TRACE(to_string(phase));
    auto c = in(phase);
    const auto s = nlohmann::json::parse(outcome_of(c, command("status")));
    EXPECT_EQ(s["phase"], to_string(phase));
    EXPECT_EQ(s["paused"], phase == run_phase::paused);
    EXPECT_EQ(s["step"], 4);
    EXPECT_EQ(s["steps"], 10);
    ASSERT_EQ(s["chips"].size(), 2u);
    const auto p = nlohmann::json::parse(outcome_of(c, command("plan")));
    EXPECT_EQ(p["generation"], 0);
    EXPECT_EQ(p["step"], 4);
    EXPECT_EQ(p["plan"]["replicas"][0]["stages"].size(), 2u);
    EXPECT_EQ(c.phase(), phase) << "asking changes nothing";
  }
}

TEST_F(runtime_run_controller, pause_and_resume_in_every_phase) {
  for (const auto phase : every_phase) {
    SCOPED_TRACE(to_string(phase));
    auto c = in(phase);
    const auto paused = outcome_of(c, command("pause"));
    if (phase == run_phase::stopping) {
      EXPECT_EQ(paused.rfind("refused: pause: the job is stopping", 0), 0u)
        << paused;
      EXPECT_EQ(c.at_boundary().what, kind::finish);
      continue;
    }
    EXPECT_EQ(nlohmann::json::parse(paused)["paused"],
              phase == run_phase::paused
                ? nlohmann::json(true)
                : nlohmann::json("at the next step boundary"));
    if (phase == run_phase::rebalancing)
      c.replan_ended(start_); // a boundary comes after the re-plan
    if (phase != run_phase::paused) {
      EXPECT_EQ(c.at_boundary().what, kind::hold);
    }
    EXPECT_EQ(c.phase(), run_phase::paused);
    bool release = false;
    EXPECT_EQ(nlohmann::json::parse(
                outcome_of(c, command("resume"), &release))["paused"],
              false);
    EXPECT_TRUE(release) << "a held boundary is taken again";
    EXPECT_EQ(c.at_boundary().what, kind::step);
    EXPECT_FALSE(c.execute(command("resume"), start_).release)
      << "resuming a running job changes nothing";
  }
  // A pause asked for and taken back before the boundary holds nothing.
  auto c = make();
  c.execute(command("pause"), start_);
  c.execute(command("resume"), start_);
  EXPECT_EQ(c.at_boundary().what, kind::step);
}

TEST_F(runtime_run_controller, stop_in_every_phase_ends_at_the_boundary) {
  for (const auto phase : every_phase) {
    SCOPED_TRACE(to_string(phase));
    auto c = in(phase);
    bool release = false;
    EXPECT_EQ(nlohmann::json::parse(
                outcome_of(c, command("stop"), &release))["stopping"],
              true);
    EXPECT_EQ(release, phase == run_phase::paused);
    EXPECT_EQ(stop_->load(), 1);
    EXPECT_EQ(c.phase(), run_phase::stopping);
    const auto a = c.at_boundary();
    EXPECT_EQ(a.what, kind::finish);
    EXPECT_TRUE(a.stopped_early);
  }
}

TEST_F(runtime_run_controller, a_signal_ends_a_held_boundary) {
  auto c = in(run_phase::paused);
  stop_->store(1); // what the signal watcher does
  EXPECT_TRUE(c.stop_requested());
  EXPECT_EQ(c.phase(), run_phase::stopping);
  EXPECT_EQ(c.at_boundary().what, kind::finish);
}

TEST_F(runtime_run_controller, checkpoint_in_every_phase) {
  for (const auto phase : every_phase) {
    SCOPED_TRACE(to_string(phase));
    auto none = in(phase, false);
    EXPECT_EQ(outcome_of(none, command("checkpoint")),
              "refused: checkpoint: the job has no [checkpoint] dir");
    auto c = in(phase);
    const auto answer =
      nlohmann::json::parse(outcome_of(c, command("checkpoint")));
    if (phase == run_phase::stopping) {
      EXPECT_EQ(answer["checkpoint"], "as the job stops");
      EXPECT_EQ(c.at_boundary().what, kind::finish);
      continue;
    }
    EXPECT_EQ(answer["checkpoint"], "at the next step boundary");
    EXPECT_EQ(next_boundary(c).what, kind::checkpoint);
    EXPECT_EQ(c.at_boundary().what,
              phase == run_phase::paused ? kind::hold : kind::step)
      << "asked once, saved once; a paused run holds again";
  }
}

TEST_F(runtime_run_controller, throttle_in_every_phase) {
  for (const auto phase : every_phase) {
    SCOPED_TRACE(to_string(phase));
    auto c = in(phase);
    EXPECT_EQ(
      outcome_of(c, command("throttle", {"3:0", "2"})).rfind("refused: ", 0),
      0u);
    const auto answer = outcome_of(c, command("throttle", {"0:1", "2.5"}));
    if (phase == run_phase::stopping) {
      EXPECT_EQ(answer.rfind("refused: throttle: the job is stopping", 0), 0u)
        << answer;
      continue;
    }
    const auto j = nlohmann::json::parse(answer);
    EXPECT_EQ(j["throttle"], "0:1");
    EXPECT_EQ(j["factor"], 2.5);
    const auto a = next_boundary(c);
    ASSERT_EQ(a.what, kind::drills);
    ASSERT_EQ(a.drills.size(), 1u);
    EXPECT_EQ(a.drills[0].chip, (chip_id{0, 1}));
    EXPECT_EQ(a.drills[0].factor, 2.5);
    c.drill_applied(a.drills[0]);
    const auto s = nlohmann::json::parse(outcome_of(c, command("status")));
    EXPECT_EQ(s["chips"][1]["throttle"], 2.5);
  }
}

TEST_F(runtime_run_controller, policy_in_every_phase) {
  for (const auto phase : every_phase) {
    SCOPED_TRACE(to_string(phase));
    auto c = in(phase);
    EXPECT_EQ(nlohmann::json::parse(
                outcome_of(c, command("policy", {"auto"})))["policy"],
              "auto");
    EXPECT_EQ(
      nlohmann::json::parse(outcome_of(c, command("status")))["policy"]["mode"],
      "auto");
  }
}

TEST_F(runtime_run_controller, rebalance_to_a_plan_in_every_phase) {
  const auto other = test::one_replica_plan(*job_, {2, 4}, 2, 4);
  const auto moved = command("rebalance", {"--plan", to_json(other, -1)});
  plan one_chip = other;
  one_chip.replicas[0].stages = {stage_plan{{0, 1}, 0, 6, false}};
  const auto json = to_json(one_chip, -1);
  for (const auto phase : every_phase) {
    SCOPED_TRACE(to_string(phase));
    auto c = in(phase);
    const auto answer = outcome_of(c, moved);
    EXPECT_EQ(outcome_of(c, command("rebalance", {"--plan", json}))
                .rfind("refused: ", 0),
              0u)
      << "other chips need --restart";
    if (phase == run_phase::stopping) {
      EXPECT_EQ(answer.rfind("refused: rebalance: the job is stopping", 0), 0u)
        << answer;
      EXPECT_EQ(c.at_boundary().what, kind::finish);
      continue;
    }
    EXPECT_EQ(nlohmann::json::parse(answer)["scheduled"], true);
    if (phase == run_phase::rebalancing) {
      EXPECT_EQ(c.replan_ended(start_), 1);
    }
    const auto a = next_boundary(c);
    ASSERT_EQ(a.what, kind::replan);
    EXPECT_EQ(a.change->reason, "admin plan");
    EXPECT_EQ(plan_chips(a.change->value), plan_chips(other));
    EXPECT_EQ(a.change->value.replicas[0].stages[0].end_layer, 2);
    c.replan_started();
    EXPECT_EQ(c.phase(), run_phase::rebalancing);
    const int generation = c.replan_ended(a.change->value);
    EXPECT_EQ(generation, phase == run_phase::rebalancing ? 2 : 1);
    EXPECT_EQ(
      nlohmann::json::parse(outcome_of(c, command("plan")))["generation"],
      generation);
  }
}

TEST_F(runtime_run_controller, a_restart_saves_and_stops_in_every_phase) {
  plan one_chip = start_;
  one_chip.replicas[0].stages = {stage_plan{{0, 1}, 0, 6, false}};
  const auto restart =
    command("rebalance", {"--plan", to_json(one_chip, -1), "--restart"});
  for (const auto phase : every_phase) {
    SCOPED_TRACE(to_string(phase));
    auto without = in(phase, false);
    EXPECT_EQ(outcome_of(without, restart).rfind("refused: ", 0), 0u);
    auto c = in(phase);
    bool release = false;
    const auto answer = outcome_of(c, restart, &release);
    if (phase == run_phase::stopping) {
      EXPECT_EQ(answer.rfind("refused: rebalance: the job is stopping", 0), 0u)
        << answer;
      continue;
    }
    EXPECT_EQ(nlohmann::json::parse(answer)["restart"], true);
    EXPECT_EQ(release, phase == run_phase::paused);
    EXPECT_EQ(c.phase(), run_phase::stopping);
    EXPECT_EQ(c.at_boundary().what, kind::finish);
  }
}

TEST_F(runtime_run_controller, rebalance_auto_in_every_phase) {
  // A lopsided start: the policy always finds a faster plan.
  start_ = test::one_replica_plan(*job_, {5, 1}, 2, 4);
  for (const auto phase : every_phase) {
    SCOPED_TRACE(to_string(phase));
    auto c = in(phase);
    const auto answer = outcome_of(c, command("rebalance", {"--auto"}));
    if (phase == run_phase::stopping) {
      EXPECT_EQ(answer.rfind("refused: rebalance: the job is stopping", 0), 0u)
        << answer;
      continue;
    }
    const auto j = nlohmann::json::parse(answer);
    EXPECT_EQ(j["scheduled"], true);
    EXPECT_LT(j["predicted_step_seconds"][1].get<double>(),
              j["predicted_step_seconds"][0].get<double>());
    EXPECT_GE(j["moved_bytes"].get<double>(), 0);
    if (phase == run_phase::rebalancing)
      c.replan_ended(start_);
    const auto a = next_boundary(c);
    ASSERT_EQ(a.what, kind::replan);
    EXPECT_EQ(a.change->reason, "admin");
    EXPECT_NE(a.change->value, start_);
  }
}

TEST_F(runtime_run_controller, the_boundary_takes_one_thing_at_a_time) {
  job_ = controlled_job("[[drills]]\nstep = 4\nthrottle = \"0:0\"\n"
                        "factor = 3\n"
                        "[checkpoint]\ndir = \"unused\"\nevery = 2\n");
  start_ = test::one_replica_plan(*job_, {3, 3}, 2, 4);
  const auto other = test::one_replica_plan(*job_, {2, 4}, 2, 4);
  auto c = make(true, {{4, other}});
  c.execute(command("checkpoint"), start_);
  c.execute(command("pause"), start_);
  c.execute(command("rebalance", {"--plan", to_json(start_, -1)}), start_);
  // The admin's checkpoint, the job's drill, the forced re-plan (which
  // replaces the admin's), then the hold.
  EXPECT_EQ(c.at_boundary().what, kind::checkpoint);
  const auto drills = c.at_boundary();
  ASSERT_EQ(drills.what, kind::drills);
  EXPECT_EQ(drills.drills[0].factor, 3);
  const auto forced = c.at_boundary();
  ASSERT_EQ(forced.what, kind::replan);
  EXPECT_EQ(forced.change->reason, "--replan");
  EXPECT_EQ(c.at_boundary().what, kind::hold);
  c.execute(command("resume"), start_);
  EXPECT_EQ(c.at_boundary().what, kind::step);
  // Steps 4 and 5 end; checkpoint.every = 2 falls due after step 6 of 10.
  EXPECT_FALSE(c.step_ended(1.0, {}, {}));
  EXPECT_TRUE(c.step_ended(1.0, {}, {}));
  EXPECT_EQ(c.step(), 6);
  for (int s = 6; s < 10; ++s)
    c.step_ended(1.0, {}, {});
  const auto end = c.at_boundary();
  EXPECT_EQ(end.what, kind::finish);
  EXPECT_FALSE(end.stopped_early);
  EXPECT_EQ(c.phase(), run_phase::stopping);
}

} // namespace
} // namespace h2::runtime
