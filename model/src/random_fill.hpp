// The counter-based random streams behind `llmesh model random` and `random-lora` (private to
// random_model.cpp and random_lora.cpp): every tensor's values come from its own stream, keyed
// by (seed, tensor name), so the bytes do not depend on write order or sharding.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>

#include "llmesh/kernels/dtype.hpp"

namespace llmesh::model::detail {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t name_hash(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

/// Fills a tensor with center + uniform(-scale, scale), rounded to its dtype.
inline std::function<void(std::span<uint8_t>)> uniform(uint64_t seed, const std::string& name, kernels::dtype type,
                                                float center, float scale) {
  return [=](std::span<uint8_t> out) {
    uint64_t state = seed ^ name_hash(name);
    size_t n = out.size() / kernels::dtype_size(type);
    for (size_t i = 0; i < n; ++i) {
      float u = static_cast<float>(splitmix64(state) >> 40) * 0x1.0p-24f;  // [0, 1)
      float v = center + scale * (2.0f * u - 1.0f);
      if (type == kernels::dtype::f32) {
        std::memcpy(out.data() + 4 * i, &v, 4);
      } else {
        uint16_t h = type == kernels::dtype::f16 ? kernels::f32_to_f16(v) : kernels::f32_to_bf16(v);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
    }
  };
}

}  // namespace llmesh::model::detail
