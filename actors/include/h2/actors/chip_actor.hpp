// The chip actor: one per chip, owning its device context and stage (through
// a runtime::stage_worker). Spawned detached, so its blocking compute and
// channel waits run on its own thread, never on CAF's scheduler threads.
#pragma once

#include "h2/runtime/checkpointing.hpp"
#include "h2/runtime/stage_worker.hpp"

#include <caf/behavior.hpp>
#include <caf/event_based_actor.hpp>

#include <memory>
#include <vector>

namespace h2::actors {

/// What a chip actor holds beside its worker's setup.
struct chip_options {
  /// This chip's layers of the checkpoint a resumed run starts from, loaded
  /// right after set-up; empty: the initial weights.
  std::vector<runtime::layer_state> restore;
  /// Its node's checkpoint writer (the job's [checkpoint]); null: none.
  std::shared_ptr<runtime::checkpoint_writer> writer;
};

/// Behaviour of a chip actor. Messages (each answered with a report or an
/// H2 caf::error):
/// - (setup_atom) -> setup_report: build the device and the stage, load
///   options.restore
/// - (step_atom, step_command) -> chip_step_report
/// - (update_atom, update_command) -> chip_update_report
/// - (eval_atom, eval_command) -> chip_eval_report
/// - (params_atom) -> std::vector<runtime::parameter_values>
/// - (snapshot_atom, std::int64_t step, std::string job_id, std::string
///   model_digest) -> std::int32_t: copies the stage's layers to host
///   memory (the training stall of a save), hands them to the writer for
///   that checkpoint (runtime::checkpoint_identity) and answers how many;
///   once they are on disk the sender gets (written_atom, step,
///   std::vector<runtime::file_record>, caf::error), sent as from this
///   chip.
/// - (layers_atom) -> std::vector<runtime::layer_state>: host copies of
///   the stage's layers (a live re-plan)
/// - (replan_atom, std::string plan_json, std::vector<layer_state>) ->
///   setup_report: rebuilds the stage for the chip's part of the plan, on
///   the same channels (the same neighbours), and loads the layers
/// - (migrate_atom, std::string from_json, std::string to_json,
///   std::int64_t step) -> setup_report: moves from plan `from_json` to
///   `to_json` in place, sending and receiving the layers that change owner
///   over the channels (stage_worker::migrate); sent_bytes counts them
/// Spawn with caf::detached.
caf::behavior chip_actor(caf::event_based_actor* self,
                         runtime::worker_setup setup, chip_options options);

} // namespace h2::actors
