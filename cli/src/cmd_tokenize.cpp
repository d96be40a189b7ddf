// `llmesh tokenize`: text -> ids (space separated on one line), or ids -> text with --decode.
// Needs only DIR/tokenizer.json.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::cli {
namespace {

struct tokenize_flags {
  std::string model_dir, text, file, decode;
  bool no_special = false;
};

status run_tokenize(const tokenize_flags& f, bool has_text) {
  int modes = (has_text ? 1 : 0) + (f.file.empty() ? 0 : 1) + (f.decode.empty() ? 0 : 1);
  if (modes != 1) return make_error(errc::invalid_request, "give exactly one of --text, --file, --decode");
  if (!f.decode.empty()) {
    auto ids = parse_id_list(f.decode);
    if (!ids) return ids.take_error();
    auto d = model::detokenizer::load(f.model_dir);
    if (!d) return d.take_error();
    std::string text = d->decode(*ids, f.no_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
    return ok_status();
  }
  auto tok = model::tokenizer::load(f.model_dir);
  if (!tok) return tok.take_error();
  std::string text = f.text;
  if (!f.file.empty()) {
    std::ifstream in(f.file, std::ios::binary);
    if (!in) return make_error(errc::not_found, "cannot read " + f.file);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  auto ids = (*tok)->encode(text, !f.no_special);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  std::printf("%s\n", line.c_str());
  return ok_status();
}

}  // namespace

void add_tokenize(CLI::App& app, command_set& commands) {
  auto f = std::make_shared<tokenize_flags>();
  auto* sub = app.add_subcommand("tokenize", "Tokenize text (or decode ids) with the model's tokenizer.json");
  sub->add_option("--model", f->model_dir, "Model directory (tokenizer.json)")->required();
  auto* text = sub->add_option("--text", f->text, "Text to tokenize");
  sub->add_option("--file", f->file, "File whose contents to tokenize");
  sub->add_option("--decode", f->decode, "Token ids to decode, comma separated");
  sub->add_flag("--no-special", f->no_special,
                "Encode: skip the post-processor's special tokens (e.g. BOS); decode: drop special tokens");
  commands.emplace_back(sub, [f, text] { return run_tokenize(*f, text->count() > 0); });
}

}  // namespace llmesh::cli
