#include "h2/corpus/tokenizer.hpp"

#include "h2/core/error.hpp"
#include "h2/corpus/shards.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <unordered_map>

namespace h2::corpus {

namespace spm = sentencepiece;

std::string_view to_string(tokenizer_kind kind) noexcept {
  return kind == tokenizer_kind::bpe ? "bpe" : "unigram";
}

struct tokenizer::impl {
  spm::SentencePieceProcessor processor;
};

namespace {

/// SentencePiece reads its training text through this.
class line_iterator final : public spm::SentenceIterator {
public:
  explicit line_iterator(const line_source& lines) : lines_(lines) { Next(); }

  bool done() const override { return done_; }
  void Next() override { done_ = !lines_(line_); }
  const std::string& value() const override { return line_; }
  spm::util::Status status() const override { return {}; }

private:
  const line_source& lines_;
  std::string line_;
  bool done_ = false;
};

std::unique_ptr<tokenizer::impl> processor_of(const std::string& bytes,
                                              const std::string& key,
                                              const std::string& what) {
  auto p = std::make_unique<tokenizer::impl>();
  const auto status = p->processor.LoadFromSerializedProto(bytes);
  if (!status.ok())
    throw config_error(key, what + ": not a SentencePiece model (" +
                              status.ToString() + ")");
  return p;
}

} // namespace

tokenizer::tokenizer(std::unique_ptr<impl> p, std::string bytes)
    : impl_(std::move(p)), bytes_(std::move(bytes)) {
}
tokenizer::tokenizer(tokenizer&&) noexcept = default;
tokenizer& tokenizer::operator=(tokenizer&&) noexcept = default;
tokenizer::~tokenizer() = default;

tokenizer tokenizer::load(const std::filesystem::path& path,
                          const std::string& key) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  if (!in || !(bytes << in.rdbuf()))
    throw config_error(key, path.string() + ": cannot read the tokenizer");
  auto text = bytes.str();
  auto p = processor_of(text, key, path.string());
  return tokenizer(std::move(p), std::move(text));
}

tokenizer tokenizer::train(const tokenizer_training& o,
                           const line_source& lines, const std::string& key) {
  // Lossless: see the header. "\n" is a piece of its own, so that text
  // keeps its line breaks at one id each.
  const std::unordered_map<std::string, std::string> args{
    {"vocab_size", std::to_string(o.vocab_size)},
    {"model_type", std::string(to_string(o.kind))},
    {"byte_fallback", "true"},
    {"normalization_rule_name", "identity"},
    {"remove_extra_whitespaces", "false"},
    {"add_dummy_prefix", "false"},
    {"allow_whitespace_only_pieces", "true"},
    {"split_digits", "true"},
    {"user_defined_symbols", "\n"},
    {"input_sentence_size", std::to_string(o.max_sentences)},
    {"shuffle_input_sentence", "true"},
    {"num_threads", std::to_string(std::max(1, o.threads))},
    {"minloglevel", "2"}};
  line_iterator it(lines);
  std::string bytes;
  const auto status = spm::SentencePieceTrainer::Train(args, &it, &bytes);
  if (!status.ok())
    throw config_error(key, "SentencePiece could not train a tokenizer: " +
                              status.ToString());
  auto p = processor_of(bytes, key, "the trained tokenizer");
  return tokenizer(std::move(p), std::move(bytes));
}

void tokenizer::encode(std::string_view text,
                       std::vector<std::uint32_t>& out) const {
  std::vector<int> ids;
  const auto status = impl_->processor.Encode(text, &ids);
  H2_ENFORCE(status.ok(),
             "SentencePiece could not encode: ", status.ToString());
  out.insert(out.end(), ids.begin(), ids.end());
}

std::vector<std::uint32_t> tokenizer::encode(std::string_view text) const {
  std::vector<std::uint32_t> out;
  encode(text, out);
  return out;
}

std::string tokenizer::decode(std::span<const std::uint32_t> ids) const {
  const int n = vocab_size();
  std::vector<int> in;
  in.reserve(ids.size());
  for (auto id : ids) {
    H2_ENFORCE(id < static_cast<std::uint32_t>(n), "token id ", id,
               " outside the vocabulary of ", n);
    in.push_back(static_cast<int>(id));
  }
  std::string out;
  const auto status = impl_->processor.Decode(in, &out);
  H2_ENFORCE(status.ok(),
             "SentencePiece could not decode: ", status.ToString());
  return out;
}

std::string tokenizer::piece(std::uint32_t id) const {
  H2_ENFORCE(id < static_cast<std::uint32_t>(vocab_size()), "token id ", id);
  return impl_->processor.IdToPiece(static_cast<int>(id));
}

int tokenizer::vocab_size() const {
  return impl_->processor.GetPieceSize();
}

int tokenizer::eos_id() const {
  return impl_->processor.eos_id();
}

std::string tokenizer::hash() const {
  return sha256_of(bytes_);
}

} // namespace h2::corpus
