// Forward declarations of transport/ (DiComm).
#pragma once

namespace h2::transport {

struct clock_stamp;
struct message;
class channel;
class pending_message;

} // namespace h2::transport
