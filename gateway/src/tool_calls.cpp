// A chat choice's output as tool calls (tool_calls.hpp).
#include "llmesh/gateway/tool_calls.hpp"

#include "partial_tag.hpp"
#include "text_space.hpp"

#include <algorithm>
#include <cctype>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

namespace llmesh::gateway {
namespace {

using detail::partial_tag;
using json = nlohmann::ordered_json;

/// Hermes-style calls (Qwen2.5/3, Hermes 2 Pro templates): <tool_call>{"name", "arguments"}</tool_call>.
constexpr std::string_view hermes_open = "<tool_call>", hermes_close = "</tool_call>";
/// Mistral's: [TOOL_CALLS] (a special token the decoder keeps for this parser), then a JSON
/// array of {"name", "arguments"} (tokenizer v3) or name[ARGS]{...} per call (v11 and later;
/// name[CALL_ID]id[ARGS]{...} where the model writes its call's id, as later tokenizers do).
constexpr std::string_view mistral_open = "[TOOL_CALLS]", mistral_args = "[ARGS]", mistral_call_id = "[CALL_ID]";

/// Phi-4-mini's: the word and bracket that open its JSON array of calls (vLLM's regex needs
/// both: "functools" alone is Python's module, in prose or code).
constexpr std::string_view phi4_open = "functools[";
/// Granite's: 3.0's special token and 3.1's string before the JSON array of calls.
constexpr std::string_view granite_token = "<|tool_call|>", granite_string = "<tool_call>";

/// The tag the automatic parser's calls start with.
std::string_view open_tag(tool_call_parser p) {
  return p == tool_call_parser::mistral ? mistral_open : p == tool_call_parser::phi4_mini_json ? phi4_open : hermes_open;
}

/// What a failed parse leaves as content: the text, without Mistral's markers (special
/// tokens kept only to find the calls; vLLM drops them too).
std::string unparsed_content(tool_call_parser p, std::string text) {
  if (p != tool_call_parser::mistral) return text;
  for (std::string_view tag : {mistral_open, mistral_args, mistral_call_id}) {
    for (size_t at; (at = text.find(tag)) != std::string::npos;) text.erase(at, tag.size());
  }
  return text;
}

/// The calls in `text`, which begins with the parser's tag (`tools`: the request's).
result<std::vector<tool_call_delta>> parse_tagged(tool_call_parser p, std::string_view text, const json* tools) {
  if (p == tool_call_parser::mistral) return parse_mistral_calls(text.substr(mistral_open.size()));
  if (p == tool_call_parser::qwen3_coder) return parse_qwen3_coder_calls(text, tools);
  if (p == tool_call_parser::phi4_mini_json) return parse_phi4_mini_calls(text);
  return parse_hermes_calls(text);
}
/// What Llama 3.1 may write before its calls (a special token: the decoder usually drops it).
constexpr std::string_view python_tag = "<|python_tag|>";

/// One past the end of the JSON object or array that begins at text[0], by bracket depth
/// outside strings; npos when it does not close.
size_t json_value_end(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
      continue;
    }
    if (ch == '"') {
      in_string = true;
    } else if (ch == '{' || ch == '[') {
      ++depth;
    } else if (ch == '}' || ch == ']') {
      if (--depth <= 0) return depth == 0 ? i + 1 : std::string_view::npos;
    }
  }
  return std::string_view::npos;
}

using detail::is_space;
using detail::lstripped;

/// Whether llama3_json takes this output for calls: it begins with "{" or the python tag.
bool llama3_calls_start(std::string_view text) { return text.starts_with('{') || text.starts_with(python_tag); }

/// The parsers that take the output whole as calls, or not at all.
bool whole_output(tool_call_parser p) {
  return p == tool_call_parser::llama3_json || p == tool_call_parser::pythonic || p == tool_call_parser::granite;
}

/// Granite's output past its optional markers (leading whitespace, "<|tool_call|>", "<tool_call>").
std::string_view granite_body(std::string_view text) {
  text = lstripped(text);
  for (std::string_view tag : {granite_token, granite_string}) {
    if (text.starts_with(tag)) text = lstripped(text.substr(tag.size()));
  }
  return text;
}

bool whole_calls_start(tool_call_parser p, std::string_view text) {
  if (p == tool_call_parser::granite) return granite_body(text).starts_with('[');
  return p == tool_call_parser::pythonic ? pythonic_calls_start(text) : llama3_calls_start(text);
}

result<std::vector<tool_call_delta>> parse_whole(tool_call_parser p, std::string_view text) {
  if (p == tool_call_parser::granite) return parse_granite_calls(text);
  return p == tool_call_parser::pythonic ? parse_pythonic_calls(text) : parse_llama3_json_calls(text);
}

/// Whether the output's text so far cannot tell yet: llama3_json — a piece of the python tag;
/// pythonic — only whitespace, or whitespace and a piece of <|python_start|>; granite —
/// whitespace and whole markers, or a piece of one after them.
bool undecided(tool_call_parser p, std::string_view held) {
  if (p == tool_call_parser::granite) {  // whitespace, or a piece of a marker after any whole ones
    const std::string_view rest = granite_body(held);
    return rest.empty() || (rest.size() < granite_token.size() && granite_token.starts_with(rest)) ||
           (rest.size() < granite_string.size() && granite_string.starts_with(rest));
  }
  if (p == tool_call_parser::pythonic) {
    const size_t first = held.find_first_not_of(" \t\n\r");
    if (first == std::string_view::npos) return true;
    held.remove_prefix(first);
    constexpr std::string_view start = "<|python_start|>";
    return held.size() < start.size() && start.starts_with(held);
  }
  return !held.empty() && held.size() < python_tag.size() && python_tag.starts_with(held);
}


}  // namespace

std::string_view tool_call_parser_name(tool_call_parser p) {
  switch (p) {
    case tool_call_parser::llama3_json: return "llama3_json";
    case tool_call_parser::mistral: return "mistral";
    case tool_call_parser::pythonic: return "pythonic";
    case tool_call_parser::qwen3_coder: return "qwen3_coder";
    case tool_call_parser::granite: return "granite";
    case tool_call_parser::phi4_mini_json: return "phi4_mini_json";
    case tool_call_parser::openai: return "openai";
    default: return "hermes";
  }
}

result<tool_call_parser> parse_tool_call_parser(std::string_view s) {
  if (s == "hermes") return tool_call_parser::hermes;
  if (s == "llama3_json") return tool_call_parser::llama3_json;
  if (s == "mistral") return tool_call_parser::mistral;
  if (s == "pythonic") return tool_call_parser::pythonic;
  if (s == "qwen3_coder" || s == "qwen3_xml") return tool_call_parser::qwen3_coder;  // (vLLM's two names of one format)
  if (s == "granite") return tool_call_parser::granite;
  if (s == "phi4_mini_json") return tool_call_parser::phi4_mini_json;
  if (s == "openai") return tool_call_parser::openai;
  return make_error(errc::invalid_request, "unknown tool-call parser '" + std::string(s) +
                                               "' (hermes, llama3_json, mistral, pythonic, qwen3_coder, granite, phi4_mini_json, openai)");
}

result<std::vector<int32_t>> tool_parser_kept_tokens(const model::tokenizer& tok, tool_call_parser p,
                                                     const std::string& model_name) {
  std::vector<int32_t> keep;
  if (p != tool_call_parser::mistral) return keep;
  for (std::string_view tag : {mistral_open, mistral_args, mistral_call_id}) {
    const auto ids = tok.encode(std::string(tag), false);
    const bool own = ids.size() == 1 && tok.decoder().token_bytes(ids[0]) == tag;
    if (own) keep.push_back(ids[0]);
    if (!own && tag == mistral_open) {
      return make_error(errc::invalid_request, "--tool-call-parser mistral: the model '" + model_name +
                                                   "' has no [TOOL_CALLS] token (it is not a Mistral tool model)");
    }
  }
  return keep;
}

std::string new_mistral_tool_call_id() {
  // Mistral's templates refuse ids that are not 9 alphanumerics (vLLM generates these too).
  thread_local std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()};
  static constexpr char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id;
  for (int i = 0; i < 9; ++i) id += alnum[rng() % 62];
  return id;
}

result<std::vector<tool_call_delta>> parse_mistral_calls(std::string_view text) {
  const error not_calls = make_error(errc::invalid_request, "the output after [TOOL_CALLS] is not Mistral's calls");
  std::vector<tool_call_delta> calls;
  auto add = [&](std::string name, const json& args, std::string id = {}) {
    tool_call_delta c;
    c.index = calls.size();
    c.id = id.empty() ? new_mistral_tool_call_id() : std::move(id);
    c.name = std::move(name);
    c.arguments = args.dump(-1, ' ', false, json::error_handler_t::replace);
    calls.push_back(std::move(c));
  };
  const size_t first = text.find_first_not_of(" \n");
  const bool json_form = first != std::string_view::npos && (text[first] == '[' || text[first] == '{');
  if (!json_form) {
    // v11: name[ARGS]{...}, the next call after another [TOOL_CALLS].
    for (size_t pos = 0; pos < text.size();) {
      const size_t args = text.find(mistral_args, pos);
      if (args == std::string_view::npos) return not_calls;
      auto trimmed = [](std::string_view v) {
        std::string t(v);
        t.erase(0, t.find_first_not_of(" \n"));
        t.erase(t.find_last_not_of(" \n") + 1);
        return t;
      };
      const std::string_view head = text.substr(pos, args - pos);
      const size_t id_at = head.find(mistral_call_id);
      std::string name = trimmed(head.substr(0, id_at));
      std::string id = id_at == std::string_view::npos ? std::string() : trimmed(head.substr(id_at + mistral_call_id.size()));
      if (name.empty()) return not_calls;
      // The model's own id when it is the kind Mistral's templates take back (9 alphanumerics);
      // otherwise a new one.
      if (id.size() != 9 || !std::all_of(id.begin(), id.end(), [](unsigned char ch) { return std::isalnum(ch) != 0; })) id.clear();
      const size_t body = args + mistral_args.size(), next = text.find(mistral_open, body);
      const auto j = parse_embedded_json(text.substr(body, next == std::string_view::npos ? text.npos : next - body));
      if (!j || !j->is_object()) return not_calls;
      add(std::move(name), *j, std::move(id));
      pos = next == std::string_view::npos ? text.size() : next + mistral_open.size();
    }
  } else {
    // v3: a JSON array of {"name", "arguments"} (a single object too).
    const auto j = parse_embedded_json(text);
    if (!j || !(j->is_array() || j->is_object())) return not_calls;
    for (const auto& e : j->is_array() ? *j : json::array({*j})) {
      if (!e.is_object() || !e.contains("name") || !e["name"].is_string()) return not_calls;
      auto args = e.find("arguments");
      add(e["name"].get<std::string>(), args == e.end() ? json::object() : *args);
    }
  }
  if (calls.empty()) return not_calls;
  return calls;
}

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

namespace {

/// A JSON array of call objects {"name": string, `args` (or `alt_args` when given): any} as calls.
result<std::vector<tool_call_delta>> json_list_calls(const std::optional<json>& j, const char* args_key, const char* alt_args_key,
                                                     const error& not_calls) {
  if (!j || !j->is_array() || j->empty()) return not_calls;
  std::vector<tool_call_delta> calls;
  for (const auto& e : *j) {
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string()) return not_calls;
    auto args = e.find(args_key);
    if (args == e.end() && alt_args_key) args = e.find(alt_args_key);
    if (args == e.end()) return not_calls;
    tool_call_delta c;
    c.index = calls.size();
    c.id = new_tool_call_id();
    c.name = e["name"].get<std::string>();
    c.arguments = args->dump(-1, ' ', false, json::error_handler_t::replace);
    calls.push_back(std::move(c));
  }
  return calls;
}

}  // namespace

result<std::vector<tool_call_delta>> parse_granite_calls(std::string_view text) {
  const error not_calls = make_error(errc::invalid_request, "the output is not a JSON array of {\"name\", \"arguments\"}");
  text = detail::stripped(granite_body(text));
  if (!text.starts_with('[')) return not_calls;
  return json_list_calls(parse_embedded_json(text), "arguments", nullptr, not_calls);
}

result<std::vector<tool_call_delta>> parse_phi4_mini_calls(std::string_view text) {
  const error not_calls = make_error(errc::invalid_request, "the output after \"functools\" is not a JSON array of calls");
  const size_t at = text.find(phi4_open);
  if (at == std::string_view::npos) return not_calls;
  const std::string_view list = text.substr(at + phi4_open.size() - 1);  // from its "["
  const size_t len = json_value_end(list);
  if (len == std::string_view::npos) return not_calls;
  return json_list_calls(parse_embedded_json(list.substr(0, len)), "arguments", "parameters", not_calls);
}

result<std::vector<tool_call_delta>> parse_llama3_json_calls(std::string_view text) {
  const error not_calls =
      make_error(errc::invalid_request, "the output is not JSON calls {\"name\", \"parameters\"} separated by \";\"");
  if (text.starts_with(python_tag)) text.remove_prefix(python_tag.size());
  std::vector<tool_call_delta> calls;
  size_t pos = 0;
  auto skip_spaces = [&] {
    while (pos < text.size() && is_space(text[pos])) ++pos;
  };
  skip_spaces();
  while (pos < text.size()) {
    if (text[pos] != '{') return not_calls;
    const size_t len = json_value_end(text.substr(pos));
    if (len == std::string_view::npos) return not_calls;
    const auto j = parse_embedded_json(text.substr(pos, len));
    if (!j || !j->is_object() || !j->contains("name") || !(*j)["name"].is_string()) return not_calls;
    auto args = j->find("arguments");  // vLLM's order: arguments, else parameters
    if (args == j->end()) args = j->find("parameters");
    if (args == j->end()) return not_calls;
    tool_call_delta c;
    c.index = calls.size();
    c.id = new_tool_call_id();
    c.name = (*j)["name"].get<std::string>();
    c.arguments = args->dump(-1, ' ', false, json::error_handler_t::replace);
    calls.push_back(std::move(c));
    pos += len;
    skip_spaces();
    if (pos < text.size() && (text[pos] == ';' || text[pos] == ',')) {  // "; " as Llama writes; "," or
      ++pos;                                                            // whitespace alone pass too
      skip_spaces();
    }
  }
  if (calls.empty()) return not_calls;
  return calls;
}

void shape_tool_calls(const tool_output& t, choice_delta& c) {
  if (t.mode == tool_choice_mode::automatic && t.parser == tool_call_parser::openai) return;  // harmony: shaped already
  if (t.mode == tool_choice_mode::automatic && whole_output(t.parser)) {
    if (!whole_calls_start(t.parser, c.text)) return;
    auto calls = parse_whole(t.parser, c.text);
    if (!calls) return;  // not calls after all: all of it is content
    c.tool_calls = std::move(*calls);
    c.text.clear();
    if (c.finish == "stop") c.finish = "tool_calls";
    return;
  }
  if (t.mode == tool_choice_mode::automatic) {
    const size_t at = c.text.find(open_tag(t.parser));
    if (at == std::string::npos) return;
    auto calls = parse_tagged(t.parser, std::string_view(c.text).substr(at), t.tools.get());
    if (!calls) {  // not calls after all: all of it is content
      c.text = unparsed_content(t.parser, std::move(c.text));
      return;
    }
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
  if (t_.mode == tool_choice_mode::automatic && t_.parser == tool_call_parser::openai) {  // harmony: shaped already
    out.push_back(std::move(c));
    return out;
  }
  if (t_.mode == tool_choice_mode::named) {
    if (c.role) {
      // The call's start; the first text piece (if any) follows in its own delta.
      choice_delta head;
      head.index = c.index;
      head.role = true;
      head.role_name = c.role_name;
      head.tool_calls = {tool_call_delta{0, new_tool_call_id(), t_.name, ""}};
      c.role = false;
      if (c.text.empty()) {  // nothing more to say: the head carries the rest of c
        head.finish = std::move(c.finish);
        head.stop_string = std::move(c.stop_string);
        head.stop_token = c.stop_token;
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
  if (t_.mode == tool_choice_mode::automatic) {
    return whole_output(t_.parser) ? shape_whole_output(std::move(c)) : shape_automatic(std::move(c));
  }
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

std::vector<choice_delta> tool_call_stream::shape_whole_output(choice_delta c) {
  if (!decided_) {
    held_ += c.text;
    c.text.clear();
    // The first text tells: calls begin with "{" or the python tag (pythonic: "[" after any
    // whitespace); a piece of the tag (pythonic: whitespace) waits.
    if (!held_.empty() && (!undecided(t_.parser, held_) || c.finish)) {
      decided_ = true;
      in_calls_ = whole_calls_start(t_.parser, held_);
      if (!in_calls_) {  // content: it streams from here on
        c.text = std::move(held_);
        held_.clear();
      }
    }
  } else if (in_calls_) {
    held_ += c.text;
    c.text.clear();
  }
  if (in_calls_ && t_.parser == tool_call_parser::pythonic && !pythonic_calls_may_follow(held_)) {
    in_calls_ = false;  // "[1] ...", "[note] ...": prose after all, it streams from here on
    c.text = std::move(held_);
    held_.clear();
  }
  if (c.finish) {
    if (in_calls_) {
      auto calls = parse_whole(t_.parser, held_);
      if (calls) {
        c.tool_calls = std::move(*calls);
        if (*c.finish == "stop") c.finish = "tool_calls";
      } else {
        c.text += held_;  // not calls after all: content
      }
    } else {
      c.text += held_;  // nothing decided (no text, or a piece of the tag)
    }
    held_.clear();
  }
  std::vector<choice_delta> out;
  if (!empty_delta(c)) out.push_back(std::move(c));
  return out;
}

std::vector<choice_delta> tool_call_stream::shape_automatic(choice_delta c) {
  if (!in_calls_) {
    std::string text = std::move(pending_) + c.text;
    pending_.clear();
    if (const size_t at = text.find(open_tag(t_.parser)); at != std::string::npos) {
      in_calls_ = true;  // from here on everything is held until the choice ends
      held_ = text.substr(at);
      text.resize(at);
    } else {
      const size_t keep = partial_tag(text, open_tag(t_.parser));  // it may begin a tag: wait for the next piece
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
      auto calls = parse_tagged(t_.parser, held_, t_.tools.get());
      if (calls) {
        c.tool_calls = std::move(*calls);
        if (*c.finish == "stop") c.finish = "tool_calls";
      } else {
        c.text += unparsed_content(t_.parser, std::move(held_));  // not calls after all: content
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
