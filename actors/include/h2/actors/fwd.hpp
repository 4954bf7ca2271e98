// Forward declarations of actors/.
#pragma once

namespace h2::actors {

struct op_record;
struct chip_step_report;
struct chip_update_report;
struct chip_eval_report;
struct setup_report;
struct step_summary;
class stage_worker;
struct worker_setup;
class training_observer;

} // namespace h2::actors
