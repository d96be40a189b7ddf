// The HTTP API's policies (api_service.hpp).
#include "llmesh/gateway/api_service.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "llmesh/actors/serving_metrics.hpp"

namespace llmesh::gateway {
namespace {

http_reply json_reply(int status, std::string body) {
  http_reply r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

/// Equal in time independent of where the strings differ (API keys).
bool same_secret(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return diff == 0 && !b.empty();
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// splitmix64: a seedless request's seed from a per-process random base and its id.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

api_service::api_service(api_options opt, std::vector<served_model> models, actors::mesh_client& mesh,
                         actors::metrics_registry& metrics)
    : opt_(std::move(opt)),
      models_(std::move(models)),
      mesh_(mesh),
      metrics_(metrics),
      seed_base_((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()),
      created_(unix_now()) {
  actors::metric::declare_serving(metrics_);
}

api_service::api_service(api_options opt, std::shared_ptr<const model::tokenizer> tok,
                         std::optional<model::chat_template> chat, model::model_config cfg, actors::mesh_client& mesh,
                         actors::metrics_registry& metrics)
    : api_service(opt, {served_model{opt.model_name, std::move(tok), std::move(chat), std::move(cfg)}}, mesh, metrics) {}

std::vector<std::string> api_service::model_names() const {
  std::vector<std::string> out;
  for (const auto& m : models_) out.push_back(m.name);
  return out;
}

result<const served_model*> api_service::find(const std::string& name) const {
  for (const auto& m : models_) {
    if (m.name == name) return &m;
  }
  std::string served;
  for (const auto& m : models_) served += (served.empty() ? "'" : ", '") + m.name + "'";
  return make_error(errc::not_found, "the model '" + name + "' does not exist; this server serves " + served);
}

bool api_service::authorized(std::string_view authorization) const {
  if (opt_.api_key.empty()) return true;
  constexpr std::string_view bearer = "Bearer ";
  if (!authorization.starts_with(bearer)) return false;
  return same_secret(authorization.substr(bearer.size()), opt_.api_key);
}

api_outcome api_service::handle(std::string_view method, std::string_view target, std::string_view authorization,
                                std::string_view body) {
  const std::string_view path = target.substr(0, target.find('?'));
  const bool get = method == "GET", post = method == "POST";
  if (path == "/health" && get) return json_reply(200, R"({"status":"ok"})");
  if (path == "/ready" && get) {
    if (mesh_.ready_replicas() > 0) return json_reply(200, R"({"status":"ready"})");
    return error_reply(make_error(errc::replica_unavailable, "no replica is ready"));
  }
  if (path == "/metrics" && get) {
    http_reply r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics_.render();
    return r;
  }
  const bool known = path == "/v1/models" || path == "/v1/completions" || path == "/v1/chat/completions";
  if (!known && !(path == "/health" || path == "/ready" || path == "/metrics")) {
    return error_reply(make_error(errc::not_found, "no route for " + std::string(method) + " " + std::string(path)));
  }
  if (path.starts_with("/v1/") && !authorized(authorization)) {
    return error_reply(make_error(errc::unauthorized, "missing or wrong API key (send 'Authorization: Bearer KEY')"));
  }
  if (path == "/v1/models" && get) return models();
  if (path == "/v1/completions" && post) return completions(body);
  if (path == "/v1/chat/completions" && post) return chat_completions(body);
  http_reply r = error_reply(make_error(errc::invalid_request, std::string(method) + " is not allowed on " + std::string(path)));
  r.status = 405;
  r.headers.emplace_back("Allow", path == "/v1/models" || !path.starts_with("/v1/") ? "GET" : "POST");
  return r;
}

http_reply api_service::models() const {
  auto data = nlohmann::ordered_json::array();
  for (const auto& m : models_) {
    data.push_back({{"id", m.name},
                    {"object", "model"},
                    {"created", created_},
                    {"owned_by", "llmesh"},
                    {"max_model_len", m.cfg.max_positions}});
  }
  nlohmann::ordered_json j = {{"object", "list"}, {"data", std::move(data)}};
  return json_reply(200, j.dump());
}

api_outcome api_service::completions(std::string_view body) {
  auto r = parse_completion_request(body, opt_.limits);
  if (!r) return error_reply(r.err());
  auto m = find(r->model);
  if (!m) return error_reply(m.err());
  std::vector<int32_t> prompt = std::move(r->prompt_ids);
  if (r->prompt_text) prompt = (*m)->tok->encode(*r->prompt_text, true);
  auto job = prepare(false, **m, std::move(prompt), r->gen);
  if (!job) return error_reply(job.err());
  return std::move(*job);
}

api_outcome api_service::chat_completions(std::string_view body) {
  auto r = parse_chat_request(body, opt_.limits);
  if (!r) return error_reply(r.err());
  auto m = find(r->model);
  if (!m) return error_reply(m.err());
  const served_model& sm = **m;
  if (!sm.chat) {
    return error_reply(make_error(errc::invalid_request, "the model '" + sm.name + "' has no chat template; use /v1/completions"));
  }
  auto text = sm.chat->render(r->messages, true);
  if (!text) return error_reply(make_error(errc::invalid_request, "chat template: " + text.err().message));
  // The template writes the special tokens itself (as HF's apply_chat_template does).
  auto job = prepare(true, sm, sm.tok->encode(*text, false), r->gen);
  if (!job) return error_reply(job.err());
  return std::move(*job);
}

result<generation_job> api_service::native_generate(std::string_view api_key, const std::string& model,
                                                    const std::optional<std::string>& prompt_text,
                                                    std::vector<int32_t> prompt_ids,
                                                    const sampling_input& sampling, generation_fields rest) {
  if (!authorized("Bearer " + std::string(api_key))) {
    return make_error(errc::unauthorized, "missing or wrong API key");
  }
  generation_fields g = std::move(rest);
  g.max_tokens = opt_.limits.max_tokens;  // unless given: until EOS or the context, bounded by the server
  g.max_tokens_given = false;
  LLMESH_TRY(apply_sampling(sampling, opt_.limits, g));
  auto found = find(model);
  if (!found) return found.take_error();
  const served_model* m = *found;
  if (mesh_.ready_replicas(model) == 0) {
    return make_error(errc::replica_unavailable, "no replica of the model '" + model + "' is ready");
  }
  if (prompt_text) prompt_ids = m->tok->encode(*prompt_text, true);
  return prepare(false, *m, std::move(prompt_ids), std::move(g));
}

result<generation_job> api_service::prepare(bool chat, const served_model& m, std::vector<int32_t> prompt,
                                            generation_fields g) {
  const model::model_config& cfg = m.cfg;
  // Sampling fields left out take the model's recommended values (generation_config.json).
  if (!g.temperature_given && cfg.sampling.temperature) g.temperature = *cfg.sampling.temperature;
  if (!g.top_p_given && cfg.sampling.top_p) g.top_p = *cfg.sampling.top_p;
  if (!g.top_k_given && cfg.sampling.top_k) g.top_k = *cfg.sampling.top_k;
  if (prompt.empty()) return (make_error(errc::invalid_request, "the prompt is empty"));
  for (int32_t t : prompt) {
    if (t < 0 || static_cast<size_t>(t) >= cfg.vocab) {
      return (make_error(errc::invalid_request, "prompt token id " + std::to_string(t) +
                                                               " is outside the vocabulary of " + std::to_string(cfg.vocab)));
    }
  }
  for (const auto& [t, bias] : g.logit_bias) {  // the parser checked the form and the range
    if (static_cast<size_t>(t) >= cfg.vocab) {
      return make_error(errc::invalid_request, "'logit_bias' holds token " + std::to_string(t) +
                                                   ", outside the vocabulary of " + std::to_string(cfg.vocab));
    }
  }
  for (int32_t t : g.stop_token_ids) {  // the parser checked type, sign and count
    if (static_cast<size_t>(t) >= cfg.vocab) {
      return make_error(errc::invalid_request, "'stop_token_ids' holds " + std::to_string(t) +
                                                   ", outside the vocabulary of " + std::to_string(cfg.vocab));
    }
  }
  const size_t ctx = cfg.max_positions;
  if (prompt.size() >= ctx) {
    return (make_error(errc::invalid_request, "the prompt has " + std::to_string(prompt.size()) +
                                                             " tokens; this model's context is " + std::to_string(ctx)));
  }
  size_t max_tokens = g.max_tokens;
  if (!g.max_tokens_given) {
    max_tokens = std::min(max_tokens, ctx - prompt.size());
  } else if (prompt.size() + max_tokens > ctx) {
    return (make_error(errc::invalid_request,
                                  "the prompt (" + std::to_string(prompt.size()) + " tokens) plus max_tokens (" +
                                      std::to_string(max_tokens) + ") exceeds this model's context of " + std::to_string(ctx)));
  }
  // vLLM's rule against the effective max_tokens: the parser checked the one it knew; without
  // one given, the context may leave fewer tokens than that.
  if (static_cast<size_t>(g.min_tokens) > max_tokens) {
    return make_error(errc::invalid_request,
                      "'min_tokens' (" + std::to_string(g.min_tokens) + ") must be at most the " +
                          std::to_string(max_tokens) + " tokens this model's context of " + std::to_string(ctx) +
                          " leaves after the prompt (" + std::to_string(prompt.size()) + " tokens)");
  }
  // The concurrency slot: taken here, released when the job (and its connection's use of it) ends.
  if (inflight_->fetch_add(1) >= opt_.max_concurrent) {
    inflight_->fetch_sub(1);
    return (make_error(errc::overloaded, "the server is at its limit of " +
                                                        std::to_string(opt_.max_concurrent) + " concurrent requests; retry shortly"));
  }
  metrics_.get_gauge(actors::metric::gateway_inflight)->set(static_cast<double>(inflight_->load()));
  auto counter = inflight_;
  auto* gauge = metrics_.get_gauge(actors::metric::gateway_inflight);
  std::shared_ptr<void> slot(nullptr, [counter, gauge](void*) { gauge->set(static_cast<double>(counter->fetch_sub(1) - 1)); });

  const uint64_t id = next_id_.fetch_add(1);
  generation_job job;
  job.streaming = g.stream;
  job.slot = std::move(slot);
  job.req.id = id;
  job.req.max_tokens = max_tokens;
  job.req.sampling.temperature = g.temperature;
  job.req.sampling.top_p = g.top_p;
  job.req.sampling.top_k = g.top_k;
  job.req.sampling.min_p = g.min_p;
  job.req.sampling.seed = g.seed ? *g.seed : mix(seed_base_ ^ id);
  job.req.sampling.logprobs = g.logprobs;  // the parser bounded it by kernels::max_logprobs
  job.req.sampling.presence_penalty = g.presence_penalty;  // the parser checked their ranges
  job.req.sampling.frequency_penalty = g.frequency_penalty;
  job.req.sampling.repetition_penalty = g.repetition_penalty;
  job.req.sampling.min_tokens = g.min_tokens;
  // The request's stop ids end it as an EOS id does (finish "stop"), and hold with ignore_eos
  // too: vLLM's ignore_eos drops only the model's EOS, never the stop_token_ids asked for.
  if (!g.ignore_eos) job.req.eos_ids = cfg.eos_ids;
  for (int32_t t : g.stop_token_ids) {
    if (std::find(job.req.eos_ids.begin(), job.req.eos_ids.end(), t) == job.req.eos_ids.end()) {
      job.req.eos_ids.push_back(t);
    }
  }

  stream_setup s;
  s.chat = chat;
  s.streaming = g.stream;
  s.include_usage = g.include_usage;
  s.return_token_ids = g.return_token_ids;
  char idbuf[32];
  std::snprintf(idbuf, sizeof idbuf, "%016llx", static_cast<unsigned long long>(mix(seed_base_ + id)));
  s.id = std::string(chat ? "chatcmpl-" : "cmpl-") + idbuf;
  s.created = unix_now();
  s.model = m.name;
  s.prompt_ids = prompt;
  s.stop = g.stop;
  s.stop_token_ids = g.stop_token_ids;
  s.logprobs = g.logprobs;
  s.min_tokens = g.min_tokens;
  job.req.prompt = std::move(prompt);
  job.req.model = m.name;
  for (const auto& [t, bias] : g.logit_bias) job.req.logit_bias.push_back({t, bias});
  job.tok = m.tok;
  job.stream = std::make_unique<completion_stream>(std::move(s), m.tok->decoder(), &metrics_);
  return job;
}

}  // namespace llmesh::gateway
