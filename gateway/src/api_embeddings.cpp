// The pooling endpoints on the HTTP API (api_service.hpp): OpenAI's POST /v1/embeddings,
// vLLM's /score and /rerank over embeddings or a cross-encoder, /classify and /pooling. The inputs are tokenized and checked against the
// model's context, each one an embedding request in the mesh (the served model's pooling), at
// most embedding_window of them in flight (fewer when the server's concurrency bound is lower)
// and as many concurrency slots held; embeddings_output renders the reply once every vector is
// in: the vectors, or the cosine similarities of normalized vectors (as vLLM scores with an
// embedding model).
#include <algorithm>
#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

#include "llmesh/actors/serving_metrics.hpp"
#include "llmesh/gateway/api_service.hpp"
#include "llmesh/transport/wire.hpp"
#include "prompt_truncation.hpp"

namespace llmesh::gateway {
namespace {

/// Inputs of one request in flight at once (and concurrency slots taken): enough for the
/// replicas to batch their prompts, while a 2048-input request does not fill the server alone.
constexpr size_t embedding_window = 32;

/// "input[i]: " ahead of an input's error when there are several.
error about_input(error e, size_t i, size_t inputs) {
  if (inputs > 1) e.message = "input[" + std::to_string(i) + "]: " + e.message;
  return e;
}

std::vector<prompt_input> as_inputs(const std::vector<std::string>& texts) {
  std::vector<prompt_input> out;
  out.reserve(texts.size());
  for (const auto& t : texts) out.push_back({t, {}});
  return out;
}

/// A cross-encoder's input for one pair: the tokenizer's pair template, or both texts as one
/// (vLLM's use_pad_token false: an LLM as reranker).
std::vector<int32_t> pair_ids(const served_model& m, const std::string& a, const std::string& b, bool add_special) {
  return m.cfg.classifier.use_pad_token ? m.tok->encode_pair(a, b, add_special) : m.tok->encode(a + b, add_special);
}

/// truncate_prompt_tokens would cut a pair's tokens from one end, where vLLM's tokenizer cuts
/// the longer text: refused rather than scored on a different pair.
status check_pair_truncation(int64_t truncate) {
  if (truncate == 0) return ok_status();
  return make_error(errc::invalid_request, "'truncate_prompt_tokens' is not taken for a cross-encoder's pairs; shorten the texts");
}

}  // namespace

result<generation_job> api_service::pooling_job(const std::string& model, std::vector<prompt_input> inputs,
                                                const pooling_options& o, embeddings_output::setup es) {
  auto m = find_or_only(model);
  if (!m) return m.take_error();
  const served_model& sm = **m;
  const auto& cfg = sm.cfg;
  if (o.priority != 0 && !opt_.priority_scheduling) {
    return make_error(errc::invalid_request, "'priority' needs the priority scheduling policy (--scheduling-policy "
                                             "priority); this server serves requests first come, first served");
  }
  using shape = embeddings_output::shape;
  const size_t labels = cfg.classifier.labels;
  if (labels > 0 && es.kind == shape::embeddings) {
    return make_error(errc::invalid_request, "the model '" + sm.name + (cfg.classifier.reward
                                                                           ? "' is a reward model: it serves /pooling and /classify, "
                                                                             "not embeddings"
                                                                           : "' is a sequence classifier: it serves /classify, /score, "
                                                                             "/rerank and /pooling, not embeddings"));
  }
  if (labels == 0 && es.kind == shape::classify) {
    return make_error(errc::invalid_request, "the model '" + sm.name + "' is not a sequence classifier (a "
                                             "…ForSequenceClassification checkpoint, or classifier_from_token through "
                                             "--hf-overrides): /classify needs one");
  }
  if (cfg.classifier.reward && (es.kind == shape::score || es.kind == shape::rerank)) {
    return make_error(errc::invalid_request, "the model '" + sm.name + "' is a reward model: it serves /pooling (token_classify, "
                                             "its default) and /classify, not /score or /rerank");
  }
  if (labels > 1 && (es.kind == shape::score || es.kind == shape::rerank)) {
    return make_error(errc::invalid_request, "the model '" + sm.name + "' is a classifier of " + std::to_string(labels) +
                                                 " labels: /score and /rerank take a classifier of one (a cross-encoder) "
                                                 "or an embedding model");
  }
  es.width = labels > 0 ? labels : cfg.hidden;  // values a position (token tasks)
  if (labels > 0) {  // its logits are the answer: neither cut nor normalized
    es.cross_encoder = es.kind == shape::score || es.kind == shape::rerank;
    es.labels = cfg.classifier.names;
    if (es.cross_encoder) es.activation = !cfg.classifier.score_identity;
    es.dimensions = 0;
  }
  if (es.dimensions > cfg.hidden) {
    return make_error(errc::invalid_request, "'dimensions' is " + std::to_string(es.dimensions) + "; the model '" + sm.name +
                                                 "' gives " + std::to_string(cfg.hidden) + " at most");
  }
  LLMESH_TRY(detail::check_truncation(o.truncate_prompt_tokens, cfg.max_positions));
  std::vector<actors::replica_request> requests;
  requests.reserve(inputs.size());
  size_t token_values = 0;  // a token task's, over every input
  const uint64_t first = next_id_.fetch_add(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto& in = inputs[i];
    std::vector<int32_t> ids = in.text ? sm.tok->encode(*in.text, o.add_special_tokens) : std::move(in.ids);
    detail::truncate_prompt(ids, o.truncate_prompt_tokens, cfg.max_positions);
    if (ids.empty()) return about_input(make_error(errc::invalid_request, "it has no tokens"), i, inputs.size());
    for (int32_t t : ids) {
      if (static_cast<size_t>(t) >= cfg.vocab) {
        return about_input(make_error(errc::invalid_request, "token id " + std::to_string(t) +
                                                                 " is outside the vocabulary of " + std::to_string(cfg.vocab)),
                           i, inputs.size());
      }
    }
    if (ids.size() > cfg.max_positions) {  // vLLM's message
      return about_input(
          make_error(errc::invalid_request, "this model's maximum context length is " + std::to_string(cfg.max_positions) +
                                                " tokens; the input has " + std::to_string(ids.size()) +
                                                " (send truncate_prompt_tokens, or shorten it)"),
          i, inputs.size());
    }
    // A token task's values come back in one mesh message, bounded by the wire's limit.
    const size_t width = es.width;
    if (es.per_token && ids.size() * width > transport::max_embedding) {
      return about_input(make_error(errc::invalid_request, "its " + std::to_string(ids.size()) + " tokens would give " +
                                                               std::to_string(ids.size() * width) + " values (" +
                                                               std::to_string(width) + " a token); a token task gives " +
                                                               std::to_string(transport::max_embedding) + " at most: send at most " +
                                                               std::to_string(transport::max_embedding / width) +
                                                               " tokens (truncate_prompt_tokens)"),
                         i, inputs.size());
    }
    // And the reply holds them all at once (in memory, then as JSON text).
    token_values += es.per_token ? ids.size() * width : 0;
    if (token_values > max_token_task_values) {
      return make_error(errc::invalid_request, "the inputs' tokens would give more than " + std::to_string(max_token_task_values) +
                                                   " values in all (from input " + std::to_string(i) +
                                                   "); send fewer inputs or fewer tokens");
    }
    actors::replica_request q;
    q.id = first + i;
    q.prompt = std::move(ids);
    q.max_tokens = 1;  // nothing is generated (replica_request::pool)
    q.model = sm.route_name();
    q.lora = sm.lora;
    q.pool = es.per_token ? actors::pooling::all
             : labels > 0 ? actors::pooling::last  // a classifier reads the last token (transformers')
                          : sm.embedding.pool;
    q.priority = o.priority;
    q.sampling.seed = mix_id(first + i);
    requests.push_back(std::move(q));
  }
  // The window: as many slots as the server has to give, up to embedding_window.
  const size_t window = std::max<size_t>(1, std::min({requests.size(), embedding_window, opt_.max_concurrent}));
  auto slot = take_slots(window);
  if (!slot) return slot.take_error();

  char idbuf[32];
  std::snprintf(idbuf, sizeof idbuf, "%016llx", static_cast<unsigned long long>(mix_id(first)));
  es.id += idbuf;
  es.created = static_cast<int64_t>(std::time(nullptr));
  es.model = sm.name;
  es.normalize = labels == 0 && o.normalize.value_or(sm.embedding.normalize);
  es.window = window;
  es.metrics = &metrics_;
  generation_job job;
  job.tok = sm.tok;
  job.slot = std::move(*slot);
  metrics_.get_counter(actors::metric::model_requests, {sm.name})->add();
  group_setup gs;
  gs.id = es.id;
  gs.created = es.created;
  gs.model = sm.name;
  job.output = std::make_unique<completion_group>(gs, sm.tok->decoder(), &metrics_);
  job.output->render_as_embeddings(std::make_unique<embeddings_output>(std::move(es), std::move(requests)));
  return job;
}

result<generation_job> api_service::native_embed(std::string_view api_key, const std::string& model,
                                                 std::vector<prompt_input> inputs, const pooling_options& o, size_t dimensions) {
  if (!authorized("Bearer " + std::string(api_key))) return make_error(errc::unauthorized, "missing or wrong API key");
  if (inputs.empty() || inputs.size() > max_embedding_inputs) {
    return make_error(errc::invalid_request, "an embed call takes 1 to " + std::to_string(max_embedding_inputs) + " inputs, not " +
                                                 std::to_string(inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].text ? inputs[i].text->empty() : inputs[i].ids.empty()) {
      return about_input(make_error(errc::invalid_request, "it is empty"), i, inputs.size());
    }
  }
  embeddings_output::setup es;
  es.id = "embd-";
  es.dimensions = dimensions;
  return pooling_job(model, std::move(inputs), o, std::move(es));
}

api_outcome api_service::embeddings(std::string_view body) {
  auto r = parse_pooling_body(body);
  if (!r) return error_reply(r.err());
  embeddings_output::setup es;
  es.id = "embd-";
  es.base64 = r->base64;
  es.dimensions = r->dimensions ? static_cast<size_t>(*r->dimensions) : 0;
  auto job = pooling_job(r->model, std::move(r->inputs), {r->add_special_tokens, r->truncate_prompt_tokens, r->priority, r->normalize},
                         std::move(es));
  if (!job) return error_reply(job.err());
  return std::move(*job);
}

api_outcome api_service::score(std::string_view body) {
  auto r = parse_score_request(body);
  if (!r) return error_reply(r.err());
  embeddings_output::setup es;
  es.kind = embeddings_output::shape::score;
  es.id = "score-";
  std::vector<prompt_input> inputs;
  if (auto cross = classifier_of(r->model)) {  // each pair one input, tokenized as a pair
    if (auto t = check_pair_truncation(r->truncate_prompt_tokens); !t) return error_reply(t.err());
    for (const auto& [a, b] : r->pairs) {
      es.pairs.emplace_back(inputs.size(), inputs.size());
      inputs.push_back({std::nullopt, pair_ids(*cross, r->text_1[a], r->text_2[b], r->add_special_tokens)});
    }
  } else {
    // text_1's texts, then text_2's: pair (i, j) compares inputs i and text_1.size() + j.
    for (const auto& [a, b] : r->pairs) es.pairs.emplace_back(a, r->text_1.size() + b);
    inputs = as_inputs(r->text_1);
    for (auto& t : as_inputs(r->text_2)) inputs.push_back(std::move(t));
  }
  auto job = pooling_job(r->model, std::move(inputs), {r->add_special_tokens, r->truncate_prompt_tokens, r->priority, true},
                         std::move(es));
  if (!job) return error_reply(job.err());
  return std::move(*job);
}

api_outcome api_service::rerank(std::string_view body) {
  auto r = parse_rerank_request(body);
  if (!r) return error_reply(r.err());
  embeddings_output::setup es;
  es.kind = embeddings_output::shape::rerank;
  es.id = "rerank-";
  es.top_n = r->top_n;
  if (r->return_documents) es.documents = r->documents;
  std::vector<prompt_input> inputs;
  if (auto cross = classifier_of(r->model)) {  // the query with each document, tokenized as a pair
    if (auto t = check_pair_truncation(r->truncate_prompt_tokens); !t) return error_reply(t.err());
    for (const auto& d : r->documents) inputs.push_back({std::nullopt, pair_ids(*cross, r->query, d, r->add_special_tokens)});
  } else {
    inputs.push_back({r->query, {}});
    for (auto& t : as_inputs(r->documents)) inputs.push_back(std::move(t));
  }
  auto job = pooling_job(r->model, std::move(inputs), {r->add_special_tokens, r->truncate_prompt_tokens, r->priority, true},
                         std::move(es));
  if (!job) return error_reply(job.err());
  return std::move(*job);
}

api_outcome api_service::classify(std::string_view body) {
  auto r = parse_pooling_body(body);  // vLLM's ClassificationRequest: the same input and pooling fields
  if (!r) return error_reply(r.err());
  auto activation = parse_use_activation(body);  // vLLM's use_activation (default: the model's, true: probabilities)
  if (!activation) return error_reply(activation.err());
  auto m = find_or_only(r->model);
  if (!m) return error_reply(m.err());
  embeddings_output::setup es;
  es.kind = embeddings_output::shape::classify;
  es.id = "classify-";
  es.activation = activation->value_or((*m)->embedding.activation);
  auto job = pooling_job(r->model, std::move(r->inputs), {r->add_special_tokens, r->truncate_prompt_tokens, r->priority, false},
                         std::move(es));
  if (!job) return error_reply(job.err());
  return std::move(*job);
}

api_outcome api_service::pooling(std::string_view body) {
  auto r = parse_pooling_body(body);
  if (!r) return error_reply(r.err());
  auto f = parse_pooling_fields(body);
  if (!f) return error_reply(f.err());
  auto m = find_or_only(r->model);
  if (!m) return error_reply(m.err());
  const bool classifier = (*m)->cfg.classifier.labels > 0;
  // A reward model's default is vLLM's: every position rewarded (token_classify).
  const pooling_task task = f->task.value_or((*m)->cfg.classifier.reward ? pooling_task::token_classify
                                             : classifier                ? pooling_task::classify
                                                                         : pooling_task::embed);
  const bool classifying = task == pooling_task::classify || task == pooling_task::token_classify;
  if (classifying != classifier) {
    return error_reply(make_error(errc::invalid_request,
                                  "the model '" + (*m)->name + "' is " + (classifier ? "" : "not ") + "a sequence classifier: its " +
                                      "tasks are " + (classifier ? "classify and token_classify" : "embed and token_embed") +
                                      ", not " + task_name(task)));
  }
  if (classifying && r->dimensions) {
    return error_reply(make_error(errc::invalid_request, "'dimensions' cuts an embedding; task " + std::string(task_name(task)) +
                                                             " gives the labels' values"));
  }
  // vLLM's one switch: normalize (deprecated) first, then use_activation and its aliases.
  const std::optional<bool> on = r->normalize ? r->normalize : f->activation;
  embeddings_output::setup es;
  es.kind = embeddings_output::shape::pooling;
  es.id = "pool-";
  es.base64 = r->base64;
  es.dimensions = r->dimensions ? static_cast<size_t>(*r->dimensions) : 0;
  es.activation = on.value_or((*m)->embedding.activation);
  es.per_token = task == pooling_task::token_embed || task == pooling_task::token_classify;
  auto job = pooling_job(r->model, std::move(r->inputs), {r->add_special_tokens, r->truncate_prompt_tokens, r->priority, on},
                         std::move(es));
  if (!job) return error_reply(job.err());
  return std::move(*job);
}

std::shared_ptr<const served_model> api_service::classifier_of(const std::string& model) const {
  auto m = find_or_only(model);
  if (!m || (*m)->cfg.classifier.labels == 0) return nullptr;  // (pooling_job answers a bad name)
  return *m;
}

}  // namespace llmesh::gateway
