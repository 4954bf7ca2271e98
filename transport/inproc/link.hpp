// The inproc backend's link: what both ends of an in-process channel share
// (docs/transport.md, File layout). Private to transport/inproc/.
#pragma once

#include "h2/transport/channel.hpp"
#include "h2/transport/mailbox.hpp"

#include <atomic>
#include <cstdint>
#include <memory>

namespace h2::transport::inproc {

/// Each end's mailbox, whether it is closed and what it sent. Shared by the
/// two ends; lives while either does.
struct link {
  mailbox inbox[2];
  std::atomic<bool> closed[2] = {false, false};
  std::atomic<std::uint64_t> messages_sent[2] = {0, 0};
  std::atomic<std::uint64_t> bytes_sent[2] = {0, 0};
};

/// End `side` (0 or 1) of the channel over `l`: a send is a delivery into
/// the other side's mailbox, no copy.
std::unique_ptr<channel> make_end(std::shared_ptr<link> l, int side);

} // namespace h2::transport::inproc
