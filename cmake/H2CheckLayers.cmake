# The include rules between modules (docs/architecture.md, "Modules and who
# may use whom"), checked on the sources as text:
#   core/, corpus/, scheduler/, metrics/  no libtorch (ATen, c10, torch)
#                                and no CAF
#   runtime/                     no CAF
#   actors/                      no ATen, c10 or torch include of its own
# Run at configure time (H2Layers.cmake) and as the CTest test "layering":
#   cmake -DH2_SOURCE_DIR=<repo> -P cmake/H2CheckLayers.cmake
if(NOT H2_SOURCE_DIR)
  message(FATAL_ERROR "H2CheckLayers: pass -DH2_SOURCE_DIR=<repository root>")
endif()

set(_torch_include "^[ \t]*#[ \t]*include[ \t]*[<\"](ATen|c10|torch)/")
set(_caf_include "^[ \t]*#[ \t]*include[ \t]*[<\"]caf/")
set(_rules
  "core!${_torch_include}!libtorch"
  "core!${_caf_include}!CAF"
  "corpus!${_torch_include}!libtorch"
  "corpus!${_caf_include}!CAF"
  "scheduler!${_torch_include}!libtorch"
  "scheduler!${_caf_include}!CAF"
  "metrics!${_torch_include}!libtorch"
  "metrics!${_caf_include}!CAF"
  "runtime!${_caf_include}!CAF"
  "actors!${_torch_include}!libtorch")

set(_violations "")
foreach(rule IN LISTS _rules)
  string(REPLACE "!" ";" parts "${rule}")
  list(GET parts 0 module)
  list(GET parts 1 pattern)
  list(GET parts 2 what)
  file(GLOB_RECURSE sources "${H2_SOURCE_DIR}/${module}/*.cpp"
                            "${H2_SOURCE_DIR}/${module}/*.hpp")
  foreach(source IN LISTS sources)
    file(STRINGS "${source}" hits REGEX "${pattern}")
    foreach(hit IN LISTS hits)
      file(RELATIVE_PATH rel "${H2_SOURCE_DIR}" "${source}")
      string(STRIP "${hit}" hit)
      string(APPEND _violations "\n  ${rel}: ${hit} (${module}/ includes no ${what})")
    endforeach()
  endforeach()
endforeach()

if(_violations)
  message(FATAL_ERROR "H2: an include crosses the module layering:${_violations}")
endif()
