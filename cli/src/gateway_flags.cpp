#include "gateway_flags.hpp"

#include "llmesh/kernels/sampling.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include <chrono>
#include <cstdlib>

namespace llmesh::cli {

void add_gateway_flags(CLI::App* sub, gateway_flags& f) {
  sub->add_option("--api-key", f.api_key, "Require 'Authorization: Bearer KEY' on /v1 routes (or LLMESH_API_KEY)");
  sub->add_option("--max-concurrent", f.max_concurrent, "Generations in flight; beyond: 429")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_option("--max-tokens-limit", f.max_tokens, "Largest max_tokens a request may ask for")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  sub->add_option("--max-body-kb", f.max_body_kb, "Largest request body, KiB; beyond: 413")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_option("--max-connections", f.max_connections, "Open HTTP connections; beyond: 429 and closed at once")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_option("--max-connections-per-client", f.max_connections_per_client,
                  "Open HTTP connections one client address may hold; beyond: 429")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_option("--idle-timeout", f.idle_timeout_s, "Seconds an idle connection stays open")
      ->check(CLI::Range(1, 86400))->capture_default_str();
  sub->add_option("--max-stored-responses", f.max_stored_responses,
                  "Responses API: responses kept for previous_response_id and GET /v1/responses/{id}, oldest dropped "
                  "first; 0: none")
      ->check(CLI::Range(0, 1 << 24))->capture_default_str();
  sub->add_option("--max-stored-responses-mb", f.max_stored_responses_mb, "Responses API: MiB of JSON those may take")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_option("--max-conversations", f.max_conversations,
                  "Conversations API: conversations kept (POST /v1/conversations; a response's 'conversation'), "
                  "least recently written dropped first; 0: none")
      ->check(CLI::Range(0, 1 << 24))->capture_default_str();
  sub->add_option("--max-conversations-mb", f.max_conversations_mb, "Conversations API: MiB of JSON those may take")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  sub->add_option("--scheduling-policy", f.scheduling_policy,
                  "fcfs: first come, first served (a request's non-zero 'priority' is a 400); priority: requests' "
                  "'priority' orders admission and preemption in the replicas, lower first (vLLM's)")
      ->check(CLI::IsMember({"fcfs", "priority"}))->capture_default_str();
  sub->add_option("--allowed-origins", f.allowed_origins,
                  "vLLM's: origins whose pages may call the API from a browser (CORS), a JSON list or comma-separated; "
                  "'[\"*\"]': any (default: none, unlike vLLM's any)");
  sub->add_option("--allowed-methods", f.allowed_methods, "vLLM's: methods a CORS preflight may ask for (* : any)")
      ->capture_default_str();
  sub->add_option("--allowed-headers", f.allowed_headers, "vLLM's: request headers a CORS preflight may ask for (* : any)")
      ->capture_default_str();
  sub->add_flag("--allow-credentials", f.allow_credentials, "vLLM's: CORS answers allow credentials (cookies, auth)");
  sub->add_option("--ssl-certfile", f.tls.cert_file, "vLLM's: serve HTTPS with this PEM certificate (then its chain)");
  sub->add_option("--ssl-keyfile", f.tls.key_file, "vLLM's: the certificate's PEM private key, unencrypted (default: in --ssl-certfile)");
  sub->add_option("--ssl-ca-certs", f.tls.ca_file, "vLLM's: PEM CAs that client certificates are checked against");
  sub->add_option("--ssl-cert-reqs", f.tls.cert_reqs,
                  "vLLM's: client certificates: 0 not asked for, 1 optional (one sent must verify), 2 required")
      ->check(CLI::Range(0, 2))->capture_default_str();
  sub->add_option("--ssl-ciphers", f.tls.ciphers, "OpenSSL cipher list for TLS 1.2 (default: OpenSSL's; TLS 1.3 keeps its own)");
  sub->add_flag("--enable-ssl-refresh", f.tls.refresh,
                "vLLM's: new connections get the certificate, key and CAs as their files are now, after a change");
  sub->add_option("--max-logprobs", f.max_logprobs,
                  "vLLM's: the most alternatives per token a request may ask for (logprobs, top_logprobs, "
                  "prompt_logprobs); beyond: 400. At most 20 here (the engine's bound; -1: 20)")
      ->check(CLI::Range(-1, 1 << 30))->capture_default_str();
  sub->add_option("--response-role", f.response_role,
                  "vLLM's: the role chat answers name after a generation prompt (else the continued message's)")
      ->capture_default_str();
  sub->add_flag("--enable-request-id-headers", f.request_id_headers,
                "vLLM's: answers carry X-Request-Id (the request's own, or a new random one)");
  sub->add_option("--root-path", f.root_path,
                  "vLLM's (FastAPI's root_path): a path prefix a proxy may leave on requests; routes answer with and "
                  "without it");
  sub->add_flag("--enable-log-requests", f.log_requests,
                "vLLM's: a line on stderr per request admitted (id, model, prompt text and ids, sampling settings)");
  sub->add_option("--chat-template-content-format", f.content_format,
                  "vLLM's: how chat templates see message content: auto or string (one string), openai (a list of "
                  "{\"type\": \"text\", \"text\": ...} parts)")
      ->check(CLI::IsMember({"auto", "string", "openai"}))->capture_default_str();
  sub->add_flag("--enable-log-outputs", f.log_outputs,
                "vLLM's: a line on stderr per choice of a response that ended (finish reason, text, ids)");
  sub->add_option("--max-log-len", f.max_log_len, "vLLM's: the prompt characters and ids a logged request shows (0: all)")
      ->capture_default_str();
  sub->add_option("--otlp-traces-endpoint", f.otlp_traces_endpoint,
                  "vLLM's: send a span per request (OpenTelemetry, gen_ai.* attributes) to this OTLP/HTTP collector "
                  "endpoint, e.g. http://localhost:4318/v1/traces; OTEL_EXPORTER_OTLP_TRACES_* and OTEL_BSP_* "
                  "settings apply (protocol http/protobuf or http/json)");
  sub->add_flag_function("--enable-server-load-tracking", [](int64_t) {},
                         "vLLM's; accepted: GET /load always reports the requests in flight");
  sub->add_flag_function("--disable-uvicorn-access-log", [](int64_t) {},
                         "vLLM's; accepted: this server writes no access log");
  sub->add_flag("--enable-force-include-usage", f.force_include_usage,
                "vLLM's: every streamed response ends with its usage chunk (as stream_options.include_usage)");
  sub->add_flag("--return-tokens-as-token-ids", f.tokens_as_ids,
                "vLLM's: logprobs name every token 'token_id:<id>' (as a request's return_tokens_as_token_ids)");
  sub->add_flag_function("--enable-prompt-tokens-details", [](int64_t) {},
                         "vLLM's; accepted: usage always has prompt_tokens_details (cached_tokens)");
  sub->add_option("--seed", f.seed,
                  "vLLM's: requests without a seed draw theirs from this one, so that a server started again with it "
                  "samples the same sequence of requests alike (default: a random seed per start)");
  sub->add_option("--reasoning-parser", f.reasoning_parser,
                  "Split chat output's <think> block into reasoning_content: none | deepseek_r1 | qwen3 | openai_gptoss "
                  "(OpenAI's harmony channels; GPT-OSS models use it unasked)")
      ->check(CLI::IsMember({"none", "deepseek_r1", "qwen3", "openai_gptoss"}))->capture_default_str();
  sub->add_option("--tool-call-parser", f.tool_call_parser,
                  "The format tool_choice \"auto\" takes calls from: hermes (<tool_call> blocks) | llama3_json | mistral | pythonic | "
                  "qwen3_coder (Qwen3-Coder's XML calls; also qwen3_xml) | granite | phi4_mini_json | openai (GPT-OSS's harmony "
                  "calls, which GPT-OSS models use whatever is named)")
      ->check(CLI::IsMember({"hermes", "llama3_json", "mistral", "pythonic", "qwen3_coder", "qwen3_xml", "granite", "phi4_mini_json", "openai"}))
      ->capture_default_str();
  sub->add_option("--chat-template", f.chat_template,
                  "The chat template instead of the model's: a Jinja file, or the template itself in one line");
  sub->add_option("--max-model-len", f.max_model_len,
                  "Context length the API grants (prompt + max_tokens), at most the model's (default: the model's)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30));
  sub->add_option("--pooling", f.pooling,
                  "/v1/embeddings' pooling: model (sentence-transformers' modules.json in the model directory, else "
                  "last) | last | mean | cls (vLLM's --override-pooler-config)")
      ->check(CLI::IsMember({"model", "last", "mean", "cls"}))->capture_default_str();
}

void apply_gateway_flags(const gateway_flags& f, gateway::api_options& api, gateway::http_options& http) {
  api.api_key = f.api_key;
  if (api.api_key.empty()) {
    if (const char* k = std::getenv("LLMESH_API_KEY")) api.api_key = k;
  }
  api.limits.max_tokens = f.max_tokens;
  api.max_concurrent = f.max_concurrent;
  api.max_stored_responses = f.max_stored_responses;
  api.priority_scheduling = f.scheduling_policy == "priority";
  api.seed = f.seed;
  api.force_include_usage = f.force_include_usage;
  api.tokens_as_ids = f.tokens_as_ids;
  api.response_role = f.response_role;
  api.root_path = f.root_path;
  api.log_requests = f.log_requests;
  api.log_outputs = f.log_outputs;
  api.content_as_parts = f.content_format == "openai";
  api.max_log_len = f.max_log_len;
  while (!api.root_path.empty() && api.root_path.back() == '/') api.root_path.pop_back();
  if (!api.root_path.empty() && api.root_path.front() != '/') api.root_path.insert(0, "/");
  api.limits.max_logprobs = f.max_logprobs < 0 ? kernels::max_logprobs : std::min(f.max_logprobs, kernels::max_logprobs);
  if (f.max_logprobs < 0 || f.max_logprobs > kernels::max_logprobs) {
    std::fprintf(stderr, "llmesh: --max-logprobs %d: this server returns at most %d alternatives per token; a request "
                         "asking for more gets a 400\n", f.max_logprobs, kernels::max_logprobs);
  }
  http.request_id_headers = f.request_id_headers;
  api.max_stored_response_bytes = f.max_stored_responses_mb << 20;
  api.max_conversations = f.max_conversations;
  api.max_conversation_bytes = f.max_conversations_mb << 20;
  http.max_body_bytes = f.max_body_kb << 10;
  http.idle_timeout = std::chrono::seconds(f.idle_timeout_s);
  http.max_connections = f.max_connections;
  http.max_connections_per_client = f.max_connections_per_client;
  http.tls = f.tls;
}

result<std::optional<gateway::otlp_options>> otlp_options_of(const gateway_flags& f) {
  if (f.otlp_traces_endpoint.empty()) return std::optional<gateway::otlp_options>();
  auto o = gateway::otlp_options_from(f.otlp_traces_endpoint, [](const char* name) { return std::getenv(name); });
  if (!o) return o.take_error();
  return std::optional<gateway::otlp_options>(std::move(*o));
}

std::shared_ptr<gateway::otlp_exporter> start_tracer(std::optional<gateway::otlp_options> o, actors::metrics_registry& metrics) {
  if (!o) return nullptr;
  std::fprintf(stderr, "llmesh: tracing: a span per request to %s (%s, every %lld ms)\n", o->endpoint.c_str(),
               o->json ? "http/json" : "http/protobuf", static_cast<long long>(o->schedule_delay.count()));
  return std::make_shared<gateway::otlp_exporter>(std::move(*o), &metrics);
}

result<gateway::cors_options> cors_options_of(const gateway_flags& f) {
  gateway::cors_options o;
  if (!f.allowed_origins.empty()) {
    auto origins = gateway::parse_cors_list(f.allowed_origins, "--allowed-origins");
    if (!origins) return origins.take_error();
    o.origins = std::move(*origins);
  }
  auto methods = gateway::parse_cors_list(f.allowed_methods, "--allowed-methods");
  if (!methods) return methods.take_error();
  auto headers = gateway::parse_cors_list(f.allowed_headers, "--allowed-headers");
  if (!headers) return headers.take_error();
  o.methods = std::move(*methods);
  for (auto& m : o.methods) {  // browsers send methods in capitals, and compare them so
    for (auto& c : m) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  o.headers = std::move(*headers);
  o.credentials = f.allow_credentials;
  return o;
}

status apply_model_overrides(gateway::served_model& m, const std::string& dir, const std::string& chat_template,
                             size_t max_model_len, bool from_config) {
  if (!chat_template.empty()) {
    auto t = model::chat_template::load_override(dir, chat_template, from_config ? m.name + ": chat_template" : "--chat-template");
    if (!t) return t.take_error();
    m.chat = std::move(*t);
  }
  if (max_model_len > m.cfg.max_positions) {
    return make_error(errc::invalid_request, std::string(from_config ? m.name + ": max_model_len " : "--max-model-len ") +
                                                 std::to_string(max_model_len) + " exceeds " + m.name + "'s context of " +
                                                 std::to_string(m.cfg.max_positions) + " positions");
  }
  if (max_model_len > 0) m.cfg.max_positions = max_model_len;
  return ok_status();
}

}  // namespace llmesh::cli
