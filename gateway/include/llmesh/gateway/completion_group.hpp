// One response's choices, a plain class: a request with several prompts or n > 1 runs one
// generation per choice in the mesh, each rendered by its own completion_stream; the group
// routes the mesh's messages to them by request id and writes what belongs to the response as
// a whole — the usage chunk and [DONE] once, after every choice finished; an error (a reply
// before anything was sent, an event mid-stream); the whole non-streamed response with every
// choice in index order and the usage summed — and says which generations to cancel.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "llmesh/gateway/beam_search.hpp"
#include "llmesh/gateway/completion_stream.hpp"
#include "llmesh/gateway/embeddings_api.hpp"
#include "llmesh/gateway/messages_api.hpp"
#include "llmesh/gateway/responses_api.hpp"

namespace llmesh::gateway {

/// What the choices of one response share.
struct group_setup {
  bool chat = false;
  bool streaming = false;
  bool include_usage = false;  ///< stream_options.include_usage
  std::string id;              ///< "cmpl-…" / "chatcmpl-…"
  int64_t created = 0;
  std::string model;
  /// Choices per prompt (OpenAI's n): choice i is choice i % n of prompt i / n, and usage
  /// counts each prompt's tokens once (as vLLM does), not once per choice.
  size_t n = 1;
  /// OpenAI's best_of, when above n (not streamed): each prompt has this many candidates,
  /// added in order (candidate i is candidate i % best_of of prompt i / best_of); the response
  /// holds each prompt's n with the highest cumulative log-probability (ties: the lower
  /// candidate), best first as vLLM orders them, numbered prompt * n + rank; usage counts every
  /// candidate's tokens. Their requests must carry logprobs (the stream's own setup says
  /// whether to render them).
  size_t best_of = 1;
  /// Generations per prompt.
  size_t candidates() const { return best_of > n ? best_of : n; }
};

/// Thread affinity: the connection's. Owns its streams; borrows the detokenizer and metrics.
///
/// Streamed, the choices' chunks interleave as their tokens arrive, each carrying its index;
/// every choice ends with its own finish_reason chunk; then the usage chunk (include_usage)
/// and [DONE]. A failure of any choice ends the response: before anything was produced,
/// reply() is that error (non-streamed: any failure); after, an error event and [DONE] follow
/// what was sent (the single stream's rule). Either way the other choices are to be cancelled.
class completion_group {
 public:
  completion_group(group_setup g, const model::detokenizer& d, actors::metrics_registry* metrics);

  /// Adds the next choice (its index: the choices added before it; with best_of, the next
  /// candidate), rendering the tokens of the mesh request `request_id`. The fields `s` shares
  /// with the group (chat, streaming, id, created, model) and its index are set here.
  void add_choice(uint64_t request_id, stream_setup s);

  /// use_beam_search: one prompt's search, its choices already added with `choice_ids` (best
  /// beam first). The group feeds the search its steps' messages and hands out its requests
  /// (take_submissions); once it ends, its beams are replayed into those choices as their
  /// tokens (the ones beyond the beams found, when a grammar allowed fewer, are left out of
  /// the response) — streamed, their chunks all go out then, after the search.
  void add_beam_search(std::unique_ptr<beam_search> b, std::vector<uint64_t> choice_ids);
  /// /v1/responses: the chat output this group renders (one choice) goes out as the Responses
  /// API's response object or stream events instead (responses_api.hpp).
  void render_as_responses(std::unique_ptr<responses_renderer> r) { responses_ = std::move(r); }
  /// That renderer (nullptr: a chat or completions response).
  responses_renderer* responses() const { return responses_.get(); }
  /// /v1/messages: the chat output (one choice) goes out as Anthropic's message object or
  /// stream events instead, and an error in Anthropic's shape (messages_api.hpp).
  void render_as_messages(std::unique_ptr<messages_renderer> m) { messages_ = std::move(m); }
  /// /v1/embeddings: the group has no choices; `e` runs the inputs (its requests come out of
  /// take_submissions, a window at a time) and its list is the reply. Not streamed.
  void render_as_embeddings(std::unique_ptr<embeddings_output> e);
  /// That output (nullptr: not a pooling request).
  const embeddings_output* embeddings() const { return embeddings_.get(); }
  /// Requests to submit to the mesh now (beam searches' next steps, embedding inputs), each
  /// handed out once.
  std::vector<actors::replica_request> take_submissions();
  /// The requests handed out by take_submissions still running (to cancel when the response
  /// ends early).
  std::vector<uint64_t> running_searches() const;
  /// The beam searches added, in order, and the choice ids each one's beams become (the native
  /// API replays a finished search into its own choices).
  size_t searches() const { return beams_.size(); }
  const beam_search& search(size_t i) const { return *beams_.at(i).search; }
  const std::vector<uint64_t>& search_choices(size_t i) const { return beams_.at(i).choice_ids; }

  /// Takes one message of any choice's request (t.id picks it; unknown ids and messages after
  /// the end are ignored). Returns the SSE bytes to send now (streaming only; may be empty).
  std::string on_message(const actors::token_msg& t);

  /// Every choice has ended, or one failed.
  bool done() const { return done_; }
  /// Something has been produced (streaming): the HTTP status is committed.
  bool started() const { return started_; }
  const std::optional<error>& failure() const { return failure_; }
  /// Requests to cancel in the mesh now (a choice ended by a stop string; after a failure, the
  /// choices still running); each id is handed out once.
  std::vector<uint64_t> take_cancellations();
  /// Non-streaming (or a failure before anything was produced): the whole response, or the
  /// error. REQUIRES: done().
  http_reply reply() const;

  size_t size() const { return choices_.size(); }
  /// The response's id ("cmpl-…" / "chatcmpl-…") and creation time.
  const std::string& id() const { return g_.id; }
  int64_t created() const { return g_.created; }
  /// What the choices share (chat or not, model, n).
  const group_setup& setup() const { return g_; }
  /// The slowest choice's (or pooled input's) time on its replica (replica_times::keep_slower).
  actors::replica_times times() const;
  const completion_stream& choice(size_t i) const { return *choices_[i].stream; }
  /// Summed over the choices (every best_of candidate); prompt tokens once per prompt.
  usage_counts usage() const;
  /// The choices of the whole response, in index order (with best_of, each prompt's best).
  std::vector<choice_delta> results() const;

 private:
  struct member {
    uint64_t request_id = 0;
    std::unique_ptr<completion_stream> stream;
    bool absent = false;  ///< a beam search's choice with no beam: not in the response
  };
  struct beam_member {
    std::unique_ptr<beam_search> search;
    std::vector<uint64_t> choice_ids;
  };

  /// on_message's chat rendering (what on_message sends, unless responses_ translates it).
  std::string on_chat_message(const actors::token_msg& t);
  /// The ended search's beams as its choices' token messages; returns what to send.
  std::string replay(const beam_member& b);

  /// Ends the response on `e` (see the class comment); returns what to send.
  std::string fail(const error& e);
  /// Every choice has ended: streamed, the usage chunk (include_usage) and [DONE] to send.
  std::string end();
  std::string_view chunk_kind() const { return g_.chat ? "chat.completion.chunk" : "text_completion"; }

  group_setup g_;
  const model::detokenizer& detok_;
  actors::metrics_registry* metrics_;
  std::vector<member> choices_;  ///< in index order
  std::vector<uint64_t> cancels_;
  std::vector<beam_member> beams_;
  std::vector<actors::replica_request> submissions_;
  std::unique_ptr<responses_renderer> responses_;
  std::unique_ptr<messages_renderer> messages_;
  std::unique_ptr<embeddings_output> embeddings_;
  size_t finished_ = 0;
  std::optional<error> failure_;
  bool done_ = false, started_ = false;
};

}  // namespace llmesh::gateway
