# The include rules between modules (docs/architecture.md, "Modules and who
# may use whom"), checked on the sources as text:
#   core/, corpus/, scheduler/, metrics/  no libtorch (ATen, c10, torch)
#                                and no CAF
#   runtime/                     no CAF
#   actors/                      no ATen, c10 or torch include of its own
# and the arrows between modules, read from docs/architecture.md's
# ```arrows block ("runtime -> scheduler, transport, model, metrics"): a
# module includes h2/<other>/ headers only of modules it reaches along them
# (and core).
# Run at configure time (H2Layers.cmake) and as the CTest test "layering":
#   cmake -DH2_SOURCE_DIR=<repo> -P cmake/H2CheckLayers.cmake
cmake_policy(SET CMP0057 NEW) # if(... IN_LIST ...)
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

# The arrows: "module -> a, b" lines of the ```arrows block.
set(_doc "${H2_SOURCE_DIR}/docs/architecture.md")
file(STRINGS "${_doc}" _arrows REGEX "^[a-z]+ +-> ")
if(NOT _arrows)
  message(FATAL_ERROR "H2CheckLayers: no arrows block in ${_doc}")
endif()
set(_modules "")
foreach(line IN LISTS _arrows)
  string(REGEX MATCH "^([a-z]+) +-> +(.*)$" _ "${line}")
  set(from "${CMAKE_MATCH_1}")
  string(REPLACE "," ";" to "${CMAKE_MATCH_2}")
  list(TRANSFORM to STRIP)
  list(APPEND _modules ${from})
  set(_uses_${from} ${to})
endforeach()
# Each module's reach: the closure of its arrows, and core. A module with
# no arrow (core) reaches nothing else.
list(APPEND _modules core)
list(REMOVE_DUPLICATES _modules)
foreach(module IN LISTS _modules)
  set(reach core)
  set(frontier ${_uses_${module}})
  while(frontier)
    list(POP_FRONT frontier next)
    if(NOT next IN_LIST reach)
      list(APPEND reach ${next})
      list(APPEND frontier ${_uses_${next}})
    endif()
  endwhile()
  file(GLOB_RECURSE sources "${H2_SOURCE_DIR}/${module}/*.cpp"
                            "${H2_SOURCE_DIR}/${module}/*.hpp")
  foreach(source IN LISTS sources)
    file(STRINGS "${source}" hits
         REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]h2/[a-z_]+/")
    foreach(hit IN LISTS hits)
      string(REGEX MATCH "h2/([a-z_]+)/" _ "${hit}")
      set(used "${CMAKE_MATCH_1}")
      if(NOT used STREQUAL module AND NOT used IN_LIST reach)
        file(RELATIVE_PATH rel "${H2_SOURCE_DIR}" "${source}")
        string(STRIP "${hit}" hit)
        string(APPEND _violations
               "\n  ${rel}: ${hit} (${module}/ does not reach ${used}/ "
               "along the arrows of docs/architecture.md)")
      endif()
    endforeach()
  endforeach()
endforeach()

if(_violations)
  message(FATAL_ERROR "H2: an include crosses the module layering:${_violations}")
endif()
