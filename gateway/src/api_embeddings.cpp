// OpenAI's POST /v1/embeddings on the HTTP API (api_service.hpp): the inputs tokenized and
// checked against the model's context, each one an embedding request in the mesh (the served
// model's pooling), at most embedding_window of them in flight (fewer when the server's
// concurrency bound is lower) and as many concurrency slots held; the list rendered by
// embeddings_output once every vector is in.
#include <algorithm>
#include <cstdio>
#include <ctime>

#include "llmesh/gateway/api_service.hpp"
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

}  // namespace

api_outcome api_service::embeddings(std::string_view body) {
  auto r = parse_embeddings_request(body);
  if (!r) return error_reply(r.err());
  auto m = find_or_only(r->model);
  if (!m) return error_reply(m.err());
  const served_model& sm = **m;
  const auto& cfg = sm.cfg;
  if (r->priority != 0 && !opt_.priority_scheduling) {
    return error_reply(make_error(errc::invalid_request, "'priority' needs the priority scheduling policy (--scheduling-policy "
                                                         "priority); this server serves requests first come, first served"));
  }
  if (r->dimensions && static_cast<size_t>(*r->dimensions) > cfg.hidden) {
    return error_reply(make_error(errc::invalid_request, "'dimensions' is " + std::to_string(*r->dimensions) + "; the model '" +
                                                             sm.name + "' gives " + std::to_string(cfg.hidden) + " at most"));
  }
  if (auto s = detail::check_truncation(r->truncate_prompt_tokens, cfg.max_positions); !s) return error_reply(s.err());
  std::vector<actors::replica_request> requests;
  requests.reserve(r->inputs.size());
  const uint64_t first = next_id_.fetch_add(r->inputs.size());
  for (size_t i = 0; i < r->inputs.size(); ++i) {
    auto& in = r->inputs[i];
    std::vector<int32_t> ids = in.text ? sm.tok->encode(*in.text, r->add_special_tokens) : std::move(in.ids);
    detail::truncate_prompt(ids, r->truncate_prompt_tokens, cfg.max_positions);
    if (ids.empty()) return error_reply(about_input(make_error(errc::invalid_request, "it has no tokens"), i, r->inputs.size()));
    for (int32_t t : ids) {
      if (static_cast<size_t>(t) >= cfg.vocab) {
        return error_reply(about_input(make_error(errc::invalid_request, "token id " + std::to_string(t) +
                                                                             " is outside the vocabulary of " +
                                                                             std::to_string(cfg.vocab)),
                                       i, r->inputs.size()));
      }
    }
    if (ids.size() > cfg.max_positions) {  // vLLM's message
      return error_reply(about_input(
          make_error(errc::invalid_request, "this model's maximum context length is " + std::to_string(cfg.max_positions) +
                                                " tokens; the input has " + std::to_string(ids.size()) +
                                                " (send truncate_prompt_tokens, or shorten it)"),
          i, r->inputs.size()));
    }
    actors::replica_request q;
    q.id = first + i;
    q.prompt = std::move(ids);
    q.max_tokens = 1;  // nothing is generated (replica_request::pool)
    q.model = sm.name;
    q.pool = sm.embedding.pool;
    q.priority = r->priority;
    q.sampling.seed = mix_id(first + i);
    requests.push_back(std::move(q));
  }
  // The window: as many slots as the server has to give, up to embedding_window.
  const size_t window = std::max<size_t>(1, std::min({requests.size(), embedding_window, opt_.max_concurrent}));
  auto slot = take_slots(window);
  if (!slot) return error_reply(slot.err());

  embeddings_output::setup es;
  char idbuf[32];
  std::snprintf(idbuf, sizeof idbuf, "%016llx", static_cast<unsigned long long>(mix_id(first)));
  es.id = std::string("embd-") + idbuf;
  es.created = static_cast<int64_t>(std::time(nullptr));
  es.model = sm.name;
  es.base64 = r->base64;
  es.dimensions = r->dimensions ? static_cast<size_t>(*r->dimensions) : 0;
  es.normalize = r->normalize.value_or(sm.embedding.normalize);
  es.window = window;
  es.metrics = &metrics_;
  generation_job job;
  job.tok = sm.tok;
  job.slot = std::move(*slot);
  group_setup gs;
  gs.id = es.id;
  gs.created = es.created;
  gs.model = sm.name;
  job.output = std::make_unique<completion_group>(gs, sm.tok->decoder(), &metrics_);
  job.output->render_as_embeddings(std::make_unique<embeddings_output>(std::move(es), std::move(requests)));
  return job;
}

}  // namespace llmesh::gateway
