// The HTTP API of DESIGN.md §Contracts without the HTTP transport, a plain class: a request
// (method, target, Authorization header, body) in; either a complete reply or a generation
// job (the requests for the mesh, one per choice, plus the completion_group that renders their
// tokens) out. It owns the gateway's policies: API key, the served models (a request's
// "model" picks one: its tokenizer, chat template, context and sampling defaults, and the
// replicas it is routed to), prompt and max_tokens limits against the context, seeds (for
// seedless requests, and per choice), and the bound on concurrent generations (429 with
// Retry-After when full; a request takes one slot per choice).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "llmesh/actors/local_mesh.hpp"
#include "llmesh/actors/metrics.hpp"
#include "llmesh/gateway/completion_group.hpp"
#include "llmesh/gateway/embeddings_api.hpp"
#include "llmesh/gateway/openai_api.hpp"
#include "llmesh/gateway/reasoning.hpp"
#include "llmesh/gateway/response_store.hpp"
#include "llmesh/gateway/responses_api.hpp"
#include "llmesh/gateway/tool_calls.hpp"
#include "llmesh/model/chat_template.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/lora.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::gateway {

struct api_options {
  std::string model_name;        ///< the single-model constructor's model: the id clients send as "model"
  std::string api_key;           ///< empty: /v1 routes are open
  request_limits limits;         ///< max_tokens bound, stop strings, messages
  size_t max_concurrent = 256;   ///< generations in flight; beyond: 429
  /// vLLM's --scheduling-policy priority: requests' `priority` reaches the replicas (lower
  /// first); false (fcfs): a non-zero priority is a 400, as vLLM answers it.
  bool priority_scheduling = false;
  /// vLLM's runtime LoRA updates (VLLM_ALLOW_RUNTIME_LORA_UPDATING): POST
  /// /v1/load_lora_adapter and /v1/unload_lora_adapter add and remove adapters while the server
  /// runs; off: both answer 404 saying how to turn them on.
  bool runtime_lora_updates = false;
  /// vLLM's --enable-force-include-usage: every streamed response ends with its usage chunk, as
  /// stream_options.include_usage asks.
  bool force_include_usage = false;
  /// vLLM's --return-tokens-as-token-ids: every request's logprobs name tokens "token_id:<id>",
  /// as its return_tokens_as_token_ids asks.
  bool tokens_as_ids = false;
  /// vLLM's --response-role: the role a chat answer names when the request's template added a
  /// generation prompt (add_generation_prompt; otherwise the last message's role, as vLLM's).
  std::string response_role = "assistant";
  /// vLLM's --enable-log-requests: a line on stderr per admitted prompt (request_log.hpp), with
  /// at most max_log_len of its characters and ids (vLLM's --max-log-len; 0: all).
  bool log_requests = false;
  size_t max_log_len = 0;
  /// vLLM's --enable-log-outputs: a line on stderr per choice of a response that ended, with its
  /// finish reason, text and ids (as capped by max_log_len).
  bool log_outputs = false;
  /// vLLM's --chat-template-content-format openai: the template sees each message's content as
  /// a list of parts ([{"type": "text", "text": ...}]); false (auto, string): as one string.
  bool content_as_parts = false;
  /// vLLM's --root-path (Starlette's root_path): a request whose path begins with it (then "/")
  /// is routed on the rest, as a proxy that keeps the prefix sends it; "" or others as they are.
  std::string root_path;
  /// vLLM's --seed: a seedless request's seed is drawn from it and the request's place in the
  /// server's sequence of ids (none: from a random value drawn at start). Ids stay random.
  std::optional<uint64_t> seed;
  /// The Responses API's stored responses (response_store.hpp): at most this many (0: none
  /// stored; `previous_response_id` is then a 400) and this many bytes of JSON.
  size_t max_stored_responses = 1024;
  size_t max_stored_response_bytes = size_t{64} << 20;
  /// The Conversations API's conversations (api_conversations.cpp): at most this many (0: the
  /// routes and the Responses API's `conversation` answer 400) and this many bytes of JSON.
  size_t max_conversations = 1024;
  size_t max_conversation_bytes = size_t{64} << 20;
};

/// One model a gateway serves.
struct served_model {
  std::string name;  ///< the id clients send as "model" and /v1/models lists
  std::shared_ptr<const model::tokenizer> tok;
  std::optional<model::chat_template> chat;  ///< nullopt: its chat endpoint answers 400
  model::model_config cfg;                   ///< context, vocabulary, EOS ids, sampling defaults
  /// Splits chat output into reasoning_content and content (reasoning.hpp); none: no split.
  reasoning_parser reasoning = reasoning_parser::none;
  /// The format tool_choice "auto" finds calls in (tool_calls.hpp).
  tool_call_parser tool_parser = tool_call_parser::hermes;
  /// Special tokens the parser needs to see (tool_parser_kept_tokens: mistral's [TOOL_CALLS]);
  /// a chat choice with tools keeps their text.
  std::vector<int32_t> tool_tokens = {};
  /// /v1/embeddings' pooling and normalization (load_embedding_defaults).
  embedding_defaults embedding = {};
  /// LoRA adapters served on this model (--lora-modules, a cluster config model's loras): the
  /// service answers each as a model of its own name (vLLM's way), run on this model's replicas.
  std::vector<model::lora_source> loras = {};
  /// Set on the entries the service makes for those adapters: the base model's name (the
  /// mesh's routing key), the adapter's name (replica_request::lora) and directory.
  std::string parent = {}, lora = {}, root = {};
  /// More names the model answers to (vLLM's --served-model-name A B ...): the service lists and
  /// serves it under each, a response naming the one its request sent.
  std::vector<std::string> aliases = {};
  /// Names the model also answers to without /v1/models listing them: `llmesh serve PATH`'s
  /// PATH as given, vLLM's default model name, beside the directory's name llmesh lists.
  std::vector<std::string> unlisted_aliases = {};
  /// Set on the entries the service makes for those names: the model's own (first) name.
  std::string alias_of = {};
  bool listed = true;  ///< false: an unlisted alias's entry
  /// The model the mesh routes its requests to: the base model's name for an adapter or a name.
  const std::string& route_name() const { return !parent.empty() ? parent : !alias_of.empty() ? alias_of : name; }
};

/// A response to run: submit every request to the mesh, feed their messages to `output`.
struct generation_job {
  /// One generation per choice, in choice index order (prompt index * n + j; with best_of,
  /// each prompt's candidates), each with its own id and seed; `output` renders each by its id.
  std::vector<actors::replica_request> requests;
  std::shared_ptr<const model::tokenizer> tok;  ///< the served model's (the native API decodes with it)
  std::unique_ptr<completion_group> output;
  bool streaming = false;
  std::shared_ptr<void> slot;  ///< holds requests.size() of max_concurrent; released when dropped
};

/// The seed of choice j of a prompt, from the request's seed S_0 (the client's, or the one
/// drawn for a seedless request): S_0 itself for j = 0, so that a prompt's first choice
/// samples exactly as an n = 1 request with that seed; for j >= 1 the j-th output of a
/// SplitMix64 generator whose state starts at S_0 (Steele, Lea and Flood 2014; Java's
/// SplittableRandom): S_j = f(S_0 + j * 0x9e3779b97f4a7c15) mod 2^64, f its output mix
/// (z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27; z *= 0x94d049bb133111eb; z ^= z >> 31).
/// Deterministic, so a seeded request's choices are reproducible, and distinct from each other.
uint64_t choice_seed(uint64_t request_seed, size_t j);

/// vLLM's bad_words as token ids: each word with its leading whitespace removed, tokenized
/// without special tokens; and again after a space (" word", how it appears mid-text) where
/// that gives the same number of tokens with another first one. A word of whitespace only
/// bans nothing.
std::vector<std::vector<int32_t>> bad_word_ids(const model::tokenizer& tok, const std::vector<std::string>& words);

class background_run;
class background_runs;

/// A background response's stream events to send (background_runs.hpp): the ones after
/// sequence number `after` (-1: all), then each as it comes, until the run ends. The client
/// going away does not stop the run.
struct event_tail {
  std::shared_ptr<background_run> run;
  int64_t after = -1;
};

using api_outcome = std::variant<http_reply, generation_job, event_tail>;

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

  ~api_service();
  api_service(const api_service&) = delete;
  api_service& operator=(const api_service&) = delete;

  api_outcome handle(std::string_view method, std::string_view target, std::string_view authorization,
                     std::string_view body);

  /// The native API's generation (gateway/rpc_server), one choice: the checks and policies of
  /// /v1/completions — API key, then `sampling` checked as the HTTP API checks it
  /// (apply_sampling: ranges and the max-tokens limit), model name, prompt (text is tokenized
  /// with BOS) and context limits, the concurrency slot, a seed when none is given. `rest`
  /// carries the other fields (seed, ignore_eos, n: 1..max_choices generations, choice j seeded
  /// as over HTTP). Without max_tokens a
  /// generation runs until EOS or the context, bounded by the max-tokens limit (as chat does).
  /// `extra`: the other fields as apply_extra_fields takes them (null: none), or the error the
  /// caller met reading them (reported after the API key is checked).
  /// `add_special_tokens`: a text prompt is tokenized with the tokenizer's special tokens (BOS;
  /// /v1/completions' add_special_tokens). The prompt is then cut to rest's (or extra's)
  /// truncate_prompt_tokens, as over HTTP.
  /// The caller uses the job's requests (n, in choice order) and slots (its output renders
  /// OpenAI chunks, which the RPC server does not need).
  [[nodiscard]] result<generation_job> native_generate(std::string_view api_key, const std::string& model,
                                                       const std::optional<std::string>& prompt_text,
                                                       std::vector<int32_t> prompt_ids,
                                                       const sampling_input& sampling, generation_fields rest,
                                                       const result<nlohmann::ordered_json>& extra = nlohmann::ordered_json(),
                                                       bool add_special_tokens = true);

  /// What the pooling endpoints share: how inputs are tokenized and cut, their priority, and
  /// normalize (unset: the model's default).
  struct pooling_options {
    bool add_special_tokens = true;
    int64_t truncate_prompt_tokens = 0;
    int32_t priority = 0;
    std::optional<bool> normalize;
  };
  /// The native API's embed: the API key, then as /v1/embeddings (1..max_embedding_inputs
  /// inputs, none empty, `dimensions` 0 for all). The job's output holds the vectors
  /// (completion_group::embeddings) once it is done.
  [[nodiscard]] result<generation_job> native_embed(std::string_view api_key, const std::string& model,
                                                    std::vector<prompt_input> inputs, const pooling_options& o,
                                                    size_t dimensions);

  /// Ends the background responses (cancelling the running ones in the mesh): before the mesh
  /// stops, since their requests are its, and before the http_server goes, since readers of
  /// their streams wake through its io_context. Later background requests are refused (503).
  void close_background();

  /// A mesh's news (a gateway node, node_agent_options::on_lora_news): the adapters added to
  /// model `base` while the mesh serves, all of them. Entries of runtime adapters no longer
  /// listed go and new ones come; the configured adapters stay. Idempotent; any thread.
  void set_runtime_adapters(const std::string& base, const std::vector<model::lora_source>& adapters);

  /// Generations (choices) in flight.
  size_t inflight() const { return inflight_->load(); }
  /// Alternatives per token a request may ask for (--max-logprobs).
  int max_logprobs() const { return opt_.limits.max_logprobs; }
  actors::mesh_client& mesh() { return mesh_; }
  actors::metrics_registry& metrics() { return metrics_; }
  /// --enable-log-outputs (api_options::log_outputs): whether to, and the lines of a response
  /// whose generation ended (every choice's; a streamed one kept its text for this).
  bool logs_outputs() const { return opt_.log_outputs; }
  /// The messages as the chat template sees them (content_as_parts: string contents as one text
  /// part); `messages` itself otherwise.
  nlohmann::ordered_json template_messages(const nlohmann::ordered_json& messages) const;
  void log_outputs(const completion_group& out) const;
  /// The line of one native-API choice that ended (log_outputs' form).
  std::string output_line(const std::string& id, size_t index, const std::string& finish, const std::vector<int32_t>& ids,
                          const std::string& text) const;
  /// The served models' listed names (not unlisted aliases), in the order given.
  std::vector<std::string> model_names() const;

 private:
  api_outcome completions(std::string_view body);
  /// `responses`: the request came to /v1/responses as this chat request; its output is
  /// rendered as the Responses API's (responses_api.hpp).
  /// A Responses request as chat_completions runs it: what its response repeats, its body (its
  /// input items are stored with the response) and the conversation it continues.
  struct responses_job {
    responses_echo echo;
    nlohmann::ordered_json request;
    nlohmann::ordered_json earlier = nlohmann::ordered_json::array();
    std::string conversation;  ///< the conversation it continues and extends (empty: none)
  };
  /// `as_messages`: the request came to /v1/messages; its output is rendered as Anthropic's
  /// (messages_api.hpp).
  api_outcome chat_completions(std::string_view body, const responses_job* responses = nullptr, bool as_messages = false);
  /// Anthropic's Messages API (api_messages.cpp): /v1/messages and /v1/messages/count_tokens,
  /// every answer (errors too: the key's, the route's) in its shape.
  api_outcome messages_route(std::string_view method, std::string_view path, std::string_view authorization, std::string_view body);
  api_outcome messages(std::string_view body);
  http_reply count_message_tokens(std::string_view body);
  /// A checked chat request's prompt: the model's template rendered (tools, chat_template_kwargs,
  /// continue_final_message), and its tokens (truncate_prompt_tokens applied). REQUIRES: sm.chat.
  result<std::pair<std::string, std::vector<int32_t>>> chat_prompt(const chat_request& r, const served_model& sm) const;
  /// truncation "auto": how many of the conversation's first items (`earlier`, then the
  /// request's input) to leave out so that the prompt and its max_output_tokens (1 when not
  /// given) fit the context; 0 when it fits as it is or cannot be measured (the chat path
  /// then answers as without truncation). At most all but the input's last item.
  size_t items_to_drop(const nlohmann::ordered_json& body, const responses_job& job);
  /// OpenAI's Responses API (api_responses.cpp): the request as the chat request it means, run
  /// as one, continuing a stored response's conversation with previous_response_id.
  api_outcome responses(std::string_view body);
  /// The renderer of a Responses request's output; with store, it keeps the final response.
  std::unique_ptr<responses_renderer> responses_output(const responses_job& r, std::string_view chat_id, int64_t created,
                                                       const std::string& model) const;
  /// /v1/responses/{id}[/input_items|/cancel] (`rest`: the path after "/v1/responses/"): a
  /// stored or background response; `?stream=true[&starting_after=N]` on a background one
  /// is its events.
  api_outcome stored_responses(std::string_view method, std::string_view rest, std::string_view query) const;
  /// POST .../cancel (api_responses.cpp).
  http_reply cancel_response(const std::string& id) const;
  /// /v1/conversations[/{id}[/items[/{item}]]] (api_conversations.cpp; `rest`: the path after
  /// "/v1/conversations").
  http_reply conversations(std::string_view method, std::string_view rest, std::string_view query, std::string_view body);
  /// Items a client gives a conversation (at most 20 a call, each one a Responses input item),
  /// with ids where they had none; a 400 naming `field` otherwise.
  result<nlohmann::ordered_json> conversation_items(const nlohmann::ordered_json& items, const std::string& field);
  /// A finished response's input items and output appended to conversation `id` of `store`.
  static status extend_conversation(json_store& store, const std::string& id, const nlohmann::ordered_json& input_items,
                                    const nlohmann::ordered_json& response);
  /// 16 hex digits, unique in this process (ids of conversations and their items).
  std::string fresh_hex();
  uint64_t mix_id(uint64_t n) const;
  /// OpenAI's /v1/embeddings and vLLM's /score and /rerank (api_embeddings.cpp): each input an
  /// embedding request in the mesh, a window of them in flight; the job's output renders the
  /// vectors, or the similarities of normalized ones.
  api_outcome embeddings(std::string_view body);
  /// vLLM's POST /invocations (SageMaker): the chat, completion, embedding, score or rerank API,
  /// as the body's fields say.
  api_outcome invoke(std::string_view body);
  api_outcome score(std::string_view body);
  api_outcome rerank(std::string_view body);
  /// vLLM's POST /classify: a sequence classifier's labels for each input (the inputs as
  /// /v1/embeddings takes them).
  api_outcome classify(std::string_view body);
  /// vLLM's POST /pooling: the inputs as /v1/embeddings takes them (or `messages`) and a `task`
  /// (parse_pooling_fields) the model serves: embed and token_embed for any model but a
  /// sequence classifier, classify and token_classify for one.
  api_outcome pooling(std::string_view body);
  /// `model` (find_or_only) when it is a sequence classifier (null otherwise): /score and
  /// /rerank tokenize their pairs together for it, /invocations classifies its inputs.
  std::shared_ptr<const served_model> classifier_of(const std::string& model) const;
  /// The job of a pooling request: its inputs checked against `model` (find_or_only) and its
  /// context, one embedding request each, rendered by an embeddings_output of `es` (its id
  /// prefix completed, the model, normalize, window and metrics set here).
  result<generation_job> pooling_job(const std::string& model, std::vector<prompt_input> inputs, const pooling_options& o,
                                     embeddings_output::setup es);
  /// vLLM's /tokenize and /detokenize (api_tokenize.cpp).
  api_outcome tokenize(std::string_view body);
  api_outcome detokenize(std::string_view body);
  /// A tokenize request's messages through `sm`'s chat template (with its tools and kwargs).
  result<std::string> render_messages(const served_model& sm, const tokenize_request& r) const;
  /// The body of /v1/embeddings or /classify (parse_embeddings_request), in vLLM's chat form
  /// too (EmbeddingChatRequest, ClassificationChatRequest): `messages` in place of `input` are
  /// rendered into one input, the conversation's token ids (no generation prompt and no special
  /// tokens beyond the template's unless asked).
  result<embeddings_request> parse_pooling_body(std::string_view body) const;
  /// The served model of that name; not_found naming the served ones otherwise.
  result<std::shared_ptr<const served_model>> find(const std::string& name) const;
  /// find(), or with no name the one model served (several: a 400 asking for one).
  result<std::shared_ptr<const served_model>> find_or_only(const std::string& name) const;
  /// The served models now (adapters come and go: runtime LoRA updates).
  std::vector<std::shared_ptr<const served_model>> served() const;
  /// The entry that serves adapter `l` of `base`: the base model's, under the adapter's name.
  static served_model adapter_entry(const served_model& base, const model::lora_source& l);
  /// vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter (api_lora.cpp).
  http_reply load_lora_adapter(std::string_view body);
  /// Whether the routes run: allowed (api_options::runtime_lora_updates) and the mesh's replicas take them.
  status lora_updates_usable() const;
  /// The base model an adapter loads onto: `base_name` (or one of its further names), or with
  /// none the one base model served.
  result<std::shared_ptr<const served_model>> lora_base(const std::string& base_name) const;
  http_reply unload_lora_adapter(std::string_view body);
  /// A prompt as prepare() takes it: its tokens, and the text its choices begin with (echo).
  struct prepared_prompt {
    std::vector<int32_t> ids;
    std::string echo;
  };
  /// The job of a request: prompts × g.candidates() generations (n choices, or best_of
  /// candidates), each prompt checked against the context, each carrying g.constraint; `tools`
  /// (chat: the request's tool_choice) shapes each choice's output into tool calls, after
  /// `reasoning` splits off its thinking.
  /// `role`: chat's message role (stream_setup::role).
  result<generation_job> prepare(bool chat, const served_model& m, std::vector<prepared_prompt> prompts,
                                 generation_fields g, const tool_output& tools = {},
                                 const reasoning_mode& reasoning = {}, const std::string& role = "assistant");
  /// A prompt's effective max_tokens, once it is checked (ids within the vocabulary, it and
  /// max_tokens and min_tokens within the context).
  static result<size_t> check_prompt(const model::model_config& cfg, const std::vector<int32_t>& prompt,
                                     const generation_fields& g);
  /// `k` slots of max_concurrent, all or none (429 when they are not free).
  result<std::shared_ptr<void>> take_slots(size_t k);
  http_reply models() const;
  /// GET /v1/models/{id}: one model's card (OpenAI's models.retrieve), 404 naming the served ones.
  http_reply model(std::string_view name) const;
  nlohmann::ordered_json model_card(const served_model& m) const;
  bool authorized(std::string_view authorization) const;

  api_options opt_;
  mutable std::shared_mutex models_mu_;  ///< guards models_ (runtime LoRA updates change it)
  std::vector<std::shared_ptr<const served_model>> models_;
  std::mutex lora_updates_mu_;  ///< one runtime LoRA update at a time
  std::set<std::string> runtime_adapters_;  ///< names of the adapters added while serving (guarded by models_mu_)
  actors::mesh_client& mesh_;
  actors::metrics_registry& metrics_;
  std::shared_ptr<response_store> store_;  ///< shared with the renderers that store into it
  std::shared_ptr<json_store> conversations_;
  std::shared_ptr<std::atomic<size_t>> inflight_ = std::make_shared<std::atomic<size_t>>(0);
  std::atomic<uint64_t> next_id_{1};
  uint64_t seed_base_;
  uint64_t seedless_base_;  ///< seedless requests' seeds: from api_options::seed, else seed_base_
  int64_t created_;
  /// Background responses (last: destroyed first, so no run outlives what it borrows).
  std::unique_ptr<background_runs> runs_;
};

}  // namespace llmesh::gateway
