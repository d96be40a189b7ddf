// The HTTP gateway's flags, shared by `llmesh serve` and `llmesh node` (a gateway node): API
// key, request and connection limits. One definition, so both commands take the same flags
// with the same ranges and defaults.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "llmesh/gateway/api_service.hpp"
#include "llmesh/gateway/http_server.hpp"
#include "llmesh/gateway/otlp_exporter.hpp"

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
  std::string chat_template;      ///< vLLM's --chat-template: a file, or the template inline ("": the model's)
  size_t max_model_len = 0;       ///< vLLM's --max-model-len: the context requests get (0: the model's)
  std::optional<uint64_t> seed;   ///< vLLM's --seed: seeds of seedless requests drawn from it (none: at random)
  /// vLLM's CORS flags (cors.hpp): a JSON list or names separated by commas; no origins: off.
  std::string allowed_origins, allowed_methods = "*", allowed_headers = "*";
  bool allow_credentials = false;
  bool force_include_usage = false;  ///< vLLM's --enable-force-include-usage
  bool tokens_as_ids = false;        ///< vLLM's --return-tokens-as-token-ids
  gateway::tls_options tls;          ///< vLLM's --ssl-certfile, --ssl-keyfile, ... (tls.hpp)
  int max_logprobs = 20;             ///< vLLM's --max-logprobs (-1: the engine's bound)
  std::string response_role = "assistant";  ///< vLLM's --response-role
  bool request_id_headers = false;   ///< vLLM's --enable-request-id-headers
  std::string root_path;             ///< vLLM's --root-path
  bool log_requests = false;         ///< vLLM's --enable-log-requests
  bool log_outputs = false;          ///< vLLM's --enable-log-outputs
  std::string content_format = "auto";  ///< vLLM's --chat-template-content-format
  size_t max_log_len = 0;            ///< vLLM's --max-log-len
  std::string otlp_traces_endpoint;  ///< vLLM's --otlp-traces-endpoint ("": no tracing)
};

/// Adds --api-key (or LLMESH_API_KEY), --max-concurrent, --max-tokens-limit, --max-body-kb,
/// --max-connections, --max-connections-per-client, --idle-timeout, --max-stored-responses,
/// --max-stored-responses-mb, --scheduling-policy, --reasoning-parser, --tool-call-parser and
/// --pooling to `sub`.
void add_gateway_flags(CLI::App* sub, gateway_flags& f);

/// Whether any per-model gateway flag (--reasoning-parser, --tool-call-parser, --pooling,
/// --chat-template, --max-model-len) differs from its default.
inline bool sets_model_flags(const gateway_flags& f) {
  return f.reasoning_parser != "none" || f.tool_call_parser != "hermes" || f.pooling != "model" || !f.chat_template.empty() ||
         f.max_model_len != 0;
}

/// A served model's --chat-template (replaces its own) and --max-model-len (at most the model's
/// context: prompts and max_tokens are checked against it, /v1/models reports it); "" and 0
/// leave the model's. Errors name the flag.
/// `from_config`: the values are a cluster config model's (errors name its keys).
[[nodiscard]] status apply_model_overrides(gateway::served_model& m, const std::string& dir, const std::string& chat_template,
                                           size_t max_model_len, bool from_config = false);

/// Copies the flags into the API's and the HTTP server's options (API key from LLMESH_API_KEY
/// when the flag is not given; HTTPS as the --ssl-* flags say); the CORS options come from
/// cors_options_of.
void apply_gateway_flags(const gateway_flags& f, gateway::api_options& api, gateway::http_options& http);

/// The CORS flags parsed (all three lists, whether or not origins are given: a typo fails the
/// start before anything loads); origins empty when --allowed-origins is not given.
[[nodiscard]] result<gateway::cors_options> cors_options_of(const gateway_flags& f);

/// --otlp-traces-endpoint's exporter settings, with the OTEL_* environment
/// (otlp_exporter.hpp); none without the flag. Read before anything loads, so that a bad
/// endpoint or variable fails the start.
[[nodiscard]] result<std::optional<gateway::otlp_options>> otlp_options_of(const gateway_flags& f);

/// The exporter for those settings (null: none), its spans counted in `metrics`, and a line on
/// stderr saying where spans go.
std::shared_ptr<gateway::otlp_exporter> start_tracer(std::optional<gateway::otlp_options> o, actors::metrics_registry& metrics);

/// The URL scheme the gateway serves: "https" with --ssl-certfile, else "http".
inline const char* url_scheme(const gateway_flags& f) { return f.tls.enabled() ? "https" : "http"; }

}  // namespace llmesh::cli
