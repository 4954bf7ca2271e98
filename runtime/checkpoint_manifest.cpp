// manifest.json of a checkpoint (docs/checkpoints.md): its JSON form, the
// atomic write and the hostile-input read.
#include "h2/runtime/checkpoint_files.hpp"

#include "checkpoint_io.hpp"
#include "h2/core/crc32c.hpp"
#include "h2/transport/handshake.hpp"

#include <climits>
#include <cstdio>

namespace h2::runtime {
namespace {

using nlohmann::json;

/// Largest manifest the reader accepts, in bytes (it holds no tensor data).
constexpr std::uint64_t max_manifest_bytes = 64ull << 20;

/// The key of the manifest's own checksum (docs/checkpoints.md): CRC32C of
/// the compact dump (nlohmann's, keys sorted) of every other key.
constexpr const char* self_crc_key = "manifest_crc32c";

std::uint32_t content_crc32c(const json& manifest_without_crc) {
  const std::string text = manifest_without_crc.dump();
  return crc32c(text.data(), text.size());
}

json to_json(const checkpoint_manifest& m) {
  json files = json::array();
  for (const auto& f : m.files) {
    json tensors = json::array();
    for (const auto& t : f.tensors)
      tensors.push_back(
        {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}});
    files.push_back({{"file", f.file},
                     {"layer", f.layer},
                     {"bytes", f.bytes},
                     {"crc32c", f.crc32c},
                     {"tensors", std::move(tensors)}});
  }
  json hashes = json::array();
  for (const auto& [path, hash] : m.data_hashes)
    hashes.push_back({{"path", path}, {"hash", hash}});
  json out = {{"format", std::string(checkpoint_format)},
              {"format_version", m.format_version},
              {"step", m.step},
              {"job_id", m.job_id},
              {"model_digest", m.model_digest},
              {"seed", m.seed},
              {"model", m.model},
              {"optimizer", m.optimizer},
              {"data_hashes", std::move(hashes)},
              {"plan_json", m.plan_json},
              {"job_toml", m.job_toml},
              {"files", std::move(files)}};
  if (!m.data.is_null()) // absent in manifests of older H2s
    out["data"] = m.data;
  return out;
}

/// Typed access to the manifest's keys; anything else is `corrupt`, naming
/// the key path ("files[2].tensors[0].shape").
class manifest_fields {
public:
  explicit manifest_fields(const std::filesystem::path& file) : file_(file) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw checkpoint_error(checkpoint_errc::corrupt, file_, why);
  }

  const json& get(const json& object, const std::string& where,
                  const char* key) const {
    if (!object.contains(key))
      fail("no key " + where + key);
    return object[key];
  }

  const json& array(const json& object, const std::string& where,
                    const char* key) const {
    const json& v = get(object, where, key);
    if (!v.is_array())
      fail(where + key + " is not an array");
    return v;
  }

  const json& object(const json& v, const std::string& where) const {
    if (!v.is_object())
      fail(where + " is not an object");
    return v;
  }

  std::string string(const json& object, const std::string& where,
                     const char* key) const {
    const json& v = get(object, where, key);
    if (!v.is_string())
      fail(where + key + " is not a string");
    return v.get<std::string>();
  }

  /// `v` as an integer in [lo, hi]; `what` names it in the error.
  template <class Int>
  Int integer(const json& v, const std::string& what, Int lo, Int hi) const {
    bool ok = false;
    if (v.is_number_unsigned()) {
      ok = v.get<std::uint64_t>() <= static_cast<std::uint64_t>(hi);
    } else if (v.is_number_integer()) {
      const std::int64_t x = v.get<std::int64_t>();
      ok = x >= static_cast<std::int64_t>(lo) &&
           (x < 0 ||
            static_cast<std::uint64_t>(x) <= static_cast<std::uint64_t>(hi));
    }
    if (!ok)
      fail(what + " is not an integer in [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]: " + v.dump());
    return v.get<Int>();
  }

  /// The integer at `object`[`key`], in [lo, hi].
  template <class Int>
  Int integer(const json& object, const std::string& where, const char* key,
              Int lo, Int hi) const {
    return integer(get(object, where, key), where + key, lo, hi);
  }

private:
  const std::filesystem::path& file_;
};

file_record parse_file_record(const manifest_fields& f, const json& j,
                              const std::string& where) {
  f.object(j, where);
  const std::string at = where + ".";
  file_record r;
  r.file = f.string(j, at, "file");
  r.layer = f.integer<int>(j, at, "layer", 0, INT_MAX);
  r.bytes = f.integer<std::uint64_t>(j, at, "bytes", 0, UINT64_MAX);
  r.crc32c = f.integer<std::uint32_t>(j, at, "crc32c", 0, UINT32_MAX);
  if (r.file != layer_file_name(r.layer))
    f.fail(where + " names file \"" + r.file + "\" for layer " +
           std::to_string(r.layer) + ", expected " + layer_file_name(r.layer));
  const json& tensors = f.array(j, at, "tensors");
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string t_at = at + "tensors[" + std::to_string(i) + "]";
    const json& t = f.object(tensors[i], t_at);
    tensor_record record{
      f.string(t, t_at + ".", "name"), f.string(t, t_at + ".", "dtype"), {}};
    const json& shape = f.array(t, t_at + ".", "shape");
    for (std::size_t d = 0; d < shape.size(); ++d)
      record.shape.push_back(f.integer<std::int64_t>(
        shape[d], t_at + ".shape[" + std::to_string(d) + "]", 0, INT64_MAX));
    r.tensors.push_back(std::move(record));
  }
  return r;
}

} // namespace

std::string model_digest(const nlohmann::json& model) {
  return transport::job_digest(model.dump());
}

checkpoint_identity identity_of(const checkpoint_manifest& m) {
  return {m.job_id, m.model_digest, m.step};
}

void write_manifest(const std::filesystem::path& dir,
                    const checkpoint_manifest& manifest) {
  crash_point("before-manifest");
  std::string text;
  try {
    json j = to_json(manifest);
    j[self_crc_key] = content_crc32c(j);
    text = j.dump(2) + "\n";
  } catch (const json::exception& e) {
    throw internal_error(std::string("checkpoint manifest: ") + e.what());
  }
  // The layer files' directory entries become durable before the manifest
  // that names them can.
  detail::sync_directory(dir);
  const auto temp = dir / (std::string(manifest_file_name) + ".tmp");
  const auto final_path = dir / manifest_file_name;
  const std::span<const std::uint8_t> piece(
    reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
  detail::write_file_synced(temp, {&piece, 1});
  if (::rename(temp.c_str(), final_path.c_str()) != 0)
    detail::throw_errno(checkpoint_errc::io, final_path,
                        "cannot rename " + temp.string() + " to it");
  detail::sync_directory(dir);
  crash_point("after-manifest-rename");
}

checkpoint_manifest read_manifest(const std::filesystem::path& dir) {
  const auto file = dir / manifest_file_name;
  return parse_manifest(detail::read_small_file(file, max_manifest_bytes),
                        file);
}

checkpoint_manifest parse_manifest(std::string_view text,
                                   const std::filesystem::path& file) {
  if (text.empty())
    throw checkpoint_error(checkpoint_errc::truncated, file, "empty file");

  detail::check_json_depth(text, file);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    // nlohmann reports an unexpected end of input one past the last byte.
    if (e.byte > text.size())
      throw checkpoint_error(checkpoint_errc::truncated, file,
                             std::string("the JSON ends early: ") + e.what());
    throw checkpoint_error(checkpoint_errc::corrupt, file,
                           std::string("not JSON: ") + e.what());
  } catch (const json::exception& e) {
    // out_of_range: a number no double holds (1e400).
    throw checkpoint_error(checkpoint_errc::corrupt, file,
                           std::string("not JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("format") ||
      j["format"] != std::string(checkpoint_format))
    throw checkpoint_error(
      checkpoint_errc::foreign, file,
      "not an H2 checkpoint manifest (\"format\" is " +
        (j.is_object() && j.contains("format") ? j["format"].dump()
                                               : std::string("absent")) +
        ", expected \"" + std::string(checkpoint_format) + "\")");

  const manifest_fields f(file);
  checkpoint_manifest m;
  m.format_version = f.integer<int>(j, "", "format_version", 0, INT_MAX);
  if (m.format_version != checkpoint_format_version)
    throw checkpoint_error(
      checkpoint_errc::mismatch, file,
      "format version " + std::to_string(m.format_version) +
        ", this H2 reads version " + std::to_string(checkpoint_format_version));
  // Damage the JSON survives (a digit of the step, the seed) shows here.
  const auto crc = f.integer<std::uint32_t>(j, "", self_crc_key, 0, UINT32_MAX);
  j.erase(self_crc_key);
  if (const auto actual = content_crc32c(j); actual != crc)
    throw checkpoint_error(checkpoint_errc::corrupt, file,
                           "the content's CRC32C is " + detail::hex32(actual) +
                             ", manifest_crc32c says " + detail::hex32(crc));
  m.step = f.integer<std::int64_t>(j, "", "step", 0, INT64_MAX);
  m.job_id = f.string(j, "", "job_id");
  if (m.job_id.size() != 32 ||
      m.job_id.find_first_not_of("0123456789abcdef") != std::string::npos)
    f.fail("job_id is \"" + m.job_id + "\", expected 32 hex digits");
  m.model_digest = f.string(j, "", "model_digest");
  m.seed = f.integer<std::uint64_t>(j, "", "seed", 0, UINT64_MAX);
  m.model = f.get(j, "", "model");
  if (model_digest(m.model) != m.model_digest)
    f.fail("model_digest does not match the model it describes");
  m.optimizer = f.get(j, "", "optimizer");
  m.plan_json = f.string(j, "", "plan_json");
  m.job_toml = f.string(j, "", "job_toml");
  const json& hashes = f.array(j, "", "data_hashes");
  for (std::size_t i = 0; i < hashes.size(); ++i) {
    const std::string at = "data_hashes[" + std::to_string(i) + "]";
    f.object(hashes[i], at);
    m.data_hashes.emplace_back(f.string(hashes[i], at + ".", "path"),
                               f.string(hashes[i], at + ".", "hash"));
  }
  if (j.contains("data")) {
    m.data = j.at("data");
    if (!m.data.is_object())
      f.fail("data is not an object");
  }
  const json& files = f.array(j, "", "files");
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string at = "files[" + std::to_string(i) + "]";
    m.files.push_back(parse_file_record(f, files[i], at));
    if (m.files.back().layer != static_cast<int>(i))
      f.fail(at + " is layer " + std::to_string(m.files.back().layer) +
             ", expected layer " + std::to_string(i) +
             " (files list layers 0..n-1 in order)");
  }
  return m;
}

} // namespace h2::runtime
