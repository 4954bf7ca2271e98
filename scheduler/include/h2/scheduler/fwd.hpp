// Forward declarations of scheduler/'s vocabulary.
#pragma once

namespace h2::scheduler {

enum class op_kind;
struct op;
struct schedule;

} // namespace h2::scheduler
