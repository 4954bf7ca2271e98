// The safetensors writer and the hostile-input reader (docs/checkpoints.md).
#include "h2/runtime/safetensors.hpp"

#include "checkpoint_io.hpp"
#include "h2/core/crc32c.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>

#include <fcntl.h>
#include <unistd.h>

namespace h2::runtime {
namespace {

using nlohmann::json;

/// Elements of `shape`, or nullopt if a dimension is negative or the product
/// (times `element_bytes`) overflows 64 bits.
std::optional<std::uint64_t> shape_bytes(std::span<const std::int64_t> shape,
                                         std::size_t element_bytes) {
  std::uint64_t product = element_bytes;
  for (std::int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(product, static_cast<std::uint64_t>(d),
                                        &product))
      return std::nullopt;
  }
  return product;
}

void check_tensor(const state_tensor& t) {
  const std::size_t element = dtype_bytes(t.dtype);
  H2_ENFORCE(!t.name.empty() && t.name != "__metadata__", "tensor name '",
             t.name, "'");
  H2_ENFORCE(element != 0, "tensor ", t.name, " has dtype '", t.dtype, "'");
  const auto bytes = shape_bytes(t.shape, element);
  H2_ENFORCE(bytes && *bytes == t.bytes.size(), "tensor ", t.name, " holds ",
             t.bytes.size(), " bytes, its ", t.dtype, " shape needs ",
             bytes.value_or(0));
}

std::uint64_t load_le64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

} // namespace

std::size_t dtype_bytes(std::string_view dtype) noexcept {
  if (dtype == "F32")
    return 4;
  if (dtype == "BF16" || dtype == "F16")
    return 2;
  if (dtype == "I64")
    return 8;
  return 0;
}

state_tensor f32_tensor(std::string name, std::vector<std::int64_t> shape,
                        std::span<const float> values) {
  state_tensor t{std::move(name), "F32", std::move(shape), {}};
  t.bytes.resize(values.size_bytes());
  if (!values.empty())
    std::memcpy(t.bytes.data(), values.data(), values.size_bytes());
  return t;
}

written_file
write_safetensors(const std::filesystem::path& path,
                  std::span<const state_tensor> tensors,
                  const std::map<std::string, std::string>& metadata) {
  json header;
  json meta = {{"format", "pt"}, {"producer", "h2"}};
  for (const auto& [key, value] : metadata) {
    H2_ENFORCE(!meta.contains(key), "metadata may not set '", key, "'");
    meta[key] = value;
  }
  header["__metadata__"] = std::move(meta);
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    check_tensor(t);
    H2_ENFORCE(!header.contains(t.name), "tensor ", t.name, " twice");
    const std::uint64_t bytes = t.bytes.size();
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // The data starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::uint8_t length[8];
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<std::uint8_t>(text.size() >> (8 * i));

  std::vector<std::span<const std::uint8_t>> pieces;
  pieces.reserve(tensors.size() + 2);
  pieces.emplace_back(length, sizeof(length));
  pieces.emplace_back(reinterpret_cast<const std::uint8_t*>(text.data()),
                      text.size());
  for (const auto& t : tensors)
    pieces.emplace_back(t.bytes);
  return detail::write_file_synced(path, pieces);
}

safetensors_reader::safetensors_reader(
  std::filesystem::path path, std::optional<std::uint64_t> expected_bytes)
    : path_(std::move(path)) {
  fd_ = detail::open_for_reading(path_, file_bytes_);
  try {
    // A file whose size the caller trusts was not cut short: a header that
    // runs past its end is damage in the header itself.
    checkpoint_errc overrun = checkpoint_errc::truncated;
    if (expected_bytes) {
      if (file_bytes_ < *expected_bytes)
        throw checkpoint_error(checkpoint_errc::truncated, path_,
                               "the file has " + std::to_string(file_bytes_) +
                                 " bytes, the manifest says " +
                                 std::to_string(*expected_bytes));
      if (file_bytes_ > *expected_bytes)
        throw checkpoint_error(checkpoint_errc::mismatch, path_,
                               "the file has " + std::to_string(file_bytes_) +
                                 " bytes, the manifest says " +
                                 std::to_string(*expected_bytes));
      overrun = checkpoint_errc::corrupt;
    }
    if (file_bytes_ < 8)
      throw checkpoint_error(overrun, path_,
                             "the file has " + std::to_string(file_bytes_) +
                               " bytes, less than the 8-byte header length");
    std::uint8_t prefix[8];
    detail::read_exact(fd_, prefix, sizeof(prefix), path_);
    const std::uint64_t header_bytes = load_le64(prefix);
    if (header_bytes > max_safetensors_header_bytes)
      throw checkpoint_error(checkpoint_errc::corrupt, path_,
                             "header length " + std::to_string(header_bytes) +
                               " is over the limit of " +
                               std::to_string(max_safetensors_header_bytes));
    if (header_bytes > file_bytes_ - 8)
      throw checkpoint_error(overrun, path_,
                             "header length " + std::to_string(header_bytes) +
                               " runs past the end of the file (" +
                               std::to_string(file_bytes_) + " bytes)");
    std::string text(header_bytes, '\0');
    detail::read_exact(fd_, text.data(), text.size(), path_);
    header_crc32c_ = h2::crc32c(prefix, sizeof(prefix));
    header_crc32c_ = h2::crc32c(text.data(), text.size(), header_crc32c_);
    data_bytes_ = file_bytes_ - 8 - header_bytes;
    parse_header(text, overrun);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

safetensors_reader::~safetensors_reader() {
  ::close(fd_);
}

void safetensors_reader::parse_header(const std::string& text,
                                      checkpoint_errc overrun) {
  auto bad = [&](const std::string& why) {
    return checkpoint_error(checkpoint_errc::corrupt, path_, why);
  };
  detail::check_json_depth(text, path_);
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw bad(std::string("the header is not JSON: ") + e.what());
  }
  if (!header.is_object())
    throw bad("the header is not a JSON object");
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object())
        throw bad("__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string())
          throw bad("__metadata__." + key + " is not a string");
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor " + name;
    if (!entry.is_object() || entry.size() != 3 || !entry.contains("dtype") ||
        !entry.contains("shape") || !entry.contains("data_offsets"))
      throw bad(where + ": expected exactly dtype, shape and data_offsets");
    const json& dtype = entry["dtype"];
    const json& shape = entry["shape"];
    const json& offsets = entry["data_offsets"];
    if (!dtype.is_string() || dtype_bytes(dtype.get<std::string>()) == 0)
      throw bad(where + ": unknown dtype " + dtype.dump() +
                " (H2 reads F32, BF16, F16, I64)");
    if (!shape.is_array())
      throw bad(where + ": shape is not an array");
    tensor_record record{name, dtype.get<std::string>(), {}};
    for (const json& d : shape) {
      if (!d.is_number_unsigned() ||
          d.get<std::uint64_t>() > static_cast<std::uint64_t>(
                                     std::numeric_limits<std::int64_t>::max()))
        throw bad(where + ": shape " + shape.dump() +
                  " is not a list of sizes");
      record.shape.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
    }
    if (!offsets.is_array() || offsets.size() != 2 ||
        !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      throw bad(where + ": data_offsets " + offsets.dump() +
                " is not [begin, end]");
    const span_in_file span{offsets[0].get<std::uint64_t>(),
                            offsets[1].get<std::uint64_t>()};
    if (span.begin > span.end)
      throw bad(where + ": data_offsets " + offsets.dump() +
                " end before they begin");
    if (span.end > data_bytes_)
      throw checkpoint_error(overrun, path_,
                             where + ": data_offsets " + offsets.dump() +
                               " run past the end of the data (" +
                               std::to_string(data_bytes_) + " bytes)");
    const auto expected = shape_bytes(record.shape, dtype_bytes(record.dtype));
    if (!expected || *expected != span.end - span.begin)
      throw bad(where + ": data_offsets " + offsets.dump() + " span " +
                std::to_string(span.end - span.begin) + " bytes, its " +
                record.dtype + " shape " + shape.dump() + " needs " +
                (expected ? std::to_string(*expected) : "more than 2^64"));
    records_.push_back(std::move(record));
    spans_.push_back(span);
  }
  // File order: by offset. The tensors must tile the data exactly.
  std::vector<std::size_t> order(records_.size());
  for (std::size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::pair(spans_[a].begin, spans_[a].end) <
           std::pair(spans_[b].begin, spans_[b].end);
  });
  std::vector<tensor_record> records;
  std::vector<span_in_file> spans;
  std::uint64_t at = 0;
  for (std::size_t i : order) {
    if (spans_[i].begin < at)
      throw bad("tensor " + records_[i].name +
                " overlaps the tensor before it (data_offsets begin at " +
                std::to_string(spans_[i].begin) + ", the previous ends at " +
                std::to_string(at) + ")");
    if (spans_[i].begin > at)
      throw bad("a gap of " + std::to_string(spans_[i].begin - at) +
                " bytes before tensor " + records_[i].name);
    at = spans_[i].end;
    records.push_back(std::move(records_[i]));
    spans.push_back(spans_[i]);
  }
  if (at != data_bytes_)
    throw bad(std::to_string(data_bytes_ - at) +
              " bytes after the last tensor's data");
  records_ = std::move(records);
  spans_ = std::move(spans);
}

std::vector<state_tensor>
safetensors_reader::read_tensors(std::uint32_t& crc32c) {
  H2_ENFORCE(::lseek(fd_, 0, SEEK_CUR) ==
               static_cast<off_t>(file_bytes_ - data_bytes_),
             "read_tensors called twice on ", path_.string());
  // The disk reads ahead of the tensor being read while it is allocated
  // and checksummed (docs/benchmarks.md, Checkpoints): a hint for the next
  // read_ahead_bytes past each tensor, so a huge file is not asked for at
  // once. Offsets are within the file (checked). Errors do not matter.
  constexpr std::uint64_t read_ahead_bytes = 64ull << 20;
  const std::uint64_t data_start = file_bytes_ - data_bytes_;
  std::uint64_t hinted = 0; // relative to data_start
  std::vector<state_tensor> tensors;
  tensors.reserve(records_.size());
  std::uint32_t crc = header_crc32c_;
  for (std::size_t i = 0; i < records_.size(); ++i) {
    const std::uint64_t want =
      std::min(data_bytes_, spans_[i].end + read_ahead_bytes);
    if (want > hinted) {
      ::posix_fadvise(fd_, static_cast<off_t>(data_start + hinted),
                      static_cast<off_t>(want - hinted), POSIX_FADV_WILLNEED);
      hinted = want;
    }
    // Sizes were checked against the file's size: this allocates at most
    // what the file holds.
    state_tensor t{records_[i].name, records_[i].dtype, records_[i].shape,
                   std::vector<std::uint8_t>(spans_[i].end - spans_[i].begin)};
    detail::read_exact(fd_, t.bytes.data(), t.bytes.size(), path_);
    crc = h2::crc32c(t.bytes.data(), t.bytes.size(), crc);
    tensors.push_back(std::move(t));
  }
  crc32c = crc;
  return tensors;
}

} // namespace h2::runtime
