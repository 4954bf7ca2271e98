// The job file reader (core/job.hpp): TOML text from a user or, in a
// multi-node job, the file every node must share. Input: the file's text.
// Bad input is a config_error naming the key (toml++'s own parse_error
// must not escape).
#include "fuzz.hpp"

#include "h2/core/job.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  h2::job_config job;
  if (!h2::fuzz::decodes([&] {
        job = h2::parse_job(h2::fuzz::as_text(data, size), "fuzz.toml");
      }))
    return 0;
  // What the runtime relies on of a valid job.
  h2::fuzz::require(!job.nodes.empty(), "a valid job has nodes");
  for (const auto* chip : job.chips())
    h2::fuzz::require(job.find_chip(chip->id) == chip,
                      "every chip is found by its id");
  return 0;
}
