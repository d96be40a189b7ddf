// One generation's output as the client sees it, a plain class: tokens from the mesh in,
// text out — streamed as SSE chunks shaped like OpenAI's, or gathered into one response —
// with UTF-8 kept whole across tokens (stream_decoder), stop strings matched across token
// boundaries (stop_matcher), finish reasons, usage, and the serving latency metrics.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "llmesh/actors/metrics.hpp"
#include "llmesh/actors/token_stream.hpp"
#include "llmesh/gateway/stop_matcher.hpp"
#include "llmesh/model/detokenizer.hpp"

namespace llmesh::gateway {

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
  bool streaming = false;
  bool include_usage = false;
  bool return_token_ids = false;
  std::string id;  ///< "cmpl-…" / "chatcmpl-…"
  int64_t created = 0;
  std::string model;
  std::vector<int32_t> prompt_ids;
  std::vector<std::string> stop;
  /// The request's stop_token_ids: a generation that ends on one (finish eos) keeps the id in
  /// token_ids but not its text, as vLLM does (include_stop_str_in_output off).
  std::vector<int32_t> stop_token_ids;
};

/// Thread affinity: the connection's.
class completion_stream {
 public:
  completion_stream(stream_setup s, const model::detokenizer& d, actors::metrics_registry* metrics);

  /// Takes one message of the request's stream. Returns the SSE bytes to send now (streaming
  /// only; may be empty). After a failure with nothing sent yet it returns "": answer with
  /// error_reply(*failure()) instead of a stream.
  std::string on_message(const actors::token_msg& t);

  /// The stream has ended (last token, stop string, or failure).
  bool done() const { return done_; }
  /// It ended on a stop string: the request must be cancelled in the mesh.
  bool stopped_by_string() const { return stopped_by_string_; }
  /// Something has been sent (streaming): the HTTP status is committed.
  bool started() const { return started_; }
  const std::optional<error>& failure() const { return failure_; }
  /// Non-streaming: the whole response (or the error); REQUIRES: done().
  http_reply reply() const;

  size_t completion_tokens() const { return tokens_.size(); }

 private:
  std::string chunk(const std::string& text, const std::optional<std::string>& finish, bool with_usage);
  /// Ends the stream; `text` is what the last token released.
  std::string finish(const std::string& reason, std::string text);
  void observe_token();

  stream_setup s_;
  model::stream_decoder decoder_;
  stop_matcher matcher_;
  actors::metrics_registry* metrics_;
  std::chrono::steady_clock::time_point start_, last_;
  std::vector<int32_t> tokens_;
  size_t ids_sent_ = 0;  ///< token ids already carried by a chunk (return_token_ids)
  std::string text_;     ///< non-streaming: the text so far
  std::string finish_reason_;
  std::optional<error> failure_;
  bool done_ = false, stopped_by_string_ = false, started_ = false;
};

}  // namespace llmesh::gateway
