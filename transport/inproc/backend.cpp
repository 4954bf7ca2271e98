#include "h2/transport/inproc/backend.hpp"

#include "link.hpp"

namespace h2::transport::inproc {

std::pair<std::unique_ptr<channel>, std::unique_ptr<channel>> make_pair() {
  auto l = std::make_shared<link>();
  return {make_end(l, 0), make_end(l, 1)};
}

} // namespace h2::transport::inproc
