# Third-party packages, all from Debian 12 (scripts/install-deps.sh installs them).
find_package(Threads REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(GTest REQUIRED)
include(GoogleTest)
# OpenBLAS is only the peer that `llmesh bench` measures our GEMM against.
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
