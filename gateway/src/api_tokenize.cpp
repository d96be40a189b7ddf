// vLLM's tokenizer endpoints on the HTTP API (api_service.hpp): POST /tokenize (a prompt, or
// chat messages through the model's template) and POST /detokenize. Tokenizer work only: no
// replica, no concurrency slot.
#include <nlohmann/json.hpp>

#include "llmesh/gateway/api_service.hpp"

namespace llmesh::gateway {

result<std::shared_ptr<const served_model>> api_service::find_or_only(const std::string& name) const {
  if (!name.empty()) return find(name);
  // One base model: its adapters and further names (served as models too) do not make the name
  // ambiguous.
  std::shared_ptr<const served_model> only;
  for (const auto& m : served()) {
    if (!m->parent.empty() || !m->alias_of.empty()) continue;
    if (only) return make_error(errc::invalid_request, "this server serves several models: name one in 'model'");
    only = m;
  }
  if (only) return only;
  return make_error(errc::invalid_request, "this server serves several models: name one in 'model'");
}

api_outcome api_service::tokenize(std::string_view body) {
  auto r = parse_tokenize_request(body, opt_.limits);
  if (!r) return error_reply(r.err());
  auto m = find_or_only(r->model);
  if (!m) return error_reply(m.err());
  const served_model& sm = **m;
  std::string text;
  if (r->prompt) {
    text = std::move(*r->prompt);
  } else {
    auto rendered = render_messages(sm, *r);
    if (!rendered) return error_reply(rendered.err());
    text = std::move(*rendered);
  }
  const auto ids = sm.tok->encode(text, r->add_special_tokens);
  nlohmann::ordered_json j = {{"count", ids.size()}, {"max_model_len", sm.cfg.max_positions}, {"tokens", ids}};
  if (r->return_token_strs) {
    // Each token's text (its bytes; a piece of a character shows as U+FFFD).
    auto strs = nlohmann::ordered_json::array();
    for (int32_t id : ids) strs.push_back(sm.tok->decoder().token_bytes(id));
    j["token_strs"] = std::move(strs);
  }
  http_reply out;
  out.body = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return out;
}

result<std::string> api_service::render_messages(const served_model& sm, const tokenize_request& r) const {
  if (!sm.chat) return make_error(errc::invalid_request, "the model '" + sm.name + "' has no chat template; send a 'prompt'");
  auto extra = r.template_kwargs;  // chat_template_kwargs, then the tools, as chat renders them
  if (!r.tools.is_null()) extra["tools"] = r.tools;
  const auto messages = template_messages(*r.messages);
  auto rendered = r.continue_final_message ? sm.chat->render_continuing(messages, extra)
                                           : sm.chat->render(messages, r.add_generation_prompt, extra);
  if (!rendered) return make_error(errc::invalid_request, "chat template: " + rendered.err().message);
  return rendered;
}

result<embeddings_request> api_service::parse_pooling_body(std::string_view body) const {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("messages")) return parse_embeddings_request(body);
  if (j.contains("input")) return make_error(errc::invalid_request, "send one of 'input' and 'messages'");
  if (!j.contains("add_generation_prompt")) j["add_generation_prompt"] = false;  // vLLM's default for pooling
  auto t = parse_tokenize_request(j.dump(), opt_.limits);
  if (!t) return t.take_error();
  auto m = find_or_only(t->model);
  if (!m) return m.take_error();
  auto text = render_messages(**m, *t);
  if (!text) return text.take_error();
  j.erase("messages");
  j["input"] = nlohmann::json::array({(*m)->tok->encode(*text, t->add_special_tokens)});
  return parse_embeddings_request(j.dump());
}

api_outcome api_service::detokenize(std::string_view body) {
  auto r = parse_detokenize_request(body);
  if (!r) return error_reply(r.err());
  auto m = find_or_only(r->model);
  if (!m) return error_reply(m.err());
  const served_model& sm = **m;
  for (int32_t id : r->tokens) {
    if (static_cast<size_t>(id) >= sm.cfg.vocab) {
      return error_reply(make_error(errc::invalid_request, "token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                                               std::to_string(sm.cfg.vocab) + ")"));
    }
  }
  // As HF's tokenizer.decode by default (vLLM's): special tokens keep their text.
  const nlohmann::ordered_json j = {{"prompt", sm.tok->decoder().decode(r->tokens, /*skip_special=*/false)}};
  http_reply out;
  out.body = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return out;
}

}  // namespace llmesh::gateway
