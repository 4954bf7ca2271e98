# FindCAF
# -------
# Finds the C++ Actor Framework (Debian's libcaf-dev ships neither a CMake
# config nor a pkg-config file).
#
# Components: core, io, openssl. Imported targets: CAF::core, CAF::io,
# CAF::openssl. Result variables: CAF_FOUND, CAF_VERSION, CAF_INCLUDE_DIR.
find_path(CAF_INCLUDE_DIR caf/all.hpp)
if(CAF_INCLUDE_DIR AND EXISTS ${CAF_INCLUDE_DIR}/caf/config.hpp)
  file(STRINGS ${CAF_INCLUDE_DIR}/caf/config.hpp _caf_version_line
       REGEX "^#define CAF_VERSION [0-9]+")
  string(REGEX REPLACE "^#define CAF_VERSION ([0-9]+).*" "\\1" _caf_v
         "${_caf_version_line}")
  # CAF_VERSION is major * 10000 + minor * 100 + patch.
  math(EXPR _caf_major "${_caf_v} / 10000")
  math(EXPR _caf_minor "(${_caf_v} / 100) % 100")
  math(EXPR _caf_patch "${_caf_v} % 100")
  set(CAF_VERSION "${_caf_major}.${_caf_minor}.${_caf_patch}")
endif()

if(NOT CAF_FIND_COMPONENTS)
  set(CAF_FIND_COMPONENTS core)
endif()
foreach(_comp IN LISTS CAF_FIND_COMPONENTS)
  find_library(CAF_${_comp}_LIBRARY NAMES caf_${_comp})
  if(CAF_${_comp}_LIBRARY)
    set(CAF_${_comp}_FOUND TRUE)
  endif()
endforeach()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CAF
  REQUIRED_VARS CAF_INCLUDE_DIR
  VERSION_VAR CAF_VERSION
  HANDLE_COMPONENTS)

if(CAF_FOUND)
  foreach(_comp IN LISTS CAF_FIND_COMPONENTS)
    if(CAF_${_comp}_FOUND AND NOT TARGET CAF::${_comp})
      add_library(CAF::${_comp} UNKNOWN IMPORTED)
      set_target_properties(CAF::${_comp} PROPERTIES
        IMPORTED_LOCATION ${CAF_${_comp}_LIBRARY}
        INTERFACE_INCLUDE_DIRECTORIES ${CAF_INCLUDE_DIR})
    endif()
  endforeach()
  if(TARGET CAF::io)
    target_link_libraries(CAF::io INTERFACE CAF::core)
  endif()
  if(TARGET CAF::openssl)
    target_link_libraries(CAF::openssl INTERFACE CAF::io)
  endif()
  if(TARGET CAF::core)
    target_link_libraries(CAF::core INTERFACE Threads::Threads)
    # CAF 0.17's caf/detail/atom_val.hpp uses uint64_t without including
    # <cstdint>; GCC 13's standard headers no longer bring it in.
    target_compile_options(CAF::core INTERFACE
      "$<$<COMPILE_LANGUAGE:CXX>:SHELL:-include cstdint>")
  endif()
endif()
mark_as_advanced(CAF_INCLUDE_DIR)
