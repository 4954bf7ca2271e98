# Optional hardware backends (docs/conventions.md, rule 3). Each option takes
# AUTO (build it when the toolkit is found), ON (the toolkit must be found) or
# OFF. Backends are compiled whenever their toolkit exists, even on machines
# without the hardware; the result is recorded in the generated h2/config.hpp.
set(H2_WITH_CUDA AUTO CACHE STRING "CUDA device backend (AUTO|ON|OFF)")
set(H2_WITH_HIP AUTO CACHE STRING "HIP device backend (AUTO|ON|OFF)")
set(H2_WITH_RDMA AUTO CACHE STRING "RDMA transport backend (AUTO|ON|OFF)")
foreach(_opt H2_WITH_CUDA H2_WITH_HIP H2_WITH_RDMA)
  set_property(CACHE ${_opt} PROPERTY STRINGS AUTO ON OFF)
  if(NOT ${_opt} MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${_opt}=${${_opt}}: expected AUTO, ON or OFF")
  endif()
endforeach()

# h2_resolve_backend(<option> <found> <what>) sets H2_HAS_<name> to 1 or 0.
function(h2_resolve_backend option found what result)
  if(${option} STREQUAL "OFF")
    set(${result} 0 PARENT_SCOPE)
  elseif(found)
    set(${result} 1 PARENT_SCOPE)
  elseif(${option} STREQUAL "ON")
    message(FATAL_ERROR "${option}=ON but ${what} was not found")
  else()
    message(STATUS "${option}=AUTO: ${what} not found, backend not built")
    set(${result} 0 PARENT_SCOPE)
  endif()
endfunction()

# CUDA: the runtime library is enough for device discovery and memory
# queries; tensor math on the device needs a CUDA-enabled libtorch, which is
# checked at runtime (Debian's libtorch is CPU-only).
set(_cuda_found FALSE)
if(NOT H2_WITH_CUDA STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  set(_cuda_found ${CUDAToolkit_FOUND})
endif()
h2_resolve_backend(H2_WITH_CUDA "${_cuda_found}" "the CUDA toolkit (cudart)"
                   H2_HAS_CUDA)

# HIP: the host API (headers + libamdhip64) is all the device context needs.
# Neither CMake's HIP language nor hip-config.cmake work with Debian's layout
# (the latter insists on hipcc), so look for the files themselves.
set(_hip_found FALSE)
if(NOT H2_WITH_HIP STREQUAL "OFF")
  find_path(H2_HIP_INCLUDE_DIR hip/hip_runtime_api.h
            HINTS /opt/rocm/include)
  find_library(H2_HIP_LIBRARY amdhip64 HINTS /opt/rocm/lib)
  if(H2_HIP_INCLUDE_DIR AND H2_HIP_LIBRARY)
    add_library(h2_hip_host INTERFACE)
    add_library(h2::hip_host ALIAS h2_hip_host)
    target_include_directories(h2_hip_host SYSTEM INTERFACE
                               ${H2_HIP_INCLUDE_DIR})
    target_link_libraries(h2_hip_host INTERFACE ${H2_HIP_LIBRARY})
    target_compile_definitions(h2_hip_host INTERFACE __HIP_PLATFORM_AMD__)
    set(_hip_found TRUE)
  endif()
endif()
h2_resolve_backend(H2_WITH_HIP "${_hip_found}" "the HIP runtime (amdhip64)"
                   H2_HAS_HIP)

# RDMA: rdma-core verbs + rdma_cm.
set(_rdma_found FALSE)
if(NOT H2_WITH_RDMA STREQUAL "OFF")
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(H2_IBVERBS QUIET IMPORTED_TARGET libibverbs)
    pkg_check_modules(H2_RDMACM QUIET IMPORTED_TARGET librdmacm)
    if(H2_IBVERBS_FOUND AND H2_RDMACM_FOUND)
      set(_rdma_found TRUE)
    endif()
  endif()
endif()
h2_resolve_backend(H2_WITH_RDMA "${_rdma_found}"
                   "rdma-core (libibverbs, librdmacm)" H2_HAS_RDMA)

# libtorch's own CUDA support (c10_cuda): the chip's stream, the caching
# allocator's figures and its out-of-memory errors (devices/cuda). Debian's
# libtorch ships the c10/cuda headers but not the library; a CUDA-enabled
# libtorch (CMAKE_PREFIX_PATH, the GPU machines) finds it.
if(H2_HAS_CUDA AND C10_CUDA_LIBRARY)
  set(H2_TORCH_HAS_CUDA 1)
else()
  set(H2_TORCH_HAS_CUDA 0)
endif()
