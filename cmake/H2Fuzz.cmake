# H2_FUZZ: the fuzz targets of fuzz/ as libFuzzer binaries (docs/fuzzing.md,
# `make fuzz`). Needs clang with libFuzzer (clang-14, libclang-rt-14-dev)
# and the Sanitize build type, whose ASan + UBSan (H2Flags.cmake) then run
# under libFuzzer; H2's code also gets libFuzzer's coverage
# instrumentation. Without it, the same targets are corpus-replay drivers
# that ctest runs (fuzz_replay.<name>).
option(H2_FUZZ "Build the fuzz targets as libFuzzer binaries (clang)" OFF)

if(H2_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "H2_FUZZ=ON needs clang (libFuzzer), not "
                        "${CMAKE_CXX_COMPILER_ID}: configure with "
                        "CXX=clang++-14 (make fuzz does)")
  endif()
  if(NOT CMAKE_BUILD_TYPE STREQUAL "Sanitize")
    message(FATAL_ERROR "H2_FUZZ=ON needs CMAKE_BUILD_TYPE=Sanitize "
                        "(ASan + UBSan under libFuzzer), not "
                        "'${CMAKE_BUILD_TYPE}'")
  endif()
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_FLAGS -fsanitize=fuzzer)
  check_cxx_source_compiles([[
    #include <cstddef>
    #include <cstdint>
    extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) {
      return 0;
    }]] H2_HAS_LIBFUZZER)
  unset(CMAKE_REQUIRED_FLAGS)
  if(NOT H2_HAS_LIBFUZZER)
    message(FATAL_ERROR "H2_FUZZ=ON: ${CMAKE_CXX_COMPILER} cannot link "
                        "-fsanitize=fuzzer (install libclang-rt-14-dev)")
  endif()
  target_compile_options(h2_flags INTERFACE -fsanitize=fuzzer-no-link)
endif()
