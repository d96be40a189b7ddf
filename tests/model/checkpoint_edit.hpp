// Test helper shared by packed_weights_test.cpp and fp8_weights_test.cpp: a random model's
// checkpoint rewritten tensor by tensor (to break one, change its values, or drop it).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "llmesh/model/random_model.hpp"
#include "llmesh/model/safetensors.hpp"
#include "temp_dir.hpp"

namespace llmesh::model::testing {

/// The model's tensors (float and integer) rewritten into its model.safetensors through
/// `change` (return false to drop one); an int64 tensor (compressed-tensors' weight_shape)
/// is kept as it is; `extra` tensors are added.
inline void rewrite(const temp_dir& dir, const std::function<bool(tensor_spec&)>& change, std::vector<tensor_spec> extra = {}) {
  auto st = tensor_store::open(dir.path());
  ASSERT_TRUE(st.ok());
  std::vector<tensor_spec> specs;
  std::vector<std::string> names = st->names();
  for (const auto& n : st->integer_names()) names.push_back(n);
  for (const auto& n : names) {
    auto t = st->contains(n) ? st->get(n) : st->get_i32(n);
    if (!t.ok() && !st->contains(n) && st->get_u8(n).ok()) t = st->get_u8(n);  // MXFP4 blocks and exponents
    if (!t.ok() && st->integers(n).ok()) {
      const auto v = st->integers(n).value();
      specs.push_back({n, kernels::dtype::f32, {v.size()}, [v](std::span<uint8_t> out) { std::memcpy(out.data(), v.data(), out.size()); }, 8});
      continue;
    }
    ASSERT_TRUE(t.ok());
    std::vector<uint8_t> bytes(static_cast<const uint8_t*>(t->data), static_cast<const uint8_t*>(t->data) + t->bytes);
    tensor_spec s{n, t->type, t->shape, [bytes](std::span<uint8_t> out) { std::memcpy(out.data(), bytes.data(), std::min(out.size(), bytes.size())); },
                  t->int_bytes};
    if (change(s)) specs.push_back(std::move(s));
  }
  for (auto& s : extra) specs.push_back(std::move(s));
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", specs).ok());
}

}  // namespace llmesh::model::testing
