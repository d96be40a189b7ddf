// vLLM's runtime LoRA updates on the HTTP API (api_service.hpp): POST /v1/load_lora_adapter
// {"lora_name", "lora_path"} adds an adapter to a base model's replicas and serves it as a
// model of its own; POST /v1/unload_lora_adapter {"lora_name"} takes it away (requests running
// with it finish with it). Both answer vLLM's plain-text lines, and only when the server was
// started with runtime updates allowed.
#include <nlohmann/json.hpp>

#include "llmesh/gateway/api_service.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;

http_reply text_reply(std::string line) {
  http_reply r;
  r.content_type = "text/plain; charset=utf-8";
  r.body = std::move(line);
  return r;
}

/// The request's object, or a 400 naming what is wrong.
result<json> request_object(std::string_view body) {
  auto j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error(errc::invalid_request, "the body must be a JSON object");
  return j;
}

/// A string field: "" when it is absent; a 400 when it is there and not a string.
result<std::string> string_field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::string();
  if (!it->is_string()) return make_error(errc::invalid_request, std::string("'") + key + "' must be a string");
  return it->get<std::string>();
}

const char* const updates_off =
    "runtime LoRA updates are off: start the server with --allow-runtime-lora-updating (or "
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true)";

}  // namespace

http_reply api_service::load_lora_adapter(std::string_view body) {
  if (!opt_.runtime_lora_updates) return error_reply(make_error(errc::not_found, updates_off));
  auto j = request_object(body);
  if (!j) return error_reply(j.err());
  auto name = string_field(*j, "lora_name");
  auto path = string_field(*j, "lora_path");
  auto base_name = string_field(*j, "base_model_name");
  for (const auto* f : {&name, &path, &base_name}) {
    if (!*f) return error_reply(f->err());
  }
  if (name->empty() || path->empty()) {
    return error_reply(make_error(errc::invalid_request, "Both 'lora_name' and 'lora_path' must be provided."));
  }
  if (!model::valid_lora_name(*name)) {
    return error_reply(make_error(errc::invalid_request, "'lora_name' must be 1 to 128 letters, digits and -_.:/"));
  }
  std::lock_guard updating(lora_updates_mu_);
  std::shared_ptr<const served_model> base;
  for (const auto& m : served()) {
    if (m->name == *name) {
      return error_reply(make_error(errc::invalid_request,
                                    m->lora.empty() ? "'" + *name + "' names a served model; an adapter needs a name of its own"
                                                    : "The lora adapter '" + *name + "' has already been loaded."));
    }
    if (!m->parent.empty() || !m->alias_of.empty()) continue;  // adapters and further names are not bases
    if (base_name->empty() ? static_cast<bool>(base) : m->name != *base_name) {
      if (base_name->empty()) {
        return error_reply(make_error(errc::invalid_request, "this server serves several models: name the adapter's in 'base_model_name'"));
      }
      continue;
    }
    base = m;
  }
  if (!base) return error_reply(make_error(errc::not_found, "the base model '" + *base_name + "' is not served here"));
  const model::lora_source src{*name, *path};
  if (auto s = mesh_.load_lora(base->route_name(), src); !s) return error_reply(s.err());
  {
    std::unique_lock lock(models_mu_);
    models_.push_back(std::make_shared<const served_model>(adapter_entry(*base, src)));
  }
  return text_reply("Success: LoRA adapter '" + *name + "' added successfully.");
}

http_reply api_service::unload_lora_adapter(std::string_view body) {
  if (!opt_.runtime_lora_updates) return error_reply(make_error(errc::not_found, updates_off));
  auto j = request_object(body);
  if (!j) return error_reply(j.err());
  auto name = string_field(*j, "lora_name");
  if (!name) return error_reply(name.err());
  if (name->empty()) {
    return error_reply(make_error(errc::invalid_request, "'lora_name' needs to be provided to unload a LoRA adapter."));
  }
  std::lock_guard updating(lora_updates_mu_);
  std::shared_ptr<const served_model> entry;
  for (const auto& m : served()) {
    if (m->name == *name && !m->lora.empty()) entry = m;
  }
  if (!entry) return error_reply(make_error(errc::not_found, "The lora adapter '" + *name + "' cannot be found."));
  {  // first: no new request names it; then the replicas let it go
    std::unique_lock lock(models_mu_);
    std::erase(models_, entry);
  }
  if (auto s = mesh_.unload_lora(entry->route_name(), entry->lora); !s) {
    std::unique_lock lock(models_mu_);  // still loaded there: keep serving it
    models_.push_back(entry);
    return error_reply(s.err());
  }
  return text_reply("Success: LoRA adapter '" + *name + "' removed successfully.");
}

}  // namespace llmesh::gateway
