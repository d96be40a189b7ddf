// OpenAI's Responses API (POST /v1/responses, as vLLM serves it), a plain class pair over the
// chat endpoint: a request is translated into the chat request it means — `instructions` and
// `input` (a string, or message / function_call / function_call_output items) become messages,
// flat function tools become chat tools, `text.format` a response_format, `max_output_tokens`
// max_completion_tokens — which api_service then checks and runs as any chat request (template,
// tool calls, reasoning parser, structured outputs); the chat output (the whole chat.completion,
// or its SSE chunks) is translated back into a `response` object, or into the Responses API's
// typed stream events (response.created ... response.output_text.delta ... response.completed).
//
// The server keeps no responses: `previous_response_id`, `conversation`, `background` and
// stored prompts are refused with a 400 naming them; the response says `"store": false`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"

namespace llmesh::gateway {

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
};

/// A Responses request as the chat request it means, or an invalid_request naming the field.
/// Fills `echo`. The chat body asks for usage on a stream (the final event carries it).
[[nodiscard]] result<nlohmann::ordered_json> responses_to_chat(const nlohmann::ordered_json& body, responses_echo& echo);

/// Thread affinity: the connection's. Renders one response from its chat output.
class responses_renderer {
 public:
  /// `id` is the chat response's ("chatcmpl-<hex>"): the response is "resp_<hex>", its items
  /// "msg_/rs_/fc_<hex><output index>" (the hex part has a fixed length).
  responses_renderer(responses_echo echo, std::string_view id, int64_t created, std::string model);

  /// The whole chat.completion body → the response object's body (an error body passes as is).
  std::string whole(std::string_view chat_body) const;
  /// Chat SSE bytes (any number of whole `data: ...` events) → the Responses stream's events
  /// (`event: TYPE\ndata: {...}\n\n`, each with its sequence_number).
  std::string stream(std::string_view chat_sse);

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
  std::string hex_;  ///< the id's unique part
  int64_t created_;
  std::string model_;
  // The stream's state.
  uint64_t seq_ = 0;
  bool started_ = false, ended_ = false, failed_ = false;
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
