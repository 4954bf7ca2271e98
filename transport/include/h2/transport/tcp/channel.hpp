// Backend `tcp`: everywhere. Asio sockets with TCP_NODELAY; frames are
// written with scatter-gather straight from the tensor and read straight
// into the receiver's tensor, so large messages are never copied twice.
#pragma once

#include "h2/transport/endpoint.hpp"

namespace h2::transport::tcp {

/// The tcp backend of an endpoint.
std::unique_ptr<backend> make_backend(const endpoint_options& options);

} // namespace h2::transport::tcp
