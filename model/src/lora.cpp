// PEFT LoRA adapters: adapter_config.json and adapter_model.safetensors, read into memory
// (16-bit tensors as they are, others as float32).
#include "llmesh/model/lora.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <regex>
#include <cstring>
#include <set>
#include <tuple>

#include "llmesh/kernels/quantize.hpp"
#include "llmesh/model/safetensors.hpp"
#include "language_model_name.hpp"
#include "read_file.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;

constexpr size_t max_lora_rank = 512;

error bad(const lora_source& src, const std::string& what) {
  return error{errc::invalid_request, "LoRA adapter '" + src.name + "' (" + src.path + "): " + what};
}

/// The adapter's settings that change what its tensors mean.
struct lora_settings {
  double alpha = 8.0;  // PEFT's default lora_alpha
  bool rslora = false;
};

result<lora_settings> read_settings(const lora_source& src) {
  const std::string path = (std::filesystem::path(src.path) / "adapter_config.json").string();
  auto text = read_text_file(path);
  if (!text) return bad(src, "cannot read adapter_config.json: " + text.err().message);
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad(src, "adapter_config.json is not a JSON object");
  lora_settings s;
  if (j.contains("peft_type") && j["peft_type"] != "LORA") {
    return bad(src, "peft_type " + j["peft_type"].dump() + " is not LORA");
  }
  if (j.contains("lora_alpha")) {
    if (!j["lora_alpha"].is_number() || !std::isfinite(j["lora_alpha"].get<double>())) return bad(src, "lora_alpha must be a number");
    s.alpha = j["lora_alpha"].get<double>();
  }
  auto flag = [&](const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); };
  s.rslora = flag("use_rslora");
  if (flag("use_dora")) return bad(src, "DoRA (use_dora) is not supported");
  if (flag("fan_in_fan_out")) return bad(src, "fan_in_fan_out (Conv1D weights) is not supported");
  if (j.contains("bias") && j["bias"] != "none") return bad(src, "bias " + j["bias"].dump() + " is not supported (only \"none\")");
  auto non_empty = [&](const char* key) {
    return j.contains(key) && !j[key].is_null() && !(j[key].is_array() && j[key].empty()) &&
           !(j[key].is_object() && j[key].empty());
  };
  if (non_empty("modules_to_save")) return bad(src, "modules_to_save is not supported");
  if (non_empty("alpha_pattern")) return bad(src, "alpha_pattern is not supported");
  return s;
}

/// "layers.3.self_attn.q_proj.lora_A" and the like, after PEFT's prefixes.
const std::regex& tensor_name_rule() {
  static const std::regex rule(
      R"(^base_model\.model\.(?:model\.)?layers\.(\d{1,6})\.(self_attn|mlp)\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.lora_([AB])(?:\.default)?\.weight$)");
  return rule;
}

constexpr std::string_view target_names[lora_target_count] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                              "gate_proj", "up_proj", "down_proj"};

}  // namespace

std::string_view lora_target_name(lora_target t) { return target_names[static_cast<size_t>(t)]; }

std::optional<lora_target> parse_lora_target(std::string_view name) {
  for (size_t i = 0; i < lora_target_count; ++i) {
    if (target_names[i] == name) return static_cast<lora_target>(i);
  }
  return std::nullopt;
}

std::pair<size_t, size_t> lora_projection_shape(const model_config& c, lora_target t) {
  const size_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
  switch (t) {
    case lora_target::q: return {q_dim, c.hidden};
    case lora_target::k:
    case lora_target::v: return {kv_dim, c.hidden};
    case lora_target::o: return {c.hidden, q_dim};
    case lora_target::gate:
    case lora_target::up: return {c.intermediate, c.hidden};
    case lora_target::down: return {c.hidden, c.intermediate};
  }
  return {0, 0};
}

bool valid_lora_name(std::string_view n) {
  if (n.empty() || n.size() > 128) return false;
  for (char ch : n) {
    const bool ok = std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.' || ch == ':' || ch == '/';
    if (!ok) return false;
  }
  return true;
}

result<lora_source> parse_lora_source(std::string_view spec) {
  lora_source s;
  const std::string text(spec);
  if (!text.empty() && text.front() == '{') {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("path") ||
        !j["path"].is_string()) {
      return make_error(errc::invalid_request, "--lora-modules: a JSON value needs string fields name and path");
    }
    s.name = j["name"].get<std::string>();
    s.path = j["path"].get<std::string>();
  } else {
    const size_t eq = text.find('=');
    if (eq == std::string::npos) {
      return make_error(errc::invalid_request, "--lora-modules: expected NAME=PATH, not '" + text + "'");
    }
    s.name = text.substr(0, eq);
    s.path = text.substr(eq + 1);
  }
  if (!valid_lora_name(s.name)) {
    return make_error(errc::invalid_request, "--lora-modules: the name '" + s.name +
                                                 "' must be 1-128 letters, digits or -_.:/");
  }
  if (s.path.empty()) return make_error(errc::invalid_request, "--lora-modules: '" + s.name + "' has an empty path");
  return s;
}

status check_lora_names(const std::vector<lora_source>& loras, const std::string& base_name) {
  std::set<std::string> seen;
  for (const auto& l : loras) {
    if (l.name == base_name) {
      return make_error(errc::invalid_request, "LoRA adapter name '" + l.name + "' is the base model's name");
    }
    if (!seen.insert(l.name).second) return make_error(errc::invalid_request, "LoRA adapter name '" + l.name + "' given twice");
  }
  return ok_status();
}

size_t lora_adapter::bytes() const {
  size_t n = 0;
  for (const auto& l : layers) {
    for (const auto& p : l.pairs) n += p.a.bytes.size() + p.b.bytes.size();
  }
  return n;
}

result<lora_adapter> load_lora(const lora_source& src, const model_config& cfg) {
  auto settings = read_settings(src);
  if (!settings) return settings.take_error();
  const std::string file = (std::filesystem::path(src.path) / "adapter_model.safetensors").string();
  std::error_code ec;
  if (!std::filesystem::exists(file, ec)) {
    const bool bin = std::filesystem::exists(std::filesystem::path(src.path) / "adapter_model.bin", ec);
    return bad(src, bin ? "adapter_model.bin (a pickle) is not read; save the adapter with safe_serialization"
                        : "no adapter_model.safetensors");
  }
  tensor_store store;
  if (auto s = store.add_file(file); !s) return bad(src, s.err().message);

  lora_adapter a;
  a.name = src.name;
  a.path = src.path;
  a.layers.resize(cfg.n_layers);
  // Each projection's A and B, found by name; every tensor must be one of them.
  struct found {
    const tensor_view* a = nullptr;
    const tensor_view* b = nullptr;
  };
  std::map<std::pair<size_t, lora_target>, found> pairs;
  std::vector<std::pair<std::string, tensor_view>> views;
  for (const auto& name : store.names()) {
    std::string n = name;
    constexpr std::string_view peft = "base_model.model.";
    if (cfg.language_model_of_multimodal && n.starts_with(peft)) {  // PEFT over a multimodal checkpoint
      const std::string_view rest = std::string_view(n).substr(peft.size());
      if (auto lm = detail::language_model_name(rest)) {
        n = std::string(peft) + *lm;
      } else {
        const std::string_view tower = rest.starts_with("model.") ? rest.substr(6) : rest;
        if (tower.starts_with("vision_tower.") || tower.starts_with("multi_modal_projector.")) continue;  // never run for text
      }
    }
    views.emplace_back(n, *store.get(name));
  }
  for (const auto& [name, view] : views) {
    std::smatch m;
    if (name.size() > 256) {  // std::regex recurses per character: bound it before matching
      return bad(src, "a tensor name of " + std::to_string(name.size()) + " characters is not a LoRA pair's");
    }
    if (!std::regex_match(name, m, tensor_name_rule())) {
      return bad(src, "tensor '" + name + "' is not a LoRA pair of a q/k/v/o, gate/up/down projection (embeddings, the LM "
                      "head, biases, MoE experts and fused projections are not supported)");
    }
    const size_t layer = std::stoul(m[1].str());
    if (layer >= cfg.n_layers) {
      return bad(src, "tensor '" + name + "' is for layer " + m[1].str() + "; the model has " + std::to_string(cfg.n_layers));
    }
    const auto t = parse_lora_target(m[3].str());
    if (!t || lora_target_in_mlp(*t) != (m[2].str() == "mlp")) {
      return bad(src, "tensor '" + name + "' names a projection outside its block");
    }
    if (cfg.moe.n_experts > 0 && m[2].str() == "mlp") return bad(src, "tensor '" + name + "': an MoE model's MLP takes no adapter");
    if (cfg.fused_projections) return bad(src, "a model with fused projections (Phi-3) takes no adapter here");
    auto& f = pairs[{layer, *t}];
    const tensor_view*& slot = m[4].str() == "A" ? f.a : f.b;
    if (slot) return bad(src, "tensor '" + name + "': its projection's lora_" + m[4].str() + " is given twice");
    slot = &view;
  }
  if (pairs.empty()) return bad(src, "adapter_model.safetensors holds no LoRA tensors");
  for (const auto& [key, f] : pairs) {
    const auto [layer, t] = key;
    const std::string where = "layer " + std::to_string(layer) + " " + std::string(lora_target_name(t));
    if (!f.a || !f.b) return bad(src, where + ": lora_A and lora_B must both be present");
    const auto [out, in] = lora_projection_shape(cfg, t);
    if (f.a->shape.size() != 2 || f.b->shape.size() != 2) return bad(src, where + ": lora_A and lora_B must be matrices");
    const size_t r = f.a->shape[0];
    if (r == 0 || r > max_lora_rank) {
      return bad(src, where + ": rank " + std::to_string(r) + " is outside 1.." + std::to_string(max_lora_rank));
    }
    if (f.a->shape != std::vector<size_t>{r, in} || f.b->shape != std::vector<size_t>{out, r}) {
      return bad(src, where + ": lora_A " + shape_string(f.a->shape) + " and lora_B " + shape_string(f.b->shape) +
                          " do not fit; the model needs [r, " + std::to_string(in) + "] and [" + std::to_string(out) + ", r]");
    }
    lora_pair& p = a.layers[layer][t];
    p.r = r;
    p.in = in;
    p.out = out;
    const double rd = static_cast<double>(r);
    p.scale = static_cast<float>(settings->alpha / (settings->rslora ? std::sqrt(rd) : rd));
    for (auto [view, m, n, label] : {std::tuple{f.a, &p.a, r * in, "lora_A"}, std::tuple{f.b, &p.b, out * r, "lora_B"}}) {
      m->type = view->type == kernels::dtype::bf16 || view->type == kernels::dtype::f16 ? view->type : kernels::dtype::f32;
      m->bytes.resize(kernels::dtype_bytes(m->type, n));
      if (m->type == view->type) {
        std::memcpy(m->bytes.data(), view->data, m->bytes.size());
      } else {
        for (size_t i = 0; i < n; ++i) {
          const float x = kernels::load_as_f32(view->data, view->type, i);
          std::memcpy(m->bytes.data() + 4 * i, &x, 4);
        }
      }
      for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(m->value(i))) return bad(src, where + ": " + label + " holds a non-finite value");
      }
    }
    a.max_rank = std::max(a.max_rank, r);
  }
  return a;
}

status cast_lora(lora_adapter& a, kernels::dtype to) {
  if (to != kernels::dtype::f32 && to != kernels::dtype::bf16 && to != kernels::dtype::f16) {
    return make_error(errc::invalid_request, "--lora-dtype must be float32, bfloat16 or float16");
  }
  auto cast = [&](lora_matrix& m, size_t rows, size_t cols) -> status {
    if (m.type == to || rows * cols == 0) return ok_status();
    std::vector<uint8_t> out(kernels::dtype_offset(to, rows * cols));
    if (auto s = kernels::convert_rows(m.bytes.data(), m.type, rows, cols, out.data(), to); !s) {
      return make_error(errc::invalid_request, "LoRA adapter '" + a.name + "' (" + a.path + "): --lora-dtype: " + s.err().message);
    }
    m.type = to;
    m.bytes = std::move(out);
    return ok_status();
  };
  for (auto& layer : a.layers) {
    for (auto& p : layer.pairs) {
      if (p.r == 0) continue;
      LLMESH_TRY(cast(p.a, p.r, p.in));
      LLMESH_TRY(cast(p.b, p.out, p.r));
    }
  }
  return ok_status();
}

}  // namespace llmesh::model
