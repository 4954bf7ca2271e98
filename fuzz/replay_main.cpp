// The corpus-replay driver (docs/fuzzing.md): where libFuzzer is not
// linked (g++ builds), each fuzz target is this main() plus its
// LLVMFuzzerTestOneInput, run by ctest over its seed corpus as
// `fuzz_replay.<name>`. Feeds every file of the directories (and files)
// given, in name order, once each; a finding aborts naming the file.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data,
                                      std::size_t size);

namespace {

namespace fs = std::filesystem;

/// The file being replayed, for the message when it ends the process.
std::string current_input;

[[noreturn]] void on_terminate() {
  std::string what = "no exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = std::string("an uncaught exception: ") + x.what();
    } catch (...) {
      what = "an uncaught exception of unknown type";
    }
  }
  std::fprintf(stderr, "fuzz replay: %s ended in std::terminate (%s)\n",
               current_input.c_str(), what.c_str());
  std::abort();
}

std::vector<std::uint8_t> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "fuzz replay: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  return {std::istreambuf_iterator<char>(in), {}};
}

} // namespace

int main(int argc, char** argv) {
  std::set_terminate(on_terminate);
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    if (!fs::is_directory(arg)) {
      inputs.push_back(arg);
      continue;
    }
    for (const auto& entry : fs::directory_iterator(arg))
      if (entry.is_regular_file())
        inputs.push_back(entry.path());
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...: no inputs\n",
                 argv[0]);
    return 2;
  }
  std::sort(inputs.begin(), inputs.end());
  for (const auto& path : inputs) {
    current_input = path.string();
    // A copy of exactly the file's size, so that a read past the end is
    // one past a heap block (ASan builds see it).
    const auto bytes = read_file(path);
    std::vector<std::uint8_t> input(bytes);
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("fuzz replay: %zu inputs, no finding\n", inputs.size());
  return 0;
}
