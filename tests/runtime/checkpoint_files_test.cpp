// The files of a checkpoint (docs/checkpoints.md): round trips, every kind
// of damage read back as its typed error naming the file, the directory
// scan, pruning, and crashes at each point of the write path.
#include "h2/core/crc32c.hpp"
#include "h2/core/error.hpp"
#include "h2/core/files.hpp"
#include "h2/runtime/checkpoint_files.hpp"
#include "h2/runtime/checkpointing.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace h2::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

/// A fresh directory under the system's temp directory, removed at the end.
class temp_dir {
public:
  temp_dir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("h2-checkpoint-test-" + std::to_string(::getpid()) + "-" +
             std::to_string(counter++));
    h2::remove_tree(path_);
    fs::create_directories(path_);
  }
  ~temp_dir() { h2::remove_tree(path_); }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const fs::path& path() const { return path_; }

private:
  fs::path path_;
};

std::vector<std::uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const fs::path& p, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

/// `count` bytes of a pattern that differs per `seed`.
std::vector<std::uint8_t> pattern(std::size_t count, int seed) {
  std::vector<std::uint8_t> bytes(count);
  for (std::size_t i = 0; i < count; ++i)
    bytes[i] = static_cast<std::uint8_t>(i * 31 + seed * 7 + 1);
  return bytes;
}

state_tensor tensor(std::string name, std::string dtype,
                    std::vector<std::int64_t> shape, int seed) {
  std::size_t count = dtype_bytes(dtype);
  for (auto d : shape)
    count *= static_cast<std::size_t>(d);
  return {std::move(name), std::move(dtype), std::move(shape),
          pattern(count, seed)};
}

/// A parameter and, if `moments`, its AdamW moments.
void add_param(layer_state& s, const std::string& name, std::string dtype,
               std::vector<std::int64_t> shape, bool moments) {
  const int seed = static_cast<int>(s.tensors.size()) + s.layer * 10;
  s.tensors.push_back(tensor(name, dtype, shape, seed));
  if (moments) {
    s.tensors.push_back(tensor(name + ".exp_avg", "F32", shape, seed + 1));
    s.tensors.push_back(tensor(name + ".exp_avg_sq", "F32", shape, seed + 2));
  }
}

/// Three layers: F32 and BF16 parameters, with and without moments, an F16
/// and an I64 scalar, empty tensors; layer 2 has no moments at all.
std::vector<layer_state> sample_layers() {
  std::vector<layer_state> layers(3);
  for (int i = 0; i < 3; ++i)
    layers[i].layer = i;
  add_param(layers[0], "block0.attn.qkv.weight", "F32", {2, 3}, true);
  add_param(layers[0], "block0.ln.bias", "BF16", {3}, false);
  add_param(layers[1], "block1.mlp.fc.weight", "BF16", {4, 2}, true);
  add_param(layers[1], "block1.mlp.fc.bias", "F16", {4}, true);
  // Two empty tensors at one offset, written in other than name order.
  add_param(layers[1], "block1.empty", "F32", {0, 3}, false);
  add_param(layers[1], "block1.b_empty", "F16", {0}, false);
  add_param(layers[1], "block1.count", "I64", {}, false);
  add_param(layers[2], "head.weight", "F32", {3, 2}, false);
  return layers;
}

/// The job every sample manifest belongs to.
const std::string sample_job_id = "0123456789abcdef0123456789abcdef";

checkpoint_manifest sample_manifest(std::int64_t step) {
  checkpoint_manifest m;
  m.step = step;
  m.model = {{"n_layer", 3}, {"d_model", 8}, {"name", "tiny"}};
  m.optimizer = {{"name", "adamw"}, {"lr", 0.001}, {"betas", {0.9, 0.95}}};
  m.seed = 0xfedcba9876543210ull;
  m.data_hashes = {{"data/train.bin", "0a1b2c3d"}, {"data/val.bin", "ff00"}};
  m.plan_json = R"({"stages": [{"layers": [0, 3]}]})";
  m.job_toml = "[model]\nn_layer = 3\nname = \"tiny\"\n";
  m.job_id = sample_job_id;
  m.model_digest = model_digest(m.model);
  return m;
}

fs::path manifest_path(const fs::path& dir) {
  return dir / manifest_file_name;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

/// Writes `m` as `dir`'s manifest with a matching manifest_crc32c: the
/// CRC32C of the compact dump of every other key (docs/checkpoints.md).
void write_manifest_json(const fs::path& dir, json m) {
  m.erase("manifest_crc32c");
  const std::string content = m.dump();
  m["manifest_crc32c"] = crc32c(content.data(), content.size());
  std::ofstream(manifest_path(dir), std::ios::trunc) << m.dump(2);
}

/// Makes the manifest's record of `layer` match its file again (size and
/// CRC), so only the damage inside the file is left to find.
void rerecord(const fs::path& dir, int layer) {
  json m = read_json(manifest_path(dir));
  const auto bytes = read_bytes(dir / layer_file_name(layer));
  m["files"][layer]["bytes"] = bytes.size();
  m["files"][layer]["crc32c"] = crc32c(bytes.data(), bytes.size());
  write_manifest_json(dir, m);
}

std::uint64_t header_length(const std::vector<std::uint8_t>& bytes) {
  std::uint64_t length = 0;
  std::memcpy(&length, bytes.data(), sizeof(length)); // little-endian host
  return length;
}

/// A safetensors file laid out as apps/session.cpp's write_safetensors lays
/// out the `--export` of weights: F32 tensors, keys in nlohmann's sorted
/// order, the header padded with spaces to 8 bytes, data in the given order.
struct exported_param {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

/// A safetensors file's bytes: the 8-byte length of `header` (padded here
/// with spaces to 8 bytes), `header`, `data`.
std::vector<std::uint8_t> assemble(std::string header,
                                   const std::vector<std::uint8_t>& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::uint64_t length = header.size();
  std::string out(sizeof(length), '\0');
  std::memcpy(out.data(), &length, sizeof(length)); // little-endian host
  out += header;
  out.append(reinterpret_cast<const char*>(data.data()), data.size());
  return {out.begin(), out.end()};
}

std::vector<std::uint8_t>
export_layout(const std::vector<exported_param>& params, json metadata) {
  json header;
  header["__metadata__"] = std::move(metadata);
  std::uint64_t offset = 0;
  std::vector<std::uint8_t> data;
  for (const auto& p : params) {
    std::uint64_t bytes = p.values.size() * sizeof(float);
    header[p.name] = {{"dtype", "F32"},
                      {"shape", p.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    const auto* at = reinterpret_cast<const std::uint8_t*>(p.values.data());
    data.insert(data.end(), at, at + bytes);
  }
  return assemble(header.dump(), data);
}

/// Rewrites the JSON header of `layer`'s file with `edit` and re-records it.
void edit_header(const fs::path& dir, int layer,
                 const std::function<void(json&)>& edit) {
  const auto file = dir / layer_file_name(layer);
  const auto bytes = read_bytes(file);
  const std::uint64_t length = header_length(bytes);
  json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + length);
  edit(header);
  write_bytes(
    file, assemble(header.dump(), {bytes.begin() + 8 + length, bytes.end()}));
  rerecord(dir, layer);
}

void edit_manifest(const fs::path& dir,
                   const std::function<void(json&)>& edit) {
  json m = read_json(manifest_path(dir));
  edit(m);
  write_manifest_json(dir, m);
}

/// A damage: sets the manifest's value at JSON pointer `pointer`, keeping
/// manifest_crc32c valid.
std::function<void(const fs::path&)> manifest_set(std::string pointer,
                                                  json value) {
  return [pointer, value](const fs::path& dir) {
    edit_manifest(dir,
                  [&](json& m) { m[json::json_pointer(pointer)] = value; });
  };
}

void resize_by(const fs::path& p, std::int64_t delta) {
  fs::resize_file(p, static_cast<std::uintmax_t>(
                       static_cast<std::int64_t>(fs::file_size(p)) + delta));
}

TEST(runtime_checkpoint_files, names_are_zero_padded) {
  EXPECT_EQ(layer_file_name(3), "layer-00003.safetensors");
  EXPECT_EQ(layer_file_name(123456), "layer-123456.safetensors");
  EXPECT_EQ(checkpoint_dir("/ckpt", 120), fs::path("/ckpt/step-00000120"));
  EXPECT_THROW(layer_file_name(-1), internal_error);
}

TEST(runtime_checkpoint_files, a_checkpoint_reads_back_bit_for_bit) {
  temp_dir root;
  const auto layers = sample_layers();
  const auto manifest = sample_manifest(120);
  // Layers in any order; the files and records come out by layer index.
  const auto dir =
    write_checkpoint(root.path(), manifest, {layers[2], layers[0], layers[1]});
  EXPECT_EQ(dir, root.path() / "step-00000120");
  EXPECT_TRUE(fs::exists(dir / "layer-00000.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "layer-00002.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "manifest.json.tmp"));

  const checkpoint c = read_checkpoint(dir);
  EXPECT_EQ(c.layers, layers);
  checkpoint_manifest expected = manifest;
  expected.files = c.manifest.files;
  EXPECT_EQ(c.manifest, expected);
  ASSERT_EQ(c.manifest.files.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const auto& r = c.manifest.files[i];
    EXPECT_EQ(r.layer, i);
    EXPECT_EQ(r.file, layer_file_name(i));
    const auto bytes = read_bytes(dir / r.file);
    EXPECT_EQ(r.bytes, bytes.size());
    EXPECT_EQ(r.crc32c, crc32c(bytes.data(), bytes.size()));
    ASSERT_EQ(r.tensors.size(), layers[i].tensors.size());
    EXPECT_EQ(r.tensors[0].name, layers[i].tensors[0].name);
    EXPECT_EQ(read_layer_file(dir, c.manifest, r), layers[i]);
  }

  safetensors_reader reader(dir / "layer-00001.safetensors");
  EXPECT_EQ(reader.metadata(),
            (std::map<std::string, std::string>{
              {"format", "pt"},
              {"producer", "h2"},
              {"layer", "1"},
              {"job_id", sample_job_id},
              {"model_digest", manifest.model_digest},
              {"step", "120"}}));
  const auto bytes = read_bytes(reader.path());
  EXPECT_EQ(header_length(bytes) % 8, 0u);
}

TEST(runtime_checkpoint_files, a_manifest_reads_back_as_written) {
  temp_dir dir;
  checkpoint_manifest m = sample_manifest(7);
  m.files.push_back({layer_file_name(0),
                     0,
                     1234,
                     0xdeadbeef,
                     {{"w", "BF16", {2, 3}}, {"w.exp_avg", "F32", {2, 3}}}});
  m.files.push_back({layer_file_name(1), 1, 8, 0, {}});
  write_manifest(dir.path(), m);
  EXPECT_EQ(read_manifest(dir.path()), m);
  const json j = read_json(manifest_path(dir.path()));
  EXPECT_EQ(j["format"], "h2-checkpoint");
  EXPECT_EQ(j["format_version"], 2);
  EXPECT_EQ(j["job_id"], sample_job_id);
  EXPECT_EQ(j["seed"].get<std::uint64_t>(), 0xfedcba9876543210ull);
}

TEST(runtime_checkpoint_files, a_manifest_parses_from_its_text_as_it_reads) {
  temp_dir dir;
  checkpoint_manifest m = sample_manifest(7);
  m.files.push_back({layer_file_name(0), 0, 8, 0, {{"w", "F32", {2}}}});
  write_manifest(dir.path(), m);
  const auto bytes = read_bytes(manifest_path(dir.path()));
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_EQ(parse_manifest(text, "elsewhere.json"), m);
  try {
    parse_manifest(text.substr(0, text.size() / 2), "elsewhere.json");
    FAIL() << "half a manifest parsed";
  } catch (const checkpoint_error& e) {
    EXPECT_EQ(e.kind(), checkpoint_errc::truncated);
    EXPECT_EQ(e.file(), "elsewhere.json");
  }
}

// The fuzz corpus's seeds (fuzz/corpus/checkpoint_manifest) stay in step
// with the format: the valid one parses, the damaged ones fail as named.
TEST(runtime_checkpoint_files, the_fuzz_seeds_follow_the_format) {
  const fs::path seeds =
    fs::path(H2_SOURCE_DIR) / "fuzz" / "corpus" / "checkpoint_manifest";
  const auto text = [&](const char* name) {
    const auto bytes = read_bytes(seeds / name);
    return std::string(bytes.begin(), bytes.end());
  };
  const auto m = parse_manifest(text("manifest.json"), "manifest.json");
  EXPECT_EQ(m.format_version, checkpoint_format_version);
  EXPECT_EQ(m.model_digest, model_digest(m.model));
  for (const auto& [name, kind] :
       {std::pair{"crc-mismatch.json", checkpoint_errc::corrupt},
        std::pair{"foreign.json", checkpoint_errc::foreign}}) {
    try {
      parse_manifest(text(name), name);
      ADD_FAILURE() << name << " parsed";
    } catch (const checkpoint_error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
    }
  }
}

TEST(runtime_checkpoint_files, a_number_too_large_for_a_double_is_corrupt) {
  // nlohmann throws out_of_range, not parse_error, for it (found by
  // fuzz_checkpoint_manifest, fuzz/corpus/checkpoint_manifest/
  // number-overflow.json).
  try {
    parse_manifest(R"({"format": "h2-checkpoint", "step": 1e400})",
                   "manifest.json");
    FAIL() << "a number no double holds parsed";
  } catch (const checkpoint_error& e) {
    EXPECT_EQ(e.kind(), checkpoint_errc::corrupt) << e.what();
    EXPECT_NE(std::string(e.what()).find("number overflow"), std::string::npos)
      << e.what();
  }
}

TEST(runtime_checkpoint_files, the_writer_rejects_inconsistent_tensors) {
  temp_dir dir;
  const auto id = identity_of(sample_manifest(1));
  auto with = [](state_tensor t) {
    layer_state s;
    s.tensors.push_back(std::move(t));
    return s;
  };
  auto short_tensor = tensor("w", "F32", {2, 2}, 1);
  short_tensor.bytes.pop_back();
  EXPECT_THROW(write_layer_file(dir.path(), with(short_tensor), id),
               internal_error);
  EXPECT_THROW(
    write_layer_file(dir.path(), with(tensor("w", "Q4", {2}, 1)), id),
    internal_error);
  layer_state twice = with(tensor("w", "F32", {2}, 1));
  twice.tensors.push_back(tensor("w", "F32", {2}, 2));
  EXPECT_THROW(write_layer_file(dir.path(), twice, id), internal_error);
  auto layers = sample_layers();
  layers.erase(layers.begin() + 1);
  EXPECT_THROW(write_checkpoint(dir.path(), sample_manifest(1), layers),
               internal_error);
}

// --- Damage: each case breaks one thing and expects its kind and file. ---

struct damage_case {
  const char* name;
  std::function<void(const fs::path& dir)> damage;
  checkpoint_errc kind;
  const char* file;    ///< the file the error must name
  const char* message; ///< a part of the message
};

void PrintTo(const damage_case& c, std::ostream* out) {
  *out << c.name;
}

class runtime_checkpoint_damage : public ::testing::TestWithParam<damage_case> {
};

TEST_P(runtime_checkpoint_damage, is_reported_as_its_kind_naming_the_file) {
  const damage_case& c = GetParam();
  temp_dir root;
  const auto dir =
    write_checkpoint(root.path(), sample_manifest(5), sample_layers());
  c.damage(dir);
  try {
    read_checkpoint(dir);
    FAIL() << "the damage was not detected";
  } catch (const checkpoint_error& e) {
    EXPECT_EQ(to_string(e.kind()), to_string(c.kind)) << e.what();
    EXPECT_EQ(e.file(), dir / c.file) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find((dir / c.file).string()), std::string::npos) << what;
    EXPECT_NE(what.find(c.message), std::string::npos) << what;
  }
}

const damage_case damage_cases[] = {
  {"truncated_layer_file",
   [](const fs::path& d) { resize_by(d / layer_file_name(1), -5); },
   checkpoint_errc::truncated, "layer-00001.safetensors", "manifest says"},
  {"layer_file_cut_inside_its_header",
   [](const fs::path& d) { fs::resize_file(d / layer_file_name(1), 20); },
   checkpoint_errc::truncated, "layer-00001.safetensors", "20 bytes"},
  {"truncated_manifest",
   [](const fs::path& d) {
     resize_by(manifest_path(d),
               -static_cast<std::int64_t>(fs::file_size(manifest_path(d))) / 2);
   },
   checkpoint_errc::truncated, "manifest.json", "ends early"},
  {"empty_manifest",
   [](const fs::path& d) { fs::resize_file(manifest_path(d), 0); },
   checkpoint_errc::truncated, "manifest.json", "empty"},
  {"flipped_data_byte",
   [](const fs::path& d) {
     auto bytes = read_bytes(d / layer_file_name(2));
     bytes.back() ^= 0x10;
     write_bytes(d / layer_file_name(2), bytes);
   },
   checkpoint_errc::corrupt, "layer-00002.safetensors", "CRC32C"},
  {"flipped_header_byte",
   [](const fs::path& d) {
     auto bytes = read_bytes(d / layer_file_name(2));
     bytes[9] ^= 0x01; // inside the JSON: '"' becomes '#'
     write_bytes(d / layer_file_name(2), bytes);
   },
   checkpoint_errc::corrupt, "layer-00002.safetensors", "not JSON"},
  {"header_length_past_the_file",
   [](const fs::path& d) {
     auto bytes = read_bytes(d / layer_file_name(0));
     const std::uint64_t length = bytes.size();
     std::memcpy(bytes.data(), &length, 8);
     write_bytes(d / layer_file_name(0), bytes);
   },
   checkpoint_errc::corrupt, "layer-00000.safetensors", "past the end"},
  {"header_length_over_the_limit",
   [](const fs::path& d) {
     auto bytes = read_bytes(d / layer_file_name(0));
     const std::uint64_t length = 1ull << 62;
     std::memcpy(bytes.data(), &length, 8);
     write_bytes(d / layer_file_name(0), bytes);
   },
   checkpoint_errc::corrupt, "layer-00000.safetensors", "over the limit"},
  {"data_offsets_past_the_file",
   [](const fs::path& d) {
     edit_header(
       d, 0, [](json& h) { h["block0.ln.bias"]["data_offsets"][1] = 1000; });
   },
   checkpoint_errc::corrupt, "layer-00000.safetensors", "past the end"},
  {"overlapping_data_offsets",
   [](const fs::path& d) {
     edit_header(d, 0, [](json& h) {
       h["block0.attn.qkv.weight.exp_avg"]["data_offsets"] = {20, 44};
     });
   },
   checkpoint_errc::corrupt, "layer-00000.safetensors", "overlaps"},
  {"data_offsets_not_matching_the_shape",
   [](const fs::path& d) {
     edit_header(d, 0, [](json& h) {
       h["block0.attn.qkv.weight"]["shape"] = {2, 4};
     });
   },
   checkpoint_errc::corrupt, "layer-00000.safetensors", "needs 32"},
  {"unknown_dtype",
   [](const fs::path& d) {
     edit_header(d, 0, [](json& h) { h["block0.ln.bias"]["dtype"] = "BF17"; });
   },
   checkpoint_errc::corrupt, "layer-00000.safetensors", "unknown dtype"},
  {"tensor_renamed_in_the_file",
   [](const fs::path& d) {
     edit_header(d, 2, [](json& h) {
       h["head.weight2"] = h["head.weight"];
       h.erase("head.weight");
     });
   },
   checkpoint_errc::mismatch, "layer-00002.safetensors", "head.weight"},
  {"tensor_of_another_shape_in_the_file",
   [](const fs::path& d) {
     edit_header(d, 0, [](json& h) {
       h["block0.attn.qkv.weight"]["shape"] = {3, 2};
     });
   },
   checkpoint_errc::mismatch, "layer-00000.safetensors",
   "is F32 [3, 2] in the file, F32 [2, 3] in the manifest"},
  {"file_larger_than_its_record",
   [](const fs::path& d) {
     edit_manifest(d, [](json& m) {
       m["files"][1]["bytes"] = m["files"][1]["bytes"].get<int>() - 1;
     });
   },
   checkpoint_errc::mismatch, "layer-00001.safetensors", "manifest says"},
  {"another_format_version", manifest_set("/format_version", 1),
   checkpoint_errc::mismatch, "manifest.json", "format version 1"},
  // Issue 24: another job's layer (or one of another step), its record
  // and CRC32C made to match, is refused by the identity it records.
  {"layer_of_another_job_with_matching_crcs",
   [](const fs::path& d) {
     edit_header(d, 1, [](json& h) {
       h["__metadata__"]["job_id"] = "fedcba9876543210fedcba9876543210";
     });
   },
   checkpoint_errc::mismatch, "layer-00001.safetensors",
   "of job fedcba9876543210fedcba9876543210"},
  {"layer_of_another_step_with_matching_crcs",
   [](const fs::path& d) {
     edit_header(d, 2, [](json& h) { h["__metadata__"]["step"] = "4"; });
   },
   checkpoint_errc::mismatch, "layer-00002.safetensors", "at step 4;"},
  {"manifest_of_another_model_digest",
   manifest_set("/model_digest", std::string(64, '0')),
   checkpoint_errc::corrupt, "manifest.json", "model_digest"},
  {"foreign_manifest", manifest_set("/format", "pytorch-dcp"),
   checkpoint_errc::foreign, "manifest.json", "pytorch-dcp"},
  {"manifest_edited_without_its_checksum",
   [](const fs::path& d) {
     json m = read_json(manifest_path(d));
     m["step"] = 6;
     std::ofstream(manifest_path(d), std::ios::trunc) << m.dump(2);
   },
   checkpoint_errc::corrupt, "manifest.json", "manifest_crc32c says"},
  {"manifest_not_json",
   [](const fs::path& d) {
     write_bytes(manifest_path(d), {'{', 'x', '}', '\n'});
   },
   checkpoint_errc::corrupt, "manifest.json", "not JSON"},
  {"manifest_key_of_the_wrong_type", manifest_set("/step", "five"),
   checkpoint_errc::corrupt, "manifest.json", "step"},
  {"manifest_record_escaping_the_directory",
   manifest_set("/files/1/file", "../layer-00001.safetensors"),
   checkpoint_errc::corrupt, "manifest.json", "../layer-00001"},
  {"manifest_missing_a_layer",
   [](const fs::path& d) {
     edit_manifest(d, [](json& m) { m["files"].erase(1); });
   },
   checkpoint_errc::corrupt, "manifest.json", "expected layer 1"},
  {"missing_manifest", [](const fs::path& d) { fs::remove(manifest_path(d)); },
   checkpoint_errc::missing, "manifest.json", "no such file"},
  {"missing_layer_file",
   [](const fs::path& d) { fs::remove(d / layer_file_name(1)); },
   checkpoint_errc::missing, "layer-00001.safetensors", "no such file"},
  {"stray_safetensors_of_another_producer",
   [](const fs::path& d) {
     write_bytes(d / layer_file_name(1),
                 export_layout({{"w", {2}, {1.0f, 2.0f}}},
                               {{"format", "pt"}, {"producer", "other"}}));
     rerecord(d, 1);
   },
   checkpoint_errc::foreign, "layer-00001.safetensors", "\"other\""},
  {"another_layers_file",
   [](const fs::path& d) {
     fs::copy_file(d / layer_file_name(0), d / layer_file_name(1),
                   fs::copy_options::overwrite_existing);
     rerecord(d, 1);
   },
   checkpoint_errc::mismatch, "layer-00001.safetensors", "holds layer 0"},
};

// --- Hostile directories: refused, never hung on or crashed by.

/// `file` replaced by a FIFO that no one writes: opening it to read would
/// wait forever.
void make_fifo(const fs::path& file) {
  fs::remove(file);
  ASSERT_EQ(::mkfifo(file.c_str(), 0600), 0) << std::strerror(errno);
}

/// JSON of `depth` nested arrays.
std::string nested_arrays(std::size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

const damage_case hostile_cases[] = {
  {"manifest_is_a_fifo", [](const fs::path& d) { make_fifo(manifest_path(d)); },
   checkpoint_errc::corrupt, "manifest.json", "not a regular file"},
  {"layer_file_is_a_fifo",
   [](const fs::path& d) { make_fifo(d / layer_file_name(1)); },
   checkpoint_errc::corrupt, "layer-00001.safetensors", "not a regular file"},
  {"manifest_is_a_symbolic_link",
   [](const fs::path& d) {
     // To a valid manifest: a link is refused for what it is.
     fs::rename(manifest_path(d), d / "elsewhere.json");
     fs::create_symlink(d / "elsewhere.json", manifest_path(d));
   },
   checkpoint_errc::corrupt, "manifest.json", "a symbolic link"},
  {"manifest_nested_a_million_deep",
   [](const fs::path& d) {
     // Probe: a recursive dump() of this crashed the reader (SIGSEGV).
     std::ofstream(manifest_path(d), std::ios::trunc)
       << "{\"format\": " << nested_arrays(1'000'000) << "}";
   },
   checkpoint_errc::corrupt, "manifest.json", "nested deeper than 64"},
  {"layer_header_nested_deep",
   [](const fs::path& d) {
     const auto file = d / layer_file_name(0);
     const auto bytes = read_bytes(file);
     const std::uint64_t length = header_length(bytes);
     write_bytes(file, assemble("{\"x\": " + nested_arrays(100'000) + "}",
                                {bytes.begin() + 8 + length, bytes.end()}));
     rerecord(d, 0);
   },
   checkpoint_errc::corrupt, "layer-00000.safetensors", "nested deeper"},
};

INSTANTIATE_TEST_SUITE_P(hostile, runtime_checkpoint_damage,
                         ::testing::ValuesIn(hostile_cases),
                         [](const ::testing::TestParamInfo<damage_case>& info) {
                           return std::string(info.param.name);
                         });

TEST(runtime_checkpoint_files, brackets_inside_strings_do_not_nest) {
  temp_dir root;
  auto m = sample_manifest(3);
  m.job_toml = "name = \"" + std::string(1000, '[') + "\\\"{\"";
  const auto dir = write_checkpoint(root.path(), m, sample_layers());
  EXPECT_EQ(read_checkpoint(dir).manifest.job_toml, m.job_toml);
}

TEST(runtime_checkpoint_files, latest_skips_a_hostile_directory_in_one_line) {
  temp_dir root;
  const auto layers = sample_layers();
  const auto good = write_checkpoint(root.path(), sample_manifest(10), layers);
  const auto deep = write_checkpoint(root.path(), sample_manifest(20), layers);
  std::ofstream(manifest_path(deep), std::ios::trunc)
    << nested_arrays(1'000'000);
  const auto fifo = write_checkpoint(root.path(), sample_manifest(30), layers);
  make_fifo(manifest_path(fifo));
  std::vector<std::string> log;
  EXPECT_EQ(latest_checkpoint(root.path(),
                              [&](const std::string& l) { log.push_back(l); }),
            good);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_NE(log[0].find("not a regular file"), std::string::npos) << log[0];
  EXPECT_NE(log[1].find("nested deeper"), std::string::npos) << log[1];
}

INSTANTIATE_TEST_SUITE_P(runtime_checkpoint_files, runtime_checkpoint_damage,
                         ::testing::ValuesIn(damage_cases),
                         [](const ::testing::TestParamInfo<damage_case>& info) {
                           return std::string(info.param.name);
                         });

// --- The directory of checkpoints. ---

TEST(runtime_checkpoint_files, latest_skips_incomplete_newer_checkpoints) {
  temp_dir root;
  std::vector<std::string> log;
  const auto record = [&](const std::string& line) {
    log.push_back(line);
  };

  EXPECT_EQ(latest_checkpoint(root.path() / "none", record), std::nullopt);
  EXPECT_EQ(latest_checkpoint(root.path(), record), std::nullopt);
  EXPECT_TRUE(log.empty());

  const auto layers = sample_layers();
  write_checkpoint(root.path(), sample_manifest(10), layers);
  // Newer: one with a damaged manifest, one never finished, one whose
  // manifest is another step's; and entries that are not checkpoints.
  const auto bad = write_checkpoint(root.path(), sample_manifest(30), layers);
  write_bytes(manifest_path(bad), {'{', '"'});
  fs::create_directories(checkpoint_dir(root.path(), 40));
  write_layer_file(checkpoint_dir(root.path(), 40), layers[0],
                   identity_of(sample_manifest(40)));
  fs::create_directories(checkpoint_dir(root.path(), 20));
  fs::copy_file(manifest_path(checkpoint_dir(root.path(), 10)),
                manifest_path(checkpoint_dir(root.path(), 20)));
  write_bytes(root.path() / "step-00000050", {'x'});
  fs::create_directories(root.path() / "step-00000060.partial");
  fs::create_directories(root.path() / "step-0000070");

  const auto latest = latest_checkpoint(root.path(), record);
  EXPECT_EQ(latest, checkpoint_dir(root.path(), 10));
  ASSERT_EQ(log.size(), 3u);
  const std::string prefix = "h2: skipping incomplete checkpoint ";
  EXPECT_EQ(log[0].rfind(prefix + checkpoint_dir(root.path(), 40).string() +
                           ": no manifest.json",
                         0),
            0u)
    << log[0];
  EXPECT_EQ(log[1].rfind(prefix + bad.string() + ": ", 0), 0u) << log[1];
  EXPECT_NE(log[1].find("truncated"), std::string::npos) << log[1];
  EXPECT_NE(log[2].find("the manifest says step 10"), std::string::npos)
    << log[2];
  // Without a log the same answer, silently.
  EXPECT_EQ(latest_checkpoint(root.path(), {}), latest);
}

TEST(runtime_checkpoint_files, prune_keeps_the_newest_complete_checkpoints) {
  temp_dir root;
  temp_dir outside;
  const auto layers = sample_layers();
  for (int step = 1; step <= 5; ++step)
    write_checkpoint(root.path(), sample_manifest(step), layers);
  // Not this job's to remove: a step directory without a manifest, a
  // newer one being written, another job's checkpoint and partial save,
  // and a link to a directory elsewhere.
  fs::create_directories(checkpoint_dir(root.path(), 0));
  fs::create_directories(checkpoint_dir(root.path(), 6));
  auto other = sample_manifest(1);
  other.job_id = "fedcba9876543210fedcba9876543210";
  write_checkpoint(root.path() / "other", other, layers);
  fs::rename(checkpoint_dir(root.path() / "other", 1),
             root.path() / "step-00000001.partial-x");
  other.step = 7;
  write_checkpoint(root.path(), other, layers);
  fs::create_directories(outside.path() / "kept");
  fs::create_directory_symlink(outside.path(), checkpoint_dir(root.path(), 8));
  // This job's abandoned save of step 2.
  fs::create_directories(partial_checkpoint_dir(root.path(), 2, sample_job_id));
  EXPECT_THROW(prune_checkpoints(root.path(), 0, sample_job_id),
               internal_error);

  auto removed = prune_checkpoints(root.path(), 2, sample_job_id);
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed,
            (std::vector<fs::path>{
              checkpoint_dir(root.path(), 1), checkpoint_dir(root.path(), 2),
              partial_checkpoint_dir(root.path(), 2, sample_job_id),
              checkpoint_dir(root.path(), 3)}));
  for (int step : {0, 4, 5, 6, 7, 8})
    EXPECT_TRUE(fs::exists(checkpoint_dir(root.path(), step))) << step;
  EXPECT_TRUE(fs::exists(root.path() / "step-00000001.partial-x"));
  EXPECT_TRUE(fs::exists(outside.path() / "kept"));
  EXPECT_NO_THROW(read_checkpoint(checkpoint_dir(root.path(), 4)));

  EXPECT_EQ(prune_checkpoints(root.path(), 1, sample_job_id),
            std::vector<fs::path>{checkpoint_dir(root.path(), 4)});
  EXPECT_TRUE(prune_checkpoints(root.path(), 1, sample_job_id).empty());
  // Another job's prune leaves this job's checkpoint alone.
  EXPECT_TRUE(prune_checkpoints(root.path(), 1, other.job_id).empty());
  EXPECT_TRUE(fs::exists(checkpoint_dir(root.path(), 5)));

  // With no complete checkpoint, nothing goes.
  temp_dir only_partial;
  fs::create_directories(
    partial_checkpoint_dir(only_partial.path(), 1, sample_job_id));
  EXPECT_TRUE(prune_checkpoints(only_partial.path(), 1, sample_job_id).empty());
}

// Issue 24: links planted in checkpoint.dir by someone who can write there
// make no save write outside it. A step directory that is a link (or
// another job's) is refused, never written through or replaced; the
// marker's temporary file and an abandoned partial save that are links
// are replaced, the files they point at untouched.
TEST(runtime_checkpoint_files, planted_links_make_no_save_write_outside) {
  temp_dir root;
  temp_dir outside;
  const std::vector<std::uint8_t> precious = {'k', 'e', 'e', 'p'};
  write_bytes(outside.path() / "manifest.json", precious);
  write_bytes(outside.path() / "file", precious);
  fs::create_directory_symlink(outside.path(), checkpoint_dir(root.path(), 2));
  fs::create_directory_symlink(
    outside.path(), partial_checkpoint_dir(root.path(), 4, sample_job_id));
  fs::create_symlink(outside.path() / "file",
                     root.path() / "h2-job-marker.tmp");

  try {
    write_checkpoint(root.path(), sample_manifest(2), sample_layers());
    FAIL() << "a save replaced a link";
  } catch (const checkpoint_error& e) {
    EXPECT_NE(std::string(e.what()).find("not a checkpoint of this job"),
              std::string::npos)
      << e.what();
  }
  const auto four =
    write_checkpoint(root.path(), sample_manifest(4), sample_layers());
  EXPECT_EQ(read_checkpoint(four).layers, sample_layers());
  EXPECT_FALSE(fs::is_symlink(four));
  write_checkpoint_marker(root.path());
  EXPECT_EQ(read_bytes(outside.path() / "manifest.json"), precious);
  EXPECT_EQ(read_bytes(outside.path() / "file"), precious);
  EXPECT_EQ(std::distance(fs::directory_iterator(outside.path()),
                          fs::directory_iterator()),
            2);
}

// --- Crashes: a child writes step 20 next to a complete step 10 and is
// killed at one point of the write path. ---

/// Forks a child that sets H2_TEST_CRASH_AT=`point` and writes step
/// `step`; returns its wait status.
int write_in_child_crashing_at(const fs::path& root, const char* point,
                               std::int64_t step) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("H2_TEST_CRASH_AT", point, 1);
    try {
      write_checkpoint(root, sample_manifest(step), sample_layers());
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0); // the crash point was never reached
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid)
    ADD_FAILURE() << "fork/waitpid: " << std::strerror(errno);
  return status;
}

TEST(runtime_checkpoint_files, a_crash_while_writing_never_yields_a_partial) {
  for (const char* point :
       {"before-layer-file", "after-layer-file", "before-manifest",
        "after-manifest-rename", "after-publish"}) {
    SCOPED_TRACE(point);
    temp_dir root;
    const auto older =
      write_checkpoint(root.path(), sample_manifest(10), sample_layers());
    const int status = write_in_child_crashing_at(root.path(), point, 20);
    ASSERT_TRUE(WIFSIGNALED(status))
      << "the child exited with " << WEXITSTATUS(status);
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
    EXPECT_EQ(read_checkpoint(older).layers, sample_layers());

    std::vector<std::string> log;
    const auto latest = latest_checkpoint(
      root.path(), [&](const std::string& l) { log.push_back(l); });
    const auto newer = checkpoint_dir(root.path(), 20);
    // Before the rename that publishes it, the save is a partial
    // directory: never a candidate, so not even a skipped one.
    EXPECT_TRUE(log.empty());
    if (std::string_view(point) == "after-publish") {
      EXPECT_EQ(latest, newer);
      const auto c = read_checkpoint(newer);
      EXPECT_EQ(c.manifest.step, 20);
      EXPECT_EQ(c.layers, sample_layers());
    } else {
      EXPECT_EQ(latest, older);
      EXPECT_THROW(read_checkpoint(newer), checkpoint_error);
    }
  }
}

TEST(runtime_checkpoint_files, rewriting_a_step_keeps_it_until_the_new_one) {
  temp_dir root;
  write_checkpoint(root.path(), sample_manifest(10), sample_layers());
  write_checkpoint(root.path(), sample_manifest(20), sample_layers());
  const int status =
    write_in_child_crashing_at(root.path(), "after-layer-file", 20);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(latest_checkpoint(root.path(), {}),
            checkpoint_dir(root.path(), 20));
  EXPECT_EQ(read_checkpoint(checkpoint_dir(root.path(), 20)).layers,
            sample_layers());
  // Rewritten whole, it replaces the old one.
  write_checkpoint(root.path(), sample_manifest(20), sample_layers());
  EXPECT_EQ(read_checkpoint(checkpoint_dir(root.path(), 20)).manifest.step, 20);
}

// --- The safetensors writer is the `--export` writer's drop-in. ---

TEST(runtime_checkpoint_files, write_safetensors_matches_the_export_layout) {
  temp_dir dir;
  const std::vector<exported_param> params = {
    {"b", {3}, {1.0f, -2.0f, 0.5f}},
    {"a.weight", {2, 2}, {0.25f, 4.0f, -1.0f, 8.0f}}};
  std::vector<state_tensor> tensors;
  for (const auto& p : params)
    tensors.push_back(f32_tensor(p.name, p.shape, p.values));
  const auto path = dir.path() / "weights.safetensors";
  const written_file w = write_safetensors(path, tensors, {{"job", "demo"}});

  const auto bytes = read_bytes(path);
  EXPECT_EQ(bytes,
            export_layout(
              params, {{"format", "pt"}, {"producer", "h2"}, {"job", "demo"}}));
  EXPECT_EQ(w.bytes, bytes.size());
  EXPECT_EQ(w.crc32c, crc32c(bytes.data(), bytes.size()));
  const std::string header(bytes.begin() + 8,
                           bytes.begin() + 8 + header_length(bytes));
  EXPECT_EQ(
    header,
    R"({"__metadata__":{"format":"pt","job":"demo","producer":"h2"},)"
    R"("a.weight":{"data_offsets":[12,28],"dtype":"F32","shape":[2,2]},)"
    R"("b":{"data_offsets":[0,12],"dtype":"F32","shape":[3]}})"
    "     "); // 155 bytes + 5 spaces: the data starts at 8 + 160

  // The generic reader takes it back, in data order.
  safetensors_reader reader(path);
  std::uint32_t crc = 0;
  EXPECT_EQ(reader.read_tensors(crc), tensors);
  EXPECT_EQ(crc, w.crc32c);
  EXPECT_THROW(write_safetensors(path, tensors, {{"producer", "x"}}),
               internal_error);
}

// The background writer (runtime/checkpointing.hpp): layer files from any
// number of write_layers calls (one per chip), then the manifest; and a
// save abandoned part-way (a second signal) publishes nothing.

TEST(runtime_checkpoint_writer, writes_layers_then_publishes_the_manifest) {
  temp_dir root;
  auto layers = sample_layers();
  const auto id = identity_of(sample_manifest(4));
  prepare_checkpoint_dir(root.path(), id);
  std::vector<file_record> records;
  {
    checkpoint_writer writer(root.path(), 2);
    std::promise<void> written;
    // Two chips: layers {0, 1} and {2}, any order of completion.
    auto part = [&](std::vector<layer_state> mine, bool last) {
      writer.write_layers(id, std::move(mine),
                          [&, last](std::vector<file_record> r,
                                    std::exception_ptr e) {
                            ASSERT_FALSE(e);
                            records.insert(records.end(), r.begin(), r.end());
                            if (last)
                              written.set_value();
                          });
    };
    part({layers[0], layers[1]}, false);
    part({layers[2]}, true);
    written.get_future().wait();
    auto manifest = sample_manifest(4);
    manifest.files = records;
    std::promise<std::exception_ptr> published;
    writer.publish(manifest, [&](std::exception_ptr e) {
      published.set_value(e);
    });
    EXPECT_FALSE(published.get_future().get());
  }
  auto back = read_checkpoint(checkpoint_dir(root.path(), 4));
  EXPECT_EQ(back.manifest.files, records);
  EXPECT_EQ(back.layers, layers);
}

TEST(runtime_checkpoint_writer, an_abandoned_save_publishes_nothing) {
  temp_dir root;
  auto layers = sample_layers();
  auto manifest = sample_manifest(2);
  write_checkpoint(root.path(), manifest, layers);

  checkpoint_writer writer(root.path(), 2);
  // Hold the writer's thread inside a first write's callback, queue the
  // save of step 4 behind it, abandon, then let go.
  std::promise<void> holding, release;
  writer.write_layers(identity_of(sample_manifest(2)), {layers[0]},
                      [&](std::vector<file_record>, std::exception_ptr) {
                        holding.set_value();
                        release.get_future().wait();
                      });
  holding.get_future().wait();
  prepare_checkpoint_dir(root.path(), identity_of(sample_manifest(4)));
  int cancelled = 0;
  writer.write_layers(identity_of(sample_manifest(4)), layers,
                      [&](std::vector<file_record> r, std::exception_ptr e) {
                        EXPECT_TRUE(r.empty());
                        EXPECT_THROW(std::rethrow_exception(e),
                                     cancelled_error);
                        ++cancelled;
                      });
  manifest.step = 4;
  writer.publish(manifest, [&](std::exception_ptr e) {
    EXPECT_THROW(std::rethrow_exception(e), cancelled_error);
    ++cancelled;
  });
  writer.abandon();
  release.set_value();
  writer.close();
  EXPECT_EQ(cancelled, 2); // both told, so nobody waits for them
  EXPECT_FALSE(fs::exists(checkpoint_dir(root.path(), 4) / manifest_file_name));
  EXPECT_EQ(latest_checkpoint(root.path(), nullptr),
            checkpoint_dir(root.path(), 2));
  EXPECT_NO_THROW(read_checkpoint(checkpoint_dir(root.path(), 2)));
}

TEST(runtime_checkpoint_writer, the_marker_tells_nodes_apart_by_directory) {
  temp_dir root;
  const auto marker = write_checkpoint_marker(root.path() / "shared");
  EXPECT_NO_THROW(
    check_checkpoint_marker(root.path() / "shared", marker, 1));
  try {
    check_checkpoint_marker(root.path() / "elsewhere", marker, 3);
    FAIL() << "a directory without the marker was accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint.dir"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("node 3"), std::string::npos);
  }
  EXPECT_THROW(check_checkpoint_marker(root.path() / "shared",
                                       write_checkpoint_marker(root.path()), 1),
               config_error);
}

} // namespace
} // namespace h2::runtime
