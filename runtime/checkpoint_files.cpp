// Layer files, whole checkpoints and the directory of checkpoints
// (docs/checkpoints.md). The manifest itself: checkpoint_manifest.cpp.
#include "h2/runtime/checkpoint_files.hpp"

#include "checkpoint_io.hpp"
#include "h2/core/files.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

namespace h2::runtime {
namespace {

/// Why the checkpoint in `dir` (named for `step`) is not complete, or
/// nullopt if its manifest reads and names that step.
std::optional<std::string> incomplete_reason(const std::filesystem::path& dir,
                                             std::int64_t step) {
  try {
    const auto m = read_manifest(dir);
    if (m.step != step)
      return "the manifest says step " + std::to_string(m.step);
    return std::nullopt;
  } catch (const checkpoint_error& e) {
    if (e.kind() == checkpoint_errc::missing)
      return "no " + std::string(manifest_file_name) + " (it is written last)";
    return std::string(e.what());
  }
}

struct step_dir {
  std::int64_t step = 0;
  std::filesystem::path dir;
  /// "" for "step-XXXXXXXX"; the rest of the name otherwise
  /// (".partial-<job id>", ".old-<job id>").
  std::string suffix;
};

/// The step and the rest of a name that starts as checkpoint_dir writes
/// "step-XXXXXXXX"; nullopt for any other name.
std::optional<std::pair<std::int64_t, std::string>>
parse_step_name(const std::string& name) {
  constexpr std::size_t digits = 8;
  if (!name.starts_with("step-") || name.size() < 5 + digits)
    return std::nullopt;
  std::int64_t step = -1;
  const char* first = name.data() + 5;
  const auto parsed = std::from_chars(first, first + digits, step);
  if (parsed.ec != std::errc() || parsed.ptr != first + digits || step < 0)
    return std::nullopt;
  return std::pair{step, name.substr(5 + digits)};
}

/// The step directories under `root` (real directories, never links),
/// newest first: complete ones ("step-XXXXXXXX") and those with a suffix
/// (partial or replaced saves). Other entries are ignored; a missing `root`
/// has none.
std::vector<step_dir> list_step_dirs(const std::filesystem::path& root) {
  std::vector<step_dir> dirs;
  std::error_code ec;
  if (!std::filesystem::is_directory(root, ec))
    return dirs;
  std::filesystem::directory_iterator it(root, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const auto parsed = parse_step_name(it->path().filename().string());
    if (!parsed || (parsed->second.empty() &&
                    checkpoint_dir(root, parsed->first).filename() !=
                      it->path().filename()))
      continue;
    std::error_code dir_ec;
    if (it->is_directory(dir_ec) && !it->is_symlink(dir_ec))
      dirs.push_back({parsed->first, it->path(), parsed->second});
  }
  if (ec)
    throw checkpoint_error(checkpoint_errc::io, root,
                           "cannot list: " + ec.message());
  std::sort(dirs.begin(), dirs.end(),
            [](const auto& a, const auto& b) { return a.step > b.step; });
  return dirs;
}

/// The manifest of the checkpoint in `dir`, or nullopt when it does not
/// read.
std::optional<checkpoint_manifest>
manifest_of(const std::filesystem::path& dir) {
  try {
    return read_manifest(dir);
  } catch (const checkpoint_error&) {
    return std::nullopt;
  }
}

void remove_dir(const std::filesystem::path& dir) {
  if (const auto ec = h2::remove_tree(dir))
    throw checkpoint_error(checkpoint_errc::io, dir,
                           "cannot remove: " + ec.message());
}

void rename_dir(const std::filesystem::path& from,
                const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    detail::throw_errno(checkpoint_errc::io, to,
                        "cannot rename " + from.string() + " to it");
}

/// "F32 [2, 3]": a tensor's dtype and shape for messages.
std::string describe(const tensor_record& t) {
  std::string text = t.dtype + " [";
  for (std::size_t i = 0; i < t.shape.size(); ++i)
    text += (i == 0 ? "" : ", ") + std::to_string(t.shape[i]);
  return text + "]";
}

} // namespace

std::string layer_file_name(int layer) {
  H2_ENFORCE(layer >= 0, "layer ", layer);
  char name[40];
  std::snprintf(name, sizeof(name), "layer-%05d.safetensors", layer);
  return name;
}

std::filesystem::path checkpoint_dir(const std::filesystem::path& root,
                                     std::int64_t step) {
  H2_ENFORCE(step >= 0, "step ", step);
  char name[40];
  std::snprintf(name, sizeof(name), "step-%08lld",
                static_cast<long long>(step));
  return root / name;
}

void crash_point(std::string_view point) {
  const char* at = std::getenv("H2_TEST_CRASH_AT");
  if (at != nullptr && point == at) {
    ::kill(::getpid(), SIGKILL);
    ::_exit(137); // not reached: SIGKILL to oneself is delivered at once
  }
}

std::filesystem::path partial_checkpoint_dir(const std::filesystem::path& root,
                                             std::int64_t step,
                                             const std::string& job_id) {
  auto dir = checkpoint_dir(root, step);
  dir += ".partial-" + job_id;
  return dir;
}

file_record write_layer_file(const std::filesystem::path& dir,
                             const layer_state& state,
                             const checkpoint_identity& id) {
  crash_point("before-layer-file");
  file_record r;
  r.file = layer_file_name(state.layer);
  r.layer = state.layer;
  const written_file w =
    write_safetensors(dir / r.file, state.tensors,
                      {{"layer", std::to_string(state.layer)},
                       {"job_id", id.job_id},
                       {"model_digest", id.model_digest},
                       {"step", std::to_string(id.step)}});
  crash_point("after-layer-file");
  r.bytes = w.bytes;
  r.crc32c = w.crc32c;
  for (const auto& t : state.tensors)
    r.tensors.push_back({t.name, t.dtype, t.shape});
  return r;
}

std::filesystem::path prepare_checkpoint_dir(const std::filesystem::path& root,
                                             const checkpoint_identity& id) {
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec)
    throw checkpoint_error(checkpoint_errc::io, root,
                           "cannot create: " + ec.message());
  const auto dir = partial_checkpoint_dir(root, id.step, id.job_id);
  remove_dir(dir); // an abandoned save's (a link: the link only)
  if (::mkdir(dir.c_str(), 0755) != 0)
    detail::throw_errno(checkpoint_errc::io, dir, "cannot create");
  detail::sync_directory(root);
  return dir;
}

std::filesystem::path publish_checkpoint(const std::filesystem::path& root,
                                         const std::filesystem::path& partial,
                                         const checkpoint_manifest& manifest) {
  write_manifest(partial, manifest);
  const auto dir = checkpoint_dir(root, manifest.step);
  struct stat st {};
  if (::lstat(dir.c_str(), &st) == 0) {
    // Rewriting a step: only this job's own checkpoint is replaced.
    const auto there = S_ISDIR(st.st_mode) ? manifest_of(dir) : std::nullopt;
    if (!there || there->job_id != manifest.job_id)
      throw checkpoint_error(
        checkpoint_errc::io, dir,
        "exists and is not a checkpoint of this job (another job's, a "
        "link, or no checkpoint): not replacing it; the new one stays in " +
          partial.string());
    auto old = dir;
    old += ".old-" + manifest.job_id;
    remove_dir(old);
    rename_dir(dir, old);
    rename_dir(partial, dir);
    detail::sync_directory(root);
    remove_dir(old);
  } else if (errno != ENOENT) {
    detail::throw_errno(checkpoint_errc::io, dir, "cannot look at");
  } else {
    rename_dir(partial, dir);
  }
  detail::sync_directory(root);
  crash_point("after-publish");
  return dir;
}

std::filesystem::path write_checkpoint(const std::filesystem::path& root,
                                       checkpoint_manifest manifest,
                                       const std::vector<layer_state>& layers) {
  std::vector<const layer_state*> ordered;
  for (const auto& l : layers)
    ordered.push_back(&l);
  std::sort(ordered.begin(), ordered.end(),
            [](auto* a, auto* b) { return a->layer < b->layer; });
  for (std::size_t i = 0; i < ordered.size(); ++i)
    H2_ENFORCE(ordered[i]->layer == static_cast<int>(i),
               "checkpoint layers must be 0..n-1; found layer ",
               ordered[i]->layer, " at position ", i);

  const auto id = identity_of(manifest);
  const auto partial = prepare_checkpoint_dir(root, id);
  manifest.files.clear();
  for (const auto* l : ordered)
    manifest.files.push_back(write_layer_file(partial, *l, id));
  return publish_checkpoint(root, partial, manifest);
}

layer_state read_layer_file(const std::filesystem::path& dir,
                            const checkpoint_manifest& manifest,
                            const file_record& record) {
  // The record comes from a manifest: its name is checked before it is
  // opened (no "../" escapes the directory).
  if (record.layer < 0 || record.file != layer_file_name(record.layer))
    throw checkpoint_error(checkpoint_errc::corrupt, dir / manifest_file_name,
                           "the record of layer " +
                             std::to_string(record.layer) + " names file \"" +
                             record.file + "\"");
  safetensors_reader reader(dir / record.file, record.bytes);
  const auto fail = [&](checkpoint_errc kind, const std::string& why) {
    return checkpoint_error(kind, reader.path(), why);
  };
  const auto& meta = reader.metadata();
  const auto producer = meta.find("producer");
  if (producer == meta.end() || producer->second != "h2")
    throw fail(checkpoint_errc::foreign,
               "not an H2 layer file (producer " +
                 (producer == meta.end() ? std::string("absent")
                                         : "\"" + producer->second + "\"") +
                 ")");
  const auto layer = meta.find("layer");
  if (layer == meta.end() || layer->second != std::to_string(record.layer))
    throw fail(checkpoint_errc::mismatch,
               "the file holds layer " +
                 (layer == meta.end() ? std::string("(none)") : layer->second) +
                 ", the manifest says layer " + std::to_string(record.layer));
  // Another job's layer, or one of another step, with CRCs made to match.
  const auto recorded = [&](const char* key) {
    const auto it = meta.find(key);
    return it == meta.end() ? std::string("(none)") : it->second;
  };
  const checkpoint_identity file_id{recorded("job_id"),
                                    recorded("model_digest"), -1};
  const auto want = identity_of(manifest);
  if (file_id.job_id != want.job_id ||
      file_id.model_digest != want.model_digest ||
      recorded("step") != std::to_string(want.step))
    throw fail(checkpoint_errc::mismatch,
               "the file is of job " + file_id.job_id + " (model " +
                 file_id.model_digest.substr(0, 12) + ") at step " +
                 recorded("step") + "; the manifest is of job " +
                 want.job_id + " (model " + want.model_digest.substr(0, 12) +
                 ") at step " + std::to_string(want.step));
  // Tensors are matched by name: the file does not record the order of
  // empty tensors that share an offset. The result is in the record's order.
  std::map<std::string, std::size_t> in_file;
  for (std::size_t i = 0; i < reader.tensors().size(); ++i)
    in_file.emplace(reader.tensors()[i].name, i);
  std::vector<std::size_t> order;
  for (const auto& want : record.tensors) {
    const auto it = in_file.find(want.name);
    if (it == in_file.end())
      throw fail(checkpoint_errc::mismatch,
                 "no tensor " + want.name +
                   " in the file (or listed twice in the manifest)");
    const auto& have = reader.tensors()[it->second];
    if (have != want)
      throw fail(checkpoint_errc::mismatch,
                 "tensor " + want.name + " is " + describe(have) +
                   " in the file, " + describe(want) + " in the manifest");
    order.push_back(it->second);
    in_file.erase(it);
  }
  if (!in_file.empty())
    throw fail(checkpoint_errc::mismatch,
               "tensor " + in_file.begin()->first +
                 " is in the file but not in the manifest");
  std::uint32_t crc = 0;
  auto tensors = reader.read_tensors(crc);
  if (crc != record.crc32c)
    throw fail(checkpoint_errc::corrupt, "CRC32C is " + detail::hex32(crc) +
                                           ", the manifest says " +
                                           detail::hex32(record.crc32c));
  layer_state state{record.layer, {}};
  for (std::size_t i : order)
    state.tensors.push_back(std::move(tensors[i]));
  return state;
}

checkpoint read_checkpoint(const std::filesystem::path& dir) {
  checkpoint c;
  c.dir = dir;
  c.manifest = read_manifest(dir);
  for (const auto& record : c.manifest.files)
    c.layers.push_back(read_layer_file(dir, c.manifest, record));
  return c;
}

std::vector<layer_state> read_layers(const std::filesystem::path& dir,
                                     const checkpoint_manifest& manifest,
                                     int first, int end) {
  const int layers = static_cast<int>(manifest.files.size());
  if (first < 0 || end > layers || first > end)
    throw checkpoint_error(checkpoint_errc::mismatch, dir / manifest_file_name,
                           "layers [" + std::to_string(first) + ", " +
                             std::to_string(end) + ") asked of a checkpoint of " +
                             std::to_string(layers) + " layers");
  std::vector<layer_state> out;
  for (int l = first; l < end; ++l)
    out.push_back(
      read_layer_file(dir, manifest,
                      manifest.files[static_cast<std::size_t>(l)]));
  return out;
}

std::optional<std::filesystem::path>
latest_checkpoint(const std::filesystem::path& root,
                  const std::function<void(const std::string&)>& log) {
  for (const auto& d : list_step_dirs(root)) {
    if (!d.suffix.empty())
      continue; // a save in progress, or abandoned
    const auto why = incomplete_reason(d.dir, d.step);
    if (!why)
      return d.dir;
    if (log)
      log("h2: skipping incomplete checkpoint " + d.dir.string() + ": " + *why);
  }
  return std::nullopt;
}

std::vector<std::filesystem::path>
prune_checkpoints(const std::filesystem::path& root, int keep,
                  const std::string& job_id) {
  H2_ENFORCE(keep >= 1, "keep=", keep,
             " (the newest complete checkpoint is always kept)");
  std::vector<std::filesystem::path> removed;
  int complete = 0;
  // Newest first: a partial directory newer than every complete one may
  // still be being written and stays.
  for (const auto& d : list_step_dirs(root)) {
    bool remove = false;
    if (d.suffix.empty()) {
      // One read: another job's, or no checkpoint, is not this job's to
      // judge.
      const auto m = manifest_of(d.dir);
      if (!m || m->job_id != job_id || m->step != d.step)
        continue;
      remove = ++complete > keep;
    } else {
      remove = complete > 0 && (d.suffix == ".partial-" + job_id ||
                                d.suffix == ".old-" + job_id);
    }
    if (!remove)
      continue;
    remove_dir(d.dir);
    removed.push_back(d.dir);
  }
  if (!removed.empty())
    detail::sync_directory(root);
  return removed;
}

} // namespace h2::runtime
