// Helpers for the GPU parity tests: skip without a device, host↔device vectors, fresh random
// inputs (seed printed; LLMESH_TEST_SEED reproduces a run), and comparisons against the CPU.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../kernels/test_seed.hpp"
#include "llmesh/kernels/cuda_runtime.hpp"
#include "llmesh/kernels/device.hpp"

namespace llmesh::gpu_testing {

namespace cuda = kernels::cuda;
using kernels::testing::test_seed;

#define LLMESH_REQUIRE_GPU()                                                       \
  do {                                                                             \
    if (llmesh::kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

/// A device copy of a host vector (or `n` poisoned elements: all bytes 0xff, a NaN pattern).
template <class T>
cuda::buffer to_device(const std::vector<T>& v) {
  auto b = cuda::buffer::device(std::max<size_t>(v.size(), 1) * sizeof(T));
  EXPECT_TRUE(b.ok());
  EXPECT_TRUE(cuda::copy_to_device(b->get(), v.data(), v.size() * sizeof(T), nullptr).ok());
  return std::move(*b);
}

inline cuda::buffer poisoned(size_t bytes) {
  auto b = cuda::buffer::device(std::max<size_t>(bytes, 4));
  EXPECT_TRUE(b.ok());
  EXPECT_TRUE(cuda::fill_bytes(b->get(), 0xff, bytes, nullptr).ok());
  return std::move(*b);
}

template <class T>
std::vector<T> to_host(const cuda::buffer& b, size_t n) {
  std::vector<T> v(n);
  EXPECT_TRUE(cuda::copy_to_host(v.data(), b.get(), n * sizeof(T), nullptr).ok());
  EXPECT_TRUE(cuda::synchronize_device().ok());
  return v;
}

inline std::vector<float> random_floats(size_t n, uint32_t salt, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(test_seed(salt));
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// ‖a − b‖ / ‖b‖; infinite when any element is not finite (unwritten poison included).
inline double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace llmesh::gpu_testing
