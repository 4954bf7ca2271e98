// The chip actor: one per chip, owning its device context and stage (through
// a runtime::stage_worker). Spawned detached, so its blocking compute and
// channel waits run on its own thread, never on CAF's scheduler threads.
#pragma once

#include "h2/runtime/stage_worker.hpp"

#include <caf/behavior.hpp>
#include <caf/event_based_actor.hpp>

namespace h2::actors {

/// Behaviour of a chip actor. Messages (each answered with a report or an
/// H2 caf::error):
/// - (setup_atom) -> setup_report: build the device and the stage
/// - (step_atom, step_command) -> chip_step_report
/// - (update_atom, update_command) -> chip_update_report
/// - (eval_atom, eval_command) -> chip_eval_report
/// - (params_atom) -> std::vector<runtime::parameter_values>
/// - (snapshot_atom) -> std::vector<runtime::layer_state>: host copies
/// - (restore_atom, std::vector<runtime::layer_state>) -> bool: loads them
/// Spawn with caf::detached.
caf::behavior chip_actor(caf::event_based_actor* self,
                         runtime::worker_setup setup);

} // namespace h2::actors
