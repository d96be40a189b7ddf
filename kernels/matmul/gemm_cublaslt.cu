// The fast projection path: cuBLASLt GEMM with BF16/F16 operands and float32 accumulate and
// output, for prefill and large decode batches. Activations are rounded to the weights' 16-bit
// type first (one small kernel); cuBLAS picks the algorithm per shape (cached), so its
// reduction order may change with m: use dense() where batch invariance matters.
// Layout: x [m][ldx] f32, w [n][ldw] (HF [out, in]), y [m][ldy] f32. In cuBLAS's column-major
// terms: yᵀ (n×m, ld ldy) = op_T(W as k×n, ld ldw) · xᵀ (k×m, ld k).
// Benchmark: `llmesh bench engine --device cuda` (prefill TFLOP/s against a plain cuBLAS GEMM).
#include <cublasLt.h>

#include <map>
#include <string>
#include <tuple>
#include <type_traits>

#include "device/cuda_common.cuh"
#include "llmesh/kernels/cuda_ops.hpp"

namespace llmesh::kernels::cuda {
namespace {

constexpr size_t workspace_bytes = 32u << 20;  // cuBLAS's recommendation for Hopper

template <class T>
__global__ void to_16bit_kernel(const float* x, size_t ldx, size_t m, size_t k, T* out) {
  const size_t total = m * k;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const size_t r = i / k, c = i % k;
    if constexpr (std::is_same_v<T, __half>) out[i] = __float2half_rn(x[r * ldx + c]);
    else out[i] = __float2bfloat16_rn(x[r * ldx + c]);
  }
}

__global__ void add_bias_kernel(float* y, size_t ldy, size_t m, size_t n, const float* bias) {
  const size_t total = m * n;
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const size_t r = i / n, c = i % n;
    y[r * ldy + c] = y[r * ldy + c] + bias[c];
  }
}

status check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return ok_status();
  return make_error(errc::internal, std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(st)));
}

unsigned grid_for(size_t n) {
  unsigned b = detail::blocks_for(n, 256);
  return b > 8192 ? 8192 : b;
}

}  // namespace

status to_16bit(const float* x, size_t ldx, size_t m, size_t k, dtype type, void* out, stream_t s) {
  if (m == 0 || k == 0) return ok_status();
  if (type == dtype::f16) {
    to_16bit_kernel<__half><<<grid_for(m * k), 256, 0, s>>>(x, ldx, m, k, static_cast<__half*>(out));
  } else {
    to_16bit_kernel<__nv_bfloat16><<<grid_for(m * k), 256, 0, s>>>(x, ldx, m, k, static_cast<__nv_bfloat16*>(out));
  }
  return detail::launched("activations to 16 bit");
}

struct blas::state {
  cublasLtHandle_t handle = nullptr;
  buffer workspace;
  struct plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool found = false;
  };
  std::map<std::tuple<size_t, size_t, size_t, size_t, size_t, int>, plan> plans;

  ~state() {
    for (auto& [key, p] : plans) {
      if (p.op) cublasLtMatmulDescDestroy(p.op);
      if (p.a) cublasLtMatrixLayoutDestroy(p.a);
      if (p.b) cublasLtMatrixLayoutDestroy(p.b);
      if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    }
    if (handle) cublasLtDestroy(handle);
  }

  result<plan*> plan_for(size_t m, size_t n, size_t k, size_t ldw, size_t ldy, dtype t) {
    auto key = std::make_tuple(m, n, k, ldw, ldy, static_cast<int>(t));
    auto it = plans.find(key);
    if (it != plans.end()) return &it->second;
    plan p;
    const cudaDataType_t ab = t == dtype::f16 ? CUDA_R_16F : CUDA_R_16BF;
    LLMESH_TRY(check(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate"));
    plan& stored = plans.emplace(key, p).first->second;  // owns the handles from here on
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LLMESH_TRY(check(cublasLtMatmulDescSetAttribute(stored.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "TRANSA"));
    LLMESH_TRY(check(cublasLtMatmulDescSetAttribute(stored.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "TRANSB"));
    LLMESH_TRY(check(cublasLtMatrixLayoutCreate(&stored.a, ab, k, n, ldw), "layout A"));
    LLMESH_TRY(check(cublasLtMatrixLayoutCreate(&stored.b, ab, k, m, k), "layout B"));
    LLMESH_TRY(check(cublasLtMatrixLayoutCreate(&stored.c, CUDA_R_32F, n, m, ldy), "layout C"));
    cublasLtMatmulPreference_t pref = nullptr;
    LLMESH_TRY(check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"));
    uint64_t ws = workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    cublasLtMatmulHeuristicResult_t heur{};
    int returned = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, stored.op, stored.a, stored.b, stored.c, stored.c, pref,
                                                       1, &heur, &returned);
    cublasLtMatmulPreferenceDestroy(pref);
    stored.found = st == CUBLAS_STATUS_SUCCESS && returned > 0;
    if (stored.found) stored.algo = heur.algo;
    return &stored;
  }
};

result<std::unique_ptr<blas>> blas::create() {
  std::unique_ptr<blas> b(new blas());
  b->st_ = std::make_unique<state>();
  LLMESH_TRY(check(cublasLtCreate(&b->st_->handle), "cublasLtCreate"));
  auto ws = buffer::device(workspace_bytes);
  if (!ws) return ws.take_error();
  b->st_->workspace = std::move(*ws);
  return std::move(b);
}

blas::~blas() = default;

status blas::gemm(const dense_job& job, size_t m, void* scratch, stream_t s) {
  if (m == 0 || job.n == 0) return ok_status();
  if (job.w_type == dtype::f32) return make_error(errc::internal, "blas::gemm: F32 weights go through dense()");
  if (is_quantized(job.w_type)) return make_error(errc::internal, "blas::gemm: block weights (int8, int4, K-quants) run on the CPU backend only");
  auto p = st_->plan_for(m, job.n, job.k, job.ldw, job.ldy, job.w_type);
  if (!p) return p.take_error();
  if (!(*p)->found) {  // no cuBLAS kernel for this shape or alignment: the CUDA-core path
    const dense_job one[1] = {job};
    return dense(one, m, s);
  }
  LLMESH_TRY(to_16bit(job.x, job.ldx, m, job.k, job.w_type, scratch, s));
  return gemm_16bit(job, m, scratch, s);
}

status blas::gemm_16bit(const dense_job& job, size_t m, const void* x16, stream_t s) {
  auto p = st_->plan_for(m, job.n, job.k, job.ldw, job.ldy, job.w_type);
  if (!p) return p.take_error();
  if (!(*p)->found) return make_error(errc::internal, "cuBLASLt has no algorithm for this shape");
  const float alpha = 1.0f, beta = 0.0f;
  LLMESH_TRY(check(cublasLtMatmul(st_->handle, (*p)->op, &alpha, job.w, (*p)->a, x16, (*p)->b, &beta, job.y, (*p)->c,
                                  job.y, (*p)->c, &(*p)->algo, st_->workspace.get(), workspace_bytes, s),
                   "cublasLtMatmul"));
  if (job.bias) {
    add_bias_kernel<<<grid_for(m * job.n), 256, 0, s>>>(job.y, job.ldy, m, job.n, job.bias);
    LLMESH_TRY(detail::launched("gemm: bias"));
  }
  return ok_status();
}

}  // namespace llmesh::kernels::cuda
