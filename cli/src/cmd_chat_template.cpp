// `llmesh chat-template --model DIR --messages FILE.json [--add-generation-prompt]`: prints the
// prompt the model's chat template renders. Needs only DIR/tokenizer_config.json.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "llmesh/model/chat_template.hpp"

namespace llmesh::cli {
namespace {

struct chat_flags {
  std::string model_dir, messages_file;
  bool add_generation_prompt = false;
};

status run_chat_template(const chat_flags& f) {
  auto t = model::chat_template::load(f.model_dir);
  if (!t) return t.take_error();
  std::ifstream in(f.messages_file);
  if (!in) return make_error(errc::not_found, "cannot read " + f.messages_file);
  std::stringstream ss;
  ss << in.rdbuf();
  auto messages = nlohmann::ordered_json::parse(ss.str(), nullptr, false);
  if (messages.is_discarded()) return make_error(errc::invalid_request, f.messages_file + ": not valid JSON");
  if (messages.is_object() && messages.contains("messages")) messages = messages["messages"];  // a request body
  auto prompt = t->render(messages, f.add_generation_prompt);
  if (!prompt) return prompt.take_error();
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  return ok_status();
}

}  // namespace

void add_chat_template(CLI::App& app, command_set& commands) {
  auto f = std::make_shared<chat_flags>();
  auto* sub = app.add_subcommand("chat-template", "Render the model's chat template for a conversation");
  sub->add_option("--model", f->model_dir, "Model directory (tokenizer_config.json)")->required();
  sub->add_option("--messages", f->messages_file, "JSON file: [{\"role\": ..., \"content\": ...}, ...]")->required();
  sub->add_flag("--add-generation-prompt", f->add_generation_prompt, "End with the assistant turn's header");
  commands.emplace_back(sub, [f] { return run_chat_template(*f); });
}

}  // namespace llmesh::cli
