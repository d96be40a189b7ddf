// Anthropic's Messages API (POST /v1/messages and POST /v1/messages/count_tokens, as vLLM,
// SGLang and llama.cpp's server serve it for Anthropic's SDKs and agents), a plain class pair
// over the chat endpoint, as responses_api.hpp is: a request is translated into the chat
// request it means — `system` and `messages` (text, tool_use, tool_result and thinking blocks)
// become chat messages, client tools chat tools, `tool_choice` auto / any / tool / none the chat
// one, `stop_sequences` stop, `output_config.format` a response_format — which api_service
// then checks and runs as any chat request (template, tool calls, reasoning parser, structured
// outputs); the chat output (the whole chat.completion, or its SSE chunks) is translated back
// into a `message` object, or into Anthropic's stream events (message_start,
// content_block_start / _delta / _stop, message_delta, message_stop). Errors on these routes
// have Anthropic's shape ({"type": "error", "error": {"type", "message"}}).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"

namespace llmesh::gateway {

/// A Messages request as the chat request it means, or an invalid_request naming the field
/// (by the Messages API's names). `counting`: a count_tokens request (model, messages, system,
/// tools, tool_choice; nothing about sampling).
[[nodiscard]] result<nlohmann::ordered_json> messages_to_chat(const nlohmann::ordered_json& body, bool counting = false);

/// Anthropic's error type for one of ours (by errc_name, as error_json writes it in "code"):
/// invalid_request_error, authentication_error, not_found_error, rate_limit_error,
/// overloaded_error (no replica), timeout_error, else api_error.
std::string_view messages_error_type(std::string_view code);

/// An OpenAI-shaped error body (error_json's) as Anthropic's error body (its HTTP `status` 413:
/// request_too_large); any other body as it is.
std::string messages_error_body(std::string_view openai_error_body, int status = 0);

/// Thread affinity: the connection's. Renders one message from its chat output.
class messages_renderer {
 public:
  /// `chat_id` is the chat response's ("chatcmpl-<hex>"): the message is "msg_<hex>".
  messages_renderer(std::string_view chat_id, std::string model);

  /// The whole chat.completion body → the message object's body; an error body → Anthropic's.
  /// Blank content (whitespace only: the newlines between thinking and a call) makes no text
  /// block, streamed or whole.
  std::string whole(std::string_view chat_body) const;
  /// Chat SSE bytes (any number of whole `data: ...` events) → the Messages stream's events
  /// (`event: TYPE\ndata: {...}\n\n`). The chat stream must carry usage (include_usage and
  /// continuous_usage_stats, as messages_to_chat asks).
  std::string stream(std::string_view chat_sse);

 private:
  enum class block { none, thinking, text, tool_use };
  std::string on_chunk(const nlohmann::ordered_json& chunk);
  std::string open(block kind, nlohmann::ordered_json content_block);
  std::string close_open();
  std::string finish();
  nlohmann::ordered_json message_delta() const;

  std::string id_;  ///< "msg_<hex>"
  std::string model_;
  bool started_ = false, ended_ = false, delta_sent_ = false;
  block open_ = block::none;
  size_t index_ = 0;  ///< the open (or next) content block's index
  bool tool_used_ = false;
  std::string finish_reason_;
  nlohmann::ordered_json stop_reason_;  ///< the chat chunk's stop_reason (a stop string: stop_sequence)
  nlohmann::ordered_json usage_;        ///< the chat usage as last seen
  std::string held_;  ///< blank text not yet in a block (a text block opens with non-blank text)
};

}  // namespace llmesh::gateway
