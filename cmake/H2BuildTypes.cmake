# Build types: Debug, Release, RelWithDebInfo, Sanitize (ASan + UBSan) and
# ThreadSanitize (TSan; .ci/run runs the transport and runtime tests with it).
# The sanitizer flags themselves are attached to the h2_flags target
# (H2Flags.cmake), never to CMAKE_CXX_FLAGS.
set(_h2_build_types Debug Release RelWithDebInfo Sanitize ThreadSanitize)
if(NOT CMAKE_BUILD_TYPE AND NOT CMAKE_CONFIGURATION_TYPES)
  set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type" FORCE)
endif()
set_property(CACHE CMAKE_BUILD_TYPE PROPERTY STRINGS ${_h2_build_types})
if(CMAKE_BUILD_TYPE AND NOT CMAKE_BUILD_TYPE IN_LIST _h2_build_types)
  message(FATAL_ERROR "CMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}: expected one of "
                      "${_h2_build_types}")
endif()
