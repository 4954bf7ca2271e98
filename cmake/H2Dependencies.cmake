# Required third-party packages (all from Debian 12's registry; `make deps`
# installs the missing ones).
find_package(Threads REQUIRED)
find_package(CAF 0.17 REQUIRED COMPONENTS core io openssl)
find_package(tomlplusplus 3 REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(OpenSSL 3 REQUIRED) # job-secret HMACs (libssl-dev)
find_package(CLI11 2 REQUIRED)

# SentencePiece (libsentencepiece-dev): the tokenizer of model/tokenizer.cpp.
find_package(PkgConfig REQUIRED)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)

find_path(ASIO_INCLUDE_DIR asio.hpp REQUIRED)
add_library(h2_asio INTERFACE)
add_library(h2::asio ALIAS h2_asio)
target_include_directories(h2_asio SYSTEM INTERFACE ${ASIO_INCLUDE_DIR})
target_compile_definitions(h2_asio INTERFACE ASIO_STANDALONE ASIO_NO_DEPRECATED)
target_link_libraries(h2_asio INTERFACE Threads::Threads)

# libtorch is only needed from devices/ upwards; core/, scheduler/ and
# metrics/ never link it.
find_package(Torch REQUIRED)

if(H2_BUILD_TESTS OR NOT DEFINED H2_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
