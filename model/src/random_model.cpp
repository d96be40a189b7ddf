// Deterministic random models. Every tensor's values come from its own counter-based stream,
// keyed by (seed, tensor name), so the bytes do not depend on write order or sharding.
// Scales keep activations O(1) through the layers and spread the logits (std ≈ 2), so greedy
// decoding has clear winners and golden comparisons are not decided by rounding.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "llmesh/model/random_model.hpp"
#include "random_fill.hpp"
#include "random_packed.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::ordered_json;
using detail::uniform;

/// GPT-2's byte-to-unicode table: the printable byte-level alphabet of BPE vocabularies.
std::string byte_token(int b) {
  int cp = b;
  bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  if (!printable) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
  return s;
}

json tokenizer_json(size_t vocab) {
  json v = json::object();
  for (int b = 0; b < 256; ++b) v[byte_token(b)] = b;
  v["<|begin_of_text|>"] = 256;
  v["<|end_of_text|>"] = 257;
  for (size_t i = 258; i < vocab; ++i) v["<|reserved_" + std::to_string(i) + "|>"] = i;
  json added = json::array();
  for (int id : {256, 257}) {
    added.push_back({{"id", id}, {"content", id == 256 ? "<|begin_of_text|>" : "<|end_of_text|>"}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", nullptr},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
            {"vocab", v}, {"merges", json::array()}}}};
}

status write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text << "\n";
  out.close();
  if (!out) return make_error(errc::io_error, "cannot write " + path);
  return ok_status();
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

result<std::string> config_architecture_name(const std::string& arch) {
  if (arch == "llama") return std::string("LlamaForCausalLM");
  if (arch == "mistral") return std::string("MistralForCausalLM");
  if (arch == "qwen2") return std::string("Qwen2ForCausalLM");
  if (arch == "qwen3") return std::string("Qwen3ForCausalLM");
  if (arch == "phi3") return std::string("Phi3ForCausalLM");
  if (arch == "qwen3_moe") return std::string("Qwen3MoeForCausalLM");
  if (arch == "mixtral") return std::string("MixtralForCausalLM");
  if (arch == "qwen2_moe") return std::string("Qwen2MoeForCausalLM");
  if (arch == "granite") return std::string("GraniteForCausalLM");
  if (arch == "gemma") return std::string("GemmaForCausalLM");
  if (arch == "gemma2") return std::string("Gemma2ForCausalLM");
  if (arch == "gemma3") return std::string("Gemma3ForCausalLM");
  if (arch == "gpt_oss") return std::string("GptOssForCausalLM");
  if (arch == "smollm3") return std::string("SmolLM3ForCausalLM");
  if (arch == "ministral3") return std::string("Ministral3ForCausalLM");
  return make_error(errc::invalid_request, "unknown --arch '" + arch +
                                               "' (llama, mistral, qwen2, qwen3, phi3, qwen3_moe, mixtral, qwen2_moe, gemma, gemma2, gemma3, granite, "
                                               "gpt_oss, smollm3, ministral3)");
}

status write_random_model(const random_model_spec& s, const std::string& dir) {
  auto arch = config_architecture_name(s.arch);
  if (!arch) return arch.take_error();
  if (s.base_model) {
    static const char* bare[] = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2"};
    if (std::find(std::begin(bare), std::end(bare), s.arch) == std::end(bare)) {
      return make_error(errc::invalid_request, "--base: llama, mistral, qwen2, qwen3, gemma or gemma2 only");
    }
    arch = arch->substr(0, arch->size() - std::string_view("ForCausalLM").size()) + "Model";
  }
  if (s.classifier_labels > 0) {
    if (s.base_model || s.arch == "gemma3") return make_error(errc::invalid_request, "a classifier is a full checkpoint, not Gemma 3");
    arch = arch->substr(0, arch->size() - std::string_view("ForCausalLM").size()) + "ForSequenceClassification";
  }
  if (s.reward) {
    if (s.arch != "qwen2" || s.classifier_labels < 1 || s.classifier_labels > 2 || s.base_model || !s.packed.empty()) {
      return make_error(errc::invalid_request, "a reward model is a qwen2 checkpoint of 1 label (Qwen2ForRewardModel) or 2 "
                                               "(Qwen2ForProcessRewardModel)");
    }
    arch = std::string(s.classifier_labels == 1 ? "Qwen2ForRewardModel" : "Qwen2ForProcessRewardModel");
  }
  if (s.vocab < 258) return make_error(errc::invalid_request, "--vocab must be at least 258 (byte tokens + BOS + EOS)");
  if (s.hidden == 0 || s.intermediate == 0 || s.n_layers == 0 || s.n_heads == 0 || s.n_kv_heads == 0 ||
      s.n_heads % s.n_kv_heads != 0) {
    return make_error(errc::invalid_request, "model shape: sizes must be positive and heads a multiple of kv heads");
  }
  if (s.head_dim == 0 && s.hidden % s.n_heads != 0) {
    return make_error(errc::invalid_request, "--hidden must be a multiple of --heads unless --head-dim is given");
  }
  if (s.shards == 0 || s.shards > s.n_layers + 1) {
    return make_error(errc::invalid_request, "--shards must be between 1 and layers + 1");
  }
  const size_t hd = s.head_dim ? s.head_dim : s.hidden / s.n_heads;
  if (hd % 2 != 0) return make_error(errc::invalid_request, "head dim must be even");
  ::mkdir(dir.c_str(), 0755);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return make_error(errc::io_error, "cannot create " + dir);
  // Weights of an earlier model in the same directory (other sharding) must not survive:
  // an old index would otherwise keep serving the old shards.
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("model", 0) == 0 && (name.ends_with(".safetensors") || name == "model.safetensors.index.json")) {
      std::filesystem::remove(entry.path(), ec);
    }
  }

  const bool qwen = s.arch == "qwen2" || s.arch == "qwen3" || s.arch == "qwen3_moe" || s.arch == "qwen2_moe";
  const bool gemma = s.arch == "gemma" || s.arch == "gemma2" || s.arch == "gemma3";
  const bool sandwich = s.arch == "gemma2" || s.arch == "gemma3";  // Gemma 2/3's four norms per layer
  const bool granite = s.arch == "granite";
  const bool gpt_oss = s.arch == "gpt_oss";
  const bool smollm3 = s.arch == "smollm3";
  const bool biased =
      ((s.arch == "llama" || s.arch == "qwen3" || s.arch == "qwen3_moe" || gemma || granite || smollm3) && s.attention_bias) || gpt_oss;
  const bool qkv_bias = s.arch == "qwen2" || s.arch == "qwen2_moe" || biased;
  const bool o_bias = biased;
  const bool qk_norm = s.arch == "qwen3" || s.arch == "qwen3_moe" || s.arch == "gemma3";
  const bool moe = s.arch == "qwen3_moe" || s.arch == "mixtral" || s.arch == "qwen2_moe" || gpt_oss;
  if (gpt_oss) {
    if (s.classifier_labels > 0 || s.base_model || s.tie_embeddings) {
      return make_error(errc::invalid_request, "gpt_oss: a causal LM with its own LM head only (no --classifier, --base or --tie)");
    }
    if (!s.packed.empty() && s.packed != "mxfp4") return make_error(errc::invalid_request, "gpt_oss: --packed must be mxfp4 or none");
    if (s.packed == "mxfp4" && (s.hidden % 32 != 0 || s.intermediate % 32 != 0)) {
      return make_error(errc::invalid_request, "gpt_oss --packed mxfp4: --hidden and --intermediate must be multiples of 32");
    }
  } else if (s.packed == "mxfp4") {
    return make_error(errc::invalid_request, "--packed mxfp4 is GPT-OSS's (--arch gpt_oss)");
  }
  const size_t shared_inter = s.arch != "qwen2_moe" ? 0 : s.shared_intermediate ? s.shared_intermediate : 2 * s.intermediate;
  const size_t n_experts = s.n_experts ? s.n_experts : 8, per_token = s.experts_per_token ? s.experts_per_token : 2;
  if (moe && (per_token > n_experts || n_experts > 1024)) {
    return make_error(errc::invalid_request, "--experts-per-token must be at most --experts (at most 1024)");
  }
  const bool fused = s.arch == "phi3";
  json cfg = {{"architectures", {*arch}},
              {"model_type", s.arch == "gemma3" ? "gemma3_text" : s.arch},
              {"hidden_size", s.hidden},
              {"intermediate_size", s.intermediate},
              {"num_hidden_layers", s.n_layers},
              {"num_attention_heads", s.n_heads},
              {"num_key_value_heads", s.n_kv_heads},
              {"vocab_size", s.vocab},
              {"max_position_embeddings", s.max_positions},
              {"rms_norm_eps", s.rms_norm_eps},
              {"rope_theta", s.rope_theta},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", s.tie_embeddings},
              {"bos_token_id", 256},
              {"eos_token_id", 257},
              {"torch_dtype", s.dtype == kernels::dtype::f32 ? "float32" : (s.dtype == kernels::dtype::f16 ? "float16" : "bfloat16")}};
  if (s.head_dim || qk_norm || gemma || gpt_oss || s.arch == "ministral3") cfg["head_dim"] = hd;  // Qwen3's default (128), Gemma's (256), GPT-OSS's (64), Ministral 3's (128)
  if (s.arch == "llama" || s.arch == "qwen3" || s.arch == "qwen3_moe" || gemma || granite || smollm3) cfg["attention_bias"] = s.attention_bias;
  if (smollm3) {  // SmolLM3Config's NoPE pattern (every 4th layer), written out as HF saves it; the window on those layers
    json rope_layers = json::array();
    for (size_t i = 0; i < s.n_layers; ++i) rope_layers.push_back((i + 1) % 4 != 0 ? 1 : 0);
    cfg["no_rope_layer_interval"] = 4;
    cfg["no_rope_layers"] = std::move(rope_layers);
    cfg["use_sliding_window"] = s.sliding_window > 0;
    cfg["sliding_window"] = s.sliding_window ? json(s.sliding_window) : json(nullptr);
  }
  if (granite) {  // shaped like granite-3.x's (which has 12, 1/64, 0.22 and 8): scales unlike the defaults
    cfg["embedding_multiplier"] = 12.0;
    cfg["attention_multiplier"] = 1.0 / static_cast<double>(hd);
    cfg["residual_multiplier"] = 0.5;
    cfg["logits_scaling"] = 2.0;
    cfg["mlp_bias"] = false;
  }
  if (gemma) {
    cfg["hidden_act"] = "gelu_pytorch_tanh";
    cfg["hidden_activation"] = "gelu_pytorch_tanh";
  }
  if (sandwich) {
    const bool g2 = s.arch == "gemma2";
    auto cap = [](float v, float fallback) { return v < 0.0f ? (fallback > 0.0f ? json(fallback) : json(nullptr)) : v == 0.0f ? json(nullptr) : json(v); };
    cfg["attn_logit_softcapping"] = cap(s.attn_softcap, g2 ? 50.0f : 0.0f);
    cfg["final_logit_softcapping"] = cap(s.final_softcap, g2 ? 30.0f : 0.0f);
    cfg["query_pre_attn_scalar"] = s.query_pre_attn_scalar > 0.0 ? s.query_pre_attn_scalar : static_cast<double>(hd);
    cfg["sliding_window"] = s.sliding_window ? json(s.sliding_window) : json(nullptr);
    if (!g2) {
      cfg["sliding_window_pattern"] = s.sliding_pattern ? s.sliding_pattern : 6;
      cfg["rope_local_base_freq"] = 10000.0;
    }
  }
  if (s.arch == "mistral" || fused) cfg["sliding_window"] = s.sliding_window ? json(s.sliding_window) : json(nullptr);
  if (qwen) cfg["use_sliding_window"] = false;
  if (s.arch == "qwen3_moe" || s.arch == "qwen2_moe") {  // every layer sparse; intermediate_size is a dense MLP's, unused
    cfg["num_experts"] = n_experts;
    cfg["num_experts_per_tok"] = per_token;
    cfg["moe_intermediate_size"] = s.intermediate;
    cfg["intermediate_size"] = 3 * s.intermediate;
    cfg["norm_topk_prob"] = s.arch == "qwen3_moe";  // Qwen1.5-MoE's and Qwen2-57B-A14B's: false
    if (shared_inter) cfg["shared_expert_intermediate_size"] = shared_inter;
    cfg["decoder_sparse_step"] = 1;
    cfg["mlp_only_layers"] = json::array();
  } else if (s.arch == "mixtral") {
    cfg["num_local_experts"] = n_experts;
    cfg["num_experts_per_tok"] = per_token;
    cfg["sliding_window"] = s.sliding_window ? json(s.sliding_window) : json(nullptr);
  }
  if (s.linear_scaling) cfg["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  if (s.dynamic_scaling) cfg["rope_scaling"] = {{"type", "dynamic"}, {"factor", 4.0}};
  if (s.llama3_scaling) {
    // Why 64: with tiny test contexts an original context of 8192 would leave every
    // frequency in the unscaled band; 64 puts frequencies in all three llama3 bands.
    cfg["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  }
  if (s.yarn_scaling) cfg["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 256}};
  if (gpt_oss) {  // GptOssConfig's fields; layer_types: even layers slide, as OpenAI's checkpoints
    cfg["num_local_experts"] = n_experts;
    cfg["num_experts_per_tok"] = per_token;
    cfg["experts_per_token"] = per_token;
    cfg["swiglu_limit"] = 7.0;
    cfg["sliding_window"] = s.sliding_window ? json(s.sliding_window) : json(nullptr);
    json types = json::array();
    for (size_t i = 0; i < s.n_layers; ++i) types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
    cfg["layer_types"] = std::move(types);
    if (s.yarn_scaling) {  // OpenAI's rope_scaling; the context is the factor's (HF and vLLM then agree on it)
      cfg["rope_scaling"]["beta_fast"] = 32.0;
      cfg["rope_scaling"]["beta_slow"] = 1.0;
      cfg["rope_scaling"]["truncate"] = false;
      cfg["max_position_embeddings"] = 4 * 256;
    }
    if (s.packed == "mxfp4") {
      cfg["quantization_config"] = {{"quant_method", "mxfp4"},
                                    {"modules_to_not_convert", {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}};
    }
  }
  if (s.arch == "ministral3") {  // Ministral3Config's rope_parameters, over 4 positions so tiny tests see the temperature rise
    cfg["rope_parameters"] = {{"type", "yarn"}, {"rope_theta", s.rope_theta}, {"factor", 16.0},
                              {"original_max_position_embeddings", 4}, {"beta_fast", 32.0}, {"beta_slow", 1.0},
                              {"mscale", 1.0}, {"mscale_all_dim", 1.0}, {"llama_4_scaling_beta", 0.1}};
    cfg["max_position_embeddings"] = 64;
    cfg["sliding_window"] = s.sliding_window ? json(s.sliding_window) : json(nullptr);
    cfg.erase("rope_theta");
  }
  if (s.partial_rotary != 1.0) cfg["partial_rotary_factor"] = s.partial_rotary;
  if (s.longrope_scaling) {
    const size_t n = static_cast<size_t>(static_cast<double>(hd) * s.partial_rotary) / 2;
    json short_f = json::array(), long_f = json::array();
    for (size_t i = 0; i < n; ++i) {
      short_f.push_back(1.0 + 0.05 * static_cast<double>(i));
      long_f.push_back(1.0 + 0.5 * static_cast<double>(i));
    }
    cfg["rope_scaling"] = {{"type", "longrope"}, {"short_factor", short_f}, {"long_factor", long_f}};
    cfg["original_max_position_embeddings"] = 64;
  }
  if (!s.packed.empty() && !gpt_oss) {
    auto q = detail::packed_quantization_config(s.packed, s.group_size);
    if (!q) return q.take_error();
    cfg["quantization_config"] = *q;
  }
  if (s.kv_scales) {  // llm-compressor's FP8 KV scheme; quant_method fp8 has no field for it
    if (!s.packed.starts_with("fp8") && !s.packed.starts_with("ct-")) {
      return make_error(errc::invalid_request, "--kv-scales needs an FP8 or compressed-tensors --packed (fp8, fp8-block, ct-...)");
    }
    if (s.packed.starts_with("ct-")) {
      cfg["quantization_config"]["kv_cache_scheme"] = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"strategy", "tensor"},
                                                       {"dynamic", false}, {"group_size", nullptr}, {"observer", "minmax"}};
    }
  }
  if (s.classifier_labels > 0) {
    json labels = json::object();
    for (size_t i = 0; i < s.classifier_labels; ++i) labels[std::to_string(i)] = "LABEL_" + std::to_string(i);
    cfg["id2label"] = std::move(labels);
  }
  LLMESH_TRY(write_text(dir + "/config.json", cfg.dump(2)));
  LLMESH_TRY(write_text(dir + "/generation_config.json",
                        json({{"bos_token_id", 256}, {"eos_token_id", 257}, {"do_sample", false}}).dump(2)));
  LLMESH_TRY(write_text(dir + "/tokenizer.json", tokenizer_json(s.vocab).dump()));
  LLMESH_TRY(write_text(dir + "/tokenizer_config.json",
                        json({{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|end_of_text|>"}, {"add_bos_token", true},
                              {"model_max_length", s.max_positions}, {"tokenizer_class", "PreTrainedTokenizerFast"}})
                            .dump(2)));

  // Tensors, grouped into shards: shard 0 holds the embedding, norms and LM head, layers are
  // spread over the rest (or everything in one file).
  const auto t = s.dtype;
  const size_t q_dim = s.n_heads * hd, kv_dim = s.n_kv_heads * hd;
  const float in_h = std::sqrt(3.0f / static_cast<float>(s.hidden));
  std::vector<std::vector<tensor_spec>> files(s.shards);
  status packed_failed = ok_status();
  // --packed: the decoder layers' projections (and Mixtral's experts' w1/w2/w3), not a router.
  auto packed_linear = [&](const std::string& name) {
    return !s.packed.empty() && !gpt_oss && name.starts_with("model.layers.") &&
           (name.ends_with("_proj.weight") || name.ends_with(".w1.weight") || name.ends_with(".w2.weight") ||
            name.ends_with(".w3.weight"));
  };
  auto add = [&](size_t file, const std::string& name, std::vector<size_t> shape, float center, float scale) {
    if (s.base_model && name == "lm_head.weight") return;  // a bare transformer has none
    // Values keyed by the full checkpoint's name: a bare one holds the same tensors.
    const std::string stored = s.base_model && name.starts_with("model.") ? name.substr(6) : name;
    if (packed_linear(name)) {
      auto layer = detail::random_packed_linear(s.seed, stored.substr(0, stored.size() - 7), shape[0], shape[1], scale, s.packed,
                                                s.group_size);
      if (!layer && packed_failed) packed_failed = layer.take_error();
      if (layer) files[file].insert(files[file].end(), layer->begin(), layer->end());
      return;
    }
    files[file].push_back({stored, t, std::move(shape), uniform(s.seed, name, t, center, scale)});
  };
  // Gemma multiplies the rows by sqrt(hidden), Granite by 12: smaller rows keep the residual stream O(1).
  add(0, "model.embed_tokens.weight", {s.vocab, s.hidden}, 0.0f, gemma ? 2.0f * in_h : granite ? 0.25f : 1.0f);
  const float norm_center = gemma ? 0.0f : 1.0f;  // Gemma stores a norm's weight as an offset from 1
  add(0, "model.norm.weight", {s.hidden}, norm_center, 0.2f);
  if (s.reward) {  // Qwen2RewardBaseModel's score: Linear(hidden, hidden), ReLU, Linear(hidden, labels)
    add(0, "score.0.weight", {s.hidden, s.hidden}, 0.0f, 2.0f * in_h);
    add(0, "score.0.bias", {s.hidden}, 0.0f, 0.2f);
    add(0, "score.2.weight", {s.classifier_labels, s.hidden}, 0.0f, 2.0f * in_h);
    add(0, "score.2.bias", {s.classifier_labels}, 0.0f, 0.2f);
  } else if (s.classifier_labels > 0) {
    add(0, "score.weight", {s.classifier_labels, s.hidden}, 0.0f, 2.0f * in_h);
  } else if (!s.tie_embeddings) {
    add(0, "lm_head.weight", {s.vocab, s.hidden}, 0.0f, 2.0f * in_h);
  }
  for (size_t i = 0; i < s.n_layers; ++i) {
    size_t f = s.shards == 1 ? 0 : 1 + i * (s.shards - 1) / s.n_layers;
    std::string p = "model.layers." + std::to_string(i) + ".";
    add(f, p + "input_layernorm.weight", {s.hidden}, norm_center, 0.2f);
    add(f, p + "post_attention_layernorm.weight", {s.hidden}, norm_center, 0.2f);
    if (sandwich) {
      add(f, p + "pre_feedforward_layernorm.weight", {s.hidden}, norm_center, 0.2f);
      add(f, p + "post_feedforward_layernorm.weight", {s.hidden}, norm_center, 0.2f);
    }
    if (fused) {  // Phi-3: q, k, v in one tensor; gate and up in another
      add(f, p + "self_attn.qkv_proj.weight", {q_dim + 2 * kv_dim, s.hidden}, 0.0f, in_h);
    } else {
      add(f, p + "self_attn.q_proj.weight", {q_dim, s.hidden}, 0.0f, in_h);
      add(f, p + "self_attn.k_proj.weight", {kv_dim, s.hidden}, 0.0f, in_h);
      add(f, p + "self_attn.v_proj.weight", {kv_dim, s.hidden}, 0.0f, in_h);
    }
    add(f, p + "self_attn.o_proj.weight", {s.hidden, q_dim}, 0.0f, std::sqrt(3.0f / static_cast<float>(q_dim)));
    if (gpt_oss) {
      add(f, p + "self_attn.sinks", {s.n_heads}, 0.0f, 2.0f);
      add(f, p + "mlp.router.weight", {n_experts, s.hidden}, 0.0f, 4.0f * in_h);
      add(f, p + "mlp.router.bias", {n_experts}, 0.0f, 0.5f);
      const std::string x = p + "mlp.experts.";
      const size_t I = s.intermediate, H = s.hidden;
      if (s.packed == "mxfp4") {  // random codes; exponents near in_h / 3 (e2m1 values reach 6), ±1
        const int e_in = 127 + static_cast<int>(std::floor(std::log2(in_h / 3.0f)));
        const int e_out = 127 + static_cast<int>(std::floor(std::log2(std::sqrt(3.0f / static_cast<float>(I)) / 3.0f)));
        auto bytes = [&](const std::string& name, std::vector<size_t> shape, int exponent) {
          files[f].push_back({name, kernels::dtype::f32, std::move(shape), [seed = s.seed, name, exponent](std::span<uint8_t> out) {
                                uint64_t state = seed ^ detail::name_hash(name);
                                for (auto& b : out) {
                                  const uint64_t r = detail::splitmix64(state);
                                  b = exponent < 0 ? static_cast<uint8_t>(r) : static_cast<uint8_t>(exponent - 1 + static_cast<int>(r % 3));
                                }
                              },
                              1});
        };
        bytes(x + "gate_up_proj_blocks", {n_experts, 2 * I, H / 32, 16}, -1);
        bytes(x + "gate_up_proj_scales", {n_experts, 2 * I, H / 32}, e_in);
        bytes(x + "down_proj_blocks", {n_experts, H, I / 32, 16}, -1);
        bytes(x + "down_proj_scales", {n_experts, H, I / 32}, e_out);
      } else {  // HF's parameters: [E, in, out]
        add(f, x + "gate_up_proj", {n_experts, H, 2 * I}, 0.0f, in_h);
        add(f, x + "down_proj", {n_experts, I, H}, 0.0f, std::sqrt(3.0f / static_cast<float>(I)));
      }
      add(f, x + "gate_up_proj_bias", {n_experts, 2 * I}, 0.0f, 0.1f);
      add(f, x + "down_proj_bias", {n_experts, H}, 0.0f, 0.1f);
    } else if (moe) {
      const std::string m = p + (s.arch == "mixtral" ? "block_sparse_moe." : "mlp.");
      const bool mixtral = s.arch == "mixtral";
      add(f, m + "gate.weight", {n_experts, s.hidden}, 0.0f, 4.0f * in_h);  // a router with clear favourites
      if (shared_inter) {
        add(f, m + "shared_expert.gate_proj.weight", {shared_inter, s.hidden}, 0.0f, in_h);
        add(f, m + "shared_expert.up_proj.weight", {shared_inter, s.hidden}, 0.0f, in_h);
        add(f, m + "shared_expert.down_proj.weight", {s.hidden, shared_inter}, 0.0f,
            std::sqrt(3.0f / static_cast<float>(shared_inter)));
        add(f, m + "shared_expert_gate.weight", {1, s.hidden}, 0.0f, 2.0f * in_h);
      }
      for (size_t e = 0; e < n_experts; ++e) {
        const std::string x = m + "experts." + std::to_string(e) + ".";
        add(f, x + (mixtral ? "w1.weight" : "gate_proj.weight"), {s.intermediate, s.hidden}, 0.0f, in_h);
        add(f, x + (mixtral ? "w3.weight" : "up_proj.weight"), {s.intermediate, s.hidden}, 0.0f, in_h);
        add(f, x + (mixtral ? "w2.weight" : "down_proj.weight"), {s.hidden, s.intermediate}, 0.0f,
            std::sqrt(3.0f / static_cast<float>(s.intermediate)));
      }
    } else if (fused) {
      add(f, p + "mlp.gate_up_proj.weight", {2 * s.intermediate, s.hidden}, 0.0f, in_h);
    } else {
      add(f, p + "mlp.gate_proj.weight", {s.intermediate, s.hidden}, 0.0f, in_h);
      add(f, p + "mlp.up_proj.weight", {s.intermediate, s.hidden}, 0.0f, in_h);
    }
    if (!moe) {
      add(f, p + "mlp.down_proj.weight", {s.hidden, s.intermediate}, 0.0f,
          std::sqrt(3.0f / static_cast<float>(s.intermediate)));
    }
    if (qkv_bias) {
      add(f, p + "self_attn.q_proj.bias", {q_dim}, 0.0f, 0.1f);
      add(f, p + "self_attn.k_proj.bias", {kv_dim}, 0.0f, 0.1f);
      add(f, p + "self_attn.v_proj.bias", {kv_dim}, 0.0f, 0.1f);
    }
    if (o_bias) add(f, p + "self_attn.o_proj.bias", {s.hidden}, 0.0f, 0.1f);
    if (qk_norm) {
      add(f, p + "self_attn.q_norm.weight", {hd}, norm_center, 0.2f);
      add(f, p + "self_attn.k_norm.weight", {hd}, norm_center, 0.2f);
    }
    if (s.kv_scales) {  // scalars: shape [] as AutoFP8 saves them, [1] as llm-compressor does
      const std::vector<size_t> one = s.packed.starts_with("fp8") ? std::vector<size_t>{} : std::vector<size_t>{1};
      add(f, p + "self_attn.k_scale", one, 0.02f, 0.01f);
      add(f, p + "self_attn.v_scale", one, 0.02f, 0.01f);
    }
  }
  LLMESH_TRY(packed_failed);
  if (s.shards == 1) return write_safetensors(dir + "/model.safetensors", files[0]);
  json weight_map = json::object();
  for (size_t f = 0; f < s.shards; ++f) {
    std::string name = shard_name(f, s.shards);
    for (const auto& ts : files[f]) weight_map[ts.name] = name;
    LLMESH_TRY(write_safetensors(dir + "/" + name, files[f]));
  }
  return write_text(dir + "/model.safetensors.index.json", json({{"metadata", json::object()}, {"weight_map", weight_map}}).dump(2));
}

}  // namespace llmesh::model
