// k_quant_slice: see row_slices.hpp.
#include "row_slices.hpp"

#include <vector>

#include "llmesh/kernels/quantize.hpp"

namespace llmesh::model::detail {

result<std::optional<row_slice>> k_quant_slice(const weight_matrix& w, size_t c0, size_t k) {
  if (!kernels::is_k_quant(w.type) || (c0 % kernels::k_block == 0 && k % kernels::k_block == 0)) return std::optional<row_slice>();
  row_slice s;
  s.w = weight_matrix{nullptr, kernels::dtype::q8, w.rows, k};
  const size_t bytes = s.w.bytes();
  s.bytes = std::shared_ptr<uint8_t[]>(new uint8_t[bytes]);
  s.w.data = s.bytes.get();
  std::vector<float> row(w.ld());
  for (size_t r = 0; r < w.rows; ++r) {
    kernels::dequantize_row(static_cast<const uint8_t*>(w.data) + kernels::dtype_offset(w.type, r * w.ld()), w.type, w.ld(), row.data());
    uint8_t* dst = s.bytes.get() + kernels::dtype_bytes(kernels::dtype::q8, r * s.w.ld());
    LLMESH_TRY(kernels::quantize_q8(row.data() + c0, kernels::dtype::f32, 1, k, dst, r));
  }
  return std::optional<row_slice>(std::move(s));
}

}  // namespace llmesh::model::detail
