# Third-party packages, all from Debian 12 (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(OpenSSL 3 REQUIRED)  # the join challenge (HMAC-SHA256, CSPRNG)
find_package(yaml-cpp REQUIRED)  # cluster configs (actors/src/cluster_config.cpp)
find_package(Boost 1.74 REQUIRED)  # headers only: Asio and Beast (the gateway)
find_package(CapnProto CONFIG REQUIRED)  # schemas/, transport/ only
find_package(ucx CONFIG REQUIRED)  # transport/ only: ucx::ucp, ucx::ucs
find_package(GTest REQUIRED)
# The tokenizer's pre-tokenizer regexes (Unicode properties, lookahead) and normalizers.
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
include(GoogleTest)
# OpenBLAS is only the peer that `llmesh bench` measures our GEMM against.
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)

# CAF 0.17.6 (libcaf-dev) ships no CMake config or pkg-config file: wrap it by hand.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIBRARY caf_core REQUIRED)
add_library(caf::core UNKNOWN IMPORTED)
set_target_properties(caf::core PROPERTIES IMPORTED_LOCATION "${CAF_CORE_LIBRARY}"
                                           INTERFACE_INCLUDE_DIRECTORIES "${CAF_INCLUDE_DIR}")
target_link_libraries(caf::core INTERFACE Threads::Threads)
