// Anthropic's Messages API over the chat endpoint (messages_api.hpp).
#include "llmesh/gateway/messages_api.hpp"

#include <optional>
#include <string_view>
#include <utility>

#include "llmesh/gateway/openai_api.hpp"
#include "sse_data.hpp"
#include "text_space.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

error bad(std::string message) { return make_error(errc::invalid_request, std::move(message)); }

bool sent(const json& j, const char* name) { return j.contains(name) && !j[name].is_null(); }

/// j[key] when j is an object holding a string there, else "" (never throws: the renderer's
/// input is the chat renderer's, read defensively).
std::string str_of(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}
int64_t int_of(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : 0;
}
const json& member(const json& j, const char* key) {
  static const json none;
  return j.is_object() && j.contains(key) ? j[key] : none;
}

std::string type_of(const json& block) { return str_of(block, "type"); }

std::string dumped(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

/// Claude Code's attribution block: a per-request hash that would defeat prefix caching
/// (vLLM leaves it out too).
bool billing_header(const std::string& text) { return text.starts_with("x-anthropic-billing-header"); }

/// A system prompt (`system`, or a message of role system, which vLLM takes too): a string or
/// text blocks, appended to `out` as vLLM joins them (with nothing between).
status add_system(const json& v, const std::string& at, std::string& out) {
  if (v.is_string()) {
    out += v.get<std::string>();
    return ok_status();
  }
  if (!v.is_array()) return bad("'" + at + "' must be a string or an array of text blocks");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string here = at + "[" + std::to_string(i) + "]";
    if (type_of(v[i]) != "text") return bad("'" + here + "' must be a text block");
    if (!v[i].contains("text") || !v[i]["text"].is_string()) return bad("'" + here + ".text' must be a string");
    const std::string& text = v[i]["text"].get_ref<const std::string&>();
    if (!billing_header(text)) out += text;
  }
  return ok_status();
}

/// A tool_result block's content as the tool message's text: a string, or text blocks joined
/// by newlines (vLLM's); tool_reference blocks (Claude Code's pointers to deferred tools) are
/// nothing for a template.
result<std::string> tool_result_text(const json& b, const std::string& at) {
  if (!sent(b, "content")) return std::string();
  const json& c = b["content"];
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) return bad("'" + at + ".content' must be a string or an array of content blocks");
  std::string text;
  bool first = true;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string here = at + ".content[" + std::to_string(i) + "]";
    const std::string type = type_of(c[i]);
    if (type == "tool_reference") continue;
    if (type != "text") {
      return bad("'" + here + "': " + (type.empty() ? std::string("a block without a type") : "blocks of type '" + type + "'") +
                 " cannot be a tool's result here (text only: this server serves text models)");
    }
    if (!c[i].contains("text") || !c[i]["text"].is_string()) return bad("'" + here + ".text' must be a string");
    text += (first ? "" : "\n") + c[i]["text"].get<std::string>();
    first = false;
  }
  return text;
}

/// One message of `messages` (`at` names it) → chat messages appended to `out` (a user
/// message's tool results first, as tool messages, then its text); a system message's text
/// goes to `system`.
status add_message(const json& m, const std::string& at, json& out, std::string& system) {
  if (!m.is_object()) return bad("'" + at + "' must be an object with a 'role' and a 'content'");
  if (!m.contains("role") || !m["role"].is_string()) return bad("'" + at + ".role' must be a string");
  std::string role = m["role"];
  if (role == "ctx" || role == "msg") role = "user";  // Claude Code's own roles, as vLLM maps them
  if (role != "user" && role != "assistant" && role != "system") return bad("'" + at + ".role' must be user or assistant");
  if (!sent(m, "content")) return bad("'" + at + ".content' is required");
  const json& content = m["content"];
  if (role == "system") return add_system(content, at + ".content", system);
  if (content.is_string()) {
    out.push_back({{"role", role}, {"content", content}});
    return ok_status();
  }
  if (!content.is_array()) return bad("'" + at + ".content' must be a string or an array of content blocks");
  json parts = json::array(), calls = json::array();
  std::string thinking;
  bool thought = false;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& b = content[i];
    const std::string here = at + ".content[" + std::to_string(i) + "]";
    const std::string type = type_of(b);
    auto string_field = [&](const char* name) -> result<std::string> {
      if (!b.contains(name) || !b[name].is_string()) return bad("'" + here + "." + name + "' must be a string");
      return b[name].get<std::string>();
    };
    auto only = [&](const char* r) { return bad("'" + here + "': " + type + " blocks belong to " + r + " messages"); };
    if (type == "text") {
      auto text = string_field("text");
      if (!text) return text.take_error();
      if (!text->empty()) parts.push_back({{"type", "text"}, {"text", std::move(*text)}});
    } else if (type == "thinking") {
      if (role != "assistant") return only("assistant");
      auto text = string_field("thinking");
      if (!text) return text.take_error();
      thinking += *text;
      thought = true;
    } else if (type == "redacted_thinking") {
      // Encrypted by Anthropic's service: nothing this server can show the template (vLLM skips it).
    } else if (type == "tool_use") {
      if (role != "assistant") return only("assistant");
      auto id = string_field("id");
      if (!id) return id.take_error();
      auto name = string_field("name");
      if (!name) return name.take_error();
      if (!b.contains("input") || !b["input"].is_object()) return bad("'" + here + ".input' must be an object");
      calls.push_back({{"id", std::move(*id)}, {"type", "function"}, {"function", {{"name", std::move(*name)}, {"arguments", dumped(b["input"])}}}});
    } else if (type == "tool_result") {
      if (role != "user") return only("user");
      auto id = string_field("tool_use_id");
      if (!id) return id.take_error();
      auto text = tool_result_text(b, here);
      if (!text) return text.take_error();
      out.push_back({{"role", "tool"}, {"tool_call_id", std::move(*id)}, {"content", std::move(*text)}});
    } else if (type == "tool_reference") {
      // Claude Code's pointer to a deferred tool: nothing for the template.
    } else if (type == "image" || type == "document") {
      return bad("'" + here + "': " + type + " blocks are not supported: this server serves text models only");
    } else {
      return bad("'" + here + "': " + (type.empty() ? std::string("a content block needs a 'type'") : "content blocks of type '" + type + "' are not supported") +
                 " (text, tool_use, tool_result, thinking, redacted_thinking)");
    }
  }
  json msg = {{"role", role}};
  if (parts.size() == 1) {
    msg["content"] = parts[0]["text"];
  } else if (parts.size() > 1) {
    msg["content"] = std::move(parts);
  } else if (role == "user") {
    return ok_status();  // only tool results: no user turn of its own (vLLM's)
  } else {
    msg["content"] = thought || !calls.empty() ? json(nullptr) : json("");
  }
  if (thought) msg["reasoning_content"] = thinking;
  if (!calls.empty()) msg["tool_calls"] = std::move(calls);
  out.push_back(std::move(msg));
  return ok_status();
}

/// Client tools ({name, description, input_schema}) as chat tools.
result<json> chat_tools(const json& tools) {
  if (!tools.is_array()) return bad("'tools' must be an array");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return bad("'" + at + "' must be an object");
    const std::string type = type_of(t);
    if (!type.empty() && type != "custom" && !t.contains("input_schema")) {
      return bad("'" + at + "': Anthropic's server tools (type '" + type +
                 "') are not supported; only client tools with a name and an input_schema");
    }
    if (!t.contains("name") || !t["name"].is_string()) return bad("'" + at + ".name' must be a string");
    if (!t.contains("input_schema") || !t["input_schema"].is_object()) return bad("'" + at + ".input_schema' must be an object (a JSON schema)");
    json schema = t["input_schema"];
    if (!schema.contains("type")) schema["type"] = "object";  // (vLLM's default)
    json f = {{"name", t["name"]}};
    if (sent(t, "description")) {
      if (!t["description"].is_string()) return bad("'" + at + ".description' must be a string");
      f["description"] = t["description"];
    }
    f["parameters"] = std::move(schema);
    if (sent(t, "strict")) f["strict"] = t["strict"];
    out.push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  return out;
}

/// tool_choice: auto, any (the chat's "required"), tool (a named call), none; and
/// disable_parallel_tool_use (the chat's parallel_tool_calls false).
status add_tool_choice(const json& c, json& chat) {
  if (!c.is_object()) return bad("'tool_choice' must be an object with a 'type' (auto, any, tool or none)");
  const std::string type = type_of(c);
  if (type == "auto" || type == "none") {
    chat["tool_choice"] = type;
  } else if (type == "any") {
    chat["tool_choice"] = "required";
  } else if (type == "tool") {
    if (!c.contains("name") || !c["name"].is_string()) return bad("'tool_choice.name' must be a string when its type is tool");
    chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
  } else {
    return bad("'tool_choice.type' must be auto, any, tool or none");
  }
  if (sent(c, "disable_parallel_tool_use")) {
    if (!c["disable_parallel_tool_use"].is_boolean()) return bad("'tool_choice.disable_parallel_tool_use' must be true or false");
    if (c["disable_parallel_tool_use"].get<bool>()) chat["parallel_tool_calls"] = false;
  }
  return ok_status();
}

/// What reaches the chat template: chat_template_kwargs (vLLM's extension), then `thinking`
/// (enable_thinking: false when disabled, true otherwise — Qwen3's and others' switch) and
/// output_config.effort (reasoning_effort, as gpt-oss's template reads it), unless set there.
status add_template_kwargs(const json& body, json& chat) {
  json kwargs = json::object();
  if (sent(body, "chat_template_kwargs")) {
    if (!body["chat_template_kwargs"].is_object()) return bad("'chat_template_kwargs' must be an object");
    kwargs = body["chat_template_kwargs"];
  }
  if (sent(body, "thinking")) {
    const std::string type = type_of(body["thinking"]);
    if (type != "enabled" && type != "disabled" && type != "adaptive") {
      return bad("'thinking' must be an object whose 'type' is enabled, disabled or adaptive");
    }
    if (!kwargs.contains("enable_thinking")) kwargs["enable_thinking"] = type != "disabled";
  }
  if (sent(body, "output_config")) {
    const json& oc = body["output_config"];
    if (!oc.is_object()) return bad("'output_config' must be an object");
    if (sent(oc, "effort")) {
      if (!oc["effort"].is_string()) return bad("'output_config.effort' must be a string");
      if (!kwargs.contains("reasoning_effort")) kwargs["reasoning_effort"] = oc["effort"];
    }
  }
  if (!kwargs.empty()) chat["chat_template_kwargs"] = std::move(kwargs);
  return ok_status();
}

/// Anthropic's usage from the chat's: input_tokens without the prefix cache's hits, which are
/// cache_read_input_tokens (with cache_creation_input_tokens 0) when the count is known —
/// vLLM's mapping.
json usage_of(const json& u) {
  const int64_t prompt = int_of(u, "prompt_tokens"), output = int_of(u, "completion_tokens");
  const bool known = member(u, "prompt_tokens_details").is_object();
  const int64_t cached = int_of(member(u, "prompt_tokens_details"), "cached_tokens");
  json out = {{"input_tokens", prompt - cached}};
  if (known) {
    out["cache_creation_input_tokens"] = 0;
    out["cache_read_input_tokens"] = cached;
  }
  out["output_tokens"] = output;
  return out;
}

/// stop_reason and stop_sequence from the chat choice's finish_reason and stop_reason:
/// tool_use only when a tool_use block was written (a call whose arguments are no object is
/// text: the turn ends).
std::pair<json, json> stop_of(const std::string& finish, const json& stop_reason, bool tool_used) {
  if (finish == "length") return {"max_tokens", nullptr};
  if (tool_used) return {"tool_use", nullptr};
  if (stop_reason.is_string()) return {"stop_sequence", stop_reason};
  return {"end_turn", nullptr};
}

json error_object(const json& e) { return {{"type", messages_error_type(str_of(e, "code"))}, {"message", str_of(e, "message")}}; }

/// A call's arguments as a tool_use block's input: the JSON object they are, or that a JSON
/// string of them holds (a model that wrote its arguments as a string); nullopt otherwise.
std::optional<json> call_input(const std::string& args) {
  auto input = parse_embedded_json(args);  // (depth-bounded: a model's output)
  if (input && input->is_string()) input = parse_embedded_json(input->get<std::string>());
  if (!input || !input->is_object()) return std::nullopt;
  return input;
}

std::string event(std::string_view type, const json& body) {
  return "event: " + std::string(type) + "\ndata: " + dumped(body) + "\n\n";
}

/// Text that makes no text block of its own: the newlines between a model's thinking and its
/// calls, say.
bool blank(std::string_view text) { return detail::lstripped(text).empty(); }

/// The signature of a thinking block: opaque to clients, which send it back (and this server
/// ignores it).
std::string signature_of(const std::string& id, size_t index) { return id + "." + std::to_string(index); }

}  // namespace

result<json> messages_to_chat(const json& body, bool counting) {
  if (!body.is_object()) return bad("the request body must be a JSON object");
  if (!sent(body, "model") || !body["model"].is_string() || body["model"].get_ref<const std::string&>().empty()) {
    return bad("'model' is required: the served model's name");
  }
  json chat = {{"model", body["model"]}};
  std::string system;
  if (sent(body, "system")) LLMESH_TRY(add_system(body["system"], "system", system));
  if (!sent(body, "messages") || !body["messages"].is_array() || body["messages"].empty()) {
    return bad("'messages' is required: a non-empty array of messages");
  }
  json messages = json::array();
  for (size_t i = 0; i < body["messages"].size(); ++i) {
    LLMESH_TRY(add_message(body["messages"][i], "messages[" + std::to_string(i) + "]", messages, system));
  }
  if (messages.empty()) return bad("'messages' holds nothing for the model (only system text)");
  if (!system.empty()) messages.insert(messages.begin(), json{{"role", "system"}, {"content", std::move(system)}});
  // Anthropic's prefill: a final assistant message with text is the answer's start, which the
  // model continues (the chat endpoint's continue_final_message; the reply holds what follows).
  // (Blank text is not continued: a template would close the turn around nothing.)
  const json& last = messages.back();
  if (last["role"] == "assistant" && !last.contains("tool_calls")) {
    std::string text = last["content"].is_string() ? last["content"].get<std::string>() : std::string();
    if (last["content"].is_array()) {
      for (const json& part : last["content"]) text += part["text"].get<std::string>();
    }
    if (!blank(text)) {
      chat["continue_final_message"] = true;
      chat["add_generation_prompt"] = false;
    }
  }
  chat["messages"] = std::move(messages);
  if (sent(body, "tools")) {
    auto tools = chat_tools(body["tools"]);
    if (!tools) return tools.take_error();
    chat["tools"] = std::move(*tools);
  }
  if (sent(body, "tool_choice")) LLMESH_TRY(add_tool_choice(body["tool_choice"], chat));
  LLMESH_TRY(add_template_kwargs(body, chat));
  if (counting) return chat;

  if (!sent(body, "max_tokens")) return bad("'max_tokens' is required: the most tokens to generate");
  if (!body["max_tokens"].is_number_integer() || body["max_tokens"].get<int64_t>() < 1) {
    return bad("'max_tokens' must be an integer of at least 1");
  }
  chat["max_tokens"] = body["max_tokens"];
  if (sent(body, "stop_sequences")) {
    const json& s = body["stop_sequences"];
    if (!s.is_array()) return bad("'stop_sequences' must be an array of strings");
    for (const json& v : s) {
      if (!v.is_string()) return bad("'stop_sequences' must be an array of strings");
    }
    chat["stop"] = s;
  }
  if (sent(body, "metadata") && !body["metadata"].is_object()) return bad("'metadata' must be an object");
  if (sent(body, "output_config") && sent(body["output_config"], "format")) {
    const json& f = body["output_config"]["format"];
    if (type_of(f) != "json_schema" || !f.contains("schema") || !f["schema"].is_object()) {
      return bad("'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}");
    }
    chat["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "response"}, {"schema", f["schema"]}}}};
  }
  // Sampling, and vLLM's extensions: checked by the chat endpoint as they are there.
  for (const char* name : {"temperature", "top_p", "top_k", "seed", "min_p", "repetition_penalty", "presence_penalty",
                           "frequency_penalty", "min_tokens", "stop_token_ids", "ignore_eos", "skip_special_tokens",
                           "include_reasoning", "priority", "cache_salt", "logit_bias"}) {
    if (sent(body, name)) chat[name] = body[name];
  }
  if (sent(body, "stream")) {
    if (!body["stream"].is_boolean()) return bad("'stream' must be true or false");
    if (body["stream"].get<bool>()) {
      chat["stream"] = true;
      // The message's events carry usage from the start (message_start's input tokens).
      chat["stream_options"] = {{"include_usage", true}, {"continuous_usage_stats", true}};
    }
  }
  return chat;
}

std::string_view messages_error_type(std::string_view code) {
  if (code == "invalid_request" || code == "unsupported") return "invalid_request_error";
  if (code == "unauthorized") return "authentication_error";
  if (code == "not_found") return "not_found_error";
  if (code == "overloaded") return "rate_limit_error";
  if (code == "replica_unavailable") return "overloaded_error";
  if (code == "deadline_exceeded") return "timeout_error";
  return "api_error";
}

std::string messages_error_body(std::string_view openai_error_body, int status) {
  const json j = json::parse(openai_error_body, nullptr, false);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_object()) return std::string(openai_error_body);
  json e = error_object(j["error"]);
  if (status == 413) e["type"] = "request_too_large";
  return dumped({{"type", "error"}, {"error", std::move(e)}});
}

messages_renderer::messages_renderer(std::string_view chat_id, std::string model) : model_(std::move(model)) {
  const size_t dash = chat_id.find('-');
  id_ = "msg_" + std::string(dash == std::string_view::npos ? chat_id : chat_id.substr(dash + 1));
}

std::string messages_renderer::whole(std::string_view chat_body) const {
  json j = json::parse(chat_body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::string(chat_body);
  if (j.contains("error")) return messages_error_body(chat_body);
  try {
    // Not const: a member another shape lacks reads as null; one of the wrong type throws.
    json& c = j["choices"][0];
    json& msg = c["message"];
    json content = json::array();
    if (msg["reasoning_content"].is_string() && !msg["reasoning_content"].get_ref<const std::string&>().empty()) {
      content.push_back({{"type", "thinking"}, {"thinking", msg["reasoning_content"]}, {"signature", signature_of(id_, content.size())}});
    }
    if (msg["content"].is_string() && !blank(msg["content"].get_ref<const std::string&>())) {
      content.push_back({{"type", "text"}, {"text", msg["content"]}});
    }
    bool tool_used = false;
    if (msg["tool_calls"].is_array()) {
      for (const json& t : msg["tool_calls"]) {
        const std::string args = str_of(member(t, "function"), "arguments");
        auto input = call_input(args);
        if (!input) {  // nothing is lost: the call's text
          content.push_back({{"type", "text"}, {"text", args}});
          continue;
        }
        content.push_back({{"type", "tool_use"}, {"id", str_of(t, "id")}, {"name", str_of(member(t, "function"), "name")}, {"input", std::move(*input)}});
        tool_used = true;
      }
    }
    auto [stop, sequence] = stop_of(str_of(c, "finish_reason"), c["stop_reason"], tool_used);
    const json m = {{"id", id_},          {"type", "message"},        {"role", "assistant"},     {"model", model_},
                    {"content", content}, {"stop_reason", stop}, {"stop_sequence", sequence}, {"usage", usage_of(j["usage"])}};
    return dumped(m);
  } catch (const nlohmann::json::exception&) {  // not the chat renderer's shape (a bug): as it is
    return std::string(chat_body);
  }
}

std::string messages_renderer::open(block kind, json content_block) {
  open_ = kind;
  held_.clear();  // blank text before another block: none of its own
  return event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(content_block)}});
}

std::string messages_renderer::close_open() {
  if (open_ == block::none) return "";
  std::string out;
  if (open_ == block::thinking) {
    out += event("content_block_delta", {{"type", "content_block_delta"},
                                         {"index", index_},
                                         {"delta", {{"type", "signature_delta"}, {"signature", signature_of(id_, index_)}}}});
  }
  out += event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}});
  open_ = block::none;
  ++index_;
  return out;
}

json messages_renderer::message_delta() const {
  auto [stop, sequence] = stop_of(finish_reason_, stop_reason_, tool_used_);
  return {{"type", "message_delta"}, {"delta", {{"stop_reason", stop}, {"stop_sequence", sequence}}}, {"usage", usage_of(usage_)}};
}

std::string messages_renderer::finish() {
  ended_ = true;
  std::string out = close_open();
  out += event("message_delta", message_delta());
  out += event("message_stop", {{"type", "message_stop"}});
  return out;
}

std::string messages_renderer::on_chunk(const json& chunk) {
  std::string out;
  if (chunk.contains("error")) {  // mid-stream (before anything, the reply is an error instead)
    ended_ = true;
    return event("error", {{"type", "error"}, {"error", error_object(chunk["error"])}});
  }
  if (member(chunk, "usage").is_object()) usage_ = chunk["usage"];
  if (!started_) {
    started_ = true;
    json u = usage_of(usage_);
    u["output_tokens"] = 0;  // (the first chunk's count is the delta's to report)
    const json m = {{"id", id_},       {"type", "message"},   {"role", "assistant"},  {"model", model_},
                    {"content", json::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr}, {"usage", std::move(u)}};
    out += event("message_start", {{"type", "message_start"}, {"message", m}});
  }
  if (!member(chunk, "choices").is_array() || chunk["choices"].empty()) return out;
  const json& c = chunk["choices"][0];
  const json& d = member(c, "delta");
  auto piece = [&](const char* key) { return str_of(d, key); };
  auto delta = [&](json body) { return event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(body)}}); };
  if (const std::string r = piece("reasoning_content"); !r.empty()) {
    if (open_ != block::thinking) {
      out += close_open();  // (two statements: the operands of + are unsequenced)
      out += open(block::thinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    }
    out += delta({{"type", "thinking_delta"}, {"thinking", r}});
  }
  auto text = [&](std::string t) {
    if (open_ != block::text && blank(held_ + t)) {
      held_ += t;  // a text block opens with its first non-blank text (whole(): none is blank)
      return;
    }
    if (open_ != block::text) {
      t = std::exchange(held_, std::string()) + t;
      out += close_open();
      out += open(block::text, {{"type", "text"}, {"text", ""}});
    }
    out += delta({{"type", "text_delta"}, {"text", t}});
  };
  if (std::string t = piece("content"); !t.empty()) text(std::move(t));
  if (member(d, "tool_calls").is_array()) {
    for (const json& tc : d["tool_calls"]) {
      const json& f = member(tc, "function");
      const std::string args = str_of(f, "arguments");
      if (!member(tc, "id").is_null()) {
        // A parser's call comes whole: arguments that are complete JSON but no object (nor a
        // string of one) are text, as whole() makes them. Others are an object, or its first
        // piece (a named call streams its arguments, a grammar keeping them an object).
        std::optional<json> input = call_input(args);
        if (!input && parse_embedded_json(args)) {  // a text block of its own, as in whole()
          held_.clear();
          out += close_open();
          out += open(block::text, {{"type", "text"}, {"text", ""}});
          out += delta({{"type", "text_delta"}, {"text", args}});
          continue;
        }
        out += close_open();
        out += open(block::tool_use, {{"type", "tool_use"}, {"id", str_of(tc, "id")}, {"name", str_of(f, "name")}, {"input", json::object()}});
        tool_used_ = true;
        if (!args.empty()) out += delta({{"type", "input_json_delta"}, {"partial_json", input ? dumped(*input) : args}});
        continue;
      }
      if (!args.empty() && open_ == block::tool_use) out += delta({{"type", "input_json_delta"}, {"partial_json", args}});
    }
  }
  if (member(c, "finish_reason").is_string()) {
    finish_reason_ = c["finish_reason"];
    stop_reason_ = member(c, "stop_reason");
    out += close_open();
  }
  return out;
}

std::string messages_renderer::stream(std::string_view chat_sse) {
  std::string out;
  detail::for_each_sse_data(chat_sse, [&](std::string_view ev) {
    if (ended_) return;
    // The chat renderer's own chunks, read without throwing (str_of, member); should one of
    // another shape (a bug) throw all the same, it is skipped rather than thrown through the
    // connection.
    try {
      if (ev == "[DONE]") {
        out += finish();  // the Messages stream ends with message_stop: no [DONE]
        return;
      }
      const json chunk = json::parse(ev, nullptr, false);
      if (!chunk.is_discarded()) out += on_chunk(chunk);
    } catch (const nlohmann::json::exception&) {
    }
  });
  return out;
}

}  // namespace llmesh::gateway
