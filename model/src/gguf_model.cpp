// A GGUF file's metadata as the config.json, tokenizer.json and tokenizer_config.json of the
// HF directory it was converted from (llama.cpp's convert_hf_to_gguf.py, read backwards), and
// read_model_file, through which every loader of those files reads a model directory or file.
#include "gguf_model.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <unordered_map>

#include "read_file.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;

error unsupported(const gguf_file& g, const std::string& msg) { return make_error(errc::unsupported, g.path() + ": " + msg); }
error bad(const gguf_file& g, const std::string& msg) { return make_error(errc::invalid_request, g.path() + ": " + msg); }

/// llama.cpp's token types (llama_token_type).
enum token_type : uint64_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

result<uint64_t> get_uint(const gguf_file& g, const std::string& key, std::optional<uint64_t> fallback) {
  const gguf_value* v = g.find(key);
  uint64_t out = 0;
  if (v == nullptr) {
    if (fallback) return *fallback;
    return bad(g, "missing metadata '" + key + "'");
  }
  if (!v->as_uint(out)) return bad(g, "metadata '" + key + "' must be a non-negative integer");
  return out;
}

result<double> get_double(const gguf_file& g, const std::string& key, double fallback) {
  const gguf_value* v = g.find(key);
  double out = 0;
  if (v == nullptr) return fallback;
  if (!v->as_double(out)) return bad(g, "metadata '" + key + "' must be a number");
  return out;
}

std::string get_string(const gguf_file& g, const std::string& key) {
  const gguf_value* v = g.find(key);
  return v != nullptr && v->is_string() ? v->s : std::string();
}

bool get_bool(const gguf_file& g, const std::string& key, bool fallback) {
  const gguf_value* v = g.find(key);
  return v != nullptr && v->is_bool() ? v->u != 0 : fallback;
}

/// An array of strings (tokens, merges), or invalid_request.
result<std::vector<std::string>> get_strings(const gguf_file& g, const std::string& key) {
  const gguf_value* v = g.find(key);
  if (v == nullptr || !v->is_array() || v->item_type != 8) return bad(g, "metadata '" + key + "' must be an array of strings");
  std::vector<std::string> out;
  out.reserve(v->items.size());
  for (const auto& x : v->items) out.push_back(x.s);
  return out;
}

// The pre-tokenizer regexes of the HF tokenizer.json files llama.cpp names them after.
constexpr const char* llama3_regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* qwen2_regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* gpt2_regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
/// GPT-4o's (o200k; Phi-4-mini's tokenizer.json, llama.cpp's "gpt-4o").
constexpr const char* gpt4o_regex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json template_processing(const std::vector<std::pair<std::string, int64_t>>& before,
                         const std::vector<std::pair<std::string, int64_t>>& after) {
  json single = json::array(), specials = json::object();
  auto add = [&](const std::pair<std::string, int64_t>& t) {
    single.push_back({{"SpecialToken", {{"id", t.first}, {"type_id", 0}}}});
    specials[t.first] = {{"id", t.first}, {"ids", {t.second}}, {"tokens", {t.first}}};
  };
  for (const auto& t : before) add(t);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  for (const auto& t : after) add(t);
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", single}, {"special_tokens", specials}};
}

/// transformers' SentencePieceExtractor: every split of a piece into two pieces of the vocabulary
/// is a merge, ranked by the whole piece's score (highest first; a piece's own splits by the
/// ids of their halves). Splits fall on UTF-8 character boundaries.
std::vector<std::string> merges_from_scores(const std::vector<std::string>& tokens, const std::vector<double>& scores,
                                            const std::vector<uint64_t>& types) {
  std::unordered_map<std::string, size_t> id;
  for (size_t i = 0; i < tokens.size(); ++i) id.emplace(tokens[i], i);
  struct merge {
    double score;
    size_t left, right;
  };
  std::vector<merge> all;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] != normal) continue;
    const std::string& t = tokens[i];
    std::vector<merge> local;
    for (size_t k = 1; k < t.size(); ++k) {
      if ((static_cast<unsigned char>(t[k]) & 0xC0) == 0x80) continue;  // inside a character
      auto l = id.find(t.substr(0, k)), r = id.find(t.substr(k));
      if (l != id.end() && r != id.end()) local.push_back({scores[i], l->second, r->second});
    }
    std::sort(local.begin(), local.end(), [](const merge& a, const merge& b) { return std::pair(a.left, a.right) < std::pair(b.left, b.right); });
    all.insert(all.end(), local.begin(), local.end());
  }
  std::stable_sort(all.begin(), all.end(), [](const merge& a, const merge& b) { return a.score > b.score; });
  std::vector<std::string> out;
  out.reserve(all.size());
  for (const auto& m : all) out.push_back(tokens[m.left] + " " + tokens[m.right]);
  return out;
}

struct vocab_facts {
  std::vector<std::string> tokens;
  std::vector<uint64_t> types;
  std::optional<int64_t> bos, eos, unk;
  bool add_bos = false, add_eos = false;
};

result<vocab_facts> read_vocab(const gguf_file& g, const std::string& model) {
  vocab_facts v;
  auto tokens = get_strings(g, "tokenizer.ggml.tokens");
  if (!tokens) return tokens.take_error();
  v.tokens = std::move(*tokens);
  v.types.assign(v.tokens.size(), normal);
  if (const gguf_value* t = g.find("tokenizer.ggml.token_type")) {
    if (!t->is_array() || t->items.size() != v.tokens.size()) return bad(g, "tokenizer.ggml.token_type must have one entry per token");
    for (size_t i = 0; i < v.types.size(); ++i) {
      if (!t->items[i].as_uint(v.types[i])) return bad(g, "tokenizer.ggml.token_type must hold integers");
    }
  }
  auto id = [&](const char* key) -> result<std::optional<int64_t>> {
    const gguf_value* x = g.find(key);
    uint64_t n = 0;
    if (x == nullptr) return std::optional<int64_t>();
    if (!x->as_uint(n) || n >= v.tokens.size()) return bad(g, std::string("metadata '") + key + "' is not a token id");
    return std::optional<int64_t>(static_cast<int64_t>(n));
  };
  for (auto [dst, key] : {std::pair{&v.bos, "tokenizer.ggml.bos_token_id"}, {&v.eos, "tokenizer.ggml.eos_token_id"},
                          {&v.unk, "tokenizer.ggml.unknown_token_id"}}) {
    auto r = id(key);
    if (!r) return r.take_error();
    *dst = *r;
  }
  const std::string pre = get_string(g, "tokenizer.ggml.pre");
  // llama.cpp's defaults where the file does not say: SentencePiece adds BOS, llama-bpe too.
  v.add_bos = get_bool(g, "tokenizer.ggml.add_bos_token", model == "llama" || pre == "llama-bpe" || pre == "llama3");
  v.add_eos = get_bool(g, "tokenizer.ggml.add_eos_token", false);
  return v;
}

/// tokenizer.json for tokenizer.ggml.model "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE).
result<json> tokenizer_json(const gguf_file& g, const std::string& model, const vocab_facts& v) {
  json vocab = json::object(), added = json::array();
  const bool spm = model == "llama";
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const uint64_t t = v.types[i];
    if (t == control || t == user_defined) {
      added.push_back({{"id", i}, {"content", v.tokens[i]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", t == user_defined}, {"special", t == control}});
      if (!spm) continue;  // HF keeps a byte-level BPE's added tokens out of the model's vocabulary
    }
    if (t == unused && !spm) continue;
    vocab[v.tokens[i]] = i;
  }
  json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}};
  std::vector<std::pair<std::string, int64_t>> before, after;
  if (v.add_bos && v.bos) before.emplace_back(v.tokens[*v.bos], *v.bos);
  if (v.add_eos && v.eos) after.emplace_back(v.tokens[*v.eos], *v.eos);
  j["post_processor"] = before.empty() && after.empty() ? json(nullptr) : template_processing(before, after);
  if (!spm) {
    const std::string pre = get_string(g, "tokenizer.ggml.pre");
    const char* regex = nullptr;
    bool ignore_merges = false, nfc = false;
    if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "smaug-bpe") {
      regex = llama3_regex;
      ignore_merges = true;
    } else if (pre == "qwen2" || pre == "deepseek-r1-qwen") {
      regex = qwen2_regex;
      nfc = true;
    } else if (pre == "gpt-2" || pre == "gpt2") {
      regex = gpt2_regex;
    } else if (pre == "gpt-4o") {
      regex = gpt4o_regex;
    } else {
      return unsupported(g, "tokenizer.ggml.pre '" + pre + "' (supported: llama-bpe, llama3, llama-v3, smaug-bpe, qwen2, "
                             "deepseek-r1-qwen, gpt-2, gpt-4o)");
    }
    auto merges = get_strings(g, "tokenizer.ggml.merges");
    if (!merges) return merges.take_error();
    j["normalizer"] = nfc ? json{{"type", "NFC"}} : json(nullptr);
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
    j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
    j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
                  {"ignore_merges", ignore_merges}, {"vocab", std::move(vocab)}, {"merges", std::move(*merges)}};
    return j;
  }
  const gguf_value* s = g.find("tokenizer.ggml.scores");
  if (s == nullptr || !s->is_array() || s->items.size() != v.tokens.size()) {
    return bad(g, "a SentencePiece vocabulary needs tokenizer.ggml.scores, one per token");
  }
  std::vector<double> scores(v.tokens.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    if (!s->items[i].as_double(scores[i])) return bad(g, "tokenizer.ggml.scores must hold numbers");
  }
  const bool prefix = get_bool(g, "tokenizer.ggml.add_space_prefix", true);
  json normalizers = json::array();
  if (prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
  normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
  j["pre_tokenizer"] = nullptr;
  json decoders = {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}}, {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}};
  if (prefix) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  std::optional<int64_t> unk = v.unk;
  for (size_t i = 0; !unk && i < v.types.size(); ++i) {
    if (v.types[i] == unknown) unk = static_cast<int64_t>(i);
  }
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", unk ? json(v.tokens[*unk]) : json(nullptr)},
                {"fuse_unk", true}, {"byte_fallback", true}, {"vocab", std::move(vocab)},
                {"merges", merges_from_scores(v.tokens, scores, v.types)}};
  return j;
}

/// The experts of an MoE file into config.json: Mixtral (arch llama with experts; feed_forward_length
/// is an expert's), Qwen3-MoE and Qwen2-MoE (expert_feed_forward_length; Qwen2-MoE's shared
/// expert, expert_shared_feed_forward_length; files from before llama.cpp wrote those keys:
/// the sizes of blk.0's ffn_gate_exps and ffn_gate_shexp rows). Every layer sparse, as
/// llama.cpp builds them; the top-k probabilities renormalised as llama.cpp's graphs do for each
/// (Mixtral and Qwen3-MoE yes, Qwen2-MoE no: llama.cpp reads no key for it, nor does this).
status moe_config(const gguf_file& g, const std::string& arch, uint64_t experts, json& c) {
  const std::string p = arch + ".";
  auto used = get_uint(g, p + "expert_used_count", std::nullopt);
  if (!used) return used.take_error();
  if (*used == 0 || *used > experts) return bad(g, p + "expert_used_count must be 1 to expert_count");
  c["num_experts_per_tok"] = *used;
  if (arch == "llama") {
    c["architectures"] = {"MixtralForCausalLM"};
    c["model_type"] = "mixtral";
    c["num_local_experts"] = experts;
    return ok_status();
  }
  auto rows_of = [&](const char* tensor) -> std::optional<uint64_t> {  // a matrix's rows (ggml dims[1])
    const gguf_tensor* t = g.tensor(tensor);
    if (t == nullptr || t->dims.size() < 2) return std::nullopt;
    return t->dims[1];
  };
  auto ffn = get_uint(g, p + "expert_feed_forward_length", rows_of("blk.0.ffn_gate_exps.weight"));
  if (!ffn) return ffn.take_error();
  c["num_experts"] = experts;
  c["moe_intermediate_size"] = *ffn;
  c["intermediate_size"] = *ffn;
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = json::array();
  c["norm_topk_prob"] = arch == "qwen3moe";
  if (arch == "qwen2moe") {
    auto shared = get_uint(g, p + "expert_shared_feed_forward_length", rows_of("blk.0.ffn_gate_shexp.weight"));
    if (!shared) return shared.take_error();
    c["shared_expert_intermediate_size"] = *shared;
  }
  return ok_status();
}

/// GPT-OSS's (llama.cpp's "gpt-oss", LLM_ARCH_OPENAI_MOE): experts (expert_used_count,
/// expert_feed_forward_length, else feed_forward_length), the window of its even layers
/// (attention.sliding_window: llama.cpp's swa pattern 2), attention biases, the clamped SwiGLU's
/// limit 7 (llama.cpp's graph hardcodes it and alpha 1.702). The rotary's yarn keys are read with
/// the others; its range is not truncated (HF's gpt-oss config says so; llama.cpp rounds it).
status gpt_oss_config(const gguf_file& g, uint64_t experts, json& c) {
  const std::string p = "gpt-oss.";
  auto used = get_uint(g, p + "expert_used_count", std::nullopt);
  if (!used) return used.take_error();
  if (*used == 0 || *used > experts) return bad(g, p + "expert_used_count must be 1 to expert_count");
  auto dense = get_uint(g, p + "feed_forward_length", 0);
  if (!dense) return dense.take_error();
  auto ffn = get_uint(g, p + "expert_feed_forward_length", *dense > 0 ? std::optional<uint64_t>(*dense) : std::nullopt);
  if (!ffn) return ffn.take_error();
  auto window = get_uint(g, p + "attention.sliding_window", std::nullopt);
  auto layers = get_uint(g, p + "block_count", std::nullopt);
  if (!window) return window.take_error();
  if (!layers) return layers.take_error();
  c["num_local_experts"] = experts;
  c["num_experts_per_tok"] = *used;
  c["intermediate_size"] = *ffn;
  c["sliding_window"] = *window;
  json types = json::array();
  for (uint64_t i = 0; i < *layers; ++i) types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  c["layer_types"] = std::move(types);
  c["attention_bias"] = true;
  c["swiglu_limit"] = 7.0;
  return ok_status();
}

/// Gemma's (llama.cpp's "gemma", "gemma2", "gemma3"): the tanh GELU; Gemma 2's logit caps
/// (missing: its 50 and 30, as in llama.cpp and HF) and window (missing: 4096); Gemma 3's final
/// cap when written, its window — every sixth layer global, the sliding layers' rotary base
/// 10000 unscaled (llama.cpp hardcodes both; so do HF's defaults) — or, without one (the
/// converter writes none for sliding_window_pattern 1), every layer global as llama.cpp runs it.
/// The query scale: llama.cpp's rule, 1/sqrt(head_dim) but for the 27B models (46 Gemma 2
/// layers, 62 Gemma 3 ones), whose query_pre_attn_scalar is hidden / heads — the converter
/// writes no key for it.
status gemma_config(const gguf_file& g, const std::string& arch, uint64_t head_dim, json& c) {
  const std::string p = arch + ".";
  c["hidden_activation"] = "gelu_pytorch_tanh";
  if (arch == "gemma") return ok_status();
  const uint64_t layers = c["num_hidden_layers"], hidden = c["hidden_size"], heads = c["num_attention_heads"];
  const bool big = layers == (arch == "gemma2" ? 46u : 62u);
  c["query_pre_attn_scalar"] = big ? hidden / heads : head_dim;
  auto window = get_uint(g, p + "attention.sliding_window", arch == "gemma2" ? 4096 : 0);
  if (!window) return window.take_error();
  c["sliding_window"] = *window;
  if (arch == "gemma3" && *window == 0) c["sliding_window_pattern"] = 1;  // no sliding layers: one rotary for all
  static const char* const caps[] = {"final_logit_softcapping", "attn_logit_softcapping"};
  for (const char* key : std::span(caps).first(arch == "gemma2" ? 2 : 1)) {  // llama.cpp reads no attention cap for Gemma 3
    if (g.find(p + key) == nullptr) continue;
    auto cap = get_double(g, p + key, 0.0);
    if (!cap) return cap.take_error();
    c[key] = *cap;
  }
  return ok_status();
}

/// Phi-3's own metadata (llama.cpp's converter): the sliding window, the original context and
/// LongRoPE's factors as the F32 tensors rope_factors_long / rope_factors_short (rotary / 2
/// each), with rope.scaling.attn_factor, the scale of cos and sin.
status phi3_config(const gguf_file& g, uint64_t positions, uint64_t rope_dims, json& c) {
  auto window = get_uint(g, "phi3.attention.sliding_window", 0);
  auto orig = get_uint(g, "phi3.rope.scaling.original_context_length", positions);
  if (!window) return window.take_error();
  if (!orig) return orig.take_error();
  c["sliding_window"] = *window == 0 ? json(nullptr) : json(*window);
  c["original_max_position_embeddings"] = *orig;
  const gguf_tensor* lf = g.tensor("rope_factors_long.weight");
  const gguf_tensor* sf = g.tensor("rope_factors_short.weight");
  if (lf == nullptr && sf == nullptr) return ok_status();
  auto factors = [&](const gguf_tensor* t, const char* name) -> result<json> {
    if (t == nullptr || t->type != ggml::f32 || t->elements() != rope_dims / 2) {
      return bad(g, std::string(name) + " must be F32 of rope.dimension_count / 2 beside its long/short twin");
    }
    const auto* d = reinterpret_cast<const float*>(t->data);
    json out = json::array();
    for (size_t i = 0; i < rope_dims / 2; ++i) out.push_back(static_cast<double>(d[i]));
    return out;
  };
  auto long_f = factors(lf, "rope_factors_long.weight");
  if (!long_f) return long_f.take_error();
  auto short_f = factors(sf, "rope_factors_short.weight");
  if (!short_f) return short_f.take_error();
  c["rope_scaling"] = {{"type", "longrope"}, {"long_factor", *long_f}, {"short_factor", *short_f}};
  auto attn = get_double(g, "phi3.rope.scaling.attn_factor", 0.0);
  if (!attn) return attn.take_error();
  if (*attn > 0.0) c["rope_scaling"]["attention_factor"] = *attn;
  return ok_status();
}

/// config.json from the {arch}.* metadata; rope_freqs (llama.cpp's per-frequency divisors for
/// Llama 3.1's rotary) must be the llama3 rule of some factor, which becomes rope_scaling.
result<json> config_json(const gguf_file& g, const std::string& arch, const vocab_facts* v) {
  if (arch.empty()) return bad(g, "missing metadata 'general.architecture'");
  static const std::map<std::string, std::pair<const char*, const char*>> archs = {
      {"llama", {"LlamaForCausalLM", "llama"}},           {"qwen2", {"Qwen2ForCausalLM", "qwen2"}},
      {"qwen3", {"Qwen3ForCausalLM", "qwen3"}},           {"qwen3moe", {"Qwen3MoeForCausalLM", "qwen3_moe"}},
      {"qwen2moe", {"Qwen2MoeForCausalLM", "qwen2_moe"}}, {"phi3", {"Phi3ForCausalLM", "phi3"}},
      {"gpt-oss", {"GptOssForCausalLM", "gpt_oss"}},     {"gemma", {"GemmaForCausalLM", "gemma"}},
      {"gemma2", {"Gemma2ForCausalLM", "gemma2"}},        {"gemma3", {"Gemma3ForCausalLM", "gemma3_text"}},
      {"smollm3", {"SmolLM3ForCausalLM", "smollm3"}}};
  auto it = archs.find(arch);
  if (it == archs.end()) {
    return unsupported(g, "general.architecture '" + arch + "' (supported: llama, qwen2, qwen3, qwen3moe, qwen2moe, phi3, gpt-oss, gemma, gemma2, gemma3, smollm3)");
  }
  const std::string p = arch + ".";
  json c = {{"architectures", {it->second.first}}, {"model_type", it->second.second}};
  const bool qwen_moe = arch == "qwen3moe" || arch == "qwen2moe", gpt_oss = arch == "gpt-oss";
  auto experts = get_uint(g, p + "expert_count", qwen_moe || gpt_oss ? std::nullopt : std::optional<uint64_t>(0));
  if (!experts) return experts.take_error();
  if (*experts > 0 && !qwen_moe && !gpt_oss && arch != "llama") return unsupported(g, "experts in a " + arch + " model");
  if ((qwen_moe || gpt_oss) && *experts == 0) return bad(g, p + "expert_count must be positive");
  for (auto [key, hf] : {std::pair{"embedding_length", "hidden_size"}, {"block_count", "num_hidden_layers"},
                         {"attention.head_count", "num_attention_heads"}}) {
    auto n = get_uint(g, p + key, std::nullopt);
    if (!n) return n.take_error();
    c[hf] = *n;
  }
  if (gpt_oss) LLMESH_TRY(gpt_oss_config(g, *experts, c));
  if (*experts > 0 && !gpt_oss) LLMESH_TRY(moe_config(g, arch, *experts, c));
  if (!qwen_moe && !gpt_oss) {  // Qwen's MoE configs carry a dense intermediate_size no layer uses: moe_config's default
    auto ffn = get_uint(g, p + "feed_forward_length", std::nullopt);
    if (!ffn) return ffn.take_error();
    c["intermediate_size"] = *ffn;
  }
  const uint64_t hidden = c["hidden_size"], heads = c["num_attention_heads"];
  if (heads == 0) return bad(g, p + "attention.head_count must be positive");
  auto kv = get_uint(g, p + "attention.head_count_kv", heads);
  auto head_dim = get_uint(g, p + "attention.key_length", hidden / heads);
  auto value_dim = get_uint(g, p + "attention.value_length", head_dim ? *head_dim : 0);
  auto positions = get_uint(g, p + "context_length", 2048);
  auto eps = get_double(g, p + "attention.layer_norm_rms_epsilon", 1e-6);
  auto theta = get_double(g, p + "rope.freq_base", 10000.0);
  for (auto* r : {&kv, &head_dim, &value_dim, &positions}) {
    if (!*r) return r->take_error();
  }
  if (!eps) return eps.take_error();
  if (!theta) return theta.take_error();
  if (*value_dim != *head_dim) return unsupported(g, "attention.value_length other than key_length");
  auto rope_dims = get_uint(g, p + "rope.dimension_count", *head_dim);
  if (!rope_dims) return rope_dims.take_error();
  if (*rope_dims > *head_dim || (*rope_dims != *head_dim && arch != "phi3")) {  // Phi-4-mini's partial rotary
    return unsupported(g, "a rotary over part of each head (rope.dimension_count < head dim) in a " + arch + " model");
  }
  if (*rope_dims != *head_dim) {  // a factor whose int(head_dim × factor) is rope_dims whatever the rounding
    c["partial_rotary_factor"] = (static_cast<double>(*rope_dims) + 0.5) / static_cast<double>(*head_dim);
  }
  if (arch == "phi3") LLMESH_TRY(phi3_config(g, *positions, *rope_dims, c));
  const bool gemma = arch == "gemma" || arch == "gemma2" || arch == "gemma3";
  if (gemma) LLMESH_TRY(gemma_config(g, arch, *head_dim, c));
  const gguf_tensor* embd = g.tensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2) return bad(g, "missing the 2-D tensor token_embd.weight");
  c["num_key_value_heads"] = *kv;
  c["head_dim"] = *head_dim;
  c["max_position_embeddings"] = *positions;
  c["rms_norm_eps"] = *eps;
  c["rope_theta"] = *theta;
  c["vocab_size"] = embd->dims[1];
  c["tie_word_embeddings"] = g.tensor("output.weight") == nullptr;
  c["hidden_act"] = "silu";
  if ((arch == "llama" || arch == "smollm3") && g.tensor("blk.0.attn_q.bias") != nullptr) c["attention_bias"] = true;
  if (arch == "smollm3") c["no_rope_layer_interval"] = 4;  // llama.cpp hardcodes SmolLM3's NoPE step (n_no_rope_layer_step)
  const std::string scaling = get_string(g, p + "rope.scaling.type");
  if (scaling == "linear") {
    auto factor = get_double(g, p + "rope.scaling.factor", 0.0);
    if (!factor) return factor.take_error();
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", *factor}};
  } else if (scaling == "yarn") {  // llama.cpp's keys for a config's yarn rope_scaling (Qwen's long context)
    auto factor = get_double(g, p + "rope.scaling.factor", 0.0);
    auto orig = get_uint(g, p + "rope.scaling.original_context_length", *positions);
    auto fast = get_double(g, p + "rope.scaling.yarn_beta_fast", 32.0);
    auto slow = get_double(g, p + "rope.scaling.yarn_beta_slow", 1.0);
    auto attn = get_double(g, p + "rope.scaling.attn_factor", 1.0);  // llama.cpp's general multiplier: vLLM's attn_factor
    auto yarn_attn = get_double(g, p + "rope.scaling.yarn_attn_factor", 0.0);  // a config's attention_factor: the whole scale
    auto ext = get_double(g, p + "rope.scaling.yarn_ext_factor", 1.0);
    auto log_mul = get_double(g, p + "rope.scaling.yarn_log_multiplier", 0.0);
    for (auto* r : {&factor, &fast, &slow, &attn, &yarn_attn, &ext, &log_mul}) {
      if (!*r) return r->take_error();
    }
    if (!orig) return orig.take_error();
    if (*log_mul != 0.0) return unsupported(g, "rope.scaling.yarn_log_multiplier (DeepSeek's yarn)");
    if (*ext != 1.0 && *ext >= 0.0) return unsupported(g, "rope.scaling.yarn_ext_factor other than 1");  // negative: llama.cpp's auto
    c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", *factor}, {"original_max_position_embeddings", *orig},
                         {"beta_fast", *fast}, {"beta_slow", *slow}, {"attn_factor", *attn}};
    if (*yarn_attn > 0.0) c["rope_scaling"]["attention_factor"] = *yarn_attn;
    if (gpt_oss) c["rope_scaling"]["truncate"] = false;
  } else if (!scaling.empty() && scaling != "none") {
    return unsupported(g, "rope.scaling.type '" + scaling + "' (supported: none, linear, yarn)");
  }
  if (const gguf_tensor* f = g.tensor("rope_freqs.weight")) {
    if (f->type != ggml::f32 || f->elements() != *head_dim / 2) return bad(g, "rope_freqs.weight must be F32 of head_dim / 2");
    const auto* d = reinterpret_cast<const float*>(f->data);
    std::vector<float> fac(d, d + *head_dim / 2);
    const double factor = *std::max_element(fac.begin(), fac.end());
    auto orig = get_uint(g, p + "rope.scaling.original_context_length", 8192);
    if (!orig) return orig.take_error();
    // Llama 3.1/3.2: low_freq_factor 1, high_freq_factor 4 (HF's _compute_llama3_parameters).
    const double low = 1.0, high = 4.0, lo_wave = *orig / low, hi_wave = *orig / high;
    for (size_t i = 0; i < fac.size(); ++i) {
      const double freq = 1.0 / std::pow(*theta, 2.0 * i / *head_dim), wave = 2.0 * M_PI / freq;
      double want = 1.0;
      if (wave > lo_wave) {
        want = factor;
      } else if (wave >= hi_wave) {
        const double smooth = (*orig / wave - low) / (high - low);
        want = 1.0 / ((1.0 - smooth) / factor + smooth);
      }
      if (std::abs(fac[i] - want) > 1e-5 * want) {
        return unsupported(g, "rope_freqs.weight that is not Llama 3's rotary scaling (factor " + std::to_string(factor) + ")");
      }
    }
    if (factor != 1.0) {
      c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", factor}, {"low_freq_factor", low},
                           {"high_freq_factor", high}, {"original_max_position_embeddings", *orig}};
    }
  }
  if (v != nullptr) {
    if (v->bos) c["bos_token_id"] = *v->bos;
    json eos = json::array();
    if (v->eos) eos.push_back(*v->eos);
    // llama.cpp also ends a generation at the end-of-turn and end-of-message tokens.
    for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
      auto id = get_uint(g, key, UINT64_MAX);
      if (id && *id < v->tokens.size() && std::find(eos.begin(), eos.end(), json(*id)) == eos.end()) eos.push_back(*id);
    }
    if (gemma) {  // llama.cpp ends a turn at <end_of_turn> by its text (Gemma 2/3 files name no eot id; HF's generation_config does)
      auto t = std::find(v->tokens.begin(), v->tokens.end(), "<end_of_turn>");
      const auto id = static_cast<uint64_t>(t - v->tokens.begin());
      if (t != v->tokens.end() && std::find(eos.begin(), eos.end(), json(id)) == eos.end()) eos.push_back(id);
    }
    if (!eos.empty()) c["eos_token_id"] = eos;
  }
  return c;
}

}  // namespace

result<gguf_texts> gguf_model_texts(const gguf_file& g) {
  gguf_texts out;
  const std::string arch = get_string(g, "general.architecture");
  const std::string model = get_string(g, "tokenizer.ggml.model");
  std::optional<vocab_facts> vocab;
  if (!model.empty()) {
    if (model != "gpt2" && model != "llama") {
      return unsupported(g, "tokenizer.ggml.model '" + model + "' (supported: gpt2, llama)");
    }
    auto v = read_vocab(g, model);
    if (!v) return v.take_error();
    vocab = std::move(*v);
  }
  // A file whose architecture llmesh does not run still has a tokenizer to read.
  auto cfg = config_json(g, arch, vocab ? &*vocab : nullptr);
  out.config_json = cfg ? result<std::string>(cfg->dump()) : result<std::string>(cfg.take_error());
  if (vocab) {
    try {
      auto tok = tokenizer_json(g, model, *vocab);
      if (!tok) return tok.take_error();
      out.tokenizer_json = tok->dump(-1, ' ', false, json::error_handler_t::replace);
    } catch (const json::exception& e) {
      return bad(g, std::string("tokenizer: ") + e.what());
    }
    json tc = {{"add_bos_token", vocab->add_bos}, {"add_eos_token", vocab->add_eos}};
    if (vocab->bos) tc["bos_token"] = vocab->tokens[*vocab->bos];
    if (vocab->eos) tc["eos_token"] = vocab->tokens[*vocab->eos];
    const std::string chat = get_string(g, "tokenizer.chat_template");
    if (!chat.empty()) tc["chat_template"] = chat;
    out.tokenizer_config_json = tc.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return out;
}

namespace {

struct cache_key {
  std::string path;
  dev_t dev;
  ino_t ino;
  off_t size;
  int64_t mtime_ns;
  bool operator<(const cache_key& o) const {
    return std::tie(path, dev, ino, size, mtime_ns) < std::tie(o.path, o.dev, o.ino, o.size, o.mtime_ns);
  }
};

/// The texts of a GGUF file, made once per file (the tokenizer of a 150k vocabulary is ~10 MB
/// of JSON; config, tokenizer, detokenizer and chat template each read one).
result<std::shared_ptr<const gguf_texts>> cached_texts(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return make_error(errc::not_found, "cannot read " + path);
  const cache_key key{path, st.st_dev, st.st_ino, st.st_size, static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  static std::mutex mu;
  static std::map<cache_key, std::shared_ptr<const gguf_texts>> cache;
  std::lock_guard lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  auto g = gguf_file::open(path);
  if (!g) return g.take_error();
  auto texts = gguf_model_texts(**g);
  if (!texts) return texts.take_error();
  auto shared = std::make_shared<const gguf_texts>(std::move(*texts));
  if (cache.size() >= 8) cache.erase(cache.begin());
  cache.emplace(key, shared);
  return shared;
}

}  // namespace

result<std::string> read_model_file(const std::string& dir, const std::string& name) {
  if (!is_gguf_file(dir)) return read_text_file(dir + "/" + name);
  auto texts = cached_texts(dir);
  if (!texts) return texts.take_error();
  if (name == "config.json") return (*texts)->config_json;
  const std::string* text = name == "tokenizer.json"        ? &(*texts)->tokenizer_json
                            : name == "tokenizer_config.json" ? &(*texts)->tokenizer_config_json
                                                              : nullptr;
  if (text == nullptr || text->empty()) return make_error(errc::not_found, dir + " holds no " + name);
  return *text;
}

std::string model_file_label(const std::string& dir, const std::string& name) {
  return is_gguf_file(dir) ? dir + " (" + name + ")" : dir + "/" + name;
}

}  // namespace llmesh::model
