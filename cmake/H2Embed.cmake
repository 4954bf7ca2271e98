# h2_embed_text(<output.cpp> <symbol> <input>) writes a C++ source defining
# `extern const char* const h2::<symbol>` with the contents of <input>, and
# re-runs CMake when <input> changes.
function(h2_embed_text output symbol input)
  file(READ ${input} H2_EMBED_TEXT)
  string(FIND "${H2_EMBED_TEXT}" ")h2embed\"" _clash)
  if(NOT _clash EQUAL -1)
    message(FATAL_ERROR "${input} contains the raw-string delimiter")
  endif()
  set(H2_EMBED_SYMBOL ${symbol})
  set(H2_EMBED_INPUT ${input})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/embed.cpp.in ${output} @ONLY)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${input})
endfunction()
