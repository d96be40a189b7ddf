// The K-quant (and IQ4_XS) types kernel tests make random super-blocks of, and where each
// keeps its float16 factors (random bytes there would be NaNs and infinities; the tests write
// random finite values of chosen magnitudes instead).
#pragma once

#include <cstddef>

#include "llmesh/kernels/dtype.hpp"
#include "llmesh/kernels/quantize.hpp"

namespace llmesh::kernels::testing {

inline constexpr dtype k_quant_types[] = {dtype::q2_k, dtype::q3_k, dtype::q4_k, dtype::q5_k, dtype::q6_k, dtype::iq4_xs};

using kernels::k_quant_halves;

}  // namespace llmesh::kernels::testing
