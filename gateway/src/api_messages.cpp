// Anthropic's Messages API on the HTTP API (api_service.hpp): POST /v1/messages as the chat
// request it means (messages_api.hpp), POST /v1/messages/count_tokens as the prompt its chat
// template renders; every answer of these routes in Anthropic's shape.
#include "json_reply.hpp"
#include "llmesh/gateway/api_service.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

/// An error reply in Anthropic's shape (the status as ours).
http_reply anthropic(http_reply r) {
  if (r.status >= 400) r.body = messages_error_body(r.body, r.status);
  return r;
}

/// A chat error's message with the chat fields named as the Messages API names them.
std::string renamed(std::string message) {
  for (auto [from, to] : {std::pair<std::string_view, std::string_view>{"'stop'", "'stop_sequences'"},
                          {"'response_format'", "'output_config.format'"},
                          {".function.parameters", ".input_schema"}}) {
    for (size_t at = 0; (at = message.find(from, at)) != std::string::npos; at += to.size()) message.replace(at, from.size(), to);
  }
  return message;
}
error renamed(error e) {
  e.message = renamed(std::move(e.message));
  return e;
}

}  // namespace

api_outcome api_service::messages_route(std::string_view method, std::string_view path, std::string_view authorization,
                                        std::string_view body) {
  if (!authorized(authorization)) {
    return anthropic(error_reply(make_error(errc::unauthorized, "missing or wrong API key (send 'x-api-key: KEY' or 'Authorization: Bearer KEY')")));
  }
  if (method != "POST") {
    http_reply r = anthropic(error_reply(make_error(errc::invalid_request, std::string(method) + " is not allowed on " + std::string(path))));
    r.status = 405;
    r.headers.emplace_back("Allow", "POST");
    return r;
  }
  if (path == "/v1/messages/count_tokens") return count_message_tokens(body);
  api_outcome out = messages(body);
  if (auto* r = std::get_if<http_reply>(&out)) return anthropic(std::move(*r));
  return out;
}

api_outcome api_service::messages(std::string_view body) {
  auto j = parse_request_object(body);
  if (!j) return error_reply(j.err());
  auto chat = messages_to_chat(*j);
  if (!chat) return error_reply(chat.err());
  api_outcome out = chat_completions(detail::dumped(*chat), nullptr, /*as_messages=*/true);
  if (auto* r = std::get_if<http_reply>(&out); r && r->status >= 400) {  // the chat path's refusal, in this API's words
    json e = json::parse(r->body, nullptr, false);
    if (e.is_object() && e.contains("error") && e["error"].is_object() && e["error"].contains("message") && e["error"]["message"].is_string()) {
      e["error"]["message"] = renamed(e["error"]["message"].get<std::string>());
      r->body = detail::dumped(e);
    }
  }
  return out;
}

http_reply api_service::count_message_tokens(std::string_view body) {
  auto j = parse_request_object(body);
  if (!j) return anthropic(error_reply(j.err()));
  auto chat = messages_to_chat(*j, /*counting=*/true);
  if (!chat) return anthropic(error_reply(chat.err()));
  auto r = parse_chat_request(detail::dumped(*chat), opt_.limits);
  if (!r) return anthropic(error_reply(renamed(r.err())));
  auto m = find(r->model);
  if (!m) return anthropic(error_reply(m.err()));
  if (!(*m)->chat) {
    return anthropic(error_reply(make_error(errc::invalid_request, "the model '" + (*m)->name + "' has no chat template")));
  }
  auto prompt = chat_prompt(*r, **m);
  if (!prompt) return anthropic(error_reply(renamed(prompt.err())));
  return detail::json_body({{"input_tokens", prompt->second.size()}});
}

}  // namespace llmesh::gateway
