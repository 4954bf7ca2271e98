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
