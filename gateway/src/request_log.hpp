// vLLM's --enable-log-requests: one line on stderr per prompt of a request the API admits (its
// response id, model, prompt text and token ids, and sampling settings), as vLLM's "Received
// request" line; --max-log-len caps the prompt's characters and ids shown. Private to the gateway.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "llmesh/gateway/openai_api.hpp"

namespace llmesh::gateway {

/// The line (without the trailing newline) for prompt `index` of `count` of response `id`.
/// `max_len` 0: no cap.
std::string request_log_line(const std::string& id, const std::string& model, size_t index, size_t count,
                             const std::string& prompt_text, const std::vector<int32_t>& prompt_ids, size_t max_tokens,
                             const generation_fields& g, uint64_t seed, size_t max_len);

/// vLLM's --enable-log-outputs: the line for choice `index` of response `id` once it ended.
std::string output_log_line(const std::string& id, size_t index, const std::string& finish, const std::vector<int32_t>& ids,
                            const std::string& text, size_t max_len);

}  // namespace llmesh::gateway
