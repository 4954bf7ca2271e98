// Forward declarations of metrics/'s types.
#pragma once

namespace h2::metrics {

class counter;
class gauge;
class histogram;
struct histogram_snapshot;
class registry;
class http_server;
class trace_writer;

} // namespace h2::metrics
