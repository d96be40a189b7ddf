// Chat templates: the `chat_template` of tokenizer_config.json rendered with a Jinja subset
// large enough for the real templates of Llama 2/3/3.1, Qwen2/3, Mistral, Gemma, GPT-OSS and
// Zephyr-style models: for (with loop.*, else, filters), if/elif/else, set (incl. namespace
// attributes), macros (positional and keyword arguments, defaults, recursion up to 64 deep;
// the body sees the top level and its own scopes, not its caller's loop variables),
// Python-like string methods, filters (trim, tojson, length, ...), tests (defined, none,
// string, ...), slicing, raise_exception. HF's environment settings apply (trim_blocks,
// lstrip_blocks). A construct outside the subset is an `unsupported` error naming it — never
// a wrongly rendered prompt.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "llmesh/common/error.hpp"

namespace llmesh::model {

namespace jinja {
struct node;
}

/// Immutable after parse; render() is thread-safe.
class chat_template {
 public:
  /// Parses a template source.
  [[nodiscard]] static result<chat_template> parse(const std::string& source);

  /// Reads DIR/chat_template.jinja when there is one (transformers 4.51's place for it, which
  /// wins over tokenizer_config.json's, as transformers loads them), else
  /// DIR/tokenizer_config.json's chat_template (a string, or a list of {name, template} of
  /// which "default" is used), else a processor's DIR/chat_template.json; and
  /// tokenizer_config.json's bos/eos tokens.
  [[nodiscard]] static result<chat_template> load(const std::string& model_dir);

  /// vLLM's --chat-template: `given` is a template file's path, or (holding "{{" or "{%") the
  /// template itself in one line; it replaces the model's own, whose bos/eos tokens it keeps
  /// (DIR/tokenizer_config.json's, when there is one). Errors start with `label` (the flag or the
  /// config key it came from) and name the file.
  [[nodiscard]] static result<chat_template> load_override(const std::string& model_dir, const std::string& given,
                                                           const std::string& label = "--chat-template");

  /// Renders `messages` (a JSON array of {role, content, ...}); `extra` adds context variables
  /// (tools, ...). bos_token, eos_token and add_generation_prompt are set as HF does.
  [[nodiscard]] result<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                           const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  /// render() for continuing the conversation's final message (HF's continue_final_message:
  /// a prefilled assistant answer the model goes on with): rendered without a generation
  /// prompt, then cut right after the final message's content, as transformers'
  /// apply_chat_template cuts it (its trailing whitespace kept only where the template kept it).
  /// Refused when the final message has no string content or the rendering does not contain it.
  [[nodiscard]] result<std::string> render_continuing(const nlohmann::ordered_json& messages,
                                                      const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  std::string bos_token, eos_token;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::node>>> nodes_;
};

}  // namespace llmesh::model
