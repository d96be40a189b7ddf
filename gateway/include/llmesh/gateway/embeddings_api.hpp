// OpenAI's POST /v1/embeddings (as vLLM serves it for pooling models), vLLM's /score and
// /rerank over embeddings (cosine similarity, as vLLM scores with an embedding model) or with a
// cross-encoder, vLLM's /classify for sequence classifiers and its generic /pooling, plain
// parts: the request bodies parsed and bounded; a model directory's pooling defaults
// (sentence-transformers' modules.json); and embeddings_output, which runs one request's
// inputs through the mesh — each input is an embedding request (actors::replica_request::pool),
// at most `window` of them in flight — and renders the response once every one has its vector.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmesh/actors/metrics.hpp"
#include "llmesh/actors/replica_core.hpp"
#include "llmesh/actors/token_stream.hpp"
#include "llmesh/gateway/completion_stream.hpp"
#include "llmesh/gateway/openai_api.hpp"

namespace llmesh::gateway {

/// How a served model turns its final hidden states into an embedding, unless a request says
/// otherwise (normalize), and whether a classifier's logits become probabilities unless a
/// request says (vLLM's use_activation).
struct embedding_defaults {
  actors::pooling pool = actors::pooling::last;
  bool normalize = true;
  bool activation = true;
};

/// vLLM's --pooler-config (its older name --override-pooler-config): a JSON object of
/// PoolerConfig's keys. pooling_type LAST, MEAN or CLS (any case: --pooling's last, mean, cls),
/// normalize, and use_activation (or vLLM's older softmax or activation) set what a request
/// that does not say gets. Other keys and pooling types (ALL, STEP, step_tag_id, dimensions,
/// ...) are refused by name; "" is no config.
struct pooler_config {
  std::string pooling = "model";
  std::optional<bool> normalize, activation;
};
[[nodiscard]] result<pooler_config> parse_pooler_config(std::string_view json_text);

/// A model directory's: sentence-transformers' `modules.json`, when present, names a Pooling
/// module (its `config.json`: one of pooling_mode_lasttoken, _mean_tokens or _cls_token) and
/// maybe a Normalize one (normalize is then true, else false). Without modules.json: last-token
/// pooling, normalized (vLLM's default for decoder models). An error names what this server
/// does not compute: an unreadable file, another pooling (max, weighted mean, several at once,
/// include_prompt false) or another module (Dense: it would change the vectors).
/// `pooling` (--pooling, a cluster config model's `pooling`): "model" as above, or last | mean |
/// cls in place of whatever pooling modules.json names (vLLM's --override-pooler-config); its
/// other rules (Normalize, the refused modules) stand. Another value is an error naming them.
/// `config` (--pooler-config): its pooling_type as `pooling` (a different --pooling is an
/// error naming both), its normalize and activation over what the directory says.
[[nodiscard]] result<embedding_defaults> load_embedding_defaults(const std::string& dir, const std::string& pooling = "model",
                                                                 const pooler_config& config = {});

/// The most inputs one request may hold (OpenAI's limit).
inline constexpr size_t max_embedding_inputs = 2048;
/// The most values one /pooling token task may give over all its inputs (each input is bounded
/// by one mesh message, transport::max_embedding): 64 MiB of floats held until the reply, whose
/// JSON takes some 10-15 bytes a value (~200 MB).
inline constexpr size_t max_token_task_values = size_t{1} << 24;

struct embeddings_request {
  std::string model;                  ///< empty: not sent
  std::vector<prompt_input> inputs;   ///< in order; each a string or token ids
  bool base64 = false;                ///< encoding_format "base64": little-endian float32 bytes
  std::optional<int64_t> dimensions;  ///< keep the first k values (then normalize)
  std::optional<bool> normalize;      ///< vLLM's; unset: the model's default
  bool add_special_tokens = true;     ///< vLLM's: text inputs are tokenized with BOS etc.
  int64_t truncate_prompt_tokens = 0; ///< vLLM's: 0 none; k keeps each input's last k tokens; -1 the context
  int32_t priority = 0;               ///< vLLM's
};

/// `input` (a string, an array of strings, an array of token ids or an array of token-id
/// arrays; at most max_embedding_inputs, none empty), `model`, `encoding_format` ("float" or
/// "base64"; null: float), `dimensions` (>= 1), `user` (a string, unused), vLLM's `normalize`,
/// `add_special_tokens`, `truncate_prompt_tokens` (-1 or >= 1) and `priority`; each checked
/// (a 400 naming it). Other fields are ignored, as the other endpoints ignore them.
[[nodiscard]] result<embeddings_request> parse_embeddings_request(std::string_view body);

/// vLLM's POST /score (and /v1/score): text_1 and text_2 each a string or a non-empty array of
/// strings; a string (or an array of one) is paired with every text of the other side, two
/// arrays of one length pair up in order. At most max_embedding_inputs pairs.
struct score_request {
  std::string model;
  std::vector<std::string> text_1, text_2;  ///< as sent (a string: an array of one)
  std::vector<std::pair<size_t, size_t>> pairs;  ///< (index into text_1, index into text_2), in order
  bool add_special_tokens = true;
  int64_t truncate_prompt_tokens = 0;
  int32_t priority = 0;
};
[[nodiscard]] result<score_request> parse_score_request(std::string_view body);

/// vLLM's POST /rerank (and /v1/rerank, /v2/rerank; Jina's and Cohere's shape): `query` a
/// non-empty string, `documents` a non-empty array (at most max_embedding_inputs) of strings
/// or of objects with a string `text`, `top_n` (>= 0; 0 or absent: all), `return_documents`
/// (default true), `model`, and truncate_prompt_tokens, add_special_tokens, priority as above.
struct rerank_request {
  std::string model;
  std::string query;
  std::vector<std::string> documents;
  size_t top_n = 0;
  bool return_documents = true;
  bool add_special_tokens = true;
  int64_t truncate_prompt_tokens = 0;
  int32_t priority = 0;
};
[[nodiscard]] result<rerank_request> parse_rerank_request(std::string_view body);

/// vLLM's /pooling tasks: embed (one vector per input, as /v1/embeddings gives it), classify (a
/// sequence classifier's label values per input), token_embed and token_classify (the same for
/// every prompt position: vLLM's ALL pooling).
enum class pooling_task { embed, classify, token_embed, token_classify };

/// /pooling's fields beside /v1/embeddings' (which parse_embeddings_request reads from the same
/// body): `task` (one of the four; unset: the model's own — token_classify for a reward model,
/// classify for another sequence classifier, embed otherwise) and vLLM's `use_activation`, read
/// after its deprecated `softmax` and `activation` as vLLM reads them (the route reads vLLM's
/// also deprecated `normalize` first: the one switch normalizes an embed task's rows and makes
/// a classify task's logits probabilities; unset: on). Another task, or a field of the wrong
/// type, is a 400 naming it.
struct pooling_fields {
  std::optional<pooling_task> task;
  std::optional<bool> activation;
};
[[nodiscard]] result<pooling_fields> parse_pooling_fields(std::string_view body);
/// The same switch on its own (/classify's: softmax, activation, use_activation; no task).
[[nodiscard]] result<std::optional<bool>> parse_use_activation(std::string_view body);
/// "embed", "classify", "token_embed", "token_classify".
const char* task_name(pooling_task t);

/// One embedding as the response carries it: a JSON array of floats (shortest round-trip
/// text), or base64 of its little-endian float32 bytes, as a JSON string. REQUIRES: finite values.
std::string embedding_json(std::span<const float> v, bool base64);

/// Thread affinity: the connection's. One request's inputs: hands out their mesh requests
/// `window` at a time (the next as each ends), takes the mesh's messages, and renders the list.
class embeddings_output {
 public:
  /// What the reply is: the vectors (/v1/embeddings), the cosine similarity of pairs of inputs
  /// (/score), the documents ranked by their similarity to the query (/rerank: input 0 is
  /// the query, input d + 1 document d), a sequence classifier's labels (/classify), or
  /// /pooling's data: each input's vector (normalized and cut as for embeddings) or a
  /// classifier's values (probabilities with `activation`), one list per input, or with
  /// `per_token` one per prompt position.
  /// With `cross_encoder` (a classifier of one label), /score's and /rerank's inputs are the
  /// pairs themselves (input i: pair i, or the query with document i) and each score is the
  /// sigmoid of its logit, as vLLM scores with a cross-encoder.
  enum class shape { embeddings, score, rerank, classify, pooling };
  struct setup {
    shape kind = shape::embeddings;
    bool cross_encoder = false;
    std::vector<std::string> labels;  ///< a classifier's label names, by index (each vector has as many values)
    /// A classifier's logits become probabilities (softmax over two or more labels, a sigmoid
    /// for one); false: as they are (vLLM's `activation: false`, or a cross-encoder whose
    /// sentence-transformers activation is Identity).
    bool activation = true;
    /// /pooling's token tasks: the replica sends every prompt position's values ([prompt][width]
    /// with `width` the hidden size, or the labels' count for a classifier: set by
    /// api_service::pooling_job) and each row is
    /// finished (cut, normalized) and rendered on its own.
    bool per_token = false;
    size_t width = 0;
    std::vector<std::pair<size_t, size_t>> pairs;  ///< score: the inputs compared, in data order
    std::vector<std::string> documents;            ///< rerank: returned with each result (empty: none)
    size_t top_n = 0;                              ///< rerank: results at most (0: all)
    std::string id;  ///< "embd-…", "score-…", "rerank-…", "classify-…", "pool-…"
    int64_t created = 0;
    std::string model;
    bool base64 = false;
    size_t dimensions = 0;  ///< values kept of each vector (0: all)
    bool normalize = true;
    size_t window = 32;     ///< inputs in flight at most (>= 1)
    /// Counts each input's prompt tokens (llmesh_prompt_tokens_total) as its vector comes (may be null).
    actors::metrics_registry* metrics = nullptr;
  };
  /// `requests`: one per input, in input order, each an embedding request of one input.
  embeddings_output(setup s, std::vector<actors::replica_request> requests);

  /// The mesh requests to submit now, each handed out once.
  std::vector<actors::replica_request> take_submissions();
  /// Takes one message of any input's request (unknown ids and messages after the end are ignored).
  void on_message(const actors::token_msg& t);
  /// Every input has its vector, or one failed.
  bool done() const { return done_; }
  const std::optional<error>& failure() const { return failure_; }
  /// Requests submitted that have not ended (to cancel when the response ends early).
  std::vector<uint64_t> running() const;
  /// The response (its shape), or the failure. REQUIRES: done().
  http_reply reply() const;
  /// Input i's vector as it goes out (per_token: its rows one after another). REQUIRES:
  /// done() without a failure.
  const std::vector<float>& vector(size_t i) const { return inputs_.at(i).vector; }
  /// The dot product of two inputs' vectors (their cosine similarity when normalized), in double.
  double similarity(size_t a, size_t b) const;
  /// /score's pair i, or /rerank's document i: a similarity, or a cross-encoder's sigmoid.
  double pair_score(size_t i) const;
  size_t prompt_tokens() const { return prompt_tokens_; }
  size_t size() const { return inputs_.size(); }
  /// The response's id and model (its trace span names them).
  const std::string& id() const { return s_.id; }
  const std::string& model() const { return s_.model; }
  /// The slowest input's time on its replica (replica_times::keep_slower).
  const actors::replica_times& times() const { return times_; }

 private:
  struct input {
    actors::replica_request request;
    bool submitted = false, ended = false;
    std::vector<float> vector;  ///< as it goes out: cut to dimensions, normalized (per_token: each row)
    size_t rows = 1;            ///< per_token: the prompt's positions
  };
  /// The replica's pooled state as the response carries it.
  std::vector<float> finish_vector(std::vector<float> v) const;
  http_reply classify_reply() const;
  http_reply pooling_reply() const;
  /// `{"id":…,"object":"list","created":…,"model":…,"data":[` of the vector replies.
  std::string list_head() const;
  void fail(error e);

  setup s_;
  std::vector<input> inputs_;
  size_t next_ = 0, in_flight_ = 0, ended_ = 0, prompt_tokens_ = 0;
  std::optional<error> failure_;
  bool done_ = false;
  actors::replica_times times_;
};

}  // namespace llmesh::gateway
