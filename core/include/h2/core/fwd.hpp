// Forward declarations of core/'s vocabulary.
#pragma once

namespace h2 {

struct chip_id;
struct chip_profile;
class catalog;
struct gpt_config;
struct layer_work;
struct job_config;
struct plan;
struct stage_plan;
struct replica_plan;

class error;
class config_error;
class device_error;
class transport_error;
class internal_error;

enum class dtype;
enum class schedule_kind;

} // namespace h2
