# One INTERFACE target carries the language level, warnings and sanitizer
# options of H2's own code (docs/conventions.md, rule 4).
add_library(h2_flags INTERFACE)
add_library(h2::flags ALIAS h2_flags)
target_compile_features(h2_flags INTERFACE cxx_std_20)
target_compile_options(h2_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-unused-parameter>)
target_include_directories(h2_flags INTERFACE
  ${CMAKE_BINARY_DIR}/generated)

# Sanitize: ASan + UBSan on everything linked with h2_flags. GCC 12's
# -Wmaybe-uninitialized misfires on <regex> under the sanitizers' -O1: not
# an error there (the other builds keep it; clang has no such warning).
set(_h2_san -fsanitize=address,undefined -fno-omit-frame-pointer
            -fno-sanitize-recover=undefined)
target_compile_options(h2_flags INTERFACE
  $<$<CONFIG:Sanitize>:${_h2_san} -O1 -g>
  $<$<AND:$<CONFIG:Sanitize>,$<CXX_COMPILER_ID:GNU>>:
    -Wno-error=maybe-uninitialized>)
target_link_options(h2_flags INTERFACE $<$<CONFIG:Sanitize>:${_h2_san}>)
