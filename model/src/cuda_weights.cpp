// Weight upload for the CUDA executor (see cuda_weights.hpp).
#include "cuda_weights.hpp"

#include <algorithm>
#include <cmath>

#include "llmesh/kernels/cuda_ops.hpp"

namespace llmesh::model {
namespace {

namespace cuda = kernels::cuda;

class uploader {
 public:
  explicit uploader(device_weights& w) : w_(w) {}

  /// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of a host matrix.
  result<device_matrix> matrix(const weight_matrix& m, size_t row0, size_t rows, size_t col0, size_t cols) {
    if (kernels::is_quantized(m.type)) {
      return make_error(errc::unsupported, "int8, int4, FP8, MXFP4 and GGUF block weights (--quantization int8, a quantized GGUF, or an AWQ/GPTQ/FP8/compressed-tensors/MXFP4 checkpoint) run on the CPU backend only");
    }
    const size_t es = kernels::dtype_size(m.type);
    auto b = cuda::buffer::device(rows * cols * es);
    if (!b) return b.take_error();
    const auto* src = static_cast<const uint8_t*>(m.data) + (row0 * m.cols + col0) * es;
    if (cols == m.cols) {
      LLMESH_TRY(cuda::copy_to_device(b->get(), src, rows * cols * es, nullptr));
    } else {
      LLMESH_TRY(cuda::copy_to_device_2d(b->get(), cols * es, src, m.cols * es, cols * es, rows));
    }
    device_matrix d{b->get(), rows, cols, cols};
    keep(std::move(*b));
    return d;
  }

  /// floats [from, from + n) of a host vector; nullptr for an empty one.
  result<const float*> floats(const std::vector<float>& v, size_t from, size_t n) {
    if (v.empty() || n == 0) return static_cast<const float*>(nullptr);
    auto b = cuda::buffer::device(n * sizeof(float));
    if (!b) return b.take_error();
    LLMESH_TRY(cuda::copy_to_device(b->get(), v.data() + from, n * sizeof(float), nullptr));
    const float* p = b->as<float>();
    keep(std::move(*b));
    return p;
  }

 private:
  void keep(cuda::buffer b) {
    w_.bytes += b.size();
    w_.owned.push_back(std::move(b));
  }
  device_weights& w_;
};

#define LLMESH_ASSIGN(lhs, expr)              \
  do {                                        \
    auto llmesh_r_ = (expr);                  \
    if (!llmesh_r_) return llmesh_r_.take_error(); \
    lhs = *llmesh_r_;                         \
  } while (0)

}  // namespace

result<device_weights> upload_weights(const model& m, const shard_layout& l) {
  const auto& c = m.config();
  if (const char* family = cpu_only_family(c)) {  // every CUDA caller comes here (engine::create refuses earlier)
    return make_error(errc::unsupported, std::string(family) + " run on the CPU backend only (use --device cpu)");
  }
  const auto& w = m.weights();
  device_weights d;
  d.type = w.embed.type;
  uploader up(d);
  const size_t hd = c.head_dim, q0 = l.q_head0 * hd, nq = l.n_heads * hd, kv0 = l.kv_head0 * hd, nkv = l.n_kv_heads * hd;
  LLMESH_ASSIGN(d.embed, up.matrix(w.embed, 0, c.vocab, 0, c.hidden));
  if (c.tie_embeddings || !c.has_lm_head) {  // tied, or a stand-in for a head never used (weights.hpp)
    const auto* base = static_cast<const uint8_t*>(d.embed.data);
    d.lm_head = {base + l.vocab0 * c.hidden * kernels::dtype_size(d.type), l.n_vocab, c.hidden, c.hidden};
  } else if (l.n_vocab > 0) {
    LLMESH_ASSIGN(d.lm_head, up.matrix(w.lm_head, l.vocab0, l.n_vocab, 0, c.hidden));
  }
  LLMESH_ASSIGN(d.final_norm, up.floats(w.final_norm, 0, c.hidden));
  for (const auto& lw : w.layers) {
    device_layer dl;
    LLMESH_ASSIGN(dl.attn_norm, up.floats(lw.attn_norm, 0, c.hidden));
    LLMESH_ASSIGN(dl.mlp_norm, up.floats(lw.mlp_norm, 0, c.hidden));
    LLMESH_ASSIGN(dl.q_bias, up.floats(lw.q_bias, q0, nq));
    LLMESH_ASSIGN(dl.k_bias, up.floats(lw.k_bias, kv0, nkv));
    LLMESH_ASSIGN(dl.v_bias, up.floats(lw.v_bias, kv0, nkv));
    if (l.rank == 0) LLMESH_ASSIGN(dl.o_bias, up.floats(lw.o_bias, 0, c.hidden));  // added once, by rank 0
    LLMESH_ASSIGN(dl.q_norm, up.floats(lw.q_norm, 0, hd));  // shared by every head: not sliced
    LLMESH_ASSIGN(dl.k_norm, up.floats(lw.k_norm, 0, hd));
    LLMESH_ASSIGN(dl.q, up.matrix(lw.q, q0, nq, 0, c.hidden));
    LLMESH_ASSIGN(dl.k, up.matrix(lw.k, kv0, nkv, 0, c.hidden));
    LLMESH_ASSIGN(dl.v, up.matrix(lw.v, kv0, nkv, 0, c.hidden));
    LLMESH_ASSIGN(dl.o, up.matrix(lw.o, 0, c.hidden, q0, nq));
    LLMESH_ASSIGN(dl.gate, up.matrix(lw.gate, l.inter0, l.n_inter, 0, c.hidden));
    LLMESH_ASSIGN(dl.up, up.matrix(lw.up, l.inter0, l.n_inter, 0, c.hidden));
    LLMESH_ASSIGN(dl.down, up.matrix(lw.down, 0, c.hidden, l.inter0, l.n_inter));
    d.layers.push_back(dl);
  }
  LLMESH_TRY(cuda::synchronize_device());  // the executor's own stream does not order after these
  return d;
}

result<device_weights> random_weights(const model_config& c, kernels::dtype type, uint64_t seed) {
  device_weights d;
  d.type = type;
  const size_t es = kernels::dtype_size(type);
  auto matrix = [&](size_t rows, size_t cols) -> result<device_matrix> {
    auto b = cuda::buffer::device(rows * cols * es);
    if (!b) return b.take_error();
    LLMESH_TRY(cuda::fill_random(b->get(), type, rows * cols, std::sqrt(3.0f / static_cast<float>(cols)), seed++, nullptr));
    device_matrix m{b->get(), rows, cols, cols};
    d.bytes += b->size();
    d.owned.push_back(std::move(*b));
    return m;
  };
  std::vector<float> ones(std::max(c.hidden, c.head_dim), 1.0f);
  auto norm = [&]() -> result<const float*> {
    auto b = cuda::buffer::device(ones.size() * sizeof(float));
    if (!b) return b.take_error();
    LLMESH_TRY(cuda::copy_to_device(b->get(), ones.data(), ones.size() * sizeof(float), nullptr));
    const float* p = b->as<float>();
    d.owned.push_back(std::move(*b));
    return p;
  };
  const size_t hd = c.head_dim;
  LLMESH_ASSIGN(d.embed, matrix(c.vocab, c.hidden));
  if (c.tie_embeddings) d.lm_head = d.embed;
  else LLMESH_ASSIGN(d.lm_head, matrix(c.vocab, c.hidden));
  LLMESH_ASSIGN(d.final_norm, norm());
  for (size_t i = 0; i < c.n_layers; ++i) {
    device_layer dl;
    LLMESH_ASSIGN(dl.attn_norm, norm());
    LLMESH_ASSIGN(dl.mlp_norm, norm());
    if (c.qk_norm) {  // unit weights: their first head_dim floats serve
      LLMESH_ASSIGN(dl.q_norm, norm());
      LLMESH_ASSIGN(dl.k_norm, norm());
    }
    LLMESH_ASSIGN(dl.q, matrix(c.n_heads * hd, c.hidden));
    LLMESH_ASSIGN(dl.k, matrix(c.n_kv_heads * hd, c.hidden));
    LLMESH_ASSIGN(dl.v, matrix(c.n_kv_heads * hd, c.hidden));
    LLMESH_ASSIGN(dl.o, matrix(c.hidden, c.n_heads * hd));
    LLMESH_ASSIGN(dl.gate, matrix(c.intermediate, c.hidden));
    LLMESH_ASSIGN(dl.up, matrix(c.intermediate, c.hidden));
    LLMESH_ASSIGN(dl.down, matrix(c.hidden, c.intermediate));
    d.layers.push_back(dl);
  }
  LLMESH_TRY(cuda::synchronize_device());  // fills ran on the legacy stream
  return d;
}

}  // namespace llmesh::model
