// A chat choice's output as tool calls (tool_calls.hpp).
#include "llmesh/gateway/tool_calls.hpp"

#include <algorithm>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

/// Hermes-style calls (Qwen2.5/3, Hermes 2 Pro templates): <tool_call>{"name", "arguments"}</tool_call>.
constexpr std::string_view hermes_open = "<tool_call>", hermes_close = "</tool_call>";


/// How many of text's last bytes could begin a "<tool_call>" tag (held back while streaming).
size_t partial_tag(std::string_view text) {
  for (size_t n = std::min(text.size(), hermes_open.size() - 1); n > 0; --n) {
    if (hermes_open.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

}  // namespace

std::string new_tool_call_id() {
  // Ids need only be unique among a conversation's calls: 128 random bits, per thread.
  thread_local std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()};
  static constexpr char hex[] = "0123456789abcdef";
  std::string id = "chatcmpl-tool-";
  for (int half = 0; half < 2; ++half) {
    uint64_t bits = rng();
    for (int i = 0; i < 16; ++i, bits >>= 4) id += hex[bits & 15];
  }
  return id;
}

result<std::vector<tool_call_delta>> parse_required_calls(std::string_view text) {
  const auto j = parse_embedded_json(text);
  const error not_calls = make_error(errc::invalid_request, "the output is not a JSON array of {\"name\", \"parameters\"}");
  if (!j || !j->is_array() || j->empty()) return not_calls;
  std::vector<tool_call_delta> calls;
  for (const auto& e : *j) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("parameters")) return not_calls;
    tool_call_delta c;
    c.index = calls.size();
    c.id = new_tool_call_id();
    c.name = e["name"].get<std::string>();
    c.arguments = e["parameters"].dump(-1, ' ', false, json::error_handler_t::replace);
    calls.push_back(std::move(c));
  }
  return calls;
}

result<std::vector<tool_call_delta>> parse_hermes_calls(std::string_view text) {
  const error not_calls = make_error(errc::invalid_request, "the output holds no well-formed <tool_call> block");
  std::vector<tool_call_delta> calls;
  for (size_t pos = 0; (pos = text.find(hermes_open, pos)) != std::string_view::npos;) {
    const size_t start = pos + hermes_open.size(), end = text.find(hermes_close, start);
    const auto j = parse_embedded_json(text.substr(start, end == std::string_view::npos ? text.npos : end - start));
    if (!j || !j->is_object() || !j->contains("name") || !(*j)["name"].is_string()) return not_calls;
    tool_call_delta c;
    c.index = calls.size();
    c.id = new_tool_call_id();
    c.name = (*j)["name"].get<std::string>();
    auto args = j->find("arguments");
    c.arguments = args == j->end() ? "{}" : args->dump(-1, ' ', false, json::error_handler_t::replace);
    calls.push_back(std::move(c));
    pos = end == std::string_view::npos ? text.size() : end + hermes_close.size();
  }
  if (calls.empty()) return not_calls;
  return calls;
}

void shape_tool_calls(const tool_output& t, choice_delta& c) {
  if (t.mode == tool_choice_mode::automatic) {
    const size_t at = c.text.find(hermes_open);
    if (at == std::string::npos) return;
    auto calls = parse_hermes_calls(std::string_view(c.text).substr(at));
    if (!calls) return;  // not calls after all: all of it is content
    c.tool_calls = std::move(*calls);
    c.text.resize(at);  // the content is what came before the first call (vLLM's)
    if (c.finish == "stop") c.finish = "tool_calls";
    return;
  }
  if (t.mode == tool_choice_mode::named) {
    c.tool_calls = {tool_call_delta{0, new_tool_call_id(), t.name, std::move(c.text)}};
    c.text.clear();
    return;
  }
  if (t.mode != tool_choice_mode::required) return;
  auto calls = parse_required_calls(c.text);
  if (!calls) return;  // cut short: the text stays the content, with its finish reason
  c.tool_calls = std::move(*calls);
  c.text.clear();
  if (c.finish == "stop") c.finish = "tool_calls";
}

std::vector<choice_delta> tool_call_stream::shape(choice_delta c) {
  std::vector<choice_delta> out;
  if (t_.mode == tool_choice_mode::named) {
    if (c.role) {
      // The call's start; the first text piece (if any) follows in its own delta.
      choice_delta head;
      head.index = c.index;
      head.role = true;
      head.tool_calls = {tool_call_delta{0, new_tool_call_id(), t_.name, ""}};
      c.role = false;
      if (c.text.empty()) {  // nothing more to say: the head carries the rest of c
        head.finish = std::move(c.finish);
        head.token_ids = std::move(c.token_ids);
        head.prompt_token_ids = std::move(c.prompt_token_ids);
        head.with_token_ids = c.with_token_ids;
        head.logprobs = std::move(c.logprobs);
        out.push_back(std::move(head));
        return out;
      }
      head.with_token_ids = c.with_token_ids;  // an empty token_ids list, as other chunks of such a stream have
      if (head.with_token_ids) head.prompt_token_ids = std::move(c.prompt_token_ids);
      if (c.logprobs) head.logprobs.emplace();
      out.push_back(std::move(head));
    }
    if (!c.text.empty()) c.tool_calls = {tool_call_delta{0, "", "", std::move(c.text)}};
    c.text.clear();
    out.push_back(std::move(c));
    return out;
  }
  if (t_.mode == tool_choice_mode::automatic) return shape_automatic(std::move(c));
  if (t_.mode == tool_choice_mode::required) {
    held_ += c.text;
    c.text.clear();
    if (c.finish) {
      auto calls = parse_required_calls(held_);
      if (calls) {
        c.tool_calls = std::move(*calls);
        if (*c.finish == "stop") c.finish = "tool_calls";
      } else {
        c.text = std::move(held_);  // cut short: what there is, as content
      }
      held_.clear();
    }
    if (!empty_delta(c)) out.push_back(std::move(c));
    return out;
  }
  out.push_back(std::move(c));
  return out;
}

std::vector<choice_delta> tool_call_stream::shape_automatic(choice_delta c) {
  if (!in_calls_) {
    std::string text = std::move(pending_) + c.text;
    pending_.clear();
    if (const size_t at = text.find(hermes_open); at != std::string::npos) {
      in_calls_ = true;  // from here on everything is held until the choice ends
      held_ = text.substr(at);
      text.resize(at);
    } else {
      const size_t keep = partial_tag(text);  // it may begin a tag: wait for the next piece
      pending_ = text.substr(text.size() - keep);
      text.resize(text.size() - keep);
    }
    c.text = std::move(text);
  } else {
    held_ += c.text;
    c.text.clear();
  }
  if (c.finish) {
    if (in_calls_) {
      auto calls = parse_hermes_calls(held_);
      if (calls) {
        c.tool_calls = std::move(*calls);
        if (*c.finish == "stop") c.finish = "tool_calls";
      } else {
        c.text += held_;  // not calls after all: content
      }
    } else {
      c.text += pending_;
    }
    held_.clear();
    pending_.clear();
  }
  std::vector<choice_delta> out;
  if (!empty_delta(c)) out.push_back(std::move(c));
  return out;
}

}  // namespace llmesh::gateway
