# One INTERFACE target carries the language level, warnings and sanitizer
# options of H2's own code (docs/conventions.md, rule 4).
# H2_WERROR=OFF keeps the warnings but not as errors: for a build against a
# toolchain or libtorch CI does not use (bench/gpu-check.sh).
option(H2_WERROR "Treat warnings in H2's own code as errors" ON)
add_library(h2_flags INTERFACE)
add_library(h2::flags ALIAS h2_flags)
target_compile_features(h2_flags INTERFACE cxx_std_20)
target_compile_options(h2_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${H2_WERROR}>>:-Werror>)
target_include_directories(h2_flags INTERFACE
  ${CMAKE_BINARY_DIR}/generated)

# Sanitize: ASan + UBSan on everything linked with h2_flags. GCC 12's
# -Wmaybe-uninitialized misfires on <regex> under the sanitizers' -O1: not
# an error there (the other builds keep it; clang has no such warning).
# Line tables only (-g1): reports name file and line, and the build on a
# 2-core CI machine takes a third less than with full debug information.
set(_h2_san -fsanitize=address,undefined -fno-omit-frame-pointer
            -fno-sanitize-recover=undefined)
# ThreadSanitize: TSan. libtorch and its OpenMP runtime are not
# instrumented: tests/tsan.supp names what of theirs TSan cannot see
# through, and the tests run with OMP_NUM_THREADS=1. GCC warns (-Wtsan)
# that it cannot instrument atomic_thread_fence, which the code does not
# use; libstdc++'s headers do.
set(_h2_tsan -fsanitize=thread -fno-omit-frame-pointer)
target_compile_options(h2_flags INTERFACE
  $<$<CONFIG:Sanitize>:${_h2_san} -O1 -g1>
  $<$<CONFIG:ThreadSanitize>:${_h2_tsan} -O1 -g1>
  $<$<AND:$<CONFIG:Sanitize,ThreadSanitize>,$<CXX_COMPILER_ID:GNU>>:
    -Wno-error=maybe-uninitialized>
  $<$<AND:$<CONFIG:ThreadSanitize>,$<CXX_COMPILER_ID:GNU>>:-Wno-tsan>)
target_link_options(h2_flags INTERFACE
  $<$<CONFIG:Sanitize>:${_h2_san}>
  $<$<CONFIG:ThreadSanitize>:${_h2_tsan}>)
