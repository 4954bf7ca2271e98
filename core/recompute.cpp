#include "h2/core/recompute.hpp"

#include <cctype>
#include <charconv>

namespace h2 {

std::string to_string(const recompute_policy& p) {
  if (p.full)
    return "full";
  if (p.blocks == 0)
    return p.attention ? "attention" : "none";
  std::string out =
    std::to_string(p.blocks) + (p.blocks == 1 ? " block" : " blocks");
  return p.attention ? out + " + attention" : out;
}

recomputed_part recomputed_part_of(const recompute_policy& p, layer_kind kind,
                                   int block) noexcept {
  if (p.full)
    return recomputed_part::forward;
  if (kind != layer_kind::block)
    return recomputed_part::nothing;
  if (block < p.blocks)
    return recomputed_part::forward;
  return p.attention ? recomputed_part::attention : recomputed_part::nothing;
}

namespace {

std::string without_spaces(std::string_view text) {
  std::string out;
  for (char c : text)
    if (std::isspace(static_cast<unsigned char>(c)) == 0)
      out += c;
  return out;
}

} // namespace

std::optional<recompute_policy> parse_recompute(std::string_view text) {
  const std::string s = without_spaces(text);
  if (s == "none")
    return recompute_policy::none();
  if (s == "full")
    return recompute_policy::whole();
  if (s == "attention")
    return recompute_policy{false, 0, true};
  recompute_policy p;
  const char* end = s.data() + s.size();
  auto [rest, ec] = std::from_chars(s.data(), end, p.blocks);
  if (ec != std::errc() || p.blocks < 0 || rest == s.data())
    return std::nullopt;
  std::string_view tail(rest, static_cast<std::size_t>(end - rest));
  if (tail.starts_with("blocks"))
    tail.remove_prefix(6);
  else if (tail.starts_with("block"))
    tail.remove_prefix(5);
  else
    return std::nullopt;
  if (tail == "+attention")
    p.attention = true;
  else if (!tail.empty())
    return std::nullopt;
  return p;
}

} // namespace h2
