// Forward declarations of actors/.
#pragma once

namespace h2::actors {

struct run_options;
struct run_context;
struct node_options;
struct node_outcome;
class local_job;
class cluster_node;

} // namespace h2::actors
