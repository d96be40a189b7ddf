// Binds HF tensor names to the weight views and checks every shape against the config.
#include "llmesh/model/weights.hpp"

#include <filesystem>

#include "llmesh/model/detokenizer.hpp"
#include "llmesh/model/token_mask.hpp"

namespace llmesh::model {
namespace {

std::string shape_str(const std::vector<size_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

result<weight_matrix> matrix(const tensor_store& store, const std::string& name, size_t rows, size_t cols) {
  auto t = store.get(name);
  if (!t) return t.take_error();
  if (t->shape != std::vector<size_t>{rows, cols}) {
    return make_error(errc::invalid_request, "tensor '" + name + "' has shape " + shape_str(t->shape) +
                                                 ", the config needs [" + std::to_string(rows) + ", " +
                                                 std::to_string(cols) + "]");
  }
  return weight_matrix{t->data, t->type, rows, cols};
}

result<std::vector<float>> vector_f32(const tensor_store& store, const std::string& name, size_t n) {
  auto t = store.get(name);
  if (!t) return t.take_error();
  if (t->shape != std::vector<size_t>{n}) {
    return make_error(errc::invalid_request, "tensor '" + name + "' has shape " + shape_str(t->shape) +
                                                 ", the config needs [" + std::to_string(n) + "]");
  }
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = kernels::load_as_f32(t->data, t->type, i);
  return out;
}

}  // namespace

result<std::shared_ptr<const model>> model::load(const std::string& dir) {
  auto cfg = load_config(dir);
  if (!cfg) return cfg.take_error();
  auto store = tensor_store::open(dir);
  if (!store) return store.take_error();
  std::shared_ptr<model> m(new model(dir, std::move(cfg.value()), std::move(store.value())));
  if (auto s = m->bind_weights(); !s) {
    error e = s.take_error();
    e.message = dir + ": " + e.message;
    return e;
  }
  if (std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json")) {
    if (auto d = detokenizer::load(dir)) m->vocabulary_ = token_vocabulary::build(*d);
  }
  return std::shared_ptr<const model>(std::move(m));
}

status model::bind_weights() {
  const auto& c = config_;
  const size_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
#define LLMESH_BIND(dst, expr)         \
  {                                    \
    auto r = (expr);                   \
    if (!r) return r.take_error();     \
    dst = std::move(r.value());        \
  }
  LLMESH_BIND(weights_.embed, matrix(store_, "model.embed_tokens.weight", c.vocab, c.hidden))
  LLMESH_BIND(weights_.final_norm, vector_f32(store_, "model.norm.weight", c.hidden))
  if (c.tie_embeddings) {
    weights_.lm_head = weights_.embed;
  } else {
    LLMESH_BIND(weights_.lm_head, matrix(store_, "lm_head.weight", c.vocab, c.hidden))
  }
  weights_.layers.resize(c.n_layers);
  for (size_t i = 0; i < c.n_layers; ++i) {
    auto& l = weights_.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LLMESH_BIND(l.attn_norm, vector_f32(store_, p + "input_layernorm.weight", c.hidden))
    LLMESH_BIND(l.mlp_norm, vector_f32(store_, p + "post_attention_layernorm.weight", c.hidden))
    LLMESH_BIND(l.q, matrix(store_, p + "self_attn.q_proj.weight", q_dim, c.hidden))
    LLMESH_BIND(l.k, matrix(store_, p + "self_attn.k_proj.weight", kv_dim, c.hidden))
    LLMESH_BIND(l.v, matrix(store_, p + "self_attn.v_proj.weight", kv_dim, c.hidden))
    LLMESH_BIND(l.o, matrix(store_, p + "self_attn.o_proj.weight", c.hidden, q_dim))
    LLMESH_BIND(l.gate, matrix(store_, p + "mlp.gate_proj.weight", c.intermediate, c.hidden))
    LLMESH_BIND(l.up, matrix(store_, p + "mlp.up_proj.weight", c.intermediate, c.hidden))
    LLMESH_BIND(l.down, matrix(store_, p + "mlp.down_proj.weight", c.hidden, c.intermediate))
    if (c.qkv_bias) {
      LLMESH_BIND(l.q_bias, vector_f32(store_, p + "self_attn.q_proj.bias", q_dim))
      LLMESH_BIND(l.k_bias, vector_f32(store_, p + "self_attn.k_proj.bias", kv_dim))
      LLMESH_BIND(l.v_bias, vector_f32(store_, p + "self_attn.v_proj.bias", kv_dim))
    }
    if (c.o_bias) LLMESH_BIND(l.o_bias, vector_f32(store_, p + "self_attn.o_proj.bias", c.hidden))
  }
#undef LLMESH_BIND
  return ok_status();
}

size_t model::decode_weight_bytes() const {
  size_t total = weights_.lm_head.bytes();
  for (const auto& l : weights_.layers) {
    total += l.q.bytes() + l.k.bytes() + l.v.bytes() + l.o.bytes() + l.gate.bytes() + l.up.bytes() + l.down.bytes();
  }
  return total;
}

}  // namespace llmesh::model
