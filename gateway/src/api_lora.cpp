// vLLM's runtime LoRA updates on the HTTP API (api_service.hpp): POST /v1/load_lora_adapter
// {"lora_name", "lora_path"} adds an adapter to a base model's replicas and serves it as a
// model of its own; POST /v1/unload_lora_adapter {"lora_name"} takes it away (requests running
// with it finish with it). Both answer vLLM's plain-text lines, and only when the server was
// started with runtime updates allowed.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/api_service.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

http_reply text_reply(std::string line) {
  http_reply r;
  r.content_type = "text/plain; charset=utf-8";
  r.body = std::move(line);
  return r;
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
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true) and --enable-lora";

}  // namespace

status api_service::lora_updates_usable() const {
  if (!opt_.runtime_lora_updates) return make_error(errc::not_found, updates_off);
  if (!mesh_.runtime_lora()) return make_error(errc::unsupported, actors::mesh_client::no_runtime_lora);
  return ok_status();
}

result<std::shared_ptr<const served_model>> api_service::lora_base(const std::string& base_name) const {
  std::shared_ptr<const served_model> only;
  for (const auto& m : served()) {
    if (!m->parent.empty() || !m->alias_of.empty()) continue;  // adapters and further names are not bases
    if (base_name.empty()) {
      if (only) return make_error(errc::invalid_request, "this server serves several models: name the adapter's in 'base_model_name'");
      only = m;
    } else if (m->name == base_name || std::count(m->aliases.begin(), m->aliases.end(), base_name) > 0 ||
               std::count(m->unlisted_aliases.begin(), m->unlisted_aliases.end(), base_name) > 0) {
      return m;
    }
  }
  if (!only) return make_error(errc::not_found, "the base model '" + base_name + "' is not served here");
  return only;
}

http_reply api_service::load_lora_adapter(std::string_view body) {
  if (auto s = lora_updates_usable(); !s) return error_reply(s.err());
  auto j = parse_request_object(body);
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
  // One update at a time; another meanwhile is told to retry (it would hold an HTTP worker).
  std::unique_lock updating(lora_updates_mu_, std::try_to_lock);
  if (!updating) return error_reply(make_error(errc::overloaded, "another LoRA adapter update is in progress; retry"));
  for (const auto& m : served()) {
    if (m->name == *name) {
      return error_reply(make_error(errc::invalid_request,
                                    m->lora.empty() ? "'" + *name + "' names a served model; an adapter needs a name of its own"
                                                    : "The lora adapter '" + *name + "' has already been loaded."));
    }
  }
  auto base = lora_base(*base_name);
  if (!base) return error_reply(base.err());
  const model::lora_source src{*name, *path};
  if (auto s = mesh_.load_lora((*base)->route_name(), src); !s) return error_reply(s.err());
  {
    std::unique_lock lock(models_mu_);
    runtime_adapters_.insert(*name);
    // (a mesh's news of it may have come first)
    if (std::none_of(models_.begin(), models_.end(), [&](const auto& m) { return m->name == *name; })) {
      models_.push_back(std::make_shared<const served_model>(adapter_entry(**base, src)));
    }
  }
  return text_reply("Success: LoRA adapter '" + *name + "' added successfully.");
}

http_reply api_service::unload_lora_adapter(std::string_view body) {
  if (auto s = lora_updates_usable(); !s) return error_reply(s.err());
  auto j = parse_request_object(body);
  if (!j) return error_reply(j.err());
  auto name = string_field(*j, "lora_name");
  if (!name) return error_reply(name.err());
  if (name->empty()) {
    return error_reply(make_error(errc::invalid_request, "'lora_name' needs to be provided to unload a LoRA adapter."));
  }
  std::unique_lock updating(lora_updates_mu_, std::try_to_lock);
  if (!updating) return error_reply(make_error(errc::overloaded, "another LoRA adapter update is in progress; retry"));
  std::shared_ptr<const served_model> entry;
  size_t at = 0;
  {  // first: no new request names it; then the replicas let it go
    std::unique_lock lock(models_mu_);
    for (size_t i = 0; i < models_.size(); ++i) {
      if (models_[i]->name == *name && !models_[i]->lora.empty()) entry = models_[i], at = i;
    }
    if (!entry) return error_reply(make_error(errc::not_found, "The lora adapter '" + *name + "' cannot be found."));
    models_.erase(models_.begin() + static_cast<std::ptrdiff_t>(at));
  }
  if (auto s = mesh_.unload_lora(entry->route_name(), entry->lora); !s) {
    std::unique_lock lock(models_mu_);  // still loaded there: serve it again, where it was listed
    if (std::none_of(models_.begin(), models_.end(), [&](const auto& m) { return m->name == *name; })) {
      models_.insert(models_.begin() + static_cast<std::ptrdiff_t>(std::min(at, models_.size())), entry);
    }
    return error_reply(s.err());
  }
  {
    std::unique_lock lock(models_mu_);
    runtime_adapters_.erase(*name);
  }
  return text_reply("Success: LoRA adapter '" + *name + "' removed successfully.");
}

void api_service::set_runtime_adapters(const std::string& base, const std::vector<model::lora_source>& adapters) {
  std::unique_lock lock(models_mu_);
  std::shared_ptr<const served_model> b;
  for (const auto& m : models_) {
    if (m->parent.empty() && m->alias_of.empty() && m->name == base) b = m;
  }
  if (!b) return;  // not a model this gateway serves
  auto listed = [&](const std::string& name) {
    return std::any_of(adapters.begin(), adapters.end(), [&](const auto& l) { return l.name == name; });
  };
  for (auto it = models_.begin(); it != models_.end();) {
    const auto& m = **it;
    if (m.parent == base && runtime_adapters_.count(m.name) && !listed(m.name)) {
      runtime_adapters_.erase(m.name);
      it = models_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& l : adapters) {
    if (std::any_of(models_.begin(), models_.end(), [&](const auto& m) { return m->name == l.name; })) continue;
    runtime_adapters_.insert(l.name);
    models_.push_back(std::make_shared<const served_model>(adapter_entry(*b, l)));
  }
}

}  // namespace llmesh::gateway
