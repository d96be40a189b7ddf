// Tests of model::load on directories written by write_random_model: every weight has the
// config's shape (tied and untied, Qwen2 and Llama biases, sharded, f16/bf16), norms and
// biases are converted to float32 exactly, decode_weight_bytes adds up, and configs that
// disagree with the tensors, or missing tensors, are errors naming the tensor.
#include "llmesh/model/weights.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmesh/model/random_model.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;
using kernels::dtype;
using testing::temp_dir;

size_t head_dim_of(const random_model_spec& s) { return s.head_dim ? s.head_dim : s.hidden / s.n_heads; }
bool is_moe(const random_model_spec& s) { return s.arch == "qwen3_moe" || s.arch == "mixtral"; }
size_t experts_of(const random_model_spec& s) { return s.n_experts ? s.n_experts : 8; }
size_t per_token_of(const random_model_spec& s) { return s.experts_per_token ? s.experts_per_token : 2; }

/// Every tensor name write_random_model writes for `s`, in its order.
std::vector<std::string> tensor_names(const random_model_spec& s) {
  std::vector<std::string> names = {"model.embed_tokens.weight", "model.norm.weight"};
  if (!s.tie_embeddings) names.push_back("lm_head.weight");
  const bool biased = (s.arch == "llama" || s.arch == "qwen3" || s.arch == "qwen3_moe") && s.attention_bias;
  const bool qkv_bias = s.arch == "qwen2" || biased;
  const bool o_bias = biased;
  for (size_t i = 0; i < s.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    if (is_moe(s)) {  // attention as Llama's; the router and each expert instead of the MLP
      for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                            "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight"}) {
        names.push_back(p + n);
      }
      const bool mixtral = s.arch == "mixtral";
      const std::string m = p + (mixtral ? "block_sparse_moe." : "mlp.");
      names.push_back(m + "gate.weight");
      for (size_t e = 0; e < experts_of(s); ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        for (const char* n : {mixtral ? "w1.weight" : "gate_proj.weight", mixtral ? "w3.weight" : "up_proj.weight",
                              mixtral ? "w2.weight" : "down_proj.weight"}) {
          names.push_back(x + n);
        }
      }
    } else if (s.arch == "phi3") {  // fused: q, k, v in one tensor; gate and up in another
      for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.qkv_proj.weight",
                            "self_attn.o_proj.weight", "mlp.gate_up_proj.weight", "mlp.down_proj.weight"}) {
        names.push_back(p + n);
      }
    } else {
      for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                            "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                            "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
        names.push_back(p + n);
      }
    }
    if (qkv_bias) {
      for (const char* n : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}) names.push_back(p + n);
    }
    if (o_bias) names.push_back(p + "self_attn.o_proj.bias");
    if (s.arch == "qwen3" || s.arch == "qwen3_moe") {
      for (const char* n : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}) names.push_back(p + n);
    }
  }
  return names;
}

std::shared_ptr<const model> write_and_load(const random_model_spec& spec, const temp_dir& dir) {
  status w = write_random_model(spec, dir.path());
  EXPECT_TRUE(w.ok()) << (w.ok() ? "" : w.err().message);
  auto m = model::load(dir.path());
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
  return m.ok() ? m.value() : nullptr;
}

void expect_matrix(const weight_matrix& w, dtype t, size_t rows, size_t cols, const char* what) {
  EXPECT_NE(w.data, nullptr) << what;
  EXPECT_EQ(w.type, t) << what;
  EXPECT_EQ(w.rows, rows) << what;
  EXPECT_EQ(w.cols, cols) << what;
  EXPECT_EQ(w.bytes(), rows * cols * kernels::dtype_size(t)) << what;
}

/// Checks every weight of `m` against the shapes `s` implies.
void expect_shapes(const model& m, const random_model_spec& s) {
  const model_config& c = m.config();
  const size_t hd = head_dim_of(s), q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd;
  EXPECT_EQ(c.hidden, s.hidden);
  EXPECT_EQ(c.intermediate, s.intermediate);
  EXPECT_EQ(c.n_layers, s.n_layers);
  EXPECT_EQ(c.n_heads, s.n_heads);
  EXPECT_EQ(c.n_kv_heads, s.n_kv_heads);
  EXPECT_EQ(c.head_dim, hd);
  EXPECT_EQ(c.vocab, s.vocab);
  EXPECT_EQ(c.tie_embeddings, s.tie_embeddings);
  const model_weights& w = m.weights();
  expect_matrix(w.embed, s.dtype, s.vocab, s.hidden, "embed");
  expect_matrix(w.lm_head, s.dtype, s.vocab, s.hidden, "lm_head");
  if (s.tie_embeddings) {
    EXPECT_EQ(w.lm_head.data, w.embed.data);
  } else {
    EXPECT_NE(w.lm_head.data, w.embed.data);
  }
  EXPECT_EQ(w.final_norm.size(), s.hidden);
  ASSERT_EQ(w.layers.size(), s.n_layers);
  const bool biased = (s.arch == "llama" || s.arch == "qwen3" || s.arch == "qwen3_moe") && s.attention_bias;
  const bool qkv_bias = s.arch == "qwen2" || biased;
  const bool o_bias = biased;
  const bool qk_norm = s.arch == "qwen3" || s.arch == "qwen3_moe";
  EXPECT_EQ(c.moe.n_experts, is_moe(s) ? experts_of(s) : 0u);
  for (const auto& l : w.layers) {
    EXPECT_EQ(l.attn_norm.size(), s.hidden);
    EXPECT_EQ(l.mlp_norm.size(), s.hidden);
    expect_matrix(l.q, s.dtype, q_dim, s.hidden, "q");
    expect_matrix(l.k, s.dtype, kv_dim, s.hidden, "k");
    expect_matrix(l.v, s.dtype, kv_dim, s.hidden, "v");
    expect_matrix(l.o, s.dtype, s.hidden, q_dim, "o");
    if (is_moe(s)) {
      EXPECT_EQ(l.gate.rows + l.up.rows + l.down.rows, 0u) << "no dense MLP";
      expect_matrix(l.router, s.dtype, experts_of(s), s.hidden, "router");
      ASSERT_EQ(l.experts.size(), experts_of(s));
      for (const auto& x : l.experts) {
        expect_matrix(x.gate, s.dtype, s.intermediate, s.hidden, "expert gate");
        expect_matrix(x.up, s.dtype, s.intermediate, s.hidden, "expert up");
        expect_matrix(x.down, s.dtype, s.hidden, s.intermediate, "expert down");
      }
    } else {
      expect_matrix(l.gate, s.dtype, s.intermediate, s.hidden, "gate");
      expect_matrix(l.up, s.dtype, s.intermediate, s.hidden, "up");
      expect_matrix(l.down, s.dtype, s.hidden, s.intermediate, "down");
      EXPECT_TRUE(l.experts.empty());
    }
    EXPECT_EQ(l.q_bias.size(), qkv_bias ? q_dim : 0u);
    EXPECT_EQ(l.k_bias.size(), qkv_bias ? kv_dim : 0u);
    EXPECT_EQ(l.v_bias.size(), qkv_bias ? kv_dim : 0u);
    EXPECT_EQ(l.o_bias.size(), o_bias ? s.hidden : 0u);
    EXPECT_EQ(l.q_norm.size(), qk_norm ? hd : 0u);
    EXPECT_EQ(l.k_norm.size(), qk_norm ? hd : 0u);
  }
}

/// decode_weight_bytes computed from the spec alone.
size_t expected_decode_bytes(const random_model_spec& s) {
  const size_t hd = head_dim_of(s), q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd;
  size_t per_layer = q_dim * s.hidden + 2 * kv_dim * s.hidden + s.hidden * q_dim + 3 * s.intermediate * s.hidden;
  if (is_moe(s)) per_layer = per_layer - 3 * s.intermediate * s.hidden + experts_of(s) * s.hidden +
                             per_token_of(s) * 3 * s.intermediate * s.hidden;  // the router and a token's experts
  return (s.vocab * s.hidden + s.n_layers * per_layer) * kernels::dtype_size(s.dtype);
}

struct named_spec {
  const char* name;
  random_model_spec spec;
};

std::vector<named_spec> specs() {
  std::vector<named_spec> out;
  random_model_spec s;
  out.push_back({"llama untied f32", s});
  s.tie_embeddings = true;
  out.push_back({"llama tied f32", s});
  s = {};
  s.arch = "qwen2";
  s.tie_embeddings = true;
  out.push_back({"qwen2 tied", s});
  s = {};
  s.attention_bias = true;
  out.push_back({"llama attention_bias", s});
  s = {};
  s.arch = "mistral";
  s.sliding_window = 32;
  s.n_layers = 4;
  s.shards = 3;
  out.push_back({"mistral sharded 3", s});
  s = {};
  s.dtype = dtype::f16;
  s.n_kv_heads = 1;
  out.push_back({"llama f16 mqa", s});
  s = {};
  s.dtype = dtype::bf16;
  s.arch = "qwen2";
  s.head_dim = 32;  // q_dim 128 != hidden 64
  s.llama3_scaling = true;
  out.push_back({"qwen2 bf16 head_dim 32", s});
  s = {};
  s.n_kv_heads = 4;
  s.n_layers = 3;
  s.shards = 4;
  s.attention_bias = true;
  s.dtype = dtype::bf16;
  out.push_back({"llama mha sharded 4 bias", s});
  s = {};
  s.arch = "qwen3";
  s.dtype = dtype::bf16;
  s.head_dim = 32;  // Qwen3: q_dim 128 != hidden 64
  s.tie_embeddings = true;
  out.push_back({"qwen3 bf16 qk_norm", s});
  s.attention_bias = true;
  s.tie_embeddings = false;
  s.shards = 2;
  out.push_back({"qwen3 attention_bias sharded 2", s});
  s = {};
  s.arch = "phi3";
  s.dtype = dtype::bf16;
  s.n_kv_heads = 1;
  s.sliding_window = 16;
  out.push_back({"phi3 fused bf16 mqa", s});
  s = {};
  s.arch = "qwen3_moe";
  s.dtype = dtype::bf16;
  s.n_experts = 4;
  s.experts_per_token = 2;
  s.intermediate = 32;
  s.shards = 2;
  out.push_back({"qwen3_moe 4 experts sharded", s});
  s.attention_bias = true;
  s.shards = 1;
  out.push_back({"qwen3_moe attention_bias", s});
  s = {};
  s.arch = "mixtral";
  out.push_back({"mixtral default experts f32", s});
  return out;
}

TEST(ModelLoad, WeightsHaveTheConfigShapesForEverySpec) {
  for (const auto& [name, spec] : specs()) {
    SCOPED_TRACE(name);
    temp_dir dir;
    auto m = write_and_load(spec, dir);
    ASSERT_NE(m, nullptr);
    expect_shapes(*m, spec);
    EXPECT_EQ(m->dir(), dir.path());
  }
}

TEST(ModelLoad, DecodeWeightBytesIsTheSumOfMatrixSizes) {
  for (const auto& [name, spec] : specs()) {
    SCOPED_TRACE(name);
    temp_dir dir;
    auto m = write_and_load(spec, dir);
    ASSERT_NE(m, nullptr);
    EXPECT_EQ(m->decode_weight_bytes(), expected_decode_bytes(spec));
    const auto& w = m->weights();
    size_t sum = w.lm_head.bytes();
    for (const auto& l : w.layers) {
      for (const weight_matrix* x : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) sum += x->bytes();
      if (!l.experts.empty()) {  // a token reads the router and experts_per_token experts
        const auto& x = l.experts.front();
        sum += l.router.bytes() + per_token_of(spec) * (x.gate.bytes() + x.up.bytes() + x.down.bytes());
      }
    }
    EXPECT_EQ(m->decode_weight_bytes(), sum);
  }
}

TEST(ModelLoad, ConfigFeaturesCarryThrough) {
  random_model_spec s;
  s.arch = "mistral";
  s.sliding_window = 48;
  s.rope_theta = 1e6;
  s.llama3_scaling = true;
  s.max_positions = 512;
  temp_dir dir;
  auto m = write_and_load(s, dir);
  ASSERT_NE(m, nullptr);
  const model_config& c = m->config();
  EXPECT_EQ(c.arch, architecture::mistral);
  EXPECT_EQ(c.sliding_window, 48u);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_TRUE(c.rope.llama3);
  EXPECT_DOUBLE_EQ(c.rope.original_max_position, 64.0);
  EXPECT_EQ(c.max_positions, 512u);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.bos_ids, std::vector<int32_t>{256});
  EXPECT_EQ(c.eos_ids, std::vector<int32_t>{257});
}

TEST(ModelLoad, MatricesPointAtTheStoredBytesAndNormsAreConvertedExactly) {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    SCOPED_TRACE(std::string(kernels::dtype_name(t)));
    random_model_spec s;
    s.arch = "qwen2";
    s.dtype = t;
    temp_dir dir;
    auto m = write_and_load(s, dir);
    ASSERT_NE(m, nullptr);
    auto store = tensor_store::open(dir.path());
    ASSERT_TRUE(store.ok()) << store.err().message;
    auto up = store->get("model.layers.1.mlp.up_proj.weight");
    ASSERT_TRUE(up.ok());
    EXPECT_EQ(std::memcmp(m->weights().layers[1].up.data, up->data, up->bytes), 0);
    struct vec_case {
      const char* name;
      const std::vector<float>* got;
    };
    const auto& l0 = m->weights().layers[0];
    for (const vec_case& vc : {vec_case{"model.layers.0.input_layernorm.weight", &l0.attn_norm},
                               vec_case{"model.layers.0.post_attention_layernorm.weight", &l0.mlp_norm},
                               vec_case{"model.layers.0.self_attn.k_proj.bias", &l0.k_bias},
                               vec_case{"model.norm.weight", &m->weights().final_norm}}) {
      auto v = store->get(vc.name);
      ASSERT_TRUE(v.ok()) << vc.name;
      ASSERT_EQ(vc.got->size(), v->elements()) << vc.name;
      for (size_t i = 0; i < vc.got->size(); ++i) {
        ASSERT_EQ((*vc.got)[i], kernels::load_as_f32(v->data, t, i)) << vc.name << "[" << i << "]";
      }
    }
    // Norms are 1 ± 0.2 and biases ± 0.1 (random_model.cpp), up to rounding to the dtype.
    for (float x : l0.attn_norm) {
      EXPECT_GE(x, 0.79f);
      EXPECT_LE(x, 1.21f);
    }
    for (float x : l0.q_bias) EXPECT_LE(std::abs(x), 0.101f);
  }
}

TEST(ModelLoad, ShardedAndSingleFileModelsLoadTheSameWeights) {
  random_model_spec s;
  s.n_layers = 4;
  s.attention_bias = true;
  temp_dir single_dir, sharded_dir;
  auto single = write_and_load(s, single_dir);
  s.shards = 3;
  auto sharded = write_and_load(s, sharded_dir);
  ASSERT_NE(single, nullptr);
  ASSERT_NE(sharded, nullptr);
  const auto& a = single->weights();
  const auto& b = sharded->weights();
  EXPECT_EQ(std::memcmp(a.embed.data, b.embed.data, a.embed.bytes()), 0);
  EXPECT_EQ(std::memcmp(a.lm_head.data, b.lm_head.data, a.lm_head.bytes()), 0);
  EXPECT_EQ(a.final_norm, b.final_norm);
  for (size_t i = 0; i < s.n_layers; ++i) {
    SCOPED_TRACE("layer " + std::to_string(i));
    const auto& la = a.layers[i];
    const auto& lb = b.layers[i];
    EXPECT_EQ(la.attn_norm, lb.attn_norm);
    EXPECT_EQ(la.mlp_norm, lb.mlp_norm);
    EXPECT_EQ(la.o_bias, lb.o_bias);
    EXPECT_EQ(la.q_bias, lb.q_bias);
    EXPECT_EQ(std::memcmp(la.q.data, lb.q.data, la.q.bytes()), 0);
    EXPECT_EQ(std::memcmp(la.down.data, lb.down.data, la.down.bytes()), 0);
  }
  EXPECT_EQ(single->decode_weight_bytes(), sharded->decode_weight_bytes());
}

/// Rewrites DIR/config.json with `edit` applied.
template <class Edit>
void edit_config(const temp_dir& dir, Edit edit) {
  json c = json::parse(testing::read_text(dir / "config.json"));
  edit(c);
  testing::write_text(dir / "config.json", c.dump(2));
}

error load_error(const temp_dir& dir) {
  auto m = model::load(dir.path());
  EXPECT_FALSE(m.ok()) << "loaded " << dir.path();
  if (m.ok()) return error{};
  EXPECT_NE(m.err().message.find(dir.path()), std::string::npos) << m.err().message;
  return m.err();
}

TEST(ModelLoad, HiddenSizeDisagreeingWithTensorsNamesTensorAndBothShapes) {
  temp_dir dir;
  random_model_spec s;  // hidden 64, vocab 517
  ASSERT_TRUE(write_random_model(s, dir.path()).ok());
  edit_config(dir, [](json& c) { c["hidden_size"] = 72; });  // head_dim 18: still a valid config
  error e = load_error(dir);
  EXPECT_EQ(e.code, errc::invalid_request);
  EXPECT_NE(e.message.find("'model.embed_tokens.weight'"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("[517, 64]"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("[517, 72]"), std::string::npos) << e.message;
}

TEST(ModelLoad, LayerShapeMismatchesNameTheLayerTensor) {
  struct mismatch {
    const char* field;
    int value;
    const char* tensor;
    const char* have;
    const char* need;
  };
  // Default spec: hidden 64, intermediate 160, heads 4, kv heads 2, head_dim 16.
  for (const mismatch& mm : {mismatch{"intermediate_size", 128, "'model.layers.0.mlp.gate_proj.weight'", "[160, 64]", "[128, 64]"},
                             mismatch{"num_key_value_heads", 4, "'model.layers.0.self_attn.k_proj.weight'", "[32, 64]", "[64, 64]"},
                             mismatch{"head_dim", 8, "'model.layers.0.self_attn.q_proj.weight'", "[64, 64]", "[32, 64]"}}) {
    SCOPED_TRACE(mm.field);
    temp_dir dir;
    ASSERT_TRUE(write_random_model(random_model_spec{}, dir.path()).ok());
    edit_config(dir, [&](json& c) { c[mm.field] = mm.value; });
    error e = load_error(dir);
    EXPECT_EQ(e.code, errc::invalid_request);
    EXPECT_NE(e.message.find(mm.tensor), std::string::npos) << e.message;
    EXPECT_NE(e.message.find(mm.have), std::string::npos) << e.message;
    EXPECT_NE(e.message.find(mm.need), std::string::npos) << e.message;
  }
}

TEST(ModelLoad, MoreLayersInConfigThanTensorsNamesTheFirstMissingOne) {
  temp_dir dir;
  ASSERT_TRUE(write_random_model(random_model_spec{}, dir.path()).ok());
  edit_config(dir, [](json& c) { c["num_hidden_layers"] = 3; });
  error e = load_error(dir);
  EXPECT_NE(e.message.find("'model.layers.2.input_layernorm.weight'"), std::string::npos) << e.message;
}

TEST(ModelLoad, UntyingATiedModelNamesTheMissingLmHead) {
  temp_dir dir;
  random_model_spec s;
  s.tie_embeddings = true;
  ASSERT_TRUE(write_random_model(s, dir.path()).ok());
  edit_config(dir, [](json& c) { c["tie_word_embeddings"] = false; });
  error e = load_error(dir);
  EXPECT_NE(e.message.find("'lm_head.weight'"), std::string::npos) << e.message;
}

/// Rewrites DIR/model.safetensors (single-file spec `s`) from its own tensors, leaving out `drop`.
void rewrite_without(const temp_dir& dir, const random_model_spec& s, const std::string& drop) {
  std::vector<tensor_spec> out;
  {
    auto store = tensor_store::open(dir.path());
    ASSERT_TRUE(store.ok()) << store.err().message;
    for (const auto& name : tensor_names(s)) {
      auto v = store->get(name);
      ASSERT_TRUE(v.ok()) << v.err().message;
      if (name == drop) continue;
      // Copy out of the mapping before the file is rewritten underneath it.
      auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(v->data),
                                                          static_cast<const uint8_t*>(v->data) + v->bytes);
      out.push_back({name, v->type, v->shape, [bytes](std::span<uint8_t> dst) {
                       std::memcpy(dst.data(), bytes->data(), bytes->size());
                     }});
    }
    ASSERT_EQ(store->size(), tensor_names(s).size()) << "tensor_names() is out of date with random_model.cpp";
  }
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", out).ok());
}

TEST(ModelLoad, MissingTensorIsNamed) {
  random_model_spec s;
  for (const char* drop : {"model.layers.1.mlp.up_proj.weight", "model.norm.weight", "lm_head.weight"}) {
    SCOPED_TRACE(drop);
    temp_dir dir;
    ASSERT_TRUE(write_random_model(s, dir.path()).ok());
    ASSERT_TRUE(model::load(dir.path()).ok());
    rewrite_without(dir, s, drop);
    error e = load_error(dir);
    EXPECT_EQ(e.code, errc::not_found) << errc_name(e.code);
    EXPECT_NE(e.message.find(std::string("missing tensor '") + drop + "'"), std::string::npos) << e.message;
  }
}

TEST(ModelLoad, MissingBiasTensorIsNamed) {
  random_model_spec s;
  s.arch = "qwen2";
  temp_dir dir;
  ASSERT_TRUE(write_random_model(s, dir.path()).ok());
  rewrite_without(dir, s, "model.layers.0.self_attn.v_proj.bias");
  error e = load_error(dir);
  EXPECT_NE(e.message.find("'model.layers.0.self_attn.v_proj.bias'"), std::string::npos) << e.message;
}

TEST(ModelLoad, MissingFilesAreNotFound) {
  temp_dir dir;
  auto no_dir = model::load(dir / "nothing_here");
  ASSERT_FALSE(no_dir.ok());
  EXPECT_EQ(no_dir.err().code, errc::not_found);
  EXPECT_NE(no_dir.err().message.find("config.json"), std::string::npos) << no_dir.err().message;

  ASSERT_TRUE(write_random_model(random_model_spec{}, dir.path()).ok());
  ASSERT_EQ(std::remove((dir / "model.safetensors").c_str()), 0);
  auto no_weights = model::load(dir.path());
  ASSERT_FALSE(no_weights.ok());
  EXPECT_EQ(no_weights.err().code, errc::not_found);
  EXPECT_NE(no_weights.err().message.find("model.safetensors"), std::string::npos) << no_weights.err().message;
}

TEST(ModelLoad, ModelOutlivesItsLoaderAndKeepsFilesMapped) {
  temp_dir dir;
  random_model_spec s;
  auto m = write_and_load(s, dir);
  ASSERT_NE(m, nullptr);
  std::vector<uint8_t> before(static_cast<const uint8_t*>(m->weights().embed.data),
                              static_cast<const uint8_t*>(m->weights().embed.data) + m->weights().embed.bytes());
  // Unlinking the files does not invalidate the mapping.
  ASSERT_EQ(std::remove((dir / "model.safetensors").c_str()), 0);
  EXPECT_EQ(std::memcmp(m->weights().embed.data, before.data(), before.size()), 0);
}

}  // namespace
}  // namespace llmesh::model
