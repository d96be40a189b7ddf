#include "llmesh/kernels/cpu_features.hpp"

#include <cstdlib>
#include <string_view>

namespace llmesh::kernels {

isa best_supported_isa() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  // The AVX-512 kernels use F (arithmetic), BW+VL (masked 16-bit loads); F16C for halves.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c")) {
    return isa::avx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return isa::avx2;
  }
#endif
  return isa::portable;
}

isa active_isa() {
  static const isa level = [] {
    isa best = best_supported_isa();
    const char* env = std::getenv("LLMESH_ISA");
    if (env == nullptr) return best;
    std::string_view want(env);
    isa asked = want == "portable" ? isa::portable
                : want == "avx2"   ? isa::avx2
                                   : isa::avx512;
    return static_cast<int>(asked) < static_cast<int>(best) ? asked : best;
  }();
  return level;
}

std::string_view isa_name(isa level) {
  switch (level) {
    case isa::portable: return "portable";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
  }
  return "unknown";
}

}  // namespace llmesh::kernels
