// The HTTP API's policies (api_service.hpp).
#include "llmesh/gateway/api_service.hpp"

#include "request_log.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include "llmesh/actors/serving_metrics.hpp"
#include "llmesh/gateway/metrics_endpoint.hpp"
#include "llmesh/gateway/background_runs.hpp"
#include "llmesh/gateway/version.hpp"
#include "prompt_truncation.hpp"

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

/// SplitMix64's increment (2^64 / the golden ratio) and output mix (see choice_seed).
constexpr uint64_t golden_gamma = 0x9e3779b97f4a7c15ull;
uint64_t splitmix_finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// splitmix64: a seedless request's seed from a per-process random base and its id.
uint64_t mix(uint64_t x) { return splitmix_finalize(x + golden_gamma); }

/// A serving gauge of `r` (the serving families declared first).
actors::metrics_registry::gauge* serving_gauge(actors::metrics_registry& r, const char* name) {
  actors::metric::declare_serving(r);
  return r.get_gauge(name);
}

/// "prompt[i]: " ahead of a prompt's error in a batch (a single prompt's error stands alone).
error about_prompt(error e, size_t i, size_t prompts) {
  if (prompts > 1) e.message = "prompt[" + std::to_string(i) + "]: " + e.message;
  return e;
}

}  // namespace

/// `base`'s entry under another name, without the names and adapters only `base` answers for
/// (an adapter's or an alias's entry starts so).
served_model named_copy(const served_model& base, const std::string& name) {
  served_model a = base;
  a.loras.clear();
  a.aliases.clear();
  a.unlisted_aliases.clear();
  a.name = name;
  return a;
}

uint64_t choice_seed(uint64_t request_seed, size_t j) {
  return j == 0 ? request_seed : splitmix_finalize(request_seed + static_cast<uint64_t>(j) * golden_gamma);
}

api_service::api_service(api_options opt, std::vector<served_model> models, actors::mesh_client& mesh,
                         actors::metrics_registry& metrics)
    : opt_(std::move(opt)),
      mesh_(mesh),
      metrics_(metrics),
      store_(std::make_shared<response_store>(opt_.max_stored_responses, opt_.max_stored_response_bytes)),
      conversations_(std::make_shared<json_store>(opt_.max_conversations, opt_.max_conversation_bytes)),
      seed_base_((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()),
      seedless_base_(opt_.seed ? mix(*opt_.seed ^ 0x5eedull) : seed_base_),
      created_(unix_now()),
      runs_(std::make_unique<background_runs>(mesh, background_limits{}, serving_gauge(metrics, actors::metric::background_running))) {
  actors::metric::declare_serving(metrics_);
  // Each LoRA adapter answers as a model of its own: the base model's entry under its name.
  std::vector<served_model> adapters;
  for (const auto& m : models) {
    for (const auto& l : m.loras) adapters.push_back(adapter_entry(m, l));
  }
  for (auto& a : adapters) models.push_back(std::move(a));
  // Each further name of a model answers as the model itself (its adapters keep their own names).
  std::vector<served_model> names;
  for (const auto& m : models) {
    for (const auto* list : {&m.aliases, &m.unlisted_aliases}) {
      for (const auto& alias : *list) {
        served_model a = named_copy(m, alias);
        a.alias_of = m.name;
        a.listed = list == &m.aliases;
        names.push_back(std::move(a));
      }
    }
  }
  for (auto& a : names) models.push_back(std::move(a));
  for (auto& m : models) models_.push_back(std::make_shared<const served_model>(std::move(m)));
  // The stores' sizes, read at each scrape (weak: a scrape after the service is gone reads none).
  metrics_.add_collector([&m = metrics_, store = std::weak_ptr<response_store>(store_),
                          convs = std::weak_ptr<json_store>(conversations_)] {
    if (auto s = store.lock()) {
      m.get_gauge(actors::metric::stored_responses)->set(static_cast<double>(s->size()));
      m.get_gauge(actors::metric::stored_response_bytes)->set(static_cast<double>(s->bytes()));
    }
    if (auto c = convs.lock()) {
      m.get_gauge(actors::metric::conversations)->set(static_cast<double>(c->size()));
      m.get_gauge(actors::metric::conversation_bytes)->set(static_cast<double>(c->bytes()));
    }
  });
}

api_service::~api_service() = default;

void api_service::close_background() { runs_->close(); }

uint64_t api_service::mix_id(uint64_t n) const { return mix(seed_base_ + n); }

api_service::api_service(api_options opt, std::shared_ptr<const model::tokenizer> tok,
                         std::optional<model::chat_template> chat, model::model_config cfg, actors::mesh_client& mesh,
                         actors::metrics_registry& metrics)
    : api_service(opt, {served_model{opt.model_name, std::move(tok), std::move(chat), std::move(cfg)}}, mesh, metrics) {}

served_model api_service::adapter_entry(const served_model& base, const model::lora_source& l) {
  served_model a = named_copy(base, l.name);
  a.parent = base.name;
  a.lora = l.name;
  a.root = l.path;
  return a;
}

std::vector<std::shared_ptr<const served_model>> api_service::served() const {
  std::shared_lock lock(models_mu_);
  return models_;
}

std::vector<std::string> api_service::model_names() const {
  std::vector<std::string> out;
  for (const auto& m : served()) {
    if (m->listed) out.push_back(m->name);
  }
  return out;
}

result<std::shared_ptr<const served_model>> api_service::find(const std::string& name) const {
  const auto all = served();
  for (const auto& m : all) {
    if (m->name == name) return m;
  }
  std::string names;
  for (const auto& m : all) names += (names.empty() ? "'" : ", '") + m->name + "'";
  return make_error(errc::not_found, "the model '" + name + "' does not exist; this server serves " + names);
}

bool api_service::authorized(std::string_view authorization) const {
  if (opt_.api_key.empty()) return true;
  constexpr std::string_view bearer = "Bearer ";
  if (!authorization.starts_with(bearer)) return false;
  return same_secret(authorization.substr(bearer.size()), opt_.api_key);
}

api_outcome api_service::handle(std::string_view method, std::string_view target, std::string_view authorization,
                                std::string_view body) {
  std::string_view path = target.substr(0, target.find('?'));
  if (!opt_.root_path.empty() && path.starts_with(opt_.root_path) && path.size() > opt_.root_path.size() &&
      path[opt_.root_path.size()] == '/') {
    path.remove_prefix(opt_.root_path.size());
    target.remove_prefix(opt_.root_path.size());
  }
  const bool get = method == "GET", post = method == "POST";
  if (path == "/health" && get) return json_reply(200, R"({"status":"ok"})");
  if (path == "/version" && get) return json_reply(200, nlohmann::json{{"version", version()}}.dump());  // vLLM's
  if (path == "/ready" && get) {
    if (mesh_.ready_replicas() > 0) return json_reply(200, R"({"status":"ready"})");
    return error_reply(make_error(errc::replica_unavailable, "no replica is ready"));
  }
  if (path == "/metrics" && get) return metrics_reply(metrics_);
  if (path == "/ping" && (get || post)) return json_reply(200, R"({"status":"ok"})");  // vLLM's (SageMaker's health)
  // vLLM's /load: requests in flight (vLLM counts them with --enable-server-load-tracking; here always).
  if (path == "/load" && get) return json_reply(200, nlohmann::json{{"server_load", inflight()}}.dump());
  // vLLM's tokenizer and pooling routes sit outside /v1 too; the API key guards them (they cost work).
  const bool tokenizer_route = path == "/tokenize" || path == "/detokenize";
  // vLLM's pooling routes, with and without /v1 (and Cohere's /v2/rerank).
  const bool score_route = path == "/score" || path == "/v1/score";
  const bool rerank_route = path == "/rerank" || path == "/v1/rerank" || path == "/v2/rerank";
  const bool classify_route = path == "/classify";  // vLLM's, for sequence classifiers
  const bool pooling_route = path == "/pooling";    // vLLM's generic pooling
  const bool invocations = path == "/invocations";  // vLLM's SageMaker route: the request's shape picks the API
  const bool cache_route = path == "/reset_prefix_cache" || path == "/flush_cache";  // vLLM's, SGLang's
  const bool guarded_route =
      path.starts_with("/v1/") || tokenizer_route || score_route || rerank_route || classify_route || pooling_route ||
      invocations || cache_route;  // the API key's
  const bool stored_route = path.starts_with("/v1/responses/");  // a stored response's routes
  const bool conversation_route = path == "/v1/conversations" || path.starts_with("/v1/conversations/");
  const bool model_route = path.starts_with("/v1/models/") && path.size() > std::string_view("/v1/models/").size();
  const bool lora_route = path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter";
  if (path == "/v1/messages" || path == "/v1/messages/count_tokens") return messages_route(method, path, authorization, body);
  const bool known = lora_route || path == "/v1/models" || path == "/v1/completions" || path == "/v1/chat/completions" ||
                     path == "/v1/responses" || path == "/v1/embeddings" || score_route || rerank_route || stored_route ||
                     conversation_route || model_route || tokenizer_route || classify_route || pooling_route ||
                     invocations || cache_route;
  if (!known && !(path == "/health" || path == "/ready" || path == "/metrics" || path == "/version" || path == "/ping" ||
                  path == "/load")) {
    return error_reply(make_error(errc::not_found, "no route for " + std::string(method) + " " + std::string(path)));
  }
  if (guarded_route && !authorized(authorization)) {
    return error_reply(make_error(errc::unauthorized, "missing or wrong API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')"));
  }
  if (path == "/v1/models" && get) return models();
  if (model_route && get) return model(path.substr(std::string_view("/v1/models/").size()));
  if (path == "/v1/completions" && post) return completions(body);
  if (path == "/v1/chat/completions" && post) return chat_completions(body);
  if (path == "/v1/responses" && post) return responses(body);
  if (path == "/v1/embeddings" && post) return embeddings(body);
  if (score_route && post) return score(body);
  if (rerank_route && post) return rerank(body);
  if (classify_route && post) return classify(body);
  if (pooling_route && post) return pooling(body);
  if (stored_route) return stored_responses(method, path.substr(std::string_view("/v1/responses/").size()),
                                            target.size() > path.size() ? target.substr(path.size() + 1) : std::string_view());
  if (conversation_route) {
    return conversations(method, path.substr(std::string_view("/v1/conversations").size()),
                         target.size() > path.size() ? target.substr(path.size() + 1) : std::string_view(), body);
  }
  if (path == "/v1/load_lora_adapter" && post) return load_lora_adapter(body);
  if (path == "/v1/unload_lora_adapter" && post) return unload_lora_adapter(body);
  if (invocations && post) return invoke(body);
  if (path == "/tokenize" && post) return tokenize(body);
  if (path == "/detokenize" && post) return detokenize(body);
  if (cache_route && (post || (get && path == "/flush_cache"))) {  // SGLang takes either
    auto told = mesh_.reset_prefix_cache();
    if (!told) return error_reply(told.err());
    return json_reply(200, nlohmann::json{{"status", "ok"}, {"replicas", *told}}.dump());
  }
  http_reply r = error_reply(make_error(errc::invalid_request, std::string(method) + " is not allowed on " + std::string(path)));
  r.status = 405;
  const bool get_route = path == "/v1/models" || model_route || !guarded_route;
  r.headers.emplace_back("Allow", path == "/ping" || path == "/flush_cache" ? "GET, POST" : get_route ? "GET" : "POST");
  return r;
}

nlohmann::ordered_json api_service::model_card(const served_model& m) const {
  nlohmann::ordered_json card = {
      {"id", m.name}, {"object", "model"}, {"created", created_}, {"owned_by", "llmesh"}, {"max_model_len", m.cfg.max_positions}};
  if (!m.parent.empty()) {  // vLLM lists an adapter with its directory as root and the base model as parent
    card["root"] = m.root;
    card["parent"] = m.parent;
  }
  return card;
}

nlohmann::ordered_json api_service::template_messages(const nlohmann::ordered_json& messages) const {
  if (!opt_.content_as_parts) return messages;
  auto out = messages;  // vLLM's "openai" content format: a string content becomes one text part
  for (auto& m : out) {
    if (m.is_object() && m.contains("content") && m["content"].is_string()) {
      m["content"] = nlohmann::ordered_json::array({{{"type", "text"}, {"text", m["content"]}}});
    }
  }
  return out;
}

void api_service::log_outputs(const completion_group& out) const {
  for (size_t i = 0; i < out.size(); ++i) {
    const completion_stream& c = out.choice(i);
    std::fprintf(stderr, "%s\n", output_line(out.id(), i, c.finish_reason(), c.token_ids(), c.text()).c_str());
  }
}

std::string api_service::output_line(const std::string& id, size_t index, const std::string& finish,
                                     const std::vector<int32_t>& ids, const std::string& text) const {
  return output_log_line(id, index, finish, ids, text, opt_.max_log_len);
}

api_outcome api_service::invoke(std::string_view body) {
  // vLLM tries its request types in order (chat, completion, embedding, ..., score, rerank) and
  // takes the first the body validates as; the fields that tell them apart decide here, and
  // that endpoint's checks then answer as they would on its own route.
  const auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    if (j.contains("messages")) return chat_completions(body);
    if (j.contains("prompt")) return completions(body);
    if (j.contains("input")) {  // a classifier's input is classified (its embeddings are refused)
      const auto model = j.find("model");
      const bool classifier = classifier_of(model != j.end() && model->is_string() ? model->get<std::string>() : "") != nullptr;
      return classifier ? classify(body) : embeddings(body);
    }
    if (j.contains("text_1")) return score(body);
    if (j.contains("query") && j.contains("documents")) return rerank(body);
  }
  return error_reply(make_error(errc::invalid_request,
                                "/invocations: cannot tell the request's kind: a chat completion has 'messages', a completion "
                                "'prompt', an embedding or classification 'input', a score 'text_1' and 'text_2', a rerank 'query' and 'documents'"));
}

http_reply api_service::models() const {
  auto data = nlohmann::ordered_json::array();
  for (const auto& m : served()) {
    if (m->listed) data.push_back(model_card(*m));
  }
  nlohmann::ordered_json j = {{"object", "list"}, {"data", std::move(data)}};
  return json_reply(200, j.dump());
}

http_reply api_service::model(std::string_view name) const {
  auto m = find(std::string(name));
  if (!m) return error_reply(m.err());
  return json_reply(200, model_card(**m).dump());
}

namespace detail {

status check_truncation(int64_t k, size_t context) {
  if (k > 0 && static_cast<size_t>(k) > context) {
    return make_error(errc::invalid_request, "'truncate_prompt_tokens' (" + std::to_string(k) +
                                                 ") is more than this model's context of " + std::to_string(context));
  }
  return ok_status();
}

bool truncate_prompt(std::vector<int32_t>& ids, int64_t k, size_t context) {
  if (k == 0) return false;
  const size_t keep = k < 0 ? context : static_cast<size_t>(k);
  if (ids.size() <= keep) return false;
  ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(keep));
  return true;
}

}  // namespace detail

using detail::check_truncation;
using detail::truncate_prompt;

std::vector<std::vector<int32_t>> bad_word_ids(const model::tokenizer& tok, const std::vector<std::string>& words) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& w : words) {
    const size_t first = w.find_first_not_of(" \t\n\r\f\v");
    if (first == std::string::npos) continue;  // only spaces: no word to ban
    const std::string bare = w.substr(first);
    auto plain = tok.encode(bare, false);
    if (plain.empty()) continue;
    // After a space the word may start with another token (a word in mid-text); vLLM bans that
    // form too when it has as many tokens.
    auto spaced = tok.encode(" " + bare, false);
    const bool other = !spaced.empty() && spaced.front() != plain.front() && spaced.size() == plain.size();
    out.push_back(std::move(plain));
    if (other) out.push_back(std::move(spaced));
  }
  return out;
}

api_outcome api_service::completions(std::string_view body) {
  auto r = parse_completion_request(body, opt_.limits);
  if (!r) return error_reply(r.err());
  auto m = find(r->model);
  if (!m) return error_reply(m.err());
  const model::tokenizer& tok = *(*m)->tok;
  if (auto s = check_truncation(r->gen.truncate_prompt_tokens, (*m)->cfg.max_positions); !s) return error_reply(s.err());
  std::vector<prepared_prompt> prompts;
  for (auto& p : r->prompts) {
    prepared_prompt q;
    if (p.text) {
      q.ids = tok.encode(*p.text, r->add_special_tokens);
      if (r->echo) q.echo = *p.text;  // the string as sent (vLLM's echo)
    } else {
      q.ids = std::move(p.ids);
      // vLLM decodes an id prompt for echo with HF's tokenizer.decode defaults: special tokens
      // keep their text (a client sending BOS gets it back), unlike the output's decode.
      if (r->echo) q.echo = tok.decoder().decode(q.ids, /*skip_special=*/false);
    }
    // A truncated prompt echoes what the model saw: its kept tokens' text.
    if (truncate_prompt(q.ids, r->gen.truncate_prompt_tokens, (*m)->cfg.max_positions) && r->echo) {
      q.echo = tok.decoder().decode(q.ids, /*skip_special=*/false);
    }
    prompts.push_back(std::move(q));
  }
  auto job = prepare(false, **m, std::move(prompts), r->gen);
  if (!job) return error_reply(job.err());
  return std::move(*job);
}


result<std::pair<std::string, std::vector<int32_t>>> api_service::chat_prompt(const chat_request& r, const served_model& sm) const {
  auto extra = r.template_kwargs;  // chat_template_kwargs, then the request's tools
  if (!r.tools.tools.empty()) extra["tools"] = r.tools.tools;
  const auto messages = template_messages(r.messages);
  auto text = r.continue_final_message ? sm.chat->render_continuing(messages, extra)
                                       : sm.chat->render(messages, r.add_generation_prompt, extra);
  if (!text) return make_error(errc::invalid_request, "chat template: " + text.err().message);
  // The template writes the special tokens itself (as HF's apply_chat_template does).
  auto ids = sm.tok->encode(*text, r.add_special_tokens);
  truncate_prompt(ids, r.gen.truncate_prompt_tokens, sm.cfg.max_positions);
  return std::pair{std::move(*text), std::move(ids)};
}

api_outcome api_service::chat_completions(std::string_view body, const responses_job* responses, bool as_messages) {
  auto r = parse_chat_request(body, opt_.limits);
  if (!r && responses) {
    // The chat fields' names in the message are the Responses API's.
    std::string msg = r.err().message;
    for (auto [from, to] : {std::pair<std::string_view, std::string_view>{"'max_completion_tokens'", "'max_output_tokens'"},
                            {"'messages'", "'input'"},
                            {"'response_format'", "'text.format'"}}) {
      for (size_t at; (at = msg.find(from)) != std::string::npos;) msg.replace(at, from.size(), to);
    }
    return error_reply(make_error(r.err().code, msg));
  }
  if (!r) return error_reply(r.err());
  auto m = find(r->model);
  if (!m) return error_reply(m.err());
  const served_model& sm = **m;
  if (!sm.chat) {
    return error_reply(make_error(errc::invalid_request, "the model '" + sm.name + "' has no chat template; use /v1/completions"));
  }
  // The tools go to the template as HF's apply_chat_template passes them: `tools`, the list as
  // sent (left undefined without tools, as before them).
  if (auto s = check_truncation(r->gen.truncate_prompt_tokens, sm.cfg.max_positions); !s) return error_reply(s.err());
  auto prompt = chat_prompt(*r, sm);
  if (!prompt) return error_reply(prompt.err());
  auto& [text, ids] = *prompt;
  // GPT-OSS writes OpenAI's harmony format: its channels split as vLLM's harmony path splits
  // them, asked for or not (reasoning.hpp, harmony.hpp).
  const bool harmony = sm.reasoning == reasoning_parser::openai_gptoss ||
                       (sm.reasoning == reasoning_parser::none &&
                        (sm.cfg.arch == model::architecture::gpt_oss || sm.tool_parser == tool_call_parser::openai));
  tool_output shape{r->tools.mode, r->tools.name, harmony ? tool_call_parser::openai : sm.tool_parser,
                    r->tools.tools.empty() ? nullptr : std::make_shared<const nlohmann::ordered_json>(r->tools.tools)};
  // The model's reasoning parser splits the thinking off. A structured output or a forced tool
  // call then holds for the answer, after "</think>" (unless the prompt closed the block).
  reasoning_mode reasoning;
  if (harmony) {
    if (r->tools.mode == tool_choice_mode::named || r->tools.mode == tool_choice_mode::required) {
      return error_reply(make_error(errc::invalid_request, "tool_choice \"required\" and a named tool_choice are not supported for "
                                                           "the model '" + sm.name + "' (OpenAI's harmony format): use \"auto\""));
    }
    reasoning.parser = reasoning_parser::openai_gptoss;
    reasoning.include = r->include_reasoning;
    reasoning.harmony_calls = r->tools.mode == tool_choice_mode::automatic;
    // A structured output holds for the final channel's message.
    if (r->gen.constraint.type != model::constraint_spec::kind::none) {
      r->gen.constraint_after = sm.tok->encode(std::string(harmony_final_header()), false);
    }
  } else if (sm.reasoning != reasoning_parser::none) {
    // Opened by the template's generation prompt, or by the message being continued; closed
    // by the prompt (thinking turned off), or by a continued message outside a block.
    bool opened = prompt_opens_reasoning(text), closed = prompt_closes_reasoning(text);
    if (r->continue_final_message) {
      const auto& last = r->messages.back();
      opened = last.contains("content") && last["content"].is_string() &&
               leaves_reasoning_open(last["content"].get_ref<const std::string&>());
      closed = !opened;
    }
    reasoning = {sm.reasoning, opened, r->include_reasoning, closed};
    const auto open_ids = sm.tok->encode(std::string(reasoning_start_tag()), false);
    const auto close_ids = sm.tok->encode(std::string(reasoning_end_tag()), false);
    if (open_ids.size() == 1 && close_ids.size() == 1) {  // (check_reasoning_tokens made sure at startup)
      reasoning.open_id = open_ids[0];
      reasoning.close_id = close_ids[0];
    }
    // An output that may think first is constrained after it; one that answers at once, at once.
    if (r->gen.constraint.type != model::constraint_spec::kind::none && !closed) {
      r->gen.constraint_after = sm.tok->encode(std::string(reasoning_end_tag()), false);
    }
  }
  // vLLM's get_chat_request_role: the server's role after a generation prompt, else the role of
  // the last message (the one continued); a message without a string role keeps the server's.
  std::string role = opt_.response_role;
  if (!r->add_generation_prompt && !r->messages.empty() && r->messages.back().contains("role") &&
      r->messages.back()["role"].is_string()) {
    role = r->messages.back()["role"].get<std::string>();
  }
  auto job = prepare(true, sm, {prepared_prompt{std::move(ids), {}}}, r->gen, shape, reasoning, role);
  if (!job) return error_reply(job.err());
  if (responses) job->output->render_as_responses(responses_output(*responses, job->output->id(), job->output->created(), sm.name));
  if (as_messages) job->output->render_as_messages(std::make_unique<messages_renderer>(job->output->id(), sm.name));
  return std::move(*job);
}

result<generation_job> api_service::native_generate(std::string_view api_key, const std::string& model,
                                                    const std::optional<std::string>& prompt_text,
                                                    std::vector<int32_t> prompt_ids,
                                                    const sampling_input& sampling, generation_fields rest,
                                                    const result<nlohmann::ordered_json>& extra,
                                                    bool add_special_tokens) {
  if (!authorized("Bearer " + std::string(api_key))) {
    return make_error(errc::unauthorized, "missing or wrong API key");
  }
  generation_fields g = std::move(rest);
  if (g.n < 1 || g.n > opt_.limits.max_choices) {
    return make_error(errc::invalid_request, "'n' must be between 1 and " + std::to_string(opt_.limits.max_choices));
  }
  g.best_of = 1;
  g.max_tokens = opt_.limits.max_tokens;  // unless given: until EOS or the context, bounded by the server
  g.max_tokens_given = false;
  LLMESH_TRY(apply_sampling(sampling, opt_.limits, g));
  if (!extra) return extra.err();
  if (!extra->is_null()) LLMESH_TRY(apply_extra_fields(*extra, opt_.limits, g));
  auto found = find(model);
  if (!found) return found.take_error();
  const std::shared_ptr<const served_model> m = *found;
  if (mesh_.ready_replicas(m->route_name()) == 0) {
    return make_error(errc::replica_unavailable, "no replica of the model '" + model + "' is ready");
  }
  LLMESH_TRY(check_truncation(g.truncate_prompt_tokens, m->cfg.max_positions));
  if (prompt_text) prompt_ids = m->tok->encode(*prompt_text, add_special_tokens);
  truncate_prompt(prompt_ids, g.truncate_prompt_tokens, m->cfg.max_positions);
  return prepare(false, *m, {prepared_prompt{std::move(prompt_ids), {}}}, std::move(g));
}

result<size_t> api_service::check_prompt(const model::model_config& cfg, const std::vector<int32_t>& prompt,
                                         const generation_fields& g) {
  if (prompt.empty()) return make_error(errc::invalid_request, "the prompt is empty");
  for (int32_t t : prompt) {
    if (t < 0 || static_cast<size_t>(t) >= cfg.vocab) {
      return make_error(errc::invalid_request, "prompt token id " + std::to_string(t) +
                                                   " is outside the vocabulary of " + std::to_string(cfg.vocab));
    }
  }
  const size_t ctx = cfg.max_positions;
  if (prompt.size() >= ctx) {
    return make_error(errc::invalid_request, "the prompt has " + std::to_string(prompt.size()) +
                                                 " tokens; this model's context is " + std::to_string(ctx));
  }
  size_t max_tokens = g.max_tokens;
  if (!g.max_tokens_given) {
    max_tokens = std::min(max_tokens, ctx - prompt.size());
  } else if (prompt.size() + max_tokens > ctx) {
    return make_error(errc::invalid_request,
                      "the prompt (" + std::to_string(prompt.size()) + " tokens) plus max_tokens (" +
                          std::to_string(max_tokens) + ") exceeds this model's context of " + std::to_string(ctx));
  }
  // vLLM's rule against the effective max_tokens: the parser checked the one it knew; without
  // one given, the context may leave fewer tokens than that.
  if (static_cast<size_t>(g.min_tokens) > max_tokens) {
    return make_error(errc::invalid_request,
                      "'min_tokens' (" + std::to_string(g.min_tokens) + ") must be at most the " +
                          std::to_string(max_tokens) + " tokens this model's context of " + std::to_string(ctx) +
                          " leaves after the prompt (" + std::to_string(prompt.size()) + " tokens)");
  }
  return max_tokens;
}

result<std::shared_ptr<void>> api_service::take_slots(size_t k) {
  // A request that could never fit is not told to retry.
  if (k > opt_.max_concurrent) {
    return make_error(errc::invalid_request, "the request asks for " + std::to_string(k) +
                                                 " choices; this server runs at most " +
                                                 std::to_string(opt_.max_concurrent) + " generations at once");
  }
  // All of the request's slots or none: a request never runs some of its choices.
  if (inflight_->fetch_add(k) + k > opt_.max_concurrent) {
    inflight_->fetch_sub(k);
    std::string msg = "the server is at its limit of " + std::to_string(opt_.max_concurrent) + " concurrent requests";
    if (k > 1) msg += " (this request's " + std::to_string(k) + " choices need as many)";
    return make_error(errc::overloaded, msg + "; retry shortly");
  }
  auto* gauge = metrics_.get_gauge(actors::metric::gateway_inflight);
  gauge->set(static_cast<double>(inflight_->load()));
  auto counter = inflight_;
  return std::shared_ptr<void>(nullptr, [counter, gauge, k](void*) {
    gauge->set(static_cast<double>(counter->fetch_sub(k) - k));
  });
}

result<generation_job> api_service::prepare(bool chat, const served_model& m, std::vector<prepared_prompt> prompts,
                                            generation_fields g, const tool_output& tools,
                                            const reasoning_mode& reasoning, const std::string& role) {
  if (g.priority != 0 && !opt_.priority_scheduling) {
    return make_error(errc::invalid_request, "'priority' needs the priority scheduling policy (--scheduling-policy "
                                             "priority); this server serves requests first come, first served");
  }
  if (m.cfg.classifier.labels > 0) {
    return make_error(errc::invalid_request, "the model '" + m.name + (m.cfg.classifier.reward
                                                                          ? "' is a reward model: it serves /pooling and /classify, "
                                                                            "not generation"
                                                                          : "' is a sequence classifier: it serves /classify, "
                                                                            "/score, /rerank and /pooling, not generation"));
  }
  if (!m.cfg.has_lm_head) {
    return make_error(errc::invalid_request, "the model '" + m.name + "' has no LM head (a bare transformer's checkpoint, "
                                             "as embedding models ship): it serves /v1/embeddings only");
  }
  const model::model_config& cfg = m.cfg;
  // Sampling fields left out take the model's recommended values (generation_config.json).
  if (!g.temperature_given && cfg.sampling.temperature) g.temperature = *cfg.sampling.temperature;
  if (!g.top_p_given && cfg.sampling.top_p) g.top_p = *cfg.sampling.top_p;
  if (!g.top_k_given && cfg.sampling.top_k) g.top_k = *cfg.sampling.top_k;
  std::vector<size_t> max_tokens;  // per prompt: without max_tokens given, what its context leaves
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto mt = check_prompt(cfg, prompts[i].ids, g);
    if (!mt) return about_prompt(mt.take_error(), i, prompts.size());
    max_tokens.push_back(*mt);
  }
  for (const auto& [t, bias] : g.logit_bias) {  // the parser checked the form and the range
    if (static_cast<size_t>(t) >= cfg.vocab) {
      return make_error(errc::invalid_request, "'logit_bias' holds token " + std::to_string(t) +
                                                   ", outside the vocabulary of " + std::to_string(cfg.vocab));
    }
  }
  for (int32_t t : g.allowed_ids) {  // the parser checked type, sign and count
    if (static_cast<size_t>(t) >= cfg.vocab) {
      return make_error(errc::invalid_request, "'allowed_token_ids' holds " + std::to_string(t) +
                                                   ", outside the vocabulary of " + std::to_string(cfg.vocab));
    }
  }
  if (!g.allowed_ids.empty() && g.constraint.type != model::constraint_spec::kind::none) {
    return make_error(errc::invalid_request, "'allowed_token_ids' cannot be combined with a structured output or a forced tool call");
  }
  for (int32_t t : g.stop_token_ids) {  // the parser checked type, sign and count
    if (static_cast<size_t>(t) >= cfg.vocab) {
      return make_error(errc::invalid_request, "'stop_token_ids' holds " + std::to_string(t) +
                                                   ", outside the vocabulary of " + std::to_string(cfg.vocab));
    }
  }
  const size_t n = std::max<size_t>(g.n, 1), per_prompt = g.candidates();  // best_of's candidates, or n
  const size_t n_choices = prompts.size() * per_prompt;  // the parser bounded it by max_choices
  // The concurrency slots: taken here, released when the job (and its connection's use of it) ends.
  auto slot = take_slots(n_choices);
  if (!slot) return slot.take_error();

  // Contiguous ids, choice k's the first + k; the first names the response and seeds a
  // seedless request exactly as a single-choice request's id did.
  const uint64_t first = next_id_.fetch_add(n_choices);
  const uint64_t request_seed = g.seed ? *g.seed : mix(seedless_base_ ^ first);
  generation_job job;
  job.streaming = g.stream;
  job.slot = std::move(*slot);
  metrics_.get_counter(actors::metric::model_requests, {m.name})->add();
  job.tok = m.tok;

  // What every choice's mesh request and stream share.
  actors::replica_request base;
  base.model = m.route_name();
  base.lora = m.lora;
  base.sampling.temperature = g.temperature;
  base.sampling.top_p = g.top_p;
  base.sampling.top_k = g.top_k;
  base.sampling.min_p = g.min_p;
  base.sampling.logprobs = g.logprobs;  // the parser bounded it by kernels::max_logprobs
  // best_of ranks candidates by their tokens' log-probabilities: computed whether or not the
  // client asked to see them (the streams render them only if it did).
  if (per_prompt > n) base.sampling.logprobs = std::max(g.logprobs, 0);
  // Echo with logprobs or vLLM's prompt_logprobs: the engine scores the prompt, as deep as either asks.
  base.sampling.prompt_logprobs = std::max(g.prompt_logprobs, g.prompt_logprobs_shown);
  base.sampling.presence_penalty = g.presence_penalty;  // the parser checked their ranges
  base.sampling.frequency_penalty = g.frequency_penalty;
  base.sampling.repetition_penalty = g.repetition_penalty;
  base.sampling.min_tokens = g.min_tokens;
  // The request's stop ids end it as an EOS id does (finish "stop"), and hold with ignore_eos
  // too: vLLM's ignore_eos drops only the model's EOS, never the stop_token_ids asked for.
  if (!g.ignore_eos) base.eos_ids = cfg.eos_ids;
  for (int32_t t : g.stop_token_ids) {
    if (std::find(base.eos_ids.begin(), base.eos_ids.end(), t) == base.eos_ids.end()) base.eos_ids.push_back(t);
  }
  for (const auto& [t, bias] : g.logit_bias) base.logit_bias.push_back({t, bias});
  base.constraint = g.constraint;  // the parser compiled it; every choice follows it
  base.allowed_ids = g.allowed_ids;
  base.bad_words = bad_word_ids(*m.tok, g.bad_words);
  base.constraint_after = g.constraint_after;
  base.priority = g.priority;
  base.cache_salt = g.cache_salt;
  base.route_key = g.route_key;
  stream_setup choice;
  choice.return_token_ids = g.return_token_ids;
  choice.stop = g.stop;
  choice.include_stop_str = g.include_stop_str;
  // Harmony's channels are special tokens: its parser reads them (and drops them).
  choice.skip_special = g.skip_special_tokens && reasoning.parser != reasoning_parser::openai_gptoss;
  choice.tokens_as_ids = g.tokens_as_ids || opt_.tokens_as_ids;
  choice.continuous_usage = g.continuous_usage;
  choice.stop_token_ids = g.stop_token_ids;
  // vLLM's stop_reason ids: the request's stop ids and the model's other end ids (vLLM folds a
  // generation config's into the stop ids), but the tokenizer's EOS (tested first: none named),
  // when that one is known (the chat template's eos_token) and ends it (not ignore_eos).
  choice.stop_reason_ids = g.stop_token_ids;
  if (!g.ignore_eos && m.chat && !m.chat->eos_token.empty()) {
    if (const auto eos = m.tok->encode(m.chat->eos_token, false); eos.size() == 1) {
      for (int32_t t : cfg.eos_ids) choice.stop_reason_ids.push_back(t);
      std::erase(choice.stop_reason_ids, eos[0]);
    }
  }
  choice.logprobs = g.logprobs;
  choice.echo_logprobs = g.prompt_logprobs >= 0;
  choice.prompt_logprobs = g.prompt_logprobs_shown;
  choice.min_tokens = g.min_tokens;
  choice.keep_text = opt_.log_outputs;
  if (chat) {
    choice.role = role;
    choice.tools = tools;
    choice.reasoning = reasoning;
    if (tools.mode == tool_choice_mode::automatic) choice.keep_special = m.tool_tokens;
  }

  group_setup gs;
  gs.chat = chat;
  gs.streaming = g.stream;
  gs.include_usage = g.include_usage || (opt_.force_include_usage && g.stream);
  char idbuf[32];
  std::snprintf(idbuf, sizeof idbuf, "%016llx", static_cast<unsigned long long>(mix(seed_base_ + first)));
  gs.id = std::string(chat ? "chatcmpl-" : "cmpl-") + idbuf;
  gs.created = unix_now();
  gs.model = m.name;
  gs.n = n;
  gs.best_of = g.best_of;
  if (opt_.log_requests) {
    for (size_t p = 0; p < prompts.size(); ++p) {
      const std::string text = m.tok->decoder().decode(prompts[p].ids, /*skip_special=*/false);
      std::fprintf(stderr, "%s\n",
                   request_log_line(gs.id, m.name, p, prompts.size(), text, prompts[p].ids, max_tokens[p], g, request_seed,
                                    opt_.max_log_len).c_str());
    }
  }
  job.output = std::make_unique<completion_group>(std::move(gs), m.tok->decoder(), &metrics_);
  // Choice `id` of prompt p: the shared setup with that prompt's ids and echo.
  auto add_choice = [&](size_t p, uint64_t id) {
    stream_setup s = choice;
    s.prompt_ids = prompts[p].ids;
    s.echo_prefix = prompts[p].echo;
    job.output->add_choice(id, std::move(s));
  };
  if (g.beam_search) {
    // One search per prompt, its n beams rendered as the prompt's choices (their ids name
    // the choices only: the searches' step requests take fresh ids as they go).
    for (size_t p = 0; p < prompts.size(); ++p) {
      beam_setup bs;
      bs.base = base;
      bs.base.prompt = prompts[p].ids;
      bs.base.max_tokens = max_tokens[p];
      bs.base.sampling.seed = request_seed;
      bs.width = n;
      bs.length_penalty = g.length_penalty;
      bs.logprobs = g.logprobs;
      bs.stop = g.stop;  // a beam whose text shows one is complete (as the choice's stream cuts it)
      bs.detok = &m.tok->decoder();
      bs.skip_special = choice.skip_special;
      bs.keep_special = choice.keep_special;
      std::vector<uint64_t> choice_ids;
      for (size_t j = 0; j < n; ++j) {
        choice_ids.push_back(first + p * n + j);
        add_choice(p, choice_ids.back());
      }
      auto search = std::make_unique<beam_search>(std::move(bs), [this] { return next_id_.fetch_add(1); });
      job.output->add_beam_search(std::move(search), std::move(choice_ids));
    }
    return job;
  }
  // Choice index prompt * n + j (vLLM's order); choice j of every prompt samples with seed S_j
  // (with best_of, candidate j: the group picks among them).
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (size_t j = 0; j < per_prompt; ++j) {
      actors::replica_request req = base;
      req.id = first + job.requests.size();
      req.prompt = prompts[p].ids;
      req.max_tokens = max_tokens[p];
      req.sampling.seed = choice_seed(request_seed, j);
      add_choice(p, req.id);
      job.requests.push_back(std::move(req));
    }
  }
  return job;
}

}  // namespace llmesh::gateway
