// The HTTP API of DESIGN.md §Contracts without the HTTP transport, a plain class: a request
// (method, target, Authorization header, body) in; either a complete reply or a generation
// job (the request for the mesh plus the completion_stream that renders its tokens) out.
// It owns the gateway's policies: API key, the served models (a request's "model" picks one:
// its tokenizer, chat template, context and sampling defaults, and the replicas it is routed
// to), prompt and max_tokens limits against the context, seeds for seedless requests, and the
// bound on concurrent generations (429 with Retry-After when full).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "llmesh/actors/local_mesh.hpp"
#include "llmesh/actors/metrics.hpp"
#include "llmesh/gateway/completion_stream.hpp"
#include "llmesh/gateway/openai_api.hpp"
#include "llmesh/model/chat_template.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::gateway {

struct api_options {
  std::string model_name;        ///< the single-model constructor's model: the id clients send as "model"
  std::string api_key;           ///< empty: /v1 routes are open
  request_limits limits;         ///< max_tokens bound, stop strings, messages
  size_t max_concurrent = 256;   ///< generations in flight; beyond: 429
};

/// One model a gateway serves.
struct served_model {
  std::string name;  ///< the id clients send as "model" and /v1/models lists
  std::shared_ptr<const model::tokenizer> tok;
  std::optional<model::chat_template> chat;  ///< nullopt: its chat endpoint answers 400
  model::model_config cfg;                   ///< context, vocabulary, EOS ids, sampling defaults
};

/// A generation to run: submit `req` to the mesh, feed its messages to `stream`.
struct generation_job {
  actors::replica_request req;  ///< req.model names the served model
  std::shared_ptr<const model::tokenizer> tok;  ///< that model's (the native API decodes with it)
  std::unique_ptr<completion_stream> stream;
  bool streaming = false;
  std::shared_ptr<void> slot;  ///< holds one of max_concurrent; released when dropped
};

using api_outcome = std::variant<http_reply, generation_job>;

/// Thread affinity: any thread (the counters are atomic; the rest is immutable).
class api_service {
 public:
  /// Serves `models` (at least one; names unique, as cluster_config checks; /v1/models lists
  /// them in this order), every one through `mesh`, which routes by replica_request::model.
  /// Borrows mesh and metrics.
  api_service(api_options opt, std::vector<served_model> models, actors::mesh_client& mesh,
              actors::metrics_registry& metrics);
  /// One model, named opt.model_name: `tok` encodes prompts and decodes output; `chat` is the
  /// model's template (nullopt: the chat endpoint answers 400).
  api_service(api_options opt, std::shared_ptr<const model::tokenizer> tok, std::optional<model::chat_template> chat,
              model::model_config cfg, actors::mesh_client& mesh, actors::metrics_registry& metrics);

  api_outcome handle(std::string_view method, std::string_view target, std::string_view authorization,
                     std::string_view body);

  /// The native API's generation (gateway/rpc_server): the checks and policies of
  /// /v1/completions — API key, then `sampling` checked as the HTTP API checks it
  /// (apply_sampling: ranges and the max-tokens limit), model name, prompt (text is tokenized
  /// with BOS) and context limits, the concurrency slot, a seed when none is given. `rest`
  /// carries the other fields (seed, ignore_eos). Without max_tokens a generation runs until EOS
  /// or the context, bounded by the max-tokens limit (as chat does). The caller uses the job's
  /// request and slot (its stream renders OpenAI chunks, which the RPC server does not need).
  [[nodiscard]] result<generation_job> native_generate(std::string_view api_key, const std::string& model,
                                                       const std::optional<std::string>& prompt_text,
                                                       std::vector<int32_t> prompt_ids,
                                                       const sampling_input& sampling, generation_fields rest);

  /// Generations in flight.
  size_t inflight() const { return inflight_->load(); }
  actors::mesh_client& mesh() { return mesh_; }
  actors::metrics_registry& metrics() { return metrics_; }
  /// The served models' names, in the order given.
  std::vector<std::string> model_names() const;

 private:
  api_outcome completions(std::string_view body);
  api_outcome chat_completions(std::string_view body);
  /// The served model of that name; not_found naming the served ones otherwise.
  result<const served_model*> find(const std::string& name) const;
  result<generation_job> prepare(bool chat, const served_model& m, std::vector<int32_t> prompt, generation_fields g);
  http_reply models() const;
  bool authorized(std::string_view authorization) const;

  api_options opt_;
  std::vector<served_model> models_;
  actors::mesh_client& mesh_;
  actors::metrics_registry& metrics_;
  std::shared_ptr<std::atomic<size_t>> inflight_ = std::make_shared<std::atomic<size_t>>(0);
  std::atomic<uint64_t> next_id_{1};
  uint64_t seed_base_;
  int64_t created_;
};

}  // namespace llmesh::gateway
