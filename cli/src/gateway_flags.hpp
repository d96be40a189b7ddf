// The HTTP gateway's flags, shared by `llmesh serve` and `llmesh node` (a gateway node): API
// key, request and connection limits. One definition, so both commands take the same flags
// with the same ranges and defaults.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "llmesh/gateway/api_service.hpp"
#include "llmesh/gateway/http_server.hpp"

namespace llmesh::cli {

struct gateway_flags {
  std::string api_key;
  size_t max_concurrent = 256, max_tokens = 4096, max_body_kb = 4096, idle_timeout_s = 15;
  size_t max_connections = 1024, max_connections_per_client = 256;
  size_t max_stored_responses = 1024, max_stored_responses_mb = 64;
  size_t max_conversations = 1024, max_conversations_mb = 64;
  std::string scheduling_policy = "fcfs";  ///< fcfs | priority (vLLM's --scheduling-policy)
  std::string reasoning_parser = "none";  ///< none | deepseek_r1 | qwen3 (reasoning.hpp)
  std::string tool_call_parser = "hermes";  ///< hermes | llama3_json | mistral (tool_calls.hpp)
  std::string pooling = "model";  ///< /v1/embeddings' pooling: model (the directory's) | last | mean | cls
};

/// Adds --api-key (or LLMESH_API_KEY), --max-concurrent, --max-tokens-limit, --max-body-kb,
/// --max-connections, --max-connections-per-client, --idle-timeout, --max-stored-responses,
/// --max-stored-responses-mb, --scheduling-policy, --reasoning-parser, --tool-call-parser and
/// --pooling to `sub`.
void add_gateway_flags(CLI::App* sub, gateway_flags& f);

/// Copies the flags into the API's and the HTTP server's options (API key from LLMESH_API_KEY
/// when the flag is not given).
void apply_gateway_flags(const gateway_flags& f, gateway::api_options& api, gateway::http_options& http);

}  // namespace llmesh::cli
