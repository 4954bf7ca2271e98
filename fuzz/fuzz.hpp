// What every fuzz target shares (docs/fuzzing.md): the one rule for what a
// decoder may do with bad input, and how a target reports a broken
// property. Each target is a `<name>_fuzz.cpp` defining
// LLVMFuzzerTestOneInput; under clang it runs under libFuzzer, under g++
// replay_main.cpp feeds it its corpus.
#pragma once

#include "h2/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>

namespace h2::fuzz {

/// Ends the run as a finding: libFuzzer saves the input that got here,
/// the replay driver names its file.
[[noreturn]] inline void finding(std::string_view what,
                                 std::string_view detail = {}) {
  std::fprintf(stderr, "h2 fuzz finding: %.*s%s%.*s\n",
               static_cast<int>(what.size()), what.data(),
               detail.empty() ? "" : ": ", static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

/// A property of the decoder's output that must hold for any input.
inline void require(bool holds, std::string_view property) {
  if (!holds)
    finding("broken property", property);
}

/// Runs `decode`. Bad input must end in the errors the project documents
/// for it: h2::error and its subclasses (core/error.hpp). An
/// internal_error is a broken invariant, a bug in H2 whatever the input,
/// and anything else (std::out_of_range, a library's own exception type)
/// escapes on purpose: both are findings. Returns whether `decode`
/// returned.
template <class Decode>
bool decodes(Decode&& decode) {
  try {
    decode();
    return true;
  } catch (const internal_error& e) {
    finding("internal_error from outside bytes", e.what());
  } catch (const error&) {
    return false;
  }
}

/// The input as text, as a decoder of text sees it.
inline std::string_view as_text(const std::uint8_t* data, std::size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// The input as bytes.
inline std::span<const std::byte> as_bytes(const std::uint8_t* data,
                                           std::size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

} // namespace h2::fuzz
