// OpenAI API responses (openai_api.hpp): whole responses, streamed chunks, errors and the
// logprob shapes, as OpenAI's API and vLLM's extensions render them. The requests are parsed in
// openai_api.cpp.
#include <charconv>
#include <cmath>

#include "llmesh/gateway/openai_api.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

/// A log-probability as vLLM renders it: below -9999 (-inf: a masked token) -9999.0, NaN (none
/// known) null. Written with the float's shortest decimal form ("-0.1", not the double
/// -0.10000000149011612 a widening gives): the same float when read back as one.
json logprob_json(float v) {
  if (std::isnan(v)) return nullptr;
  if (v < -9999.0f) return -9999.0;
  char buf[32];
  auto written = std::to_chars(buf, buf + sizeof buf, v);
  double d = v;
  if (written.ec == std::errc()) std::from_chars(buf, written.ptr, d);  // locale-free both ways
  return d;
}

json byte_list(const std::string& bytes) {
  json out = json::array();
  for (char b : bytes) out.push_back(static_cast<unsigned char>(b));
  return out;
}

/// The legacy completions shape. Each top_logprobs dict holds the chosen token and then the
/// alternatives, keyed by text (vLLM's: tokens of equal text share one key, the later value).
json completion_logprobs_json(const std::vector<logprob_entry>& entries) {
  json offsets = json::array(), values = json::array(), tokens = json::array(), tops = json::array();
  for (const auto& e : entries) {
    offsets.push_back(e.text_offset);
    values.push_back(logprob_json(e.chosen.logprob));
    tokens.push_back(e.chosen.text);
    if (e.top_null) {
      tops.push_back(nullptr);
      continue;
    }
    json top = json::object();
    top[e.chosen.text] = logprob_json(e.chosen.logprob);
    for (const auto& t : e.top) top[t.text] = logprob_json(t.logprob);
    tops.push_back(std::move(top));
  }
  return {{"text_offset", std::move(offsets)},
          {"token_logprobs", std::move(values)},
          {"tokens", std::move(tokens)},
          {"top_logprobs", std::move(tops)}};
}

json prompt_logprobs_json(const std::vector<prompt_logprob_entry>& entries) {
  json out = json::array();
  for (const auto& e : entries) {
    if (!e) {
      out.push_back(nullptr);
      continue;
    }
    json m = json::object();
    for (const auto& t : *e) {
      m[std::to_string(t.id)] = {{"logprob", logprob_json(t.logprob)}, {"rank", t.rank}, {"decoded_token", t.text}};
    }
    out.push_back(std::move(m));
  }
  return out;
}

json chat_logprobs_json(const std::vector<logprob_entry>& entries) {
  auto token_json = [](const logprob_token& t) {
    return json{{"token", t.text}, {"logprob", logprob_json(t.logprob)}, {"bytes", byte_list(t.bytes)}};
  };
  json content = json::array();
  for (const auto& e : entries) {
    json c = token_json(e.chosen);
    json top = json::array();
    for (const auto& t : e.top) top.push_back(token_json(t));
    c["top_logprobs"] = std::move(top);
    content.push_back(std::move(c));
  }
  return {{"content", std::move(content)}};
}

/// A message's tool calls (whole), or a delta's pieces of them (streamed: each with its index;
/// id, type and name only where the piece starts a call).
json tool_calls_json(const std::vector<tool_call_delta>& calls, bool stream) {
  json out = json::array();
  for (const auto& t : calls) {
    json call = json::object();
    if (stream) call["index"] = t.index;
    if (!stream || !t.id.empty()) {
      call["id"] = t.id;
      call["type"] = "function";
    }
    json f = json::object();
    if (!stream || !t.name.empty()) f["name"] = t.name;
    f["arguments"] = t.arguments;
    call["function"] = std::move(f);
    out.push_back(std::move(call));
  }
  return out;
}

json choice_json(std::string_view kind, const choice_delta& c, bool stream) {
  json ch;
  ch["index"] = c.index;
  const bool chat = kind.starts_with("chat");
  if (chat) {
    json msg = json::object();
    if (c.role || !stream) msg["role"] = c.role_name;
    if (c.reasoning && (stream ? !c.reasoning->empty() : true)) msg["reasoning_content"] = *c.reasoning;
    if (!stream && c.reasoning && c.text.empty() && c.tool_calls.empty()) {
      msg["content"] = nullptr;  // all of it was reasoning
    } else if (!c.text.empty() || !stream) {
      msg["content"] = c.text;
    }
    if (!c.tool_calls.empty()) msg["tool_calls"] = tool_calls_json(c.tool_calls, stream);
    ch[stream ? "delta" : "message"] = msg;
  } else {
    ch["text"] = c.text;
  }
  ch["logprobs"] = !c.logprobs ? json(nullptr)
                   : chat      ? chat_logprobs_json(*c.logprobs)
                               : completion_logprobs_json(*c.logprobs);
  ch["finish_reason"] = c.finish ? json(*c.finish) : json(nullptr);
  // vLLM's: whole choices and completions' chunks always carry it; chat chunks once it is set.
  if (!stream || !chat || c.finish) {
    ch["stop_reason"] = c.stop_string ? json(*c.stop_string) : c.stop_token ? json(*c.stop_token) : json(nullptr);
  }
  if (c.with_token_ids) {
    ch["token_ids"] = c.token_ids;
    if (!c.prompt_token_ids.empty()) ch["prompt_token_ids"] = c.prompt_token_ids;
  }
  if (!chat && c.prompt_logprobs) ch["prompt_logprobs"] = prompt_logprobs_json(*c.prompt_logprobs);
  return ch;
}

json usage_json(const usage_counts& u) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  if (u.cached_tokens) j["prompt_tokens_details"] = {{"cached_tokens", *u.cached_tokens}};
  if (u.reasoning_tokens) j["completion_tokens_details"] = {{"reasoning_tokens", *u.reasoning_tokens}};
  return j;
}

json envelope(std::string_view kind, std::string_view id, int64_t created, std::string_view model) {
  return {{"id", id}, {"object", kind}, {"created", created}, {"model", model}};
}
}  // namespace

bool empty_delta(const choice_delta& c) {
  return c.text.empty() && (!c.reasoning || c.reasoning->empty()) && !c.finish && !c.role && c.tool_calls.empty() &&
         c.token_ids.empty() && c.prompt_token_ids.empty() && (!c.logprobs || c.logprobs->empty());
}

http_error_kind http_error_of(errc code) {
  switch (code) {
    case errc::invalid_request: return {400, "invalid_request_error"};
    case errc::unauthorized: return {401, "authentication_error"};
    case errc::not_found: return {404, "not_found_error"};
    case errc::overloaded: return {429, "rate_limit_error"};
    case errc::replica_unavailable: return {503, "service_unavailable"};
    case errc::cancelled: return {499, "cancelled"};
    case errc::deadline_exceeded: return {504, "timeout"};
    case errc::unsupported: return {400, "invalid_request_error"};
    default: return {500, "internal_error"};
  }
}

std::string error_json(const error& e) {
  json j = {{"error", {{"message", e.message}, {"type", http_error_of(e.code).type}, {"code", errc_name(e.code)}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string response_json(std::string_view kind, std::string_view id, int64_t created, std::string_view model,
                           const std::vector<choice_delta>& choices, const usage_counts& u) {
  json j = envelope(kind, id, created, model);
  j["choices"] = json::array();
  for (const auto& c : choices) j["choices"].push_back(choice_json(kind, c, false));
  j["usage"] = usage_json(u);
  if (kind.starts_with("chat") && !choices.empty() && choices.front().prompt_logprobs) {
    j["prompt_logprobs"] = prompt_logprobs_json(*choices.front().prompt_logprobs);
  }
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string chunk_json(std::string_view kind, std::string_view id, int64_t created, std::string_view model,
                       const choice_delta& c, const std::optional<usage_counts>& u) {
  json j = envelope(kind, id, created, model);
  j["choices"] = json::array({choice_json(kind, c, true)});
  if (u) j["usage"] = usage_json(*u);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string usage_chunk_json(std::string_view kind, std::string_view id, int64_t created, std::string_view model,
                             const usage_counts& u) {
  json j = envelope(kind, id, created, model);
  j["choices"] = json::array();
  j["usage"] = usage_json(u);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string sse_event(std::string_view json_text) {
  std::string out;
  out.reserve(json_text.size() + 8);
  out += "data: ";
  out += json_text;
  out += "\n\n";
  return out;
}

}  // namespace llmesh::gateway
