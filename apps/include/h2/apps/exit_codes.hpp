// Exit codes of every H2 binary (docs/cli.md).
#pragma once

namespace h2::apps {

/// The run completed.
constexpr int exit_ok = 0;
/// Training failed: a chip ran out of memory, a peer died, a device is
/// missing. The message names the chip and the cause.
constexpr int exit_failed = 1;
/// Bad input: job file, plan file or command line. Nothing was started.
constexpr int exit_bad_input = 2;
/// Another node of the job died or stalled (h2-node), or could not be
/// reached; this node stopped because of it.
constexpr int exit_peer_failed = 3;
/// An operator check failed (h2-opcheck, or `[ditorch] check = true`
/// before training): an operator of a chip disagrees with the reference
/// beyond its tolerance. The table names it.
constexpr int exit_check_failed = 4;
/// Stopped by a signal: 128 + the signal's number (130 for SIGINT, 143 for
/// SIGTERM), after a clean stop at a step boundary or an abort.
constexpr int exit_signal_base = 128;

} // namespace h2::apps
