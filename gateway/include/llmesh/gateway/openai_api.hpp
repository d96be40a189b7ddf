// The OpenAI-compatible HTTP API's bodies (DESIGN.md §Contracts), without the HTTP: request
// parsing with a one-line error naming the offending field, the one mapping from error kinds
// to HTTP statuses and OpenAI error types, and the response / SSE chunk shapes of
// /v1/completions and /v1/chat/completions. Plain functions over nlohmann::json; the Beast
// server calls them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"
#include "llmesh/gateway/structured_output.hpp"
#include "llmesh/model/constraint.hpp"

namespace llmesh::gateway {

/// Fields both endpoints share. Defaults are OpenAI's (temperature 1, top_p 1, max_tokens 16
/// for completions); top_k is vLLM's extension (0 or -1: off).
struct generation_fields {
  size_t max_tokens = 16;
  bool max_tokens_given = false;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;
  float min_p = 0.0f;  ///< vLLM's min_p within [0, 1] (0: off)
  /// Which of the three the client sent: the others take the model's recommended values
  /// (generation_config.json) where it has them, as vLLM does (api_service applies them once
  /// the request's model is known).
  bool temperature_given = false, top_p_given = false, top_k_given = false;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;     ///< stream_options.include_usage
  /// vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries
  /// its choice's usage so far.
  bool continuous_usage = false;
  bool return_token_ids = false;  ///< extension: prompt_token_ids and token_ids in each choice
  bool ignore_eos = false;        ///< extension (vLLM's): generate max_tokens whatever the EOS
  /// vLLM's include_stop_str_in_output: the stop string (or stop token's text) that ended the
  /// output stays at its end.
  bool include_stop_str = false;
  /// vLLM's skip_special_tokens (default true): false keeps special tokens' text in the output
  /// (an end token's is left out all the same, unless include_stop_str).
  bool skip_special_tokens = true;
  /// vLLM's return_tokens_as_token_ids: logprobs name each token "token_id:<id>" (text and
  /// bytes), so a token whose bytes are not whole UTF-8 stays identifiable.
  bool tokens_as_ids = false;
  /// vLLM's truncate_prompt_tokens: 0 none; k >= 1 keeps the prompt's last k tokens; -1 keeps
  /// the last (model context) tokens. api_service truncates after tokenizing.
  int64_t truncate_prompt_tokens = 0;
  /// vLLM's allowed_token_ids: non-empty, only these tokens may be drawn (at most
  /// request_limits::max_allowed_token_ids; api_service checks them against the vocabulary
  /// and refuses them beside a structured output).
  std::vector<int32_t> allowed_ids;
  /// vLLM's bad_words: none of these words is generated (api_service tokenizes each, as vLLM
  /// does, with and without a leading space; the replica bans a word's last token wherever the
  /// output ends with the rest of it). At most request_limits::max_bad_words, each 1..
  /// max_stop_bytes bytes.
  std::vector<std::string> bad_words;
  /// Set by api_service (chat with a reasoning parser and a constraint): the constraint holds
  /// only after the output shows these tokens ("</think>"'s), so the model thinks freely first.
  std::vector<int32_t> constraint_after;
  /// Extension (vLLM's): generation also ends after any of these ids (finish_reason "stop"),
  /// even with ignore_eos; the id is in token_ids, its text is not in the output. The parser
  /// checks the type and count; api_service checks each against the vocabulary.
  std::vector<int32_t> stop_token_ids;
  /// -1: none. n in 0..kernels::max_logprobs: each generated token comes with its
  /// log-probability and its n most likely alternatives' (completions: `logprobs: n`; chat:
  /// `logprobs: true` with `top_logprobs: n`, 0 when left out). api_service copies it into
  /// the request's sampling.logprobs.
  int logprobs = -1;
  /// -1: none. n >= 0: the prompt's own tokens are scored too (completions' echo with
  /// logprobs n): every prompt token after the first with its log-probability and its n most
  /// likely alternatives' (kernels::sampling_params::prompt_logprobs).
  int prompt_logprobs = -1;
  /// -1: none. n in 0..kernels::max_logprobs: vLLM's `prompt_logprobs` field (both endpoints,
  /// not streamed): the response's prompt_logprobs holds, per prompt token, null for the first
  /// and then {id: {logprob, rank, decoded_token}} for the token and the n most likely at its
  /// position. api_service scores the prompt to max(prompt_logprobs, this).
  int prompt_logprobs_shown = -1;
  /// Penalties on the logits (OpenAI's / vLLM's; api_service copies them into the request's
  /// sampling): presence and frequency within [-penalty_bound, penalty_bound] (0: off),
  /// repetition within (0, max_repetition_penalty] (1: off).
  float presence_penalty = 0.0f, frequency_penalty = 0.0f, repetition_penalty = 1.0f;
  /// vLLM's: the request's end ids (EOS, stop_token_ids) cannot be drawn, and no stop string
  /// ends the text, before this many tokens. 0..max_tokens (the parser checks it against the
  /// max_tokens it knows, api_service against the one the context leaves).
  int min_tokens = 0;
  /// OpenAI's logit_bias: (token id, bias within [-max_logit_bias, max_logit_bias]) pairs, each
  /// id once, in the order sent; api_service checks the ids against the vocabulary.
  std::vector<std::pair<int32_t, float>> logit_bias;
  /// OpenAI's n: choices per prompt, each its own generation (1..request_limits::max_choices,
  /// with the prompts of a batch counted in).
  size_t n = 1;
  /// OpenAI's best_of (completions; 1: off): generations per prompt when more than n, not
  /// streamed; the n with the highest cumulative log-probability are returned.
  size_t best_of = 1;
  /// What the output must match (structured_output.hpp: response_format, guided_*,
  /// structured_outputs, a forced tool call); kind none: anything. Compiled once by the parser
  /// (a bad one is a 400); api_service sets it on every generation of the request.
  model::constraint_spec constraint;
  /// vLLM's use_beam_search: each prompt's n choices are the n best beams of a beam search
  /// of width n (beam_search.hpp; n at most max_beam_width; not streamed; not with best_of).
  bool beam_search = false;
  /// vLLM's length_penalty (beam search): a beam's score is its cumulative log-probability /
  /// len^length_penalty. Finite; 1: vLLM's default.
  double length_penalty = 1.0;
  /// vLLM's priority (lower is served first; request_spec::priority), within int32. Non-zero
  /// only where the server's scheduling policy is priority (api_service refuses it otherwise).
  int32_t priority = 0;
  /// vLLM's cache_salt (non-empty, at most max_cache_salt bytes), as cache_salt_key() makes it
  /// a 64-bit key for the replicas; 0: none.
  uint64_t cache_salt = 0;
  /// OpenAI's prompt_cache_key (at most max_cache_salt bytes; "": none), as cache_salt_key()
  /// makes it: the router sends a key's requests where its last went (replica_request::route_key).
  uint64_t route_key = 0;
  /// Generations per prompt: n, or best_of when above it.
  size_t candidates() const { return best_of > n ? best_of : n; }
};

inline constexpr size_t max_cache_salt = 1024;
/// A cache_salt's key: a 64-bit hash (FNV-1a, then SplitMix64's mix), never 0.
uint64_t cache_salt_key(std::string_view salt);

/// logit_bias values lie within [-100, 100] (OpenAI's range), at most this many entries.
inline constexpr double max_logit_bias = 100.0;
inline constexpr size_t max_logit_bias_entries = 1024;

/// presence_penalty and frequency_penalty lie within [-2, 2] (OpenAI's range).
inline constexpr double penalty_bound = 2.0;
/// repetition_penalty's upper bound. vLLM asks only for a finite value > 0; this server also
/// bounds it (at 10, far past the 1.0-1.5 real uses) so a typo (120 for 1.20) is a 400 rather
/// than a degenerate generation.
inline constexpr double max_repetition_penalty = 10.0;

/// One prompt of a /v1/completions request.
struct prompt_input {
  std::optional<std::string> text;  ///< a string prompt, or
  std::vector<int32_t> ids;         ///< an array of token ids
};

/// One prompt given as token ids (each an integer within 0..INT32_MAX, at least one); `name`
/// says which in errors ("'prompt'", "'input[2]'").
[[nodiscard]] status parse_prompt_ids(const nlohmann::ordered_json& p, const std::string& name, prompt_input& out);

struct completion_request {
  std::string model;
  /// The prompts, in the order sent (one, or a batch): choice index = prompt index * n + j,
  /// as vLLM numbers them.
  std::vector<prompt_input> prompts;
  /// OpenAI's echo: each choice's text begins with its prompt's text; with logprobs, its
  /// logprobs begin with the prompt's tokens (gen.prompt_logprobs).
  bool echo = false;
  /// vLLM's: a text prompt is tokenized with the model's special tokens (BOS), unless false.
  bool add_special_tokens = true;
  generation_fields gen;
};

struct chat_request {
  std::string model;
  /// Validated: objects with a string role and a string (or null) content; content sent as an
  /// array of text parts arrives here joined into one string.
  nlohmann::ordered_json messages;
  generation_fields gen;
  /// tools (for the chat template), tool_choice and parallel_tool_calls (structured_output.hpp).
  tool_request tools;
  /// vLLM's / HF's: end the prompt with the assistant's turn opened (default), or continue the
  /// final message (a prefilled answer; chat_template::render_continuing). Not both.
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  /// vLLM's: the rendered text is tokenized without special tokens (the template writes
  /// them), unless true.
  bool add_special_tokens = false;
  /// vLLM's chat_template_kwargs: more variables for the template (e.g. enable_thinking);
  /// an object, or null. `tools` comes from the request's tools, not from here.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  /// vLLM's include_reasoning: with a reasoning parser, false leaves "reasoning_content" out.
  bool include_reasoning = true;
};

/// vLLM's POST /tokenize: a prompt string (add_special_tokens true unless sent) or chat
/// messages rendered by the model's chat template (add_special_tokens false unless sent,
/// add_generation_prompt true unless sent, `tools` passed to the template).
struct tokenize_request {
  std::string model;  ///< empty: not sent
  std::optional<std::string> prompt;
  std::optional<nlohmann::ordered_json> messages;  ///< validated as chat's
  nlohmann::ordered_json tools;                    ///< null or the tools array, for the template
  bool add_special_tokens = true;
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  bool return_token_strs = false;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  ///< as chat's
};

/// vLLM's POST /detokenize.
struct detokenize_request {
  std::string model;  ///< empty: not sent
  std::vector<int32_t> tokens;
};

/// Bounds a request must respect (the server's flags).
struct request_limits {
  size_t max_tokens = 4096;    ///< largest max_tokens accepted
  size_t max_stop = 4;         ///< stop strings (OpenAI's limit)
  size_t max_stop_bytes = 256;
  size_t max_messages = 1024;
  /// stop_token_ids per request: each is one comparison per generated token in the
  /// scheduler, and real uses (a model's end-of-turn ids) need a handful; 64 leaves room.
  size_t max_stop_token_ids = 64;
  size_t max_allowed_token_ids = 1 << 18;  ///< vLLM's allowed_token_ids (a whole 256k vocabulary)
  /// vLLM's bad_words: each word's tokens are compared with the output's end at every step.
  size_t max_bad_words = 128;
  /// Choices per request (prompts × n, or × best_of when larger): each is a generation in
  /// the mesh and a slot of the concurrency bound; 64 covers real uses (a few prompts at
  /// n = 16) while one request cannot fill the mesh alone.
  size_t max_choices = 64;
  /// Alternatives per token a request may ask for (logprobs, top_logprobs, prompt_logprobs):
  /// vLLM's --max-logprobs, at most the engine's kernels::max_logprobs.
  int max_logprobs = 20;  // kernels::max_logprobs (openai_api.cpp asserts it)
};

/// Sampling fields as a client sent them, before any check, in types wide enough for every
/// out-of-range value a wire format can carry (nullopt: not sent, the default stays).
struct sampling_input {
  std::optional<int64_t> max_tokens;
  const char* max_tokens_name = "max_tokens";  ///< the client's name for it (chat: max_completion_tokens)
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
};

/// The one check of sampling fields that both client APIs share — the HTTP API (in
/// parse_*_request) and the native RPC API (api_service::native_generate): max_tokens within
/// 1..lim.max_tokens, temperature within [0, 2], top_p within [0, 1] (NaN and infinities are
/// refused), top_k -1 or 0 (off; stored as 0) or positive. Sets the given fields of `g`; an
/// invalid_request error names the first bad field as the HTTP API spells it.
[[nodiscard]] status apply_sampling(const sampling_input& in, const request_limits& lim, generation_fields& g);

/// The native API's fields beyond sampling, as a JSON object of /v1/completions' names
/// (presence_penalty, frequency_penalty, repetition_penalty, min_tokens, min_p, stop_token_ids,
/// allowed_token_ids, stop, logit_bias, include_stop_str_in_output, skip_special_tokens,
/// return_tokens_as_token_ids, truncate_prompt_tokens, use_beam_search, length_penalty, and one
/// of guided_json / guided_regex / guided_choice / guided_grammar / response_format), checked
/// by the same rules into `g` (whose max_tokens and n are final).
[[nodiscard]] status apply_extra_fields(const nlohmann::ordered_json& fields, const request_limits& lim,
                                        generation_fields& g);

/// A request body, every field checked (an invalid_request error names the first bad one).
/// Log-probabilities: /v1/completions takes `logprobs` as an integer 0..kernels::max_logprobs
/// (false and null: none; true is refused, as the endpoint wants a count) and refuses
/// `top_logprobs` > 0 (a chat field); /v1/chat/completions takes `logprobs` as a boolean (0 and
/// 1 too, as vLLM's coercion does) and `top_logprobs` 0..max_logprobs, which above 0 needs
/// `logprobs: true` (OpenAI's rule). Penalties and min_tokens (vLLM's rules, null: the
/// neutral value): `presence_penalty` and `frequency_penalty` numbers within [-2, 2],
/// `repetition_penalty` a number > 0 and <= 10, `min_tokens` an integer from 0 to the
/// request's max_tokens (completions: 16 when left out; chat: the server's limit, and
/// api_service checks it again against what the context leaves). `logit_bias` is an object of
/// token-id strings ("50256") to numbers within [-100, 100], at most 1024 entries; `min_p` a
/// number within [0, 1]. `n` an integer >= 1 (null: 1) on both endpoints; /v1/completions'
/// `prompt` a string, an array of token ids, or a batch: an array of strings or an array of
/// token-id arrays (each non-empty, one kind); prompts × n (× best_of when larger) at most
/// lim.max_choices. `echo` (completions) true or false; with `logprobs` n (not null or false)
/// the prompt is scored too (gen.prompt_logprobs = n).
/// `best_of` (completions) an integer >= 1 (null and 1: off); above 1 it must be at least n and
/// the request not streamed (vLLM's rules). Structured outputs (both endpoints) and tools
/// (chat; on /v1/completions a non-empty `tools` is refused) as parse_output_constraint and
/// parse_tools take them; chat messages' tool calls as normalize_tool_calls does
/// (structured_output.hpp). Fields asking for behaviour this server does not implement are
/// refused rather than ignored — chat's `best_of` > 1, a non-empty `suffix` — while their
/// neutral values (null, false, 0, empty; 1 for best_of), which many clients always send, are
/// accepted. Other unknown fields are ignored.
[[nodiscard]] result<completion_request> parse_completion_request(std::string_view body, const request_limits& lim);
[[nodiscard]] result<chat_request> parse_chat_request(std::string_view body, const request_limits& lim);
/// A request body as a JSON object, its nesting bounded as every endpoint's is (a 400 naming
/// the problem otherwise).
[[nodiscard]] result<nlohmann::ordered_json> parse_request_object(std::string_view body);
/// /tokenize and /detokenize bodies: `model` optional (a non-empty string when sent); exactly
/// one of `prompt` (a string) and `messages` (as chat's); `tokens` an array of non-negative
/// 32-bit integers (the vocabulary is checked by the caller). `add_generation_prompt` and
/// `continue_final_message` as chat's (not both true); unknown fields are ignored.
[[nodiscard]] result<tokenize_request> parse_tokenize_request(std::string_view body, const request_limits& lim);
[[nodiscard]] result<detokenize_request> parse_detokenize_request(std::string_view body);

/// HTTP status and OpenAI error type of an error kind: the gateway's single mapping.
struct http_error_kind {
  int status;
  std::string_view type;
};
http_error_kind http_error_of(errc code);

/// {"error":{"message":...,"type":...,"code":...}} for an error.
std::string error_json(const error& e);

struct usage_counts {
  size_t prompt_tokens = 0, completion_tokens = 0;
  /// Of the completion tokens, those of the thinking (count_reasoning_tokens); set only where a
  /// reasoning parser applies, and shown then as completion_tokens_details.reasoning_tokens.
  std::optional<size_t> reasoning_tokens = std::nullopt;
  /// Of the prompt tokens, those the replica's prefix cache held (its first token said so),
  /// shown as prompt_tokens_details.cached_tokens; unset when no replica reported it.
  std::optional<size_t> cached_tokens = std::nullopt;
};

/// A token as a logprobs report shows it.
struct logprob_token {
  /// Its text: its bytes as UTF-8, where a piece that is not whole UTF-8 (a byte-level token
  /// holding part of a character) shows U+FFFD per bad sequence, as a decode of the one id
  /// does in HF (vLLM's token strings); special tokens show their content.
  std::string text;
  std::string bytes;  ///< its raw bytes (chat's "bytes": joined, they give the exact text)
  /// NaN: unknown (rendered null); below -9999 (-inf: a masked token) rendered -9999.0, as vLLM does.
  float logprob = 0.0f;
};

/// One generated token's log-probabilities.
struct logprob_entry {
  logprob_token chosen;
  std::vector<logprob_token> top;  ///< the n most likely, most likely first
  size_t text_offset = 0;          ///< byte offset of its text in the choice's whole text (completions)
  bool top_null = false;           ///< no alternatives known (an echoed prompt's first token): null
};

/// One token of a vLLM prompt_logprobs entry: {id: {"logprob", "rank", "decoded_token"}}.
struct prompt_logprob_item {
  int32_t id = 0;
  float logprob = 0.0f;
  int32_t rank = 0;  ///< in its row (1: the most likely)
  std::string text;  ///< the token's text
};
/// A prompt token's entry: null (the first token, or no scores), or the token itself then the
/// n most likely at its position (the token once if it is among them).
using prompt_logprob_entry = std::optional<std::vector<prompt_logprob_item>>;

/// One tool call of a chat choice, or a piece of one in a streamed delta.
struct tool_call_delta {
  size_t index = 0;       ///< streamed: which call of the choice this piece belongs to
  std::string id;         ///< "chatcmpl-tool-…"; streamed: only on a call's first piece
  std::string name;       ///< the function; streamed: only on a call's first piece
  std::string arguments;  ///< JSON text (streamed: the next piece of it)
};

/// One choice of a response or chunk.
struct choice_delta {
  size_t index = 0;                   ///< the choice's index (prompt index * n + j)
  std::string text;                   ///< completion text, or the chat delta's content
  std::optional<std::string> finish;  ///< "stop", "length", or none (mid-stream)
  /// vLLM's stop_reason, rendered beside finish_reason (on a whole choice and a completions
  /// chunk always, on a chat chunk with the finish): the stop string that ended the text, else
  /// the request's stop_token_ids id that did, else null (the model's end id, the length).
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token;
  std::vector<int32_t> token_ids;     ///< with return_token_ids
  std::vector<int32_t> prompt_token_ids;
  bool with_token_ids = false;
  bool role = false;                  ///< chat: the first chunk carries the role
  std::string role_name = "assistant";  ///< chat: the role a message or first chunk names (vLLM's --response-role)
  /// nullopt: "logprobs": null (not asked for). Otherwise these tokens' entries: completions
  /// {"text_offset", "token_logprobs", "tokens", "top_logprobs": [{text: logprob} with the
  /// chosen token first, then the alternatives]}; chat {"content": [{"token", "logprob",
  /// "bytes", "top_logprobs": [{"token", "logprob", "bytes"}...]}]}.
  std::optional<std::vector<logprob_entry>> logprobs;
  /// Chat: the message's (or delta's) tool_calls. A whole message renders each as {"id",
  /// "type": "function", "function": {"name", "arguments"}}; a delta as {"index", "id" and
  /// "type" (where id is set), "function": {"name" (where set), "arguments"}}. Empty: no
  /// "tool_calls" key.
  std::vector<tool_call_delta> tool_calls;
  /// vLLM's prompt_logprobs (generation_fields::prompt_logprobs_shown; never streamed): one
  /// entry per prompt token. Completions: on each choice; chat: once, on the response (its
  /// first choice's: every choice shares the prompt).
  std::optional<std::vector<prompt_logprob_entry>> prompt_logprobs;
  /// Chat with a reasoning parser (reasoning.hpp): the message's or delta's "reasoning_content".
  /// A whole message with it set and no content renders "content": null (vLLM's).
  std::optional<std::string> reasoning;
};

/// Whether a streamed delta carries nothing a client needs (no text, reasoning, finish, role,
/// tool call, token ids or logprob entries): such deltas are not sent.
bool empty_delta(const choice_delta& c);

/// A whole (non-streamed) response with these choices, in the order given. kind:
/// "text_completion" or "chat.completion".
std::string response_json(std::string_view kind, std::string_view id, int64_t created, std::string_view model,
                          const std::vector<choice_delta>& choices, const usage_counts& u);
/// One streamed chunk ("text_completion" or "chat.completion.chunk"); with `u`, its usage so
/// far (vLLM's continuous_usage_stats); OpenAI's include_usage adds a usage_chunk_json last.
std::string chunk_json(std::string_view kind, std::string_view id, int64_t created, std::string_view model,
                       const choice_delta& c, const std::optional<usage_counts>& u = std::nullopt);
/// The usage-only final chunk OpenAI sends with include_usage (empty choices).
std::string usage_chunk_json(std::string_view kind, std::string_view id, int64_t created, std::string_view model,
                             const usage_counts& u);

/// "data: <json>\n\n"
std::string sse_event(std::string_view json);
inline constexpr std::string_view sse_done = "data: [DONE]\n\n";

}  // namespace llmesh::gateway
