#include "llmesh/model/chat_template.hpp"

#include <filesystem>

#include "jinja/eval.hpp"
#include "gguf_model.hpp"
#include "read_file.hpp"
#include "jinja/parser.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::ordered_json;

std::string token_text(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const json& t = cfg[key];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
  return "";
}

}  // namespace

result<chat_template> chat_template::parse(const std::string& source) {
  auto nodes = jinja::parse(source);
  if (!nodes) return nodes.take_error();
  chat_template t;
  t.nodes_ = std::make_shared<const jinja::node_list>(std::move(nodes.value()));
  return t;
}

result<chat_template> chat_template::load(const std::string& dir) {
  std::string path = model_file_label(dir, "tokenizer_config.json");
  auto text = read_model_file(dir, "tokenizer_config.json");
  // transformers 4.51 on saves the template as chat_template.jinja beside the tokenizer, and a
  // file there clobbers tokenizer_config.json's (as transformers and vLLM load them); a
  // processor's chat_template.json (multimodal checkpoints) is the last resort.
  std::error_code ec;
  const bool gguf = is_gguf_file(dir);
  const bool jinja_file = !gguf && std::filesystem::is_regular_file(dir + "/chat_template.jinja", ec);
  if (!text && !jinja_file) return text.take_error();
  json cfg = text ? json::parse(*text, nullptr, false) : json::object();
  if (cfg.is_discarded() || !cfg.is_object()) return make_error(errc::invalid_request, path + ": not a JSON object");
  std::string source;
  if (jinja_file) {
    path = dir + "/chat_template.jinja";
    auto file = read_text_file(path);
    if (!file) return file.take_error();
    source = std::move(*file);
    if (source.empty()) return make_error(errc::invalid_request, path + ": empty");
  } else if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
    source = cfg["chat_template"].get<std::string>();
  } else if (cfg.contains("chat_template") && cfg["chat_template"].is_array()) {
    for (const auto& t : cfg["chat_template"]) {
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string()) {
        source = t["template"].get<std::string>();
      }
    }
  }
  if (source.empty() && !gguf && std::filesystem::is_regular_file(dir + "/chat_template.json", ec)) {
    const std::string processor = dir + "/chat_template.json";
    auto file = read_text_file(processor);
    if (!file) return file.take_error();
    json p = json::parse(*file, nullptr, false);
    if (!p.is_object() || !p.contains("chat_template") || !p["chat_template"].is_string()) {
      return make_error(errc::invalid_request, processor + ": no chat_template string");
    }
    source = p["chat_template"].get<std::string>();
    path = processor;
  }
  if (source.empty()) return make_error(errc::not_found, path + ": no chat_template");
  auto t = parse(source);
  if (!t) {
    error e = t.take_error();
    e.message = path + ": " + e.message;
    return e;
  }
  t->bos_token = token_text(cfg, "bos_token");
  t->eos_token = token_text(cfg, "eos_token");
  return t;
}

result<chat_template> chat_template::load_override(const std::string& dir, const std::string& given, const std::string& flag) {
  std::error_code ec;
  const bool is_file = std::filesystem::is_regular_file(given, ec);
  std::string source, label = flag;
  if (is_file) {
    const auto size = std::filesystem::file_size(given, ec);
    if (ec) return make_error(errc::not_found, flag + " " + given + ": " + ec.message());
    if (size > (size_t{1} << 20)) return make_error(errc::invalid_request, flag + " " + given + ": over 1 MiB");
    auto text = read_text_file(given);
    if (!text) return text.take_error();
    source = std::move(*text);
    label += " " + given;
  } else if (given.find("{{") != std::string::npos || given.find("{%") != std::string::npos) {
    source = given;
  } else {
    return make_error(errc::not_found, flag + " " + given + ": no such file (a template given inline holds {{ or {%)");
  }
  auto t = parse(source);
  if (!t) {
    error e = t.take_error();
    e.message = label + ": " + e.message;
    return e;
  }
  if (auto text = read_model_file(dir, "tokenizer_config.json"); text) {
    json cfg = json::parse(*text, nullptr, false);
    if (cfg.is_object()) {
      t->bos_token = token_text(cfg, "bos_token");
      t->eos_token = token_text(cfg, "eos_token");
    }
  }
  return t;
}

result<std::string> chat_template::render(const json& messages, bool add_generation_prompt, const json& extra) const {
  if (!messages.is_array()) return make_error(errc::invalid_request, "chat template: messages must be an array");
  json ctx = extra.is_object() ? extra : json::object();
  ctx["messages"] = messages;
  ctx["add_generation_prompt"] = add_generation_prompt;
  if (!ctx.contains("bos_token")) ctx["bos_token"] = bos_token;
  if (!ctx.contains("eos_token")) ctx["eos_token"] = eos_token;
  return jinja::render(*nodes_, ctx);
}

result<std::string> chat_template::render_continuing(const json& messages, const json& extra) const {
  if (!messages.is_array() || messages.empty() || !messages.back().is_object() || !messages.back().contains("content")) {
    return make_error(errc::invalid_request, "continue_final_message: the final message needs a string 'content' to continue");
  }
  // A string, or text parts (vLLM's "openai" content format): their texts, joined.
  const json& content = messages.back()["content"];
  std::string final;
  if (content.is_string()) {
    final = content.get<std::string>();
  } else if (content.is_array()) {
    for (const auto& part : content) {
      if (!part.is_object() || !part.contains("text") || !part["text"].is_string()) {
        return make_error(errc::invalid_request, "continue_final_message: the final message needs a text 'content' to continue");
      }
      final += part["text"].get<std::string>();
    }
  } else {
    return make_error(errc::invalid_request, "continue_final_message: the final message needs a string 'content' to continue");
  }
  auto rendered = render(messages, /*add_generation_prompt=*/false, extra);
  if (!rendered) return rendered;
  std::string& text = *rendered;
  constexpr const char* space = " \t\n\r\f\v";
  const size_t b = final.find_first_not_of(space);
  const std::string stripped = b == std::string::npos ? std::string() : final.substr(b, final.find_last_not_of(space) - b + 1);
  const std::string lstripped = b == std::string::npos ? std::string() : final.substr(b);
  const size_t at = text.rfind(stripped);
  if (at == std::string::npos) {
    return make_error(errc::invalid_request, "continue_final_message: the chat template's rendering does not contain the final message");
  }
  // As transformers: the template kept the message's own spacing (or it has none): cut after
  // it whole; else after its stripped text.
  const bool kept = text.compare(at, lstripped.size(), final) == 0;
  text.resize(at + (kept ? lstripped.size() : stripped.size()));
  return rendered;
}

}  // namespace llmesh::model
