// Fresh random seeds for kernel tests: each run draws a new base seed (printed, and
// reproducible with LLMESH_TEST_SEED=<n>), so repeated CI runs cover new inputs.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace llmesh::kernels::testing {

/// A seed derived from this run's base seed and a per-test salt.
inline uint32_t test_seed(uint32_t salt) {
  static const uint32_t base = [] {
    const char* env = std::getenv("LLMESH_TEST_SEED");
    uint32_t s = env != nullptr ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
    std::printf("kernel tests: LLMESH_TEST_SEED=%u\n", s);
    return s;
  }();
  return base ^ (salt * 0x9e3779b9u);
}

}  // namespace llmesh::kernels::testing
