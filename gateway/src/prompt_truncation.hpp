// vLLM's truncate_prompt_tokens, shared by the routes that take it (api_service.cpp,
// api_embeddings.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::gateway::detail {

/// vLLM's rule: truncate_prompt_tokens may not ask for more than the model's context.
[[nodiscard]] status check_truncation(int64_t k, size_t context);

/// Keeps the prompt's last k tokens (-1: the model's context; 0: all). Whether it cut any.
bool truncate_prompt(std::vector<int32_t>& ids, int64_t k, size_t context);

}  // namespace llmesh::gateway::detail
