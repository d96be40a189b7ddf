// Deterministic random LoRA adapters in PEFT's layout, for tests and benchmarks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "llmesh/model/config.hpp"
#include "llmesh/model/lora.hpp"
#include "llmesh/model/random_model.hpp"
#include "random_fill.hpp"

namespace llmesh::model {

status write_random_lora(const random_lora_spec& s, const std::string& model_dir, const std::string& dir) {
  auto cfg = load_config(model_dir);
  if (!cfg) return cfg.take_error();
  const auto& c = *cfg;
  if (s.rank == 0 || s.rank > 512) return make_error(errc::invalid_request, "--rank must be 1..512");
  if (s.targets.empty()) return make_error(errc::invalid_request, "--targets: at least one projection");
  std::vector<lora_target> targets;
  for (const auto& name : s.targets) {
    auto t = parse_lora_target(name);
    if (!t) return make_error(errc::invalid_request, "--targets: unknown projection '" + name + "'");
    targets.push_back(*t);
  }
  if (c.fused_projections || (c.moe.n_experts > 0 && std::any_of(targets.begin(), targets.end(), lora_target_in_mlp))) {
    return make_error(errc::invalid_request, "random-lora: fused projections and MoE MLPs take no adapter");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(errc::io_error, "cannot create " + dir + ": " + ec.message());
  // A: x·Aᵀ about O(1) per rank component for O(1) inputs; B: scaled so that scale·B·A·x is
  // about `strength` times an O(1) row.
  const double scaling = s.alpha / (s.rslora ? std::sqrt(static_cast<double>(s.rank)) : static_cast<double>(s.rank));
  std::vector<tensor_spec> tensors;
  for (size_t l = 0; l < c.n_layers; ++l) {
    for (const lora_target t : targets) {
      const auto [out, in] = lora_projection_shape(c, t);
      const std::string p = "base_model.model.model.layers." + std::to_string(l) + (lora_target_in_mlp(t) ? ".mlp." : ".self_attn.") +
                            std::string(lora_target_name(t)) + ".";
      const float a_scale = std::sqrt(3.0f / static_cast<float>(in));
      const float b_scale = s.strength * static_cast<float>(std::sqrt(3.0 / static_cast<double>(s.rank)) / scaling);
      tensors.push_back({p + "lora_A.weight", s.dtype, {s.rank, in}, detail::uniform(s.seed, p + "A", s.dtype, 0.0f, a_scale)});
      tensors.push_back({p + "lora_B.weight", s.dtype, {out, s.rank}, detail::uniform(s.seed, p + "B", s.dtype, 0.0f, b_scale)});
    }
  }
  nlohmann::ordered_json j = {{"peft_type", "LORA"},
                              {"base_model_name_or_path", model_dir},
                              {"r", s.rank},
                              {"lora_alpha", s.alpha},
                              {"lora_dropout", 0.0},
                              {"target_modules", s.targets},
                              {"use_rslora", s.rslora},
                              {"use_dora", false},
                              {"bias", "none"},
                              {"fan_in_fan_out", false},
                              {"modules_to_save", nullptr},
                              {"task_type", "CAUSAL_LM"}};
  std::ofstream(dir + "/adapter_config.json") << j.dump(2) << "\n";
  return write_safetensors(dir + "/adapter_model.safetensors", tensors);
}

}  // namespace llmesh::model
