// OpenAI's harmony output into content, reasoning and tool calls (harmony.hpp).
#include "harmony.hpp"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>

#include "llmesh/gateway/tool_calls.hpp"
#include "partial_tag.hpp"

namespace llmesh::gateway::detail {
namespace {

constexpr std::string_view tag_message = "<|message|>", tag_start = "<|start|>", tag_channel = "<|channel|>";
constexpr std::array<std::string_view, 4> body_ends = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};

bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/// The word at `at` of a header: up to whitespace or the next tag.
std::string word_at(std::string_view h, size_t at) {
  size_t end = at;
  while (end < h.size() && !space(h[end]) && h.compare(end, 2, "<|") != 0) ++end;
  return std::string(h.substr(at, end - at));
}

}  // namespace

void harmony_stream::begin_message(std::string h) {
  structured_ = true;
  in_body_ = true;
  message_started_ = false;
  std::string_view v = h;
  if (v.starts_with(tag_start)) v.remove_prefix(tag_start.size());
  std::string channel, recipient;
  if (const size_t at = v.find(tag_channel); at != std::string_view::npos) channel = word_at(v, at + tag_channel.size());
  for (size_t at = v.find("to="); at != std::string_view::npos; at = v.find("to=", at + 1)) {
    if (at == 0 || space(v[at - 1]) || v[at - 1] == '>') {
      recipient = word_at(v, at + 3);
      break;
    }
  }
  // The content type: the word after <|constrain|>, else a bare word of the header that is not
  // the role, the channel or the recipient ("commentary json"); none: JSON (vLLM's assumption).
  std::string type;
  if (const size_t at = v.find("<|constrain|>"); at != std::string_view::npos) {
    type = word_at(v, at + std::string_view("<|constrain|>").size());
  } else {
    for (size_t at = 0; at < v.size();) {
      if (v.compare(at, 2, "<|") == 0) {  // a tag: skip it
        const size_t close = v.find("|>", at + 2);
        at = close == std::string_view::npos ? v.size() : close + 2;
        continue;
      }
      if (space(v[at])) {
        ++at;
        continue;
      }
      const std::string w = word_at(v, at);
      at += std::max<size_t>(w.size(), 1);
      if (w != "assistant" && w != channel && !w.starts_with("to=")) type = w;
    }
  }
  json_ = type.empty() || type.find("json") != std::string::npos;
  args_.clear();
  name_.clear();
  if (recipient.starts_with("functions.")) {
    route_ = calls_ ? route::call : route::content;
    name_ = recipient.substr(std::string_view("functions.").size());
  } else if (recipient.empty() && channel == "final") {
    route_ = route::content;
  } else {
    route_ = route::reasoning;  // analysis, commentary preambles, built-in tools (browser.*, python, container.*)
  }
}

void harmony_stream::body(std::string_view text, std::string& content, std::string& reasoning) {
  if (text.empty()) return;
  if (route_ == route::call) {
    args_ += text;
    return;
  }
  const bool first = !message_started_;
  message_started_ = true;
  if (route_ == route::reasoning) {
    if (!include_) {
      reasoned_ = true;
      return;
    }
    if (first && reasoned_) reasoning += '\n';
    reasoned_ = true;
    reasoning += text;
  } else {
    if (first && said_) content += '\n';
    said_ = true;
    content += text;
  }
}

void harmony_stream::end_message(bool complete, std::string& content, std::vector<tool_call_delta>& calls) {
  in_body_ = false;
  if (route_ != route::call) return;
  if (!complete) {  // cut short: nothing is lost, the body is content
    route_ = route::content;
    std::string reasoning;
    body(args_, content, reasoning);
    return;
  }
  std::string args = args_;
  if (json_) {
    auto j = nlohmann::ordered_json::parse(args, nullptr, false);
    if (!j.is_discarded()) args = j.dump();
  }
  calls.push_back(tool_call_delta{calls_made_++, new_tool_call_id(), name_, std::move(args)});
}

void harmony_stream::shape(choice_delta& c) {
  const bool last = c.finish.has_value();
  std::string in = std::move(pending_) + c.text;
  pending_.clear();
  std::string content, reasoning;
  std::vector<tool_call_delta> calls;
  std::string_view rest = in;
  while (!rest.empty()) {
    if (!in_body_) {  // the header so far and this piece: <|message|> may span the two
      const size_t had = header_.size();
      header_ += rest;
      const size_t at = header_.find(tag_message, had >= tag_message.size() ? had - tag_message.size() + 1 : 0);
      if (at == std::string::npos) {  // the header goes on (held whole: it is short)
        rest = {};
        break;
      }
      rest.remove_prefix(at + tag_message.size() - had);
      header_.resize(at);
      begin_message(std::move(header_));
      header_.clear();
      continue;
    }
    size_t end = std::string_view::npos, len = 0;
    for (std::string_view tag : body_ends) {
      const size_t at = rest.find(tag);
      if (at < end) {
        end = at;
        len = tag == tag_start ? 0 : tag.size();  // <|start|> begins the next header
      }
    }
    if (end == std::string_view::npos) {
      size_t keep = 0;
      if (!last) {
        for (std::string_view tag : body_ends) keep = std::max(keep, partial_tag(rest, tag));
      }
      body(rest.substr(0, rest.size() - keep), content, reasoning);
      pending_ = std::string(rest.substr(rest.size() - keep));
      rest = {};
      break;
    }
    body(rest.substr(0, end), content, reasoning);
    rest.remove_prefix(end + len);
    end_message(true, content, calls);
  }
  if (last) {
    // The generation's end (<|call|> or <|return|>, unshown) ends a message in progress: whole
    // when it stopped, cut short at max_tokens.
    if (in_body_) end_message(c.finish == "stop" && !c.stop_string, content, calls);  // a stop string cut it short
    if (!structured_ && !header_.empty()) {  // never harmony: the output as it came
      content += header_;
      said_ = true;
    }
    header_.clear();
  }
  c.text = std::move(content);
  if (!reasoning.empty()) c.reasoning = std::move(reasoning);
  if (!calls.empty()) {
    for (auto& call : calls) c.tool_calls.push_back(std::move(call));
  }
  if (last && calls_made_ > 0 && c.finish == "stop") c.finish = "tool_calls";
}

}  // namespace llmesh::gateway::detail
