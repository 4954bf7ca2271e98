// An in-process stand-in for the rdma-core calls the rdma backend makes
// (verbs + rdma_cm), linked only into test_transport_rdma_emulated: the
// build machines have no RDMA device, yet the backend's own logic (queue
// pair setup by token, credits, notifications, waits, close and peer loss)
// can run against it. One fake device, "fake_rdma0"; RC queue pairs joined
// in this process; an RDMA WRITE is a memcpy into the registered target at
// post time. It checks what real hardware would punish: writes outside a
// registered region, more outstanding sends or receives than the queue pair
// was created with, completion queue overflow, and writes with immediate
// that find no posted receive (RNR; delivered once one is posted, as with
// rnr_retry 7, but counted).
//
// What it does not model: timing (completions arrive at once), wire
// ordering across queue pairs, rdma_cm's real state machine, address
// resolution, or device memory.
#pragma once

#include <cstdint>
#include <string>

namespace h2::transport::fake_verbs {

struct counters {
  std::uint64_t writes = 0;        ///< RDMA WRITEs placed
  std::uint64_t notifications = 0; ///< receives consumed by immediates
  std::uint64_t rnr = 0;           ///< immediates that found no receive
  std::uint64_t send_overflow = 0; ///< posts beyond max_send_wr
  std::uint64_t recv_overflow = 0; ///< posts beyond max_recv_wr
  std::uint64_t cq_overflow = 0;   ///< completions beyond a CQ's size
  std::uint64_t remote_access = 0; ///< writes outside a registered region
  std::uint64_t queue_pairs = 0;   ///< created
  std::uint64_t live_queue_pairs = 0;
};

/// Totals since the process started.
counters totals();

} // namespace h2::transport::fake_verbs
