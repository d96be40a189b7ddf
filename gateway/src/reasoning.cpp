// Reasoning outputs split from the content (reasoning.hpp).
#include "llmesh/gateway/reasoning.hpp"

#include <algorithm>

#include "harmony.hpp"
#include "partial_tag.hpp"

namespace llmesh::gateway {
namespace {

constexpr std::string_view think_open = "<think>", think_close = "</think>";

}  // namespace

std::string_view reasoning_parser_name(reasoning_parser p) {
  switch (p) {
    case reasoning_parser::deepseek_r1: return "deepseek_r1";
    case reasoning_parser::qwen3: return "qwen3";
    case reasoning_parser::openai_gptoss: return "openai_gptoss";
    default: return "none";
  }
}

result<reasoning_parser> parse_reasoning_parser(std::string_view s) {
  if (s == "none" || s.empty()) return reasoning_parser::none;
  if (s == "deepseek_r1") return reasoning_parser::deepseek_r1;
  if (s == "qwen3") return reasoning_parser::qwen3;
  if (s == "openai_gptoss") return reasoning_parser::openai_gptoss;
  return make_error(errc::invalid_request,
                    "unknown reasoning parser '" + std::string(s) + "' (none, deepseek_r1, qwen3, openai_gptoss)");
}

std::string_view harmony_final_header() { return "<|channel|>final<|message|>"; }

status check_reasoning_tokens(const model::tokenizer& tok, const std::string& model_name, reasoning_parser p) {
  const bool harmony = p == reasoning_parser::openai_gptoss;
  const std::vector<std::string_view> tags = harmony ? std::vector<std::string_view>{"<|start|>", "<|channel|>", "<|message|>", "<|end|>"}
                                                     : std::vector<std::string_view>{think_open, think_close};
  for (std::string_view tag : tags) {
    const auto ids = tok.encode(std::string(tag), false);
    if (ids.size() != 1 || tok.decoder().token_bytes(ids[0]) != tag) {
      return make_error(errc::invalid_request, "--reasoning-parser: the model '" + model_name + "' has no token \"" +
                                                   std::string(tag) + "\" of its own (" +
                                                   (harmony ? "it does not write OpenAI's harmony format" : "it is not a reasoning model") + ")");
    }
  }
  return ok_status();
}

bool prompt_opens_reasoning(std::string_view prompt) {
  const size_t end = prompt.find_last_not_of(" \t\n\r");
  return end != std::string_view::npos && prompt.substr(0, end + 1).ends_with(think_open);
}

bool prompt_closes_reasoning(std::string_view prompt) {
  const size_t end = prompt.find_last_not_of(" \t\n\r");
  return end != std::string_view::npos && prompt.substr(0, end + 1).ends_with(think_close);
}

std::string_view reasoning_end_tag() { return think_close; }
std::string_view reasoning_start_tag() { return think_open; }

bool leaves_reasoning_open(std::string_view text) {
  const size_t open = text.rfind(think_open);
  return open != std::string_view::npos && text.find(think_close, open) == std::string_view::npos;
}

size_t count_reasoning_tokens(const reasoning_mode& m, const std::vector<int32_t>& output) {
  if (!m.active() || m.open_id < 0 || m.close_id < 0 || output.empty()) return 0;
  size_t from = 0;
  if (output[0] == m.open_id) {
    from = 1;
  } else if (!(m.opened || (m.parser == reasoning_parser::deepseek_r1 && !m.closed))) {
    return 0;  // an answer from the start
  }
  size_t n = 0;
  for (size_t i = from; i < output.size() && output[i] != m.close_id; ++i) ++n;
  return n;
}

reasoning_stream::reasoning_stream(reasoning_mode m) : m_(m) {
  if (m_.parser == reasoning_parser::openai_gptoss) harmony_ = std::make_shared<detail::harmony_stream>(m_.include, m_.harmony_calls);
}

void reasoning_stream::shape(choice_delta& c) {
  if (!m_.active()) return;
  if (harmony_) {
    harmony_->shape(c);
    reasoned_ = harmony_->reasoned();
    return;
  }
  const bool last = c.finish.has_value();
  std::string in = std::move(pending_) + c.text;
  pending_.clear();
  std::string reasoning, content;
  for (bool more = true; more;) {
    switch (state_) {
      case state::start: {
        if (in.starts_with(think_open)) {
          in.erase(0, think_open.size());
          state_ = state::reasoning;
        } else if (!last && think_open.starts_with(in)) {  // too little to tell (nothing yet included)
          pending_ = std::move(in);
          in.clear();
          more = false;
        } else {
          const bool thinks = m_.opened || (m_.parser == reasoning_parser::deepseek_r1 && !m_.closed);
          state_ = thinks ? state::reasoning : state::content;
        }
        break;
      }
      case state::reasoning: {
        reasoned_ = true;
        if (const size_t at = in.find(think_close); at != std::string::npos) {
          reasoning.append(in, 0, at);
          in.erase(0, at + think_close.size());
          state_ = state::content;
          break;
        }
        const size_t keep = last ? 0 : detail::partial_tag(in, think_close);
        reasoning.append(in, 0, in.size() - keep);
        pending_ = in.substr(in.size() - keep);
        in.clear();
        more = false;
        break;
      }
      case state::content:
        content += in;
        in.clear();
        more = false;
        break;
    }
  }
  c.text = std::move(content);
  if (!reasoning.empty() && m_.include) c.reasoning = std::move(reasoning);
}

void split_reasoning(const reasoning_mode& m, choice_delta& c) {
  if (!m.active()) return;
  reasoning_stream s(m);
  const bool had_finish = c.finish.has_value();
  if (!had_finish) c.finish = "stop";  // a whole choice: everything is in, nothing to hold
  s.shape(c);
  if (!had_finish) c.finish.reset();
  if (s.reasoned() && m.include && !c.reasoning) c.reasoning = std::string();
}

}  // namespace llmesh::gateway
