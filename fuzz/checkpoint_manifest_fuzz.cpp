// A checkpoint's manifest.json (runtime/checkpoint_files.hpp): read from a
// directory that may hold anything (docs/checkpoints.md, "Errors"). Input:
// the file's text, through parse_manifest, which read_manifest calls.
#include "fuzz.hpp"

#include "h2/runtime/checkpoint_files.hpp"

#include <climits>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size) {
  using namespace h2::runtime;
  checkpoint_manifest m;
  if (!h2::fuzz::decodes([&] {
        m = parse_manifest(h2::fuzz::as_text(data, size), "manifest.json");
      }))
    return 0;
  // What read_layers and read_checkpoint rely on.
  h2::fuzz::require(m.format_version == checkpoint_format_version,
                    "this build's format version");
  h2::fuzz::require(m.step >= 0, "a step >= 0");
  h2::fuzz::require(m.job_id.size() == 32, "a job id of 32 hex digits");
  h2::fuzz::require(m.model_digest == model_digest(m.model),
                    "the model digest is the model's");
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    h2::fuzz::require(m.files[i].layer == static_cast<int>(i),
                      "files name layers 0..n-1 in order");
    h2::fuzz::require(m.files[i].file == layer_file_name(m.files[i].layer),
                      "a layer's file has the layer's name");
    for (const auto& t : m.files[i].tensors)
      for (auto d : t.shape)
        h2::fuzz::require(d >= 0, "tensor sizes >= 0");
  }
  return 0;
}
