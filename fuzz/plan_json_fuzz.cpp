// The plan reader (core/plan.hpp): JSON text from `h2-launch --plan`, a
// checkpoint's manifest or `h2-admin rebalance --plan`, then the check of
// the plan against a job (the compiled-in demo job). Input: the JSON text.
#include "fuzz.hpp"

#include "h2/core/plan.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  using h2::fuzz::decodes;
  static const h2::job_config demo =
    h2::parse_job(h2::demo_job_toml(), "demo.toml");
  const std::string text(h2::fuzz::as_text(data, size));
  h2::plan p;
  if (!decodes([&] { p = h2::plan_from_json(text, "fuzz.json"); }))
    return 0;
  // The JSON form round-trips: what h2-plan prints reads back the same.
  h2::plan again;
  h2::fuzz::require(
    decodes([&] { again = h2::plan_from_json(h2::to_json(p), "again.json"); }),
    "a plan's own JSON form reads back");
  h2::fuzz::require(again == p, "a plan's JSON form reads back the same");
  decodes([&] { h2::validate_plan(p, demo, "fuzz.json"); });
  return 0;
}
