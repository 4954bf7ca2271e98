# Checks the include rules between modules when the build is configured
# (cmake/H2CheckLayers.cmake says which); tests/CMakeLists.txt runs the same
# check as the test "layering", so an edit that breaks them fails the suite.
execute_process(
  COMMAND ${CMAKE_COMMAND} -DH2_SOURCE_DIR=${PROJECT_SOURCE_DIR}
          -P ${PROJECT_SOURCE_DIR}/cmake/H2CheckLayers.cmake
  RESULT_VARIABLE _h2_layers_result)
if(NOT _h2_layers_result EQUAL 0)
  message(FATAL_ERROR "H2: the module layering is broken (see above)")
endif()

# The size rules (docs/architecture.md, "Size rules"): no file over 700
# lines, no function over 100, outside tests, bench and fuzz.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
execute_process(
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/cmake/h2_check_lengths.py
          ${PROJECT_SOURCE_DIR}
  RESULT_VARIABLE _h2_lengths_result)
if(NOT _h2_lengths_result EQUAL 0)
  message(FATAL_ERROR "H2: a source file or function is too long (see above)")
endif()
