// One generation's output as the client sees it — one choice of a response — a plain class:
// tokens from the mesh in, text out — streamed as SSE chunks shaped like OpenAI's, or gathered
// into the choice of a whole response — with UTF-8 kept whole across tokens (stream_decoder),
// stop strings matched across token boundaries (stop_matcher), finish reasons, usage, and the
// serving latency metrics. The response around the choices (the usage chunk, [DONE], errors,
// the whole response) is completion_group's.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "llmesh/actors/metrics.hpp"
#include "llmesh/actors/token_stream.hpp"
#include "llmesh/gateway/openai_api.hpp"
#include "llmesh/gateway/reasoning.hpp"
#include "llmesh/gateway/stop_matcher.hpp"
#include "llmesh/gateway/tool_calls.hpp"
#include "llmesh/model/detokenizer.hpp"

namespace llmesh::gateway {

/// Whether the token that ended a generation (finish eos) is left out of its text, as vLLM
/// leaves it out unless include_stop_str_in_output: one of the request's stop_token_ids, or
/// with skip_special_tokens false a special token (an end id; with skipping on, its text is
/// empty anyway). The HTTP stream and the native API decide alike.
inline bool ending_token_unshown(const actors::token_msg& t, std::span<const int32_t> stop_token_ids, bool skip_special,
                                 const model::detokenizer& d) {
  return t.finish == actors::finish_reason::eos &&
         (std::find(stop_token_ids.begin(), stop_token_ids.end(), t.token) != stop_token_ids.end() ||
          (!skip_special && d.is_special(t.token)));
}

/// A complete HTTP answer (status, content type, body, extra headers).
struct http_reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

/// An OpenAI-shaped error reply for an error (status from http_error_of).
http_reply error_reply(const error& e);

struct stream_setup {
  bool chat = false;
  /// Chat: the role the message names: vLLM's --response-role with a generation prompt, else
  /// the role of the message being continued.
  std::string role = "assistant";
  bool streaming = false;
  bool return_token_ids = false;
  size_t index = 0;  ///< the choice's index in its response (prompt index * n + j)
  std::string id;  ///< "cmpl-…" / "chatcmpl-…"
  int64_t created = 0;
  std::string model;
  std::vector<int32_t> prompt_ids;  ///< this choice's prompt
  /// Text the choice's output begins with, ahead of the generated text: the prompt's text for
  /// OpenAI's echo. Streamed, it rides on the first chunk. It is not searched for stop strings.
  std::string echo_prefix;
  /// Echo with logprobs: the first token's message carries the prompt's scores
  /// (token_msg::prompt_logprobs), and the choice's logprobs begin with one entry per prompt
  /// token (the first: null value, null alternatives; text offsets summing the prompt tokens'
  /// texts from 0), then the generated tokens', their offsets continuing that sum (vLLM's
  /// count: monotonic, though a BOS token's text, say, is not in echo_prefix).
  bool echo_logprobs = false;
  /// -1: none. n >= 0: vLLM's prompt_logprobs (the first token's message carries the scores):
  /// the result's prompt_logprobs, each scored token with its rank and n alternatives.
  int prompt_logprobs = -1;
  std::vector<std::string> stop;
  /// vLLM's include_stop_str_in_output: a stop string, or a stop_token_ids token's text, ends
  /// the text instead of being cut from it.
  bool include_stop_str = false;
  /// vLLM's skip_special_tokens: false keeps special tokens' text; an end token's (a special
  /// token that ends the generation) is still left out unless include_stop_str.
  bool skip_special = true;
  /// vLLM's return_tokens_as_token_ids: logprob entries name tokens "token_id:<id>".
  bool tokens_as_ids = false;
  /// vLLM's --enable-log-outputs: a streamed choice keeps its text too (text()).
  bool keep_text = false;
  /// vLLM's continuous_usage_stats: every chunk carries this choice's usage so far.
  bool continuous_usage = false;
  /// The request's stop_token_ids: a generation that ends on one (finish eos) keeps the id in
  /// token_ids but not its text, as vLLM does (include_stop_str_in_output off).
  std::vector<int32_t> stop_token_ids;
  /// The end ids that name vLLM's stop_reason when they end the generation (api_service: the
  /// request's stop ids and the model's end ids but the tokenizer's EOS).
  std::vector<int32_t> stop_reason_ids;
  /// -1: no logprobs. n >= 0: each token's message carries its logprobs (token_msg::logprobs)
  /// and the choice reports them with the n most likely alternatives.
  int logprobs = -1;
  /// vLLM's min_tokens: no stop string is looked for until the text of token min_tokens + 1
  /// (one may still begin in the earlier text and end there), as vLLM's detokenizer does.
  int min_tokens = 0;
  /// Chat with tools (tool_choice named, "required", or "auto"): the output is shaped into
  /// tool_calls (tool_calls.hpp), streamed or whole.
  tool_output tools;
  /// Chat with the model's reasoning parser: the thinking is split from the content
  /// (reasoning.hpp) before tool calls are looked for in the content.
  reasoning_mode reasoning;
  /// Special tokens whose text is kept (a tool-call parser's markers); others are skipped.
  std::vector<int32_t> keep_special;
};

/// Thread affinity: the connection's.
///
/// Logprobs (stream_setup::logprobs >= 0): a token's entry is reported once some of its text
/// has been released to the client, or once it has none left to release (a stop token id, a
/// special token, a piece of a character the decoder holds): a streamed chunk carries the
/// entries that became ready since the previous chunk, so an entry whose text is held back (a
/// partial UTF-8 character, a possible stop string's start) rides on a later chunk, and the
/// final chunk carries all that are left. Tokens whose whole text a stop string cut away are
/// dropped with it. text_offset is the byte offset of the token's text in the choice's text.
class completion_stream {
 public:
  completion_stream(stream_setup s, const model::detokenizer& d, actors::metrics_registry* metrics);

  /// Takes one message of the request's stream. Returns the SSE chunks to send now (streaming
  /// only; may be empty): this choice's, never [DONE] or a usage chunk. A failure ends the
  /// stream and returns "" (completion_group answers it).
  std::string on_message(const actors::token_msg& t);

  /// The stream has ended (last token, stop string, or failure).
  bool done() const { return done_; }
  /// It ended on a stop string: the request must be cancelled in the mesh.
  bool stopped_by_string() const { return stopped_by_string_; }
  /// A chunk has been produced (streaming).
  bool started() const { return started_; }
  const std::optional<error>& failure() const { return failure_; }
  /// Non-streaming: the whole choice. REQUIRES: done() without failure().
  choice_delta result() const;
  /// This choice's prompt and generated tokens.
  usage_counts usage() const {
    usage_counts u{s_.prompt_ids.size(), tokens_.size(), std::nullopt, cached_};
    if (s_.chat && s_.reasoning.active()) u.reasoning_tokens = count_reasoning_tokens(s_.reasoning, tokens_);
    return u;
  }

  size_t completion_tokens() const { return tokens_.size(); }
  /// The generated ids, the text (whole, or streamed with keep_text) and the finish reason so far.
  const std::vector<int32_t>& token_ids() const { return tokens_; }
  const std::string& text() const { return text_; }
  const std::string& finish_reason() const { return finish_reason_; }
  /// The stop string that ended the text (empty: none did).
  const std::string& stop_string() const { return matcher_.matched(); }
  /// The sum of the generated tokens' log-probabilities, as their messages carried them
  /// (token_msg::logprobs; the request asked for them): best_of's ranking. 0 without them.
  double cumulative_logprob() const { return cumulative_logprob_; }
  /// Its time on the replica, as its messages said (queued and prefill after its first token;
  /// inference once the replica ended it).
  const actors::replica_times& times() const { return times_; }

 private:
  /// An entry not yet reported, with the end of its token's text in the decoded text.
  struct pending_entry {
    logprob_entry entry;
    size_t text_end = 0;
  };

  /// This choice's chunk carrying `text` (the echo prefix ahead of it in the first chunk).
  std::string chunk(const std::string& text, const std::optional<std::string>& finish);
  /// vLLM's stop_reason of the ended stream into c (choice_delta::stop_string / stop_token).
  void stop_reason_into(choice_delta& c) const;
  /// Ends the stream; `text` is what the last token released.
  std::string finish(const std::string& reason, std::string text);
  void observe_token();
  /// Stop strings are matched (more tokens than min_tokens have come).
  bool past_min_tokens() const { return tokens_.size() > static_cast<size_t>(std::max(s_.min_tokens, 0)); }
  /// Token `id`'s entry with its scores `lp` (null values when none): its text and its
  /// alternatives' from the detokenizer, at most s_.logprobs of them.
  logprob_entry entry_of(int32_t id, const kernels::token_logprobs* lp, size_t text_offset) const;
  /// Whether an entry can be reported (see the class comment).
  bool ready(const pending_entry& p) const;
  /// Moves the entries whose text is out (see the class comment) from pending_ to `out`.
  void take_ready(std::vector<logprob_entry>& out);

  stream_setup s_;
  const model::detokenizer& detok_;
  model::stream_decoder decoder_;
  stop_matcher matcher_;
  actors::metrics_registry* metrics_;
  std::chrono::steady_clock::time_point start_, last_;
  std::vector<int32_t> tokens_;
  size_t ids_sent_ = 0;  ///< token ids already carried by a chunk (return_token_ids)
  std::string text_;     ///< non-streaming: the text so far
  size_t decoded_bytes_ = 0;   ///< text the decoder gave the stop matcher (logprobs' offsets)
  size_t released_bytes_ = 0;  ///< text the stop matcher released to the client
  double cumulative_logprob_ = 0.0;
  std::optional<size_t> cached_;  ///< the prompt tokens the prefix cache held (its first token's word)
  actors::replica_times times_;
  std::vector<pending_entry> pending_;  ///< logprobs not reported yet (non-streaming: until result)
  std::vector<logprob_entry> prompt_entries_;  ///< echo with logprobs: reported first, at once
  size_t prompt_text_bytes_ = 0;               ///< their texts' sum: where the generated offsets start
  /// The prompt's entries (echo_logprobs), from the first token's message.
  void take_prompt_entries(const actors::token_msg& t);
  /// vLLM's prompt_logprobs (s_.prompt_logprobs), from the first token's message.
  void take_prompt_scores(const actors::token_msg& t);
  std::optional<std::vector<prompt_logprob_entry>> prompt_scores_;
  /// A generated token's entry as reported: its offset counted in the whole choice text.
  logprob_entry reported(logprob_entry e) const;
  std::string finish_reason_;
  std::optional<int32_t> stop_token_;  ///< the request's stop token that ended it
  std::optional<tool_call_stream> tool_stream_;  ///< streamed chat with s_.tools.shapes()
  std::optional<reasoning_stream> reasoning_stream_;  ///< streamed chat with s_.reasoning.active()
  std::optional<error> failure_;
  bool done_ = false, stopped_by_string_ = false, started_ = false;
};

}  // namespace llmesh::gateway
