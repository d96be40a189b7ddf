// Binds HF tensor names to the weight views and checks every shape against the config.
#include "llmesh/model/weights.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <tuple>

#include "llmesh/kernels/quantize.hpp"

#include "llmesh/model/detokenizer.hpp"
#include "llmesh/model/gguf.hpp"
#include "llmesh/model/token_mask.hpp"
#include "fp8_weights.hpp"
#include "gpt_oss_experts.hpp"
#include "gguf_model.hpp"
#include "kv_scales.hpp"
#include "load_threads.hpp"
#include "packed_weights.hpp"
#include "rank_parts.hpp"
#include "weight_rewrite.hpp"

namespace llmesh::model {
namespace {

result<weight_matrix> matrix(const tensor_store& store, const std::string& name, size_t rows, size_t cols) {
  auto t = store.get(name);
  if (!t) return t.take_error();
  if (t->shape != std::vector<size_t>{rows, cols}) {
    return make_error(errc::invalid_request, "tensor '" + name + "' has shape " + shape_string(t->shape) +
                                                 ", the config needs [" + std::to_string(rows) + ", " +
                                                 std::to_string(cols) + "]");
  }
  return weight_matrix{t->data, t->type, rows, cols};
}

/// Rows [row0, row0 + n) of a checkpoint matrix, as a matrix of their own (a fused tensor's part).
weight_matrix row_part(const weight_matrix& w, size_t row0, size_t n) {
  const auto* base = static_cast<const uint8_t*>(w.data);
  return weight_matrix{base + kernels::dtype_bytes(w.type, row0 * w.ld()), w.type, n, w.cols};
}

result<std::vector<float>> vector_f32(const tensor_store& store, const std::string& name, size_t n) {
  auto t = store.get(name);
  if (!t) return t.take_error();
  if (t->shape != std::vector<size_t>{n}) {
    return make_error(errc::invalid_request, "tensor '" + name + "' has shape " + shape_string(t->shape) +
                                                 ", the config needs [" + std::to_string(n) + "]");
  }
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = kernels::load_as_f32(t->data, t->type, i);
  return out;
}

}  // namespace

std::string_view quantization_name(quantization q) {
  switch (q) {
    case quantization::none: break;
    case quantization::int8: return "int8";
    case quantization::awq: return "awq";
    case quantization::gptq: return "gptq";
    case quantization::compressed_tensors: return "compressed-tensors";
    case quantization::gguf: return "gguf";
    case quantization::fp8: return "fp8";
    case quantization::mxfp4: return "mxfp4";
  }
  return "none";
}

result<quantization> parse_quantization(std::string_view s) {
  if (s == "none") return quantization::none;
  if (s == "int8") return quantization::int8;
  if (s == "awq" || s == "awq_marlin") return quantization::awq;
  if (s == "gptq" || s == "gptq_marlin") return quantization::gptq;
  if (s == "compressed-tensors") return quantization::compressed_tensors;
  if (s == "gguf") return quantization::gguf;
  if (s == "fp8") return quantization::fp8;
  if (s == "mxfp4") return quantization::mxfp4;
  for (const char* other : {"fbgemm_fp8", "ptpc_fp8", "modelopt", "modelopt_fp4", "bitsandbytes", "experts_int8",
                            "deepspeedfp", "marlin", "gptq_bitblas", "bitblas", "hqq", "moe_wna16", "quark", "torchao", "ipex", "inc",
                            "tpu_int8", "fp_quant", "auto-round", "rtn"}) {
    if (s == other) {
      return make_error(errc::unsupported, "--quantization " + std::string(s) +
                                               " is not supported: llmesh quantizes to int8 or (vLLM's online) fp8, or runs a "
                                               "checkpoint's own AWQ, GPTQ, compressed-tensors, FP8, MXFP4 or GGUF quantization");
    }
  }
  return make_error(errc::invalid_request, "--quantization must be none, int8, awq (awq_marlin), gptq (gptq_marlin), "
                                           "compressed-tensors, gguf, fp8 or mxfp4, not '" + std::string(s) + "'");
}

namespace {

/// vLLM's rule: --quantization naming a checkpoint's method must name this checkpoint's.
status check_checkpoint_method(quantization q, const model_config& c, const std::string& dir) {
  using method = model_config::packed_config::method;
  if (q == quantization::none || q == quantization::int8) return ok_status();
  const quantization own = is_gguf_file(dir)                    ? quantization::gguf
                           : c.packed.kind == method::awq        ? quantization::awq
                           : c.packed.kind == method::gptq       ? quantization::gptq
                           : c.packed.kind == method::compressed ? quantization::compressed_tensors
                           : c.packed.kind == method::fp8        ? quantization::fp8
                           : c.packed.kind == method::mxfp4      ? quantization::mxfp4
                                                                 : quantization::none;
  if (own == q) return ok_status();
  const char* has = own == quantization::gguf                 ? "it is a GGUF file"
                    : own == quantization::awq                ? "its quantization_config is AWQ"
                    : own == quantization::gptq               ? "its quantization_config is GPTQ"
                    : own == quantization::compressed_tensors ? "its quantization_config is compressed-tensors"
                    : own == quantization::fp8                ? "its quantization_config is fp8"
                    : own == quantization::mxfp4              ? "its quantization_config is mxfp4"
                                                              : "it has no quantization_config";
  if (q == quantization::fp8 && own == quantization::none) return ok_status();  // vLLM's online FP8: model::quantize
  return make_error(errc::invalid_request, "--quantization " + std::string(quantization_name(q)) +
                                               " does not match the checkpoint: " + has);
}

}  // namespace

std::string_view weight_dtype_name(std::optional<kernels::dtype> t) {
  if (!t) return "auto";
  switch (*t) {
    case kernels::dtype::f32: return "float32";
    case kernels::dtype::f16: return "float16";
    case kernels::dtype::bf16: return "bfloat16";
    case kernels::dtype::q8: return "int8";
    case kernels::dtype::q4: return "int4";
    case kernels::dtype::fp8: return "fp8";
    case kernels::dtype::mxfp4: return "mxfp4";
    case kernels::dtype::q2_k: case kernels::dtype::q3_k: case kernels::dtype::q4_k: case kernels::dtype::q5_k:
    case kernels::dtype::q6_k: case kernels::dtype::iq4_xs: case kernels::dtype::f8_e4m3: case kernels::dtype::f8_e5m2:
      break;
  }
  return kernels::dtype_name(*t);
}

result<std::optional<kernels::dtype>> parse_weight_dtype(std::string_view s) {
  if (s == "auto") return std::optional<kernels::dtype>();
  if (s == "float32" || s == "float") return std::optional(kernels::dtype::f32);
  if (s == "bfloat16") return std::optional(kernels::dtype::bf16);
  if (s == "float16" || s == "half") return std::optional(kernels::dtype::f16);
  return make_error(errc::invalid_request,
                    "--dtype must be auto, bfloat16, float16 (half) or float32 (float), not '" + std::string(s) + "'");
}

namespace {

/// load_options::ranks checked, sorted and without repeats; nullopt when it names every rank.
result<std::optional<rank_set>> held_ranks_of(std::optional<rank_set> r) {
  if (!r) return r;
  if (r->tp < 1 || r->ranks.empty()) return make_error(errc::invalid_request, "the ranks to load need a tp of at least 1 and a rank");
  std::sort(r->ranks.begin(), r->ranks.end());
  r->ranks.erase(std::unique(r->ranks.begin(), r->ranks.end()), r->ranks.end());
  if (r->ranks.front() < 0 || r->ranks.back() >= r->tp) {
    return make_error(errc::invalid_request, "rank " + std::to_string(r->ranks.front() < 0 ? r->ranks.front() : r->ranks.back()) +
                                                 " to load is outside tp " + std::to_string(r->tp));
  }
  if (static_cast<int>(r->ranks.size()) == r->tp) return std::optional<rank_set>();
  return r;
}

}  // namespace

status model::check_ranks(int tp, bool expert_parallel, std::span<const int> ranks) const {
  if (!held_ranks_) return ok_status();
  const auto& h = *held_ranks_;
  // A dense model ignores expert parallelism (make_shard_layout), so its parts do not depend on it.
  const bool ep_differs = config_.moe.n_experts > 0 && h.expert_parallel != expert_parallel;
  bool held = h.tp == tp && !ep_differs;
  for (int r : ranks) held = held && std::binary_search(h.ranks.begin(), h.ranks.end(), r);
  if (held) return ok_status();
  std::string have;
  for (int r : h.ranks) {
    if (!have.empty()) have += ", ";
    have += std::to_string(r);
  }
  return make_error(errc::invalid_request, "this copy of the model was loaded for rank" + std::string(h.ranks.size() > 1 ? "s " : " ") +
                                               have + " of tp " + std::to_string(h.tp) +
                                               (h.expert_parallel ? " with expert parallelism" : "") +
                                               " only; it cannot run other ranks");
}

result<std::shared_ptr<const model>> model::load(const std::string& dir, load_options opt) {
  auto cfg = load_config(dir, opt.hf_overrides);
  if (!cfg) return cfg.take_error();
  choose_longrope(*cfg, opt.max_model_len);
  if (auto s = check_checkpoint_method(opt.quant, *cfg, dir); !s) {
    error e = s.take_error();
    e.message = dir + ": " + e.message;
    return e;
  }
  auto ranks = held_ranks_of(opt.ranks);
  if (!ranks) return ranks.take_error();
  // What the held ranks read of a checkpoint tensor, by its HF name (the LM head whole for a
  // classifier_from_token classifier: it takes rows of it before any rank runs).
  detail::part_of_tensor part_of;
  if (*ranks) {
    part_of = [c = *cfg, r = **ranks](const std::string& name) {
      const auto [role, expert] = detail::role_of(name);
      const bool head_rows = role == detail::matrix_role::lm_head && !c.classifier.from_tokens.empty();
      return head_rows ? detail::matrix_part{} : detail::part_read(c, r, role, expert);
    };
  }
  std::vector<detail::own_columns> own;  // one rank's columns written as matrices of their own
  auto store = is_gguf_file(dir) ? gguf_tensor_store(dir, part_of, &own) : tensor_store::open(dir);
  if (!store) return store.take_error();
  if (cfg->language_model_of_multimodal && !is_gguf_file(dir)) {
    if (auto s = store->take_language_model(); !s) {
      error e = s.take_error();
      e.message = dir + ": " + e.message;
      return e;
    }
  }
  if (auto s = detail::unpack_packed_weights(*store, cfg->packed, part_of, &own); !s) {  // packed checkpoints' layers into int4 or int8
    error e = s.take_error();
    e.message = dir + ": " + e.message;
    return e;
  }
  if (auto s = detail::convert_fp8_weights(*store, cfg->packed, part_of, &own); !s) {  // FP8 checkpoints' layers into fp8 blocks
    error e = s.take_error();
    e.message = dir + ": " + e.message;
    return e;
  }
  if (cfg->arch == architecture::gpt_oss && !is_gguf_file(dir)) {  // the fused experts into Qwen3-MoE's per-expert tensors (a GGUF file's are split)
    const std::string root = !store->contains("model.embed_tokens.weight") && store->contains("embed_tokens.weight") ? "" : "model.";
    if (auto s = detail::split_gpt_oss_experts(*store, *cfg, root, part_of, &own); !s) {
      error e = s.take_error();
      e.message = dir + ": " + e.message;
      return e;
    }
  }
  std::shared_ptr<model> m(new model(dir, std::move(cfg.value()), std::move(store.value())));
  m->held_ranks_ = std::move(*ranks);
  m->keep_column_slices(own);
  if (auto s = m->bind_weights(); !s) {
    error e = s.take_error();
    e.message = dir + ": " + e.message;
    return e;
  }
  const std::string& tok_dir = opt.tokenizer_dir.empty() ? dir : opt.tokenizer_dir;
  if (auto s = m->bind_classifier(tok_dir); !s) {
    error e = s.take_error();
    e.message = dir + ": " + e.message;
    return e;
  }
  // Online FP8 quantizes the checkpoint's values (each matrix's scale from all of it: a cast
  // of some ranks' parts would not have all of it), then --dtype casts what stays unquantized.
  const bool quantize_first = opt.quant == quantization::fp8 && !m->config_.packed.float8;
  auto quantize = [&]() -> status {
    if (auto s = m->quantize(opt.quant, quantize_first && opt.dtype ? *opt.dtype : kernels::dtype::f32); !s) {
      error e = s.take_error();
      e.message = dir + ": " + e.message;
      return e;
    }
    return ok_status();
  };
  if (quantize_first) LLMESH_TRY(quantize());
  if (opt.dtype) {
    if (auto s = m->cast(*opt.dtype); !s) {
      error e = s.take_error();
      e.message = dir + ": --dtype " + std::string(weight_dtype_name(opt.dtype)) + ": " + e.message;
      return e;
    }
  }
  if (!quantize_first) LLMESH_TRY(quantize());
  if (auto s = m->compact_columns(); !s) return s.take_error();
  uint32_t held = 0;  // a bit per dtype
  auto note = [&](const weight_matrix& w) {
    if (w.rows != 0) held |= 1u << static_cast<unsigned>(w.type);
  };
  note(m->weights_.lm_head);
  note(m->weights_.embed);
  for (const auto& l : m->weights_.layers) {
    for (const weight_matrix* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) note(*w);
    for (const auto& x : l.experts) {
      note(x.gate);
      note(x.up);
      note(x.down);
    }
    for (const weight_matrix* w : {&l.shared.gate, &l.shared.up, &l.shared.down, &l.shared_gate}) note(*w);
  }
  for (auto t : {kernels::dtype::q2_k, kernels::dtype::q3_k, kernels::dtype::q4_k, kernels::dtype::q5_k, kernels::dtype::q6_k,
                 kernels::dtype::iq4_xs, kernels::dtype::q4, kernels::dtype::q8, kernels::dtype::fp8, kernels::dtype::mxfp4}) {
    if (held & (1u << static_cast<unsigned>(t))) {
      m->quantized_types_ += (m->quantized_types_.empty() ? "" : "+") + std::string(weight_dtype_name(t));
    }
  }
  m->lora_enabled_ = opt.enable_lora || !opt.loras.empty();
  m->lora_type_ = opt.lora_dtype ? opt.lora_dtype : opt.dtype;  // auto: the weights' (vLLM's)
  if (opt.max_loras != 0 && opt.max_loras < opt.loras.size()) {
    return make_error(errc::invalid_request, "--max-cpu-loras " + std::to_string(opt.max_loras) + " is below the " +
                                                 std::to_string(opt.loras.size()) + " adapters given");
  }
  m->loras_->set_capacity(std::max(opt.max_loras ? opt.max_loras : lora_set::default_capacity, opt.loras.size()));
  for (const auto& src : opt.loras) {
    auto id = m->load_lora(src);
    if (!id) return id.take_error();
  }
  if (is_gguf_file(tok_dir) || std::filesystem::exists(std::filesystem::path(tok_dir) / "tokenizer.json")) {
    if (auto d = detokenizer::load(tok_dir)) m->vocabulary_ = token_vocabulary::build(*d);
  }
  return std::shared_ptr<const model>(std::move(m));
}

result<int32_t> model::load_lora(const lora_source& src) const {
  if (!lora_enabled_) {
    return make_error(errc::unsupported, "this model was loaded without LoRA support (start with --enable-lora)");
  }
  auto a = llmesh::model::load_lora(src, config_);
  if (!a) return a.take_error();
  if (lora_type_) LLMESH_TRY(cast_lora(*a, *lora_type_));
  return loras_->add(std::make_shared<const lora_adapter>(std::move(*a)));
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
  // Gemma's RMSNorm multiplies by (1 + weight): the 1 is added here, in float32 as HF does.
  auto norm = [&](const std::string& name, size_t n) -> result<std::vector<float>> {
    auto v = vector_f32(store_, name, n);
    if (v && c.gemma.on) {
      for (float& x : *v) x = 1.0f + x;
    }
    return v;
  };
  // A bare transformer's tensors (an embedding model saved from ...Model) have no "model." prefix.
  const std::string root = !store_.contains("model.embed_tokens.weight") && store_.contains("embed_tokens.weight") ? "" : "model.";
  root_ = root;
  LLMESH_BIND(weights_.embed, matrix(store_, root + "embed_tokens.weight", c.vocab, c.hidden))
  LLMESH_BIND(weights_.final_norm, norm(root + "norm.weight", c.hidden))
  if (!c.tie_embeddings && c.has_lm_head && !store_.contains("lm_head.weight") && root.empty()) {
    config_.has_lm_head = false;  // a ...ForCausalLM config over a bare checkpoint (Qwen3-Embedding-8B)
  }
  if (c.tie_embeddings || !c.has_lm_head) {
    weights_.lm_head = weights_.embed;  // tied; or a stand-in for a head never used (embeddings only)
  } else {
    LLMESH_BIND(weights_.lm_head, matrix(store_, "lm_head.weight", c.vocab, c.hidden))
  }
  weights_.layers.resize(c.n_layers);
  for (size_t i = 0; i < c.n_layers; ++i) {
    auto& l = weights_.layers[i];
    const std::string p = root + "layers." + std::to_string(i) + ".";
    LLMESH_BIND(l.attn_norm, norm(p + "input_layernorm.weight", c.hidden))
    if (c.gemma.sandwich_norms) {
      LLMESH_BIND(l.post_attn_norm, norm(p + "post_attention_layernorm.weight", c.hidden))
      LLMESH_BIND(l.mlp_norm, norm(p + "pre_feedforward_layernorm.weight", c.hidden))
      LLMESH_BIND(l.post_mlp_norm, norm(p + "post_feedforward_layernorm.weight", c.hidden))
    } else {
      LLMESH_BIND(l.mlp_norm, norm(p + "post_attention_layernorm.weight", c.hidden))
    }
    if (c.fused_projections) {  // Phi-3: views of the fused tensors' parts
      weight_matrix qkv, gate_up;
      LLMESH_BIND(qkv, matrix(store_, p + "self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, c.hidden))
      LLMESH_BIND(gate_up, matrix(store_, p + "mlp.gate_up_proj.weight", 2 * c.intermediate, c.hidden))
      l.q = row_part(qkv, 0, q_dim);
      l.k = row_part(qkv, q_dim, kv_dim);
      l.v = row_part(qkv, q_dim + kv_dim, kv_dim);
      l.gate = row_part(gate_up, 0, c.intermediate);
      l.up = row_part(gate_up, c.intermediate, c.intermediate);
    } else {
      LLMESH_BIND(l.q, matrix(store_, p + "self_attn.q_proj.weight", q_dim, c.hidden))
      LLMESH_BIND(l.k, matrix(store_, p + "self_attn.k_proj.weight", kv_dim, c.hidden))
      LLMESH_BIND(l.v, matrix(store_, p + "self_attn.v_proj.weight", kv_dim, c.hidden))
      if (c.moe.n_experts == 0) {
        LLMESH_BIND(l.gate, matrix(store_, p + "mlp.gate_proj.weight", c.intermediate, c.hidden))
        LLMESH_BIND(l.up, matrix(store_, p + "mlp.up_proj.weight", c.intermediate, c.hidden))
      }
    }
    LLMESH_BIND(l.o, matrix(store_, p + "self_attn.o_proj.weight", c.hidden, q_dim))
    if (c.moe.n_experts > 0) {
      LLMESH_TRY(bind_experts(i));
    } else {
      LLMESH_BIND(l.down, matrix(store_, p + "mlp.down_proj.weight", c.hidden, c.intermediate))
    }
    if (c.qkv_bias) {
      LLMESH_BIND(l.q_bias, vector_f32(store_, p + "self_attn.q_proj.bias", q_dim))
      LLMESH_BIND(l.k_bias, vector_f32(store_, p + "self_attn.k_proj.bias", kv_dim))
      LLMESH_BIND(l.v_bias, vector_f32(store_, p + "self_attn.v_proj.bias", kv_dim))
    }
    if (c.o_bias) LLMESH_BIND(l.o_bias, vector_f32(store_, p + "self_attn.o_proj.bias", c.hidden))
    if (c.attn_sinks) LLMESH_BIND(l.sinks, vector_f32(store_, p + "self_attn.sinks", c.n_heads))
    if (c.qk_norm) {
      LLMESH_BIND(l.q_norm, norm(p + "self_attn.q_norm.weight", c.head_dim))
      LLMESH_BIND(l.k_norm, norm(p + "self_attn.k_norm.weight", c.head_dim))
    }
    using method = model_config::packed_config::method;
    if (c.packed.kind == method::fp8 || c.packed.kind == method::compressed) {  // vLLM's configs with a KV-cache method
      auto kv = detail::read_kv_scales(store_, p + "self_attn.");
      if (!kv) return kv.take_error();
      l.k_scale = kv->k;
      l.v_scale = kv->v;
    }
  }
#undef LLMESH_BIND
  return ok_status();
}

status model::bind_experts(size_t layer) {
  const auto& c = config_;
  auto& l = weights_.layers[layer];
  const bool qwen = c.arch != architecture::mixtral;  // GPT-OSS's experts are named as Qwen's (gpt_oss_experts.hpp)
  const std::string p = root_ + "layers." + std::to_string(layer) + (qwen ? ".mlp." : ".block_sparse_moe.");
  const std::string router = c.arch == architecture::gpt_oss ? "router." : "gate.";
  auto r = matrix(store_, p + router + "weight", c.moe.n_experts, c.hidden);
  if (!r) return r.take_error();
  l.router = *r;
  if (c.moe.biases) {
    auto b = vector_f32(store_, p + router + "bias", c.moe.n_experts);
    if (!b) return b.take_error();
    l.router_bias = std::move(*b);
  }
  l.experts.resize(c.moe.n_experts);
  for (size_t e = 0; e < c.moe.n_experts; ++e) {
    const std::string x = p + "experts." + std::to_string(e) + ".";
    auto gate = matrix(store_, x + (qwen ? "gate_proj.weight" : "w1.weight"), c.intermediate, c.hidden);
    if (!gate) return gate.take_error();
    auto up = matrix(store_, x + (qwen ? "up_proj.weight" : "w3.weight"), c.intermediate, c.hidden);
    if (!up) return up.take_error();
    auto down = matrix(store_, x + (qwen ? "down_proj.weight" : "w2.weight"), c.hidden, c.intermediate);
    if (!down) return down.take_error();
    l.experts[e] = {*gate, *up, *down, {}, {}, {}};
    if (c.moe.biases) {
      auto& x = l.experts[e];
      for (auto [dst, name, n] : {std::tuple{&x.gate_bias, "gate_proj.bias", c.intermediate}, std::tuple{&x.up_bias, "up_proj.bias", c.intermediate},
                                  std::tuple{&x.down_bias, "down_proj.bias", c.hidden}}) {
        auto b = vector_f32(store_, p + "experts." + std::to_string(e) + "." + name, n);
        if (!b) return b.take_error();
        *dst = std::move(*b);
      }
    }
  }
  if (c.moe.shared_intermediate > 0) {  // Qwen2-MoE
    const size_t si = c.moe.shared_intermediate;
    auto gate = matrix(store_, p + "shared_expert.gate_proj.weight", si, c.hidden);
    if (!gate) return gate.take_error();
    auto up = matrix(store_, p + "shared_expert.up_proj.weight", si, c.hidden);
    if (!up) return up.take_error();
    auto down = matrix(store_, p + "shared_expert.down_proj.weight", c.hidden, si);
    if (!down) return down.take_error();
    auto scale = matrix(store_, p + "shared_expert_gate.weight", 1, c.hidden);
    if (!scale) return scale.take_error();
    l.shared = {*gate, *up, *down, {}, {}, {}};
    l.shared_gate = *scale;
  }
  return ok_status();
}


status model::quantize(quantization q, kernels::dtype through) {
  const bool online_fp8 = q == quantization::fp8 && !config_.packed.float8;  // vLLM's online FP8
  if (q != quantization::int8 && !online_fp8) {  // none, or a checkpoint's own (load checked it)
    quant_ = q;
    return ok_status();
  }
  const kernels::dtype to = online_fp8 ? kernels::dtype::fp8 : kernels::dtype::q8;
  // The router and the shared expert's gate stay as loaded (small); the embedding gather keeps
  // the checkpoint's rows, so a tied head's source rows stay resident. FP8, as vLLM's, leaves
  // the LM head as loaded too.
  auto targets = detail::targets_of(weights_, to, false, config_, held_ranks_);
  if (!targets.empty() && targets.back().w().data == weights_.lm_head.data) {
    if (online_fp8) targets.pop_back();
    else targets.back().shared = config_.tie_embeddings || !config_.has_lm_head;
  }
  std::vector<detail::own_columns> own;
  auto store = detail::rewrite(targets, to, online_fp8 ? "fp8" : "int8", [this](const weight_matrix& w, size_t c0) { return column_slice(w, c0); }, own,
                               online_fp8 ? through : kernels::dtype::f32);
  if (!store) return store.take_error();
  quantized_ = std::move(*store);
  keep_column_slices(own);
  // A cast's columns that the int8 ones were made from are no view's any more (let go).
  std::vector<const void*> used;
  for (const auto& l : weights_.layers) {
    for (const weight_matrix* w : {&l.o, &l.down, &l.shared.down}) used.push_back(w->data);
    for (const auto& x : l.experts) used.push_back(x.down.data);
  }
  std::sort(used.begin(), used.end());
  std::erase_if(column_slices_, [&](const held_columns& h) { return !std::binary_search(used.begin(), used.end(), h.full); });
  quant_ = q;
  return ok_status();
}

status model::cast(kernels::dtype to) {
  auto targets = detail::targets_of(weights_, to, true, config_, held_ranks_);
  std::vector<detail::own_columns> own;
  auto store = detail::rewrite(targets, to, std::string(kernels::dtype_name(to)).c_str(), [this](const weight_matrix& w, size_t c0) { return column_slice(w, c0); }, own);
  if (!store) return store.take_error();
  cast_ = std::move(*store);
  keep_column_slices(own);
  cast_type_ = to;
  return ok_status();
}

size_t model::weight_bytes() const {
  size_t total = weights_.embed.bytes() + (config_.tie_embeddings || !config_.has_lm_head ? 0 : weights_.lm_head.bytes());
  for (const auto& l : weights_.layers) {
    total += l.q.bytes() + l.k.bytes() + l.v.bytes() + l.o.bytes() + l.gate.bytes() + l.up.bytes() + l.down.bytes();
    total += l.router.bytes() + l.shared_gate.bytes() + l.shared.gate.bytes() + l.shared.up.bytes() + l.shared.down.bytes();
    for (const auto& x : l.experts) total += x.gate.bytes() + x.up.bytes() + x.down.bytes();
  }
  return total;
}

size_t model::decode_weight_bytes() const {
  size_t total = weights_.lm_head.bytes();
  for (const auto& l : weights_.layers) {
    total += l.q.bytes() + l.k.bytes() + l.v.bytes() + l.o.bytes() + l.gate.bytes() + l.up.bytes() + l.down.bytes();
    // A token reads the router and its experts_per_token experts (a step of b tokens reads up
    // to min(n_experts, b * experts_per_token) of them: this is batch 1's figure).
    if (!l.experts.empty()) {
      const auto& x = l.experts.front();
      total += l.router.bytes() + config_.moe.experts_per_token * (x.gate.bytes() + x.up.bytes() + x.down.bytes());
      total += l.shared_gate.bytes() + l.shared.gate.bytes() + l.shared.up.bytes() + l.shared.down.bytes();
    }
  }
  return total;
}

}  // namespace llmesh::model

namespace llmesh::model {

size_t model::decode_params() const {
  auto n = [](const weight_matrix& w) { return w.rows * w.cols; };
  size_t total = n(weights_.lm_head);
  for (const auto& l : weights_.layers) {
    total += n(l.q) + n(l.k) + n(l.v) + n(l.o) + n(l.gate) + n(l.up) + n(l.down);
    if (!l.experts.empty()) {
      const auto& x = l.experts.front();
      total += n(l.router) + config_.moe.experts_per_token * (n(x.gate) + n(x.up) + n(x.down));
      total += n(l.shared_gate) + n(l.shared.gate) + n(l.shared.up) + n(l.shared.down);
    }
  }
  return total;
}

}  // namespace llmesh::model
