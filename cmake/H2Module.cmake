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
endfunction()

# h2_add_test(<name> SOURCES ... DEPS ... [TIMEOUT s] [LABELS ...])
# One GoogleTest executable per module, registered with CTest. Each test case
# becomes its own CTest entry with the given timeout.
include(GoogleTest)
function(h2_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE h2_flags ${ARG_DEPS} GTest::gtest
                                        GTest::gtest_main)
  # tests/test_jobs.hpp: the job fixtures every suite shares.
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE
    H2_SOURCE_DIR="${PROJECT_SOURCE_DIR}" H2_BINARY_DIR="${PROJECT_BINARY_DIR}")
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}")
endfunction()
