// h2-transport-peer: the far end of the fault tests, a separate process the
// test can SIGKILL or SIGSTOP. Dials node 0 at the given address, then
// echoes every message of tag 1 back as tag 2 until its channel fails.
//
//   h2-transport-peer BACKEND HOST_ID TCP_HOST TCP_PORT SHM_SOCKET SECRET ID
//                     [RDMA_DEVICE RDMA_PORT]
#include "h2/transport/endpoint.hpp"

#include <cstdio>
#include <string>

using namespace h2::transport;

int main(int argc, char** argv) {
  if (argc != 8 && argc != 10) {
    std::fprintf(stderr, "usage: h2-transport-peer BACKEND HOST_ID TCP_HOST "
                         "TCP_PORT SHM_SOCKET SECRET CHANNEL "
                         "[RDMA_DEVICE RDMA_PORT]\n");
    return 2;
  }
  std::string backend = argv[1];
  endpoint_address node0;
  node0.node_rank = 0;
  node0.host_id = argv[2];
  node0.tcp_host = argv[3];
  node0.tcp_port = static_cast<std::uint16_t>(std::stoi(argv[4]));
  node0.shm_socket = argv[5];
  if (argc == 10) {
    node0.rdma_device = argv[8];
    node0.rdma_port = static_cast<std::uint16_t>(std::stoi(argv[9]));
  }
  endpoint_options o;
  o.node_rank = 1;
  o.secret = std::make_shared<const job_secret>(argv[6]);
  o.backends = {backend};
  try {
    endpoint self(o);
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    auto ch = self.dial(node0, std::stoull(argv[7]), backend, until);
    for (;;) {
      message m = ch->recv(1, std::chrono::hours(1));
      m.tag = 2;
      ch->send(std::move(m));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "h2-transport-peer: %s\n", e.what());
    return 1;
  }
}
