// matmul(): validation, instruction-set dispatch and the thread split.
// Benchmark: `llmesh bench engine` (GEMM GFLOP/s vs OpenBLAS sgemm, decode vs bandwidth).
#include <algorithm>
#include <atomic>
#include <vector>
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
  if (is_f8(a.w_type)) {
    return make_error(errc::invalid_request, "matmul: " + std::string(dtype_name(a.w_type)) + " is a KV cache type, not a weight type");
  }
  const size_t block = dtype_block(a.w_type);
  if (a.ldw % block != 0) {
    return make_error(errc::invalid_request, "matmul: " + std::string(dtype_name(a.w_type)) + " weights need rows of whole blocks (ldw " +
                                                 std::to_string(a.ldw) + " is not a multiple of " + std::to_string(block) + ")");
  }
  if (block == k_block && a.k % k_block != 0) {  // K-quant rows have no padding to read as zeros
    return make_error(errc::invalid_request, "matmul: " + std::string(dtype_name(a.w_type)) + " weights need k a multiple of " +
                                                 std::to_string(k_block) + " (k " + std::to_string(a.k) + ")");
  }
  return ok_status();
}

/// Jobs as the kernels take them: bf16 jobs of an ISA with a permuted bf16 layout get their x
/// packed (once per distinct x; q/k/v share one) into the caller's thread-local buffers.
std::span<const matmul_args> prepare_jobs(std::span<const matmul_args> jobs, const detail::isa_kernels& isa,
                                          std::vector<matmul_args>& prepared) {
  if (isa.pack_x_bf16 == nullptr) return jobs;
  bool any = false;
  for (const auto& j : jobs) any = any || (j.w_type == dtype::bf16 && j.m > 0);
  if (!any) return jobs;
  thread_local std::vector<std::vector<float>> buffers;
  struct source {
    const float* x;
    size_t ldx, k, m;
  };
  std::vector<source> packed_from;
  prepared.assign(jobs.begin(), jobs.end());
  for (auto& j : prepared) {
    if (j.w_type != dtype::bf16 || j.m == 0) continue;
    const size_t ld = (j.k + 15) / 16 * 16;
    size_t b = 0;
    while (b < packed_from.size() &&
           !(packed_from[b].x == j.x && packed_from[b].ldx == j.ldx && packed_from[b].k == j.k && packed_from[b].m >= j.m)) {
      ++b;
    }
    if (b == packed_from.size()) {
      if (buffers.size() <= b) buffers.resize(b + 1);
      buffers[b].resize(j.m * ld);
      isa.pack_x_bf16(j.x, j.ldx, j.m, j.k, buffers[b].data(), ld);
      packed_from.push_back({j.x, j.ldx, j.k, j.m});
    }
    j.x = buffers[b].data();
    j.ldx = ld;
  }
  return prepared;
}

}  // namespace

const detail::isa_kernels& detail::cpu_kernels() { return kernels_for_cpu(); }

status matmul(std::span<const matmul_args> jobs_in, thread_pool& pool) {
  for (const auto& job : jobs_in) LLMESH_TRY(validate(job));
  const auto& isa = kernels_for_cpu();
  std::vector<matmul_args> prepared;
  const auto jobs = prepare_jobs(jobs_in, isa, prepared);
  // Work units: runs of output columns, handed out dynamically so a thread slowed by memory
  // contention does not leave the others waiting at the end of the region. A unit is at least
  // one cache block of weight rows (so blocking stays effective) and at least 64 rows (so a
  // decode stream is long enough for the prefetcher). Which thread computes a column never
  // changes its value.
  std::vector<size_t> unit_rows(jobs.size()), first_unit(jobs.size() + 1, 0);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const auto& job = jobs[i];
    const size_t kb = detail::k_block_len(job.k, job.m, isa.m_tile);
    const size_t nb = detail::n_block_rows(kb, job.w_type, isa.n_tile);
    unit_rows[i] = nb * ((64 + nb - 1) / nb);  // whole cache blocks, at least 64 rows
    size_t units = job.m == 0 ? 0 : (job.n + unit_rows[i] - 1) / unit_rows[i];
    first_unit[i + 1] = first_unit[i] + units;
  }
  const size_t total = first_unit.back();
  std::atomic<size_t> next{0};
  pool.run([&](int, int) {
    size_t job = 0;
    for (size_t u = next.fetch_add(1, std::memory_order_relaxed); u < total;
         u = next.fetch_add(1, std::memory_order_relaxed)) {
      while (u >= first_unit[job + 1]) ++job;
      const auto& a = jobs[job];
      size_t n0 = (u - first_unit[job]) * unit_rows[job];
      isa.gemm_block(a, 0, a.m, n0, std::min(a.n, n0 + unit_rows[job]));
    }
  });
  return ok_status();
}

status matmul(const matmul_args& job, thread_pool& pool) { return matmul(std::span(&job, 1), pool); }

float dot(const float* a, const float* b, size_t n) { return kernels_for_cpu().dot(a, b, n); }

}  // namespace llmesh::kernels
