// OpenAI's Responses API over the chat endpoint (responses_api.hpp).
#include "llmesh/gateway/responses_api.hpp"

#include <algorithm>
#include <array>

#include "llmesh/gateway/openai_api.hpp"
#include "sse_data.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

error bad(std::string message) { return make_error(errc::invalid_request, std::move(message)); }

bool sent(const json& j, const char* name) { return j.contains(name) && !j[name].is_null(); }

/// The text of a content part list: input_text / output_text / text parts (and a refusal's
/// text), joined as the chat endpoint joins parts; anything else is refused.
result<json> text_parts(const json& parts, const std::string& where) {
  json out = json::array();
  for (size_t i = 0; i < parts.size(); ++i) {
    const json& p = parts[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) return bad("'" + at + "' must be an object with a 'type'");
    const std::string type = p["type"];
    const char* key = type == "refusal" ? "refusal" : "text";
    if (type != "input_text" && type != "output_text" && type != "text" && type != "refusal") {
      return bad("'" + at + "': content parts of type '" + type + "' are not supported (only text)");
    }
    if (!p.contains(key) || !p[key].is_string()) return bad("'" + at + "." + key + "' must be a string");
    out.push_back({{"type", "text"}, {"text", p[key]}});
  }
  return out;
}

/// One input item (`at` names it in errors) → chat messages appended to `messages`.
status add_item(const json& item, const std::string& at, json& messages) {
  if (!item.is_object()) return bad("'" + at + "' must be an object");
  if (item.contains("id") && !item["id"].is_string()) return bad("'" + at + ".id' must be a string");
  std::string type = "message";
  if (item.contains("type")) {
    if (!item["type"].is_string()) return bad("'" + at + ".type' must be a string");
    type = item["type"];
  } else if (!item.contains("role")) {
    return bad("'" + at + "' must have a 'type' or a 'role'");
  }
  auto string_of = [&](const char* name) -> result<std::string> {
    if (!item.contains(name) || !item[name].is_string()) return bad("'" + at + "." + name + "' must be a string");
    return item[name].get<std::string>();
  };
  if (type == "message") {
    auto role = string_of("role");
    if (!role) return role.take_error();
    static constexpr std::array<std::string_view, 4> roles{"user", "assistant", "system", "developer"};
    if (std::find(roles.begin(), roles.end(), *role) == roles.end()) {
      return bad("'" + at + ".role' must be user, assistant, system or developer");
    }
    json msg = {{"role", *role == "developer" ? std::string("system") : *role}};
    if (!item.contains("content")) return bad("'" + at + ".content' is required");
    const json& content = item["content"];
    if (content.is_string()) {
      msg["content"] = content;
    } else if (content.is_array()) {
      auto parts = text_parts(content, at + ".content");
      if (!parts) return parts.take_error();
      msg["content"] = std::move(*parts);
    } else {
      return bad("'" + at + ".content' must be a string or an array of content parts");
    }
    // An assistant message after its turn's reasoning item is that turn's content.
    if (msg["role"] == "assistant" && !messages.empty() && messages.back()["role"] == "assistant" &&
        messages.back()["content"].is_null() && !messages.back().contains("tool_calls")) {
      messages.back()["content"] = std::move(msg["content"]);
      return ok_status();
    }
    messages.push_back(std::move(msg));
    return ok_status();
  }
  if (type == "function_call") {
    auto call_id = string_of("call_id");
    if (!call_id) return call_id.take_error();
    auto name = string_of("name");
    if (!name) return name.take_error();
    auto args = string_of("arguments");
    if (!args) return args.take_error();
    json call = {{"id", *call_id}, {"type", "function"}, {"function", {{"name", *name}, {"arguments", *args}}}};
    // Calls right after an assistant message (or each other) belong to that turn.
    if (messages.empty() || messages.back()["role"] != "assistant") {
      messages.push_back({{"role", "assistant"}, {"content", nullptr}});
    }
    json& turn = messages.back();
    if (!turn.contains("tool_calls")) turn["tool_calls"] = json::array();
    turn["tool_calls"].push_back(std::move(call));
    return ok_status();
  }
  if (type == "function_call_output") {
    auto call_id = string_of("call_id");
    if (!call_id) return call_id.take_error();
    if (!item.contains("output")) return bad("'" + at + ".output' is required");
    json content;
    if (item["output"].is_string()) {
      content = item["output"];
    } else if (item["output"].is_array()) {
      auto parts = text_parts(item["output"], at + ".output");
      if (!parts) return parts.take_error();
      content = std::move(*parts);
    } else {
      return bad("'" + at + ".output' must be a string or an array of content parts");
    }
    messages.push_back({{"role", "tool"}, {"tool_call_id", *call_id}, {"content", std::move(content)}});
    return ok_status();
  }
  if (type == "reasoning") {
    // The model's earlier thinking (agents send it back between tool calls): an assistant turn
    // with reasoning_content, which the turn's message and calls then join (vLLM does the
    // same). Its text is the reasoning_text parts', else the summary's; none (encrypted only):
    // nothing to show the template.
    std::string text;
    for (const char* key : {"content", "summary"}) {
      if (!item.contains(key) || !item[key].is_array()) continue;
      for (const json& p : item[key]) {
        if (p.is_object() && p.contains("text") && p["text"].is_string()) text += (text.empty() ? "" : "\n\n") + p["text"].get<std::string>();
      }
      if (!text.empty()) break;
    }
    if (!text.empty()) messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"reasoning_content", text}});
    return ok_status();
  }
  return bad("'" + at + "': input items of type '" + type + "' are not supported (message, function_call, function_call_output, reasoning)");
}

/// A chat answer's token entries as the answer text's: those after the last "</think>" token
/// when the model thought first (the reasoning's own tokens are not the text's).
json answer_logprobs(const json& entries) {
  if (!entries.is_array()) return json::array();
  size_t first = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].is_object() && entries[i].value("token", std::string()) == "</think>") first = i + 1;
  }
  json out = json::array();
  for (size_t i = first; i < entries.size(); ++i) out.push_back(entries[i]);
  return out;
}

/// The output items and content parts, as both the whole and the streamed path build them.
json reasoning_item(std::string id) {
  return {{"id", std::move(id)}, {"type", "reasoning"}, {"summary", json::array()}, {"content", json::array()}};
}
json message_item(std::string id, std::string_view status) {
  return {{"id", std::move(id)}, {"type", "message"}, {"status", status}, {"role", "assistant"}, {"content", json::array()}};
}
json call_item(std::string id, std::string_view status, std::string call_id, std::string name, std::string arguments) {
  return {{"id", std::move(id)}, {"type", "function_call"}, {"status", status}, {"call_id", std::move(call_id)},
          {"name", std::move(name)}, {"arguments", std::move(arguments)}};
}
/// A message's output_text part (with its annotations), or a reasoning item's reasoning_text.
json text_part(bool message, json text) {
  json part = {{"type", message ? "output_text" : "reasoning_text"}, {"text", std::move(text)}};
  if (message) part["annotations"] = json::array();
  return part;
}

json usage_of(const json& chat_usage) {
  if (!chat_usage.is_object()) return nullptr;
  const auto in = chat_usage.value("prompt_tokens", 0), out = chat_usage.value("completion_tokens", 0);
  int64_t reasoning = 0;
  if (chat_usage.contains("completion_tokens_details") && chat_usage["completion_tokens_details"].is_object()) {
    reasoning = chat_usage["completion_tokens_details"].value("reasoning_tokens", int64_t{0});
  }
  int64_t cached = 0;
  if (chat_usage.contains("prompt_tokens_details") && chat_usage["prompt_tokens_details"].is_object()) {
    cached = chat_usage["prompt_tokens_details"].value("cached_tokens", int64_t{0});
  }
  return {{"input_tokens", in},
          {"input_tokens_details", {{"cached_tokens", cached}}},
          {"output_tokens", out},
          {"output_tokens_details", {{"reasoning_tokens", reasoning}}},
          {"total_tokens", in + out}};
}

}  // namespace

result<json> responses_to_chat(const json& body, responses_echo& echo, const json& earlier) {
  if (!body.is_object()) return bad("the request body must be a JSON object");
  if (sent(body, "prompt")) return bad("'prompt' (a stored prompt template) is not supported by this server");
  if (sent(body, "background")) {
    if (!body["background"].is_boolean()) return bad("'background' must be true or false");
    echo.background = body["background"].get<bool>();
  }
  if (sent(body, "store") && !body["store"].is_boolean()) return bad("'store' must be true or false");
  if (sent(body, "truncation")) {
    if (body["truncation"] != "auto" && body["truncation"] != "disabled") return bad("'truncation' must be \"auto\" or \"disabled\"");
    echo.truncation = body["truncation"].get<std::string>();
  }
  json chat = json::object();
  if (body.contains("model")) chat["model"] = body["model"];
  json messages = json::array();
  if (sent(body, "instructions")) {
    if (!body["instructions"].is_string()) return bad("'instructions' must be a string");
    messages.push_back({{"role", "system"}, {"content", body["instructions"]}});
    echo.instructions = body["instructions"];
  }
  // A previous response's conversation first (its instructions do not carry over).
  if (earlier.is_array()) {
    for (size_t i = 0; i < earlier.size(); ++i) {
      LLMESH_TRY(add_item(earlier[i], "the earlier conversation's item " + std::to_string(i), messages));
    }
  }
  if (!sent(body, "input")) return bad("'input' is required: a string, or an array of input items");
  const json& input = body["input"];
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
  } else if (input.is_array() && !input.empty()) {
    for (size_t i = 0; i < input.size(); ++i) LLMESH_TRY(add_item(input[i], "input[" + std::to_string(i) + "]", messages));
  } else {
    return bad("'input' must be a string or a non-empty array of input items");
  }
  if (messages.empty()) return bad("'input' holds no message");
  // instructions and leading system / developer messages as one system message: templates
  // that want strict turns refuse two.
  while (messages.size() > 1 && messages[0]["role"] == "system" && messages[1]["role"] == "system" &&
         messages[0]["content"].is_string() && messages[1]["content"].is_string()) {
    messages[0]["content"] = messages[0]["content"].get<std::string>() + "\n\n" + messages[1]["content"].get<std::string>();
    messages.erase(messages.begin() + 1);
  }
  chat["messages"] = std::move(messages);
  // Token log-probabilities on the output text: top_logprobs n (OpenAI's), or `include` naming
  // them (with no alternatives).
  bool want_logprobs = false;
  if (sent(body, "include")) {
    if (!body["include"].is_array()) return bad("'include' must be an array of strings");
    for (const json& v : body["include"]) {
      if (!v.is_string()) return bad("'include' must be an array of strings");
      if (v == "message.output_text.logprobs") want_logprobs = true;  // other inclusions name hosted tools' data
    }
  }
  // As vLLM: the entries come only with `include` naming them; top_logprobs sets how many
  // alternatives each has (the chat endpoint checks it, 0..20).
  if (want_logprobs) {
    chat["logprobs"] = true;
    if (sent(body, "top_logprobs")) chat["top_logprobs"] = body["top_logprobs"];
  }
  if (sent(body, "max_output_tokens")) {
    chat["max_completion_tokens"] = body["max_output_tokens"];
    echo.max_output_tokens = body["max_output_tokens"];
  }
  // Sampling fields and vLLM's extensions, checked by the chat endpoint as they are there.
  for (const char* name : {"temperature", "top_p", "top_k", "seed", "stop", "presence_penalty", "frequency_penalty",
                           "repetition_penalty", "min_p", "min_tokens", "logit_bias", "stop_token_ids", "ignore_eos",
                           "chat_template_kwargs", "parallel_tool_calls", "skip_special_tokens", "include_reasoning", "priority", "cache_salt",
                           "prompt_cache_key"}) {
    if (sent(body, name)) chat[name] = body[name];
  }
  if (sent(body, "temperature")) echo.temperature = body["temperature"];
  if (sent(body, "top_p")) echo.top_p = body["top_p"];
  if (sent(body, "parallel_tool_calls") && body["parallel_tool_calls"].is_boolean()) {
    echo.parallel_tool_calls = body["parallel_tool_calls"];
  }
  if (sent(body, "tools")) {
    if (!body["tools"].is_array()) return bad("'tools' must be an array");
    json tools = json::array();
    for (size_t i = 0; i < body["tools"].size(); ++i) {
      const json& t = body["tools"][i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("type") || !t["type"].is_string()) return bad("'" + at + "' must be an object with a 'type'");
      if (t["type"] != "function") {
        return bad("'" + at + "': tools of type '" + t["type"].get<std::string>() + "' are not supported (only function)");
      }
      json f = json::object();
      for (const char* k : {"name", "description", "parameters", "strict"}) {
        if (sent(t, k)) f[k] = t[k];
      }
      tools.push_back({{"type", "function"}, {"function", std::move(f)}});
    }
    chat["tools"] = std::move(tools);
    echo.tools = body["tools"];
  }
  if (sent(body, "tool_choice")) {
    const json& c = body["tool_choice"];
    if (c.is_string()) {
      chat["tool_choice"] = c;
    } else if (c.is_object() && c.value("type", "") == "function" && c.contains("name") && c["name"].is_string()) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
    } else {
      return bad("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"name\": ...}");
    }
    echo.tool_choice = c;
  }
  if (sent(body, "text")) {
    const json& t = body["text"];
    if (!t.is_object()) return bad("'text' must be an object");
    if (sent(t, "format")) {
      const json& f = t["format"];
      if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) return bad("'text.format' must be an object with a 'type'");
      const std::string type = f["type"];
      if (type == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (type == "json_schema") {
        json schema = {{"name", f.value("name", std::string("response"))}};
        if (f.contains("schema")) schema["schema"] = f["schema"];
        if (f.contains("strict")) schema["strict"] = f["strict"];
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
      } else if (type != "text") {
        return bad("'text.format.type' must be text, json_object or json_schema");
      }
    }
    echo.text = t;
  }
  if (sent(body, "reasoning")) {
    const json& r = body["reasoning"];
    if (!r.is_object()) return bad("'reasoning' must be an object");
    // The effort reaches templates that read it (gpt-oss's reasoning_effort), as in vLLM.
    if (sent(r, "effort")) {
      if (!r["effort"].is_string()) return bad("'reasoning.effort' must be a string");
      json kwargs = chat.contains("chat_template_kwargs") && chat["chat_template_kwargs"].is_object()
                        ? chat["chat_template_kwargs"]
                        : json::object();
      if (!kwargs.contains("reasoning_effort")) kwargs["reasoning_effort"] = r["effort"];
      chat["chat_template_kwargs"] = std::move(kwargs);
    }
    echo.reasoning = {{"effort", r.value("effort", json(nullptr))}, {"summary", r.value("summary", json(nullptr))}};
  }
  if (sent(body, "metadata")) {
    if (!body["metadata"].is_object()) return bad("'metadata' must be an object");
    echo.metadata = body["metadata"];
  }
  if (sent(body, "user")) echo.user = body["user"];
  if (sent(body, "prompt_cache_key") && body["prompt_cache_key"].is_string()) echo.prompt_cache_key = body["prompt_cache_key"];
  if (echo.background) {  // rendered as events whether or not the client reads them
    if (sent(body, "stream") && !body["stream"].is_boolean()) return bad("'stream' must be true or false");
    chat["stream"] = true;
    chat["stream_options"] = {{"include_usage", true}};
  } else if (sent(body, "stream")) {
    chat["stream"] = body["stream"];
    if (body["stream"].is_boolean() && body["stream"].get<bool>()) chat["stream_options"] = {{"include_usage", true}};
  }
  return chat;
}

std::pair<json, json> without_first_items(const json& body, const json& earlier, size_t k) {
  // A system or developer message among those left out stays (it frames the whole conversation).
  auto frames = [](const json& item) {
    return item.is_object() && (item.value("role", std::string()) == "system" || item.value("role", std::string()) == "developer");
  };
  json cut_body = body, cut_earlier = json::array();
  const size_t from_earlier = std::min(k, earlier.size());
  for (size_t i = 0; i < earlier.size(); ++i) {
    if (i >= from_earlier || frames(earlier[i])) cut_earlier.push_back(earlier[i]);
  }
  const size_t from_input = k - from_earlier;
  if (from_input > 0 && body["input"].is_array()) {
    json input = json::array();
    for (size_t i = 0; i < body["input"].size(); ++i) {
      if (i >= from_input || frames(body["input"][i])) input.push_back(body["input"][i]);
    }
    cut_body["input"] = std::move(input);
  }
  return {std::move(cut_body), std::move(cut_earlier)};
}

json responses_input_items(const json& body, std::string_view hex) {
  json items = json::array();
  const json& input = body["input"];
  if (input.is_string()) {
    items.push_back({{"type", "message"}, {"role", "user"}, {"content", json::array({{{"type", "input_text"}, {"text", input}}})}});
  } else {
    items = input;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    json& item = items[i];
    if (item.contains("id")) continue;
    const std::string type = item.contains("type") ? item["type"].get<std::string>() : "message";
    const char* prefix = type == "function_call" ? "fc" : type == "function_call_output" ? "fco" : type == "reasoning" ? "rs" : "msg";
    json with_id = {{"id", std::string(prefix) + "_" + std::string(hex) + "in" + std::to_string(i)}};
    if (!item.contains("type")) with_id["type"] = "message";
    for (auto& [k, v] : item.items()) with_id[k] = std::move(v);
    item = std::move(with_id);
  }
  return items;
}

responses_renderer::responses_renderer(responses_echo echo, std::string_view id, int64_t created, std::string model)
    : echo_(std::move(echo)), created_(created), model_(std::move(model)) {
  const size_t dash = id.rfind('-');
  hex_ = std::string(dash == std::string_view::npos ? id : id.substr(dash + 1));
}

std::string responses_renderer::item_id(std::string_view prefix, size_t index) const {
  return std::string(prefix) + "_" + hex_ + std::to_string(index);
}

json responses_renderer::response_object(std::string_view status, const json& output, const json& usage,
                                         std::string_view finish) const {
  json r = {{"id", "resp_" + hex_},
            {"object", "response"},
            {"created_at", created_},
            {"status", status},
            {"background", echo_.background},
            {"error", nullptr},
            {"incomplete_details", finish == "length" ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
            {"instructions", echo_.instructions},
            {"max_output_tokens", echo_.max_output_tokens},
            {"model", model_},
            {"output", output},
            {"parallel_tool_calls", echo_.parallel_tool_calls},
            {"previous_response_id", echo_.previous_response_id},
            {"prompt_cache_key", echo_.prompt_cache_key},
            {"reasoning", echo_.reasoning},
            {"store", echo_.store},
            {"temperature", echo_.temperature},
            {"text", echo_.text},
            {"tool_choice", echo_.tool_choice},
            {"tools", echo_.tools},
            {"top_p", echo_.top_p},
            {"truncation", echo_.truncation},
            {"usage", usage},
            {"user", echo_.user},
            {"metadata", echo_.metadata}};
  if (!echo_.conversation.is_null()) r["conversation"] = echo_.conversation;
  return r;
}

std::string responses_renderer::whole(std::string_view chat_body) const {
  try {
    return whole_of(chat_body);
  } catch (const nlohmann::json::exception&) {  // not the chat renderer's shape (a bug): as it is
    return std::string(chat_body);
  }
}

std::string responses_renderer::whole_of(std::string_view chat_body) const {
  // Not const: a member another shape lacks reads as null (a const json's operator[] on a
  // missing key is undefined behaviour), a member of the wrong type throws (whole() catches).
  json j = json::parse(chat_body, nullptr, false);
  if (j.is_discarded() || !j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) {
    return std::string(chat_body);  // an error's body, as the chat endpoint wrote it
  }
  json& c = j["choices"][0];
  json& msg = c["message"];
  json output = json::array();
  if (msg.contains("reasoning_content") && msg["reasoning_content"].is_string() &&
      !msg["reasoning_content"].get_ref<const std::string&>().empty()) {
    json item = reasoning_item(item_id("rs", output.size()));
    item["content"].push_back(text_part(false, msg["reasoning_content"]));
    output.push_back(std::move(item));
  }
  const bool calls = msg.contains("tool_calls") && msg["tool_calls"].is_array() && !msg["tool_calls"].empty();
  const bool text = msg.contains("content") && msg["content"].is_string();
  if ((text && (!msg["content"].get_ref<const std::string&>().empty() || !calls)) || (!calls && output.empty())) {
    json part = text_part(true, text ? msg["content"] : json(""));
    if (c.contains("logprobs") && c["logprobs"].is_object()) part["logprobs"] = answer_logprobs(c["logprobs"].value("content", json::array()));
    json item = message_item(item_id("msg", output.size()), "completed");
    item["content"].push_back(std::move(part));
    output.push_back(std::move(item));
  }
  if (calls) {
    for (json& t : msg["tool_calls"]) {
      output.push_back(call_item(item_id("fc", output.size()), "completed", t.value("id", std::string()),
                                 t["function"].value("name", std::string()), t["function"].value("arguments", std::string())));
    }
  }
  const std::string finish = c.value("finish_reason", std::string());
  if (finish == "length" && !output.empty() && output.back().contains("status")) output.back()["status"] = "incomplete";
  const json r = response_object(finish == "length" ? "incomplete" : "completed", output, usage_of(j.value("usage", json())), finish);
  if (on_final_) on_final_(r);
  return r.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string responses_renderer::event(std::string_view type, json body) {
  json e = {{"type", type}};
  for (auto& [k, v] : body.items()) e[k] = std::move(v);
  e["sequence_number"] = seq_++;
  return "event: " + std::string(type) + "\ndata: " + e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string responses_renderer::open(open_kind kind, const json& call) {
  const size_t index = output_.size();
  text_.clear();
  open_ = kind;
  std::string out;
  switch (kind) {
    case open_kind::reasoning: item_ = reasoning_item(item_id("rs", index)); break;
    case open_kind::message: item_ = message_item(item_id("msg", index), "in_progress"); break;
    case open_kind::call:
      item_ = call_item(item_id("fc", index), "in_progress", call.value("id", std::string()),
                        call.contains("function") ? call["function"].value("name", std::string()) : std::string(), "");
      break;
    case open_kind::none: return out;
  }
  out += event("response.output_item.added", {{"output_index", index}, {"item", item_}});
  if (kind != open_kind::call) {
    out += event("response.content_part.added", {{"item_id", item_["id"]},
                                                {"output_index", index},
                                                {"content_index", 0},
                                                {"part", text_part(kind == open_kind::message, "")}});
  }
  return out;
}

std::string responses_renderer::item_status() const {
  // The last item of an output that ran out of tokens is cut short (OpenAI: "incomplete").
  return finish_reason_ == "length" || failed_ ? "incomplete" : "completed";
}

std::string responses_renderer::close_open() {
  if (open_ == open_kind::none) return "";
  const size_t index = output_.size();
  std::string out;
  const json id = item_["id"];
  if (open_ == open_kind::call) {
    out += event("response.function_call_arguments.done",
                 {{"item_id", id}, {"output_index", index}, {"name", item_["name"]}, {"arguments", text_}});
    item_["arguments"] = text_;
    item_["status"] = item_status();
  } else {
    const bool message = open_ == open_kind::message;
    json part = text_part(message, text_);
    if (message) {
      if (logprobs_wanted_) part["logprobs"] = logprobs_;
      out += event("response.output_text.done",
                   {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text_}, {"logprobs", logprobs_}});
      logprobs_ = json::array();
      item_["status"] = item_status();
    } else {
      out += event("response.reasoning_text.done", {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
    }
    out += event("response.content_part.done", {{"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    item_["content"] = json::array({part});
  }
  out += event("response.output_item.done", {{"output_index", index}, {"item", item_}});
  output_.push_back(std::move(item_));
  item_ = nullptr;
  open_ = open_kind::none;
  return out;
}

std::string responses_renderer::finish() {
  if (ended_) return "";
  ended_ = true;
  std::string out = close_open();
  const bool incomplete = finish_reason_ == "length";
  json r = response_object(incomplete ? "incomplete" : "completed", output_, usage_, finish_reason_);
  final_ = r;
  if (on_final_) on_final_(r);
  out += event(incomplete ? "response.incomplete" : "response.completed", {{"response", std::move(r)}});
  return out;
}

std::string responses_renderer::on_chunk(const json& chunk) {
  std::string out;
  if (!started_) {
    started_ = true;
    const json r = response_object("in_progress", json::array(), nullptr, "");
    out += event("response.created", {{"response", r}});
    out += event("response.in_progress", {{"response", r}});
  } else if (queued_ && !chunk.contains("error")) {
    queued_ = false;
    out += event("response.in_progress", {{"response", response_object("in_progress", json::array(), nullptr, "")}});
  }
  if (chunk.contains("error")) {
    const json& e = chunk["error"];
    failed_ = true;
    out += close_open();
    json r = response_object("failed", output_, usage_, "");
    // ResponseError.code is an enum of OpenAI's: overload is rate_limit_exceeded, the rest a
    // server_error (the detail stays in the message).
    const bool overloaded = e.contains("code") && e["code"] == "overloaded";
    r["error"] = {{"code", overloaded ? "rate_limit_exceeded" : "server_error"}, {"message", e.value("message", std::string())}};
    final_ = r;
    if (on_final_) on_final_(r);
    out += event("response.failed", {{"response", std::move(r)}});
    ended_ = true;
    return out;
  }
  if (!chunk.contains("choices") || !chunk["choices"].is_array() || chunk["choices"].empty()) {
    if (chunk.contains("usage")) usage_ = usage_of(chunk["usage"]);
    if (!finish_reason_.empty()) out += finish();
    return out;
  }
  const json& c = chunk["choices"][0];
  const json d = c.value("delta", json::object());
  if (c.contains("logprobs") && c["logprobs"].is_object()) logprobs_wanted_ = true;
  auto piece = [&](const char* key) -> std::string {
    return d.contains(key) && d[key].is_string() ? d[key].get<std::string>() : std::string();
  };
  if (const std::string r = piece("reasoning_content"); !r.empty()) {
    if (open_ != open_kind::reasoning) {
      out += close_open();  // (two statements: the operands of + are unsequenced)
      out += open(open_kind::reasoning);
    }
    text_ += r;
    out += event("response.reasoning_text.delta",
                 {{"item_id", item_["id"]}, {"output_index", output_.size()}, {"content_index", 0}, {"delta", r}});
  }
  if (const std::string t = piece("content"); !t.empty()) {
    if (open_ != open_kind::message) {
      out += close_open();
      out += open(open_kind::message);
    }
    text_ += t;
    // The chunk's token entries, unless it also carried reasoning (then they are the thinking's
    // too, and the text's cannot be told apart).
    json lp = json::array();
    if (piece("reasoning_content").empty() && c.contains("logprobs") && c["logprobs"].is_object()) {
      lp = answer_logprobs(c["logprobs"].value("content", json::array()));
    }
    for (const auto& e : lp) logprobs_.push_back(e);
    out += event("response.output_text.delta", {{"item_id", item_["id"]},
                                                {"output_index", output_.size()},
                                                {"content_index", 0},
                                                {"delta", t},
                                                {"logprobs", std::move(lp)}});
  }
  if (d.contains("tool_calls") && d["tool_calls"].is_array()) {
    for (const json& tc : d["tool_calls"]) {
      if (tc.contains("id")) {
        out += close_open();
        out += open(open_kind::call, tc);
      }
      const std::string args = tc.contains("function") && tc["function"].contains("arguments") && tc["function"]["arguments"].is_string()
                                   ? tc["function"]["arguments"].get<std::string>()
                                   : std::string();
      if (args.empty() || open_ != open_kind::call) continue;
      text_ += args;
      out += event("response.function_call_arguments.delta", {{"item_id", item_["id"]}, {"output_index", output_.size()}, {"delta", args}});
    }
  }
  if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
    finish_reason_ = c["finish_reason"];
    out += close_open();
    if (output_.empty()) {  // an empty answer is an empty message
      out += open(open_kind::message);
      out += close_open();
    }
  }
  return out;
}

std::string responses_renderer::stream(std::string_view chat_sse) {
  std::string out;
  detail::for_each_sse_data(chat_sse, [&](std::string_view ev) {
    if (ended_) return;
    if (ev == "[DONE]") {
      out += finish();  // the Responses stream ends with its last event: no [DONE]
      return;
    }
    const json chunk = json::parse(ev, nullptr, false);
    if (chunk.is_discarded()) return;
    // The chunks are the chat renderer's own; one of another shape (a bug) is skipped rather
    // than allowed to throw through the connection.
    try {
      out += on_chunk(chunk);
    } catch (const nlohmann::json::exception&) {
    }
  });
  return out;
}

std::string responses_renderer::queued() {
  if (started_) return "";
  started_ = queued_ = true;
  const json r = response_object("queued", json::array(), nullptr, "");
  std::string out = event("response.created", {{"response", r}});
  out += event("response.queued", {{"response", r}});
  return out;
}

json responses_renderer::snapshot() const {
  if (ended_) return final_;
  json output = output_;
  if (open_ != open_kind::none) {
    json item = item_;
    if (open_ == open_kind::call) {
      item["arguments"] = text_;
    } else {
      json part = text_part(open_ == open_kind::message, text_);
      if (open_ == open_kind::message && logprobs_wanted_) part["logprobs"] = logprobs_;
      item["content"] = json::array({part});
      if (open_ == open_kind::message) item["status"] = "in_progress";
    }
    output.push_back(std::move(item));
  }
  return response_object(queued_ || !started_ ? "queued" : "in_progress", output, nullptr, "");
}

json responses_renderer::cancel(const usage_counts& so_far) {
  failed_ = true;  // the open item is cut short: "incomplete"
  (void)close_open();  // (its events are not sent: the stream just ends)
  ended_ = true;
  usage_ = usage_of(json::parse(usage_chunk_json("chat.completion.chunk", "", 0, "", so_far))["usage"]);
  json r = response_object("cancelled", output_, usage_, "");
  final_ = r;
  if (on_final_) on_final_(r);
  return r;
}

std::string responses_renderer::fail(const error& e) {
  if (ended_) return "";
  return stream(sse_event(error_json(e)));
}

}  // namespace llmesh::gateway
