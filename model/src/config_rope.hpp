// config.json's rotary settings (config_rope.cpp).
#pragma once

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"
#include "llmesh/model/config.hpp"

namespace llmesh::model::detail {

/// rope_theta, partial_rotary_factor and rope_scaling (or transformers v5's rope_parameters)
/// into c.rope, after c.head_dim, c.arch and c.max_positions are read; a yarn or linear
/// scaling stretches c.max_positions as vLLM's derived max_model_len does.
[[nodiscard]] status parse_rope(const nlohmann::json& j, model_config& c);

}  // namespace llmesh::model::detail
