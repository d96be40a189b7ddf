# Third-party packages, all from Debian 12 (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(GTest REQUIRED)
# The tokenizer's pre-tokenizer regexes (Unicode properties, lookahead) and normalizers.
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
include(GoogleTest)
# OpenBLAS is only the peer that `llmesh bench` measures our GEMM against.
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
