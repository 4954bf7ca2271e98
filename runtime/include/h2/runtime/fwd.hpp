// Forward declarations of runtime/.
#pragma once

namespace h2::runtime {

struct op_record;
struct chip_step_report;
struct chip_update_report;
struct chip_eval_report;
struct setup_report;
struct step_summary;
struct run_summary;
struct layer_state;
struct link_assignment;
class stage_worker;
struct worker_setup;
class training_observer;
class checkpoint_writer;

} // namespace h2::runtime
