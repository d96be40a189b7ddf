// matmul(): validation, instruction-set dispatch and the thread split.
// Benchmark: `llmesh bench engine` (GEMM GFLOP/s vs OpenBLAS sgemm, decode vs bandwidth).
#include <algorithm>
#include <string>

#include "matmul/matmul_isa.hpp"

namespace llmesh::kernels {
namespace {

const detail::isa_kernels& kernels_for_cpu() {
  static const detail::isa_kernels k = [] {
#ifndef LLMESH_NO_X86_KERNELS
    switch (active_isa()) {
      case isa::avx512: return detail::avx512_kernels();
      case isa::avx2: return detail::avx2_kernels();
      case isa::portable: break;
    }
#endif
    return detail::portable_kernels();
  }();
  return k;
}

status validate(const matmul_args& a) {
  if (a.m == 0 || a.n == 0) return ok_status();
  if (a.x == nullptr || a.w == nullptr || a.y == nullptr || a.k == 0) {
    return make_error(errc::invalid_request, "matmul: null operand or k == 0");
  }
  if (a.ldx < a.k || a.ldw < a.k || a.ldy < a.n) {
    return make_error(errc::invalid_request,
                      "matmul: leading dimension smaller than the row (ldx " + std::to_string(a.ldx) +
                          ", ldw " + std::to_string(a.ldw) + ", ldy " + std::to_string(a.ldy) + ")");
  }
  return ok_status();
}

}  // namespace

status matmul(std::span<const matmul_args> jobs, thread_pool& pool) {
  for (const auto& job : jobs) LLMESH_TRY(validate(job));
  const auto& isa = kernels_for_cpu();
  pool.run([&](int t, int n_threads) {
    for (const auto& job : jobs) {
      if (job.m == 0 || job.n == 0) continue;
      size_t tiles = (job.n + isa.n_tile - 1) / isa.n_tile;
      auto [t0, t1] = thread_pool::split(tiles, t, n_threads);
      size_t n0 = t0 * isa.n_tile;
      size_t n1 = std::min(job.n, t1 * isa.n_tile);
      if (n0 >= n1) continue;
      isa.gemm_block(job, 0, job.m, n0, n1);
    }
  });
  return ok_status();
}

status matmul(const matmul_args& job, thread_pool& pool) { return matmul(std::span(&job, 1), pool); }

float dot(const float* a, const float* b, size_t n) { return kernels_for_cpu().dot(a, b, n); }

}  // namespace llmesh::kernels
