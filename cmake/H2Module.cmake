# h2_add_module(<name> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# Creates library h2_<name> (alias h2::<name>) whose public headers live in
# <name>/include/h2/<name>/ and whose sources sit beside them in <name>/.
function(h2_add_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(h2_${name} STATIC ${ARG_SOURCES})
  add_library(h2::${name} ALIAS h2_${name})
  target_include_directories(h2_${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>)
  target_link_libraries(h2_${name} PUBLIC h2_flags ${ARG_PUBLIC_DEPS}
                                   PRIVATE ${ARG_PRIVATE_DEPS})
  set_target_properties(h2_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  h2_unity(h2_${name})
endfunction()

# h2_unity(<target>)
# Compiles a module's or a test executable's files eight to a translation
# unit (CMake's unity build), so libtorch's, CAF's and GoogleTest's headers
# are parsed once per batch: a third to a half less compile time (and less
# than precompiled headers, which cost more to build than batches of one
# or two translation units save: docs/benchmarks.md). Each file
# still compiles alone (-DH2_UNITY=OFF checks that), so names at file scope
# are unique within a directory; a file that cannot share a batch says why
# with SKIP_UNITY_BUILD_INCLUSION.
option(H2_UNITY "Compile modules and test executables in unity batches" ON)
function(h2_unity target)
  if(H2_UNITY)
    set_target_properties(${target} PROPERTIES
      UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
endfunction()

# h2_add_suites(<target> [PREFIX p] [FILTER f] [TIMEOUT s] [LABELS ...])
# Registers one CTest entry per GoogleTest suite of <target>, found when
# ctest runs (cmake/H2TestSuites.cmake): FILTER picks the tests, TIMEOUT is
# per test, and sanitizer builds leave out what
# tests/sanitizer-exclusions.txt lists for them.
function(h2_add_suites target)
  cmake_parse_arguments(ARG "" "PREFIX;FILTER;TIMEOUT" "LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  set(stage "")
  if(CMAKE_BUILD_TYPE STREQUAL "Sanitize")
    set(stage asan)
  elseif(CMAKE_BUILD_TYPE STREQUAL "ThreadSanitize")
    set(stage tsan)
  endif()
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake")
  file(GENERATE OUTPUT "${include_file}" CONTENT
"include(\"${PROJECT_SOURCE_DIR}/cmake/H2TestSuites.cmake\")
h2_add_suite_tests(\"$<TARGET_FILE:${target}>\" \"${ARG_PREFIX}\"
  \"${ARG_FILTER}\" ${ARG_TIMEOUT} \"${ARG_LABELS}\"
  \"${CMAKE_CURRENT_BINARY_DIR}\"
  \"${CMAKE_CURRENT_BINARY_DIR}/${target}_tests.txt\"
  \"${PROJECT_SOURCE_DIR}/tests/sanitizer-exclusions.txt\" \"${stage}\")
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()

# h2_add_test(<name> SOURCES ... DEPS ... [TIMEOUT s] [LABELS ...])
# One GoogleTest executable per module, compiled in unity batches
# (h2_unity) and registered with CTest a suite per entry (h2_add_suites)
# with the given timeout per test (h2_add_suites' default without one).
function(h2_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  h2_unity(${name})
  target_link_libraries(${name} PRIVATE h2_flags ${ARG_DEPS} GTest::gtest
                                        GTest::gtest_main)
  # tests/test_jobs.hpp: the job fixtures every suite shares.
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE
    H2_SOURCE_DIR="${PROJECT_SOURCE_DIR}" H2_BINARY_DIR="${PROJECT_BINARY_DIR}")
  h2_add_suites(${name} TIMEOUT ${ARG_TIMEOUT} LABELS ${ARG_LABELS})
endfunction()
