// OpenAI's Responses API (POST /v1/responses, as vLLM serves it), a plain class pair over the
// chat endpoint: a request is translated into the chat request it means — `instructions` and
// `input` (a string, or message / function_call / function_call_output items) become messages,
// flat function tools become chat tools, `text.format` a response_format, `max_output_tokens`
// max_completion_tokens — which api_service then checks and runs as any chat request (template,
// tool calls, reasoning parser, structured outputs); the chat output (the whole chat.completion,
// or its SSE chunks) is translated back into a `response` object, or into the Responses API's
// typed stream events (response.created ... response.output_text.delta ... response.completed).
//
// Responses are stored (response_store.hpp; `store`, true by default, as OpenAI's) so that a
// request may continue one with `previous_response_id`: that response's conversation (its
// input items and output, after its own predecessors') comes before the new input.
// `background` runs a response without its connection (background_runs.hpp); `conversation`
// continues and extends a conversation (api_conversations.cpp). Stored prompts are refused with
// a 400 naming them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"

namespace llmesh::gateway {

struct usage_counts;

/// What a response repeats of its request (OpenAI's response object echoes these).
struct responses_echo {
  nlohmann::ordered_json instructions;        ///< null or the string sent
  nlohmann::ordered_json max_output_tokens;   ///< null or the integer sent
  nlohmann::ordered_json temperature = 1.0;   ///< as sent, else OpenAI's default
  nlohmann::ordered_json top_p = 1.0;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  ///< as sent
  nlohmann::ordered_json tool_choice = "auto";
  bool parallel_tool_calls = true;
  nlohmann::ordered_json text = {{"format", {{"type", "text"}}}};
  nlohmann::ordered_json reasoning = {{"effort", nullptr}, {"summary", nullptr}};
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
  nlohmann::ordered_json user;  ///< null or the string sent
  nlohmann::ordered_json prompt_cache_key;  ///< null or the string sent
  nlohmann::ordered_json previous_response_id;  ///< null or the id continued
  bool store = false;  ///< whether the response is kept (the request's `store` and the server's store)
  bool background = false;  ///< the request's `background` (the caller checks it against store)
  nlohmann::ordered_json conversation;  ///< null, or {"id": ...}: the conversation it continues
  std::string truncation = "disabled";  ///< or "auto": the oldest items give way to fit the context
};

/// The conversation `earlier` and the request's input with their first `k` items left out
/// (earlier's first, then the input's): what truncation "auto" sends. REQUIRES: the input is
/// a string or an array, and k leaves at least one input item.
std::pair<nlohmann::ordered_json, nlohmann::ordered_json> without_first_items(const nlohmann::ordered_json& body,
                                                                              const nlohmann::ordered_json& earlier, size_t k);

/// A Responses request as the chat request it means, or an invalid_request naming the field.
/// Fills `echo` (but previous_response_id and store, which the caller sets). `earlier`: the
/// items of a previous response's conversation (stored_response::conversation), before the
/// input. The chat body asks for usage on a stream (the final event carries it). With
/// `background` the chat request is always streamed (a background run renders events, whether
/// or not its client reads them).
[[nodiscard]] result<nlohmann::ordered_json> responses_to_chat(const nlohmann::ordered_json& body, responses_echo& echo,
                                                               const nlohmann::ordered_json& earlier = nlohmann::ordered_json::array());

/// The request's `input` as input items, for storing (REQUIRES: responses_to_chat accepted
/// it): a string is one user message with an input_text part. Items without an `id` get
/// "<msg|fc|fco|rs>_<hex>in<index>" (hex: the response id's unique part).
nlohmann::ordered_json responses_input_items(const nlohmann::ordered_json& body, std::string_view hex);

/// OpenAI's list of items (a stored response's input_items, a conversation's items):
/// `limit` 1..100 (default 20), `order` asc | desc (default desc), `after` an item id (the items
/// past it in that order); a 400 naming the parameter otherwise.
[[nodiscard]] result<nlohmann::ordered_json> items_page(const nlohmann::ordered_json& items, std::string_view query);

/// Thread affinity: the connection's. Renders one response from its chat output.
class responses_renderer {
 public:
  /// `id` is the chat response's ("chatcmpl-<hex>"): the response is "resp_<hex>", its items
  /// "msg_/rs_/fc_<hex><output index>" (the hex part has a fixed length).
  responses_renderer(responses_echo echo, std::string_view id, int64_t created, std::string model);
  /// Called once with the final response object (completed, incomplete or failed) as it is
  /// rendered, whole or streamed; not for an error reply or a stream cut short.
  void on_final(std::function<void(const nlohmann::ordered_json&)> f) { on_final_ = std::move(f); }
  /// The id's unique part ("resp_" + hex() is the response's id).
  const std::string& hex() const { return hex_; }

  /// The whole chat.completion body → the response object's body (an error body passes as is).
  std::string whole(std::string_view chat_body) const;
  /// Chat SSE bytes (any number of whole `data: ...` events) → the Responses stream's events
  /// (`event: TYPE\ndata: {...}\n\n`, each with its sequence_number).
  std::string stream(std::string_view chat_sse);

  // Background mode (background_runs.hpp), on the streamed rendering.
  /// The first events, before any output: response.created and response.queued (status
  /// "queued"); the first chunk then sends response.in_progress.
  std::string queued();
  /// The response as it stands: status "queued" until the first chunk, then "in_progress",
  /// with the items so far (the open one as written so far, "in_progress"); once ended, the
  /// final response.
  nlohmann::ordered_json snapshot() const;
  /// Ends the response as cancelled: the open item closes "incomplete", on_final gets the
  /// response with status "cancelled" and `so_far` as its usage, which is returned. It sends
  /// no event (OpenAI's stream has none for it: the stream just ends). REQUIRES: !ended().
  nlohmann::ordered_json cancel(const usage_counts& so_far);
  /// The failure of a run that produced nothing (no replica, refused): the response.failed
  /// event, after on_final got the failed response.
  std::string fail(const error& e);
  /// A final response has been rendered (completed, incomplete, failed or cancelled).
  bool ended() const { return ended_; }

 private:
  enum class open_kind { none, reasoning, message, call };
  nlohmann::ordered_json response_object(std::string_view status, const nlohmann::ordered_json& output,
                                         const nlohmann::ordered_json& usage, std::string_view finish) const;
  std::string event(std::string_view type, nlohmann::ordered_json body);
  std::string item_id(std::string_view prefix, size_t index) const;
  std::string whole_of(std::string_view chat_body) const;
  std::string on_chunk(const nlohmann::ordered_json& chunk);
  std::string open(open_kind kind, const nlohmann::ordered_json& call = nullptr);
  std::string close_open();
  std::string item_status() const;
  std::string finish();

  responses_echo echo_;
  std::function<void(const nlohmann::ordered_json&)> on_final_;
  std::string hex_;  ///< the id's unique part
  int64_t created_;
  std::string model_;
  // The stream's state.
  uint64_t seq_ = 0;
  bool started_ = false, ended_ = false, failed_ = false;
  bool queued_ = false;  ///< queued() sent; the first chunk sends response.in_progress
  nlohmann::ordered_json final_;  ///< the final response, once ended
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();  ///< items closed so far
  open_kind open_ = open_kind::none;
  nlohmann::ordered_json item_;  ///< the open item
  std::string text_;             ///< the open item's text (message, reasoning) or arguments (call)
  std::string finish_reason_;
  nlohmann::ordered_json logprobs_ = nlohmann::ordered_json::array();  ///< the open message's token entries
  bool logprobs_wanted_ = false;  ///< the chunks carry logprobs: output_text parts hold theirs
  nlohmann::ordered_json usage_;
};

}  // namespace llmesh::gateway
