# Runs inside ctest (docs/conventions.md, "Tests"): registers one CTest
# entry per GoogleTest suite of a test executable, which runs that suite's
# tests in one process. Every test of an H2 executable starts libtorch (and
# often a CAF actor system), about a second before the test itself; one
# process per suite rather than per test is what keeps the suite inside
# CI's budget. `ctest -R <suite>` still picks a suite, and a test can be run
# alone with the executable's --gtest_filter.
#
# h2_add_suite_tests(EXE PREFIX FILTER TIMEOUT LABELS WORKDIR LIST_FILE
#                    EXCLUSIONS STAGE)
#   FILTER     gtest filter of the tests to run ("" for all)
#   TIMEOUT    seconds per test; a suite of N tests gets N times that, at
#              most 1800 s
#   EXCLUSIONS tests/sanitizer-exclusions.txt: tests left out of a sanitizer
#              STAGE (asan, tsan; "" in other builds), each with its reason
#   LIST_FILE  where the executable's --gtest_list_tests output is kept
#              until the executable changes
function(h2_add_suite_tests exe prefix filter timeout labels workdir list_file
         exclusions stage)
  if(NOT EXISTS "${exe}")
    add_test("${prefix}NOT_BUILT" "${exe}")
    return()
  endif()
  if(NOT EXISTS "${list_file}" OR "${exe}" IS_NEWER_THAN "${list_file}")
    set(list_args --gtest_list_tests)
    if(filter)
      list(APPEND list_args "--gtest_filter=${filter}")
    endif()
    execute_process(COMMAND "${exe}" ${list_args}
                    WORKING_DIRECTORY "${workdir}"
                    OUTPUT_VARIABLE listing RESULT_VARIABLE rc
                    TIMEOUT 120)
    if(NOT rc EQUAL 0)
      add_test("${prefix}LIST_FAILED" "${exe}" --gtest_list_tests)
      return()
    endif()
    # Parameter comments ("  # GetParam() = [1, 2]") would only confuse
    # CMake's lists.
    string(REGEX REPLACE "  #[^\n]*" "" listing "${listing}")
    file(WRITE "${list_file}" "${listing}")
  endif()
  file(STRINGS "${list_file}" lines)

  # Negative patterns for this sanitizer stage.
  set(skip "")
  if(stage AND EXISTS "${exclusions}")
    file(STRINGS "${exclusions}" rules REGEX "^${stage}[ \t]")
    foreach(rule IN LISTS rules)
      string(REGEX REPLACE "^${stage}[ \t]+([^ \t]+).*" "\\1" pattern "${rule}")
      string(APPEND skip ":${pattern}")
    endforeach()
    string(REGEX REPLACE "^:" "" skip "${skip}")
  endif()

  # Suites, in the order the executable lists them, each with its tests
  # (those FILTER lets through), named one by one.
  set(suites "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^([^ #][^ ]*)\\.")
      set(suite "${CMAKE_MATCH_1}")
      list(APPEND suites "${suite}")
      set(tests_${suite} "")
    elseif(line MATCHES "^  ([^ ]+)" AND DEFINED suite)
      list(APPEND tests_${suite} "${suite}.${CMAKE_MATCH_1}")
    endif()
  endforeach()
  foreach(suite IN LISTS suites)
    list(LENGTH tests_${suite} count)
    string(REPLACE ";" ":" gtest_filter "${tests_${suite}}")
    if(skip)
      string(APPEND gtest_filter "-${skip}")
    endif()
    math(EXPR suite_timeout "${timeout} * ${count}")
    if(suite_timeout GREATER 1800)
      set(suite_timeout 1800)
    endif()
    add_test("${prefix}${suite}" "${exe}" "--gtest_filter=${gtest_filter}")
    # COST orders a clean build's first run (later runs use the times ctest
    # measured): suites with many slow-bounded tests start first, so the
    # long end-to-end suites do not run alone at the end of `ctest -j`.
    set_tests_properties("${prefix}${suite}" PROPERTIES
      TIMEOUT ${suite_timeout} LABELS "${labels}" COST ${suite_timeout}
      WORKING_DIRECTORY "${workdir}")
  endforeach()
endfunction()
