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

} // namespace h2::actors
