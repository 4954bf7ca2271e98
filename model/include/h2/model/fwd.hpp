// Forward declarations of model/.
#pragma once

namespace h2::model {

struct parameter;
class layer;
class stage;
struct micro_batch;
class data_source;
class markov_source;
class token_file_source;

} // namespace h2::model
