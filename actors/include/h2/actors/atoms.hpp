// CAF 0.17 atoms of H2's actor messages (at most 10 characters each).
#pragma once

#include <caf/atom.hpp>

namespace h2::actors {

using setup_atom = caf::atom_constant<caf::atom("setup")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using update_atom = caf::atom_constant<caf::atom("update")>;
using eval_atom = caf::atom_constant<caf::atom("eval")>;
using train_atom = caf::atom_constant<caf::atom("train")>;
using params_atom = caf::atom_constant<caf::atom("params")>;
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using written_atom = caf::atom_constant<caf::atom("written")>;
using saved_atom = caf::atom_constant<caf::atom("saved")>;
using layers_atom = caf::atom_constant<caf::atom("layers")>;
using replan_atom = caf::atom_constant<caf::atom("replan")>;
/// A live re-plan chip to chip: each chip moves its layers itself.
using migrate_atom = caf::atom_constant<caf::atom("migrate")>;
using throttle_atom = caf::atom_constant<caf::atom("throttle")>;
/// [[drills]] hang: the chip's next compute op waits until the watchdog or
/// an abort ends it.
using hang_atom = caf::atom_constant<caf::atom("hang")>;
/// The scheduler looks at its admin inbox and, while paused, its stop flag.
using wake_atom = caf::atom_constant<caf::atom("wake")>;

// The cluster: joining, assignments, liveness, the end of a job.
using hello_atom = caf::atom_constant<caf::atom("hello")>;
using join_atom = caf::atom_constant<caf::atom("join")>;
using joined_atom = caf::atom_constant<caf::atom("joined")>;
using attach_atom = caf::atom_constant<caf::atom("attach")>;
using withdraw_atom = caf::atom_constant<caf::atom("withdraw")>;
using assign_atom = caf::atom_constant<caf::atom("assign")>;
using finish_atom = caf::atom_constant<caf::atom("finish")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;
using check_atom = caf::atom_constant<caf::atom("check")>;
using done_atom = caf::atom_constant<caf::atom("done")>;
using summary_atom = caf::atom_constant<caf::atom("summary")>;

} // namespace h2::actors
