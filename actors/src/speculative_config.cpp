// vLLM's speculative_config JSON (speculative_config.hpp).
#include "llmesh/actors/speculative_config.hpp"

#include <nlohmann/json.hpp>

namespace llmesh::actors {

using json = nlohmann::json;

status apply_speculative_config(const std::string& text, speculation_config& c, std::string& draft_model, const std::string& flag) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return make_error(errc::invalid_request, flag + ": not a JSON object: " + text);
  // vLLM's methods: "ngram" (also as model "[ngram]"), a draft model (a model, method
  // "draft_model" or none), and heads this server does not run.
  std::string draft;
  if (j.contains("model") && !j["model"].is_null() && j["model"] != "[ngram]") {
    if (!j["model"].is_string() || j["model"].get<std::string>().empty()) {
      return make_error(errc::invalid_request, flag + ": 'model' must name the draft model's directory");
    }
    draft = j["model"].get<std::string>();
  }
  if (j.contains("method") && !j["method"].is_null()) {  // null: vLLM's "work it out"
    const auto& m = j["method"];
    const bool known = m == "ngram" || m == "draft_model";
    if (!known) {
      return make_error(errc::unsupported, flag + ": method " + m.dump() +
                                               ": this server speculates by prompt lookup (\"ngram\") or with a draft model "
                                               "(\"draft_model\"); EAGLE, Medusa, MLP speculators and MTP heads are not run");
    }
    if (m == "ngram" && !draft.empty()) return make_error(errc::invalid_request, flag + ": method \"ngram\" takes no 'model'");
    if (m == "draft_model" && draft.empty()) return make_error(errc::invalid_request, flag + ": method \"draft_model\" needs 'model'");
  }
  speculation_config out = c;
  for (const auto& [key, v] : j.items()) {
    if (key == "method" || key == "model") continue;
    if (key == "draft_tensor_parallel_size") {
      if (draft.empty()) return make_error(errc::invalid_request, flag + ": 'draft_tensor_parallel_size' is a draft model's");
      if (!v.is_number_integer() || v.get<int64_t>() != 1) {
        return make_error(errc::unsupported, flag + ": draft_tensor_parallel_size " + v.dump() +
                                                 ": the draft model runs on one rank here (1)");
      }
      continue;
    }
    const bool lookup = key == "prompt_lookup_max" || key == "prompt_lookup_min";
    size_t* field = key == "num_speculative_tokens"  ? &out.tokens
                    : key == "prompt_lookup_max"     ? &out.max_n
                    : key == "prompt_lookup_min"     ? &out.min_n
                    : key == "disable_by_batch_size" ? &out.disable_by_batch_size
                                                     : nullptr;
    if (!field) {
      return make_error(errc::invalid_request, flag + ": '" + key +
                                                   "' is not taken here (method, model, num_speculative_tokens, prompt_lookup_max, "
                                                   "prompt_lookup_min, disable_by_batch_size, draft_tensor_parallel_size)");
    }
    if (lookup && !draft.empty()) return make_error(errc::invalid_request, flag + ": '" + key + "' is prompt lookup's, not a draft model's");
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1 << 20) {
      return make_error(errc::invalid_request, flag + ": '" + key + "' must be a non-negative integer");
    }
    *field = v.get<size_t>();
  }
  if (out.tokens > max_speculative_tokens) {
    return make_error(errc::invalid_request, flag + ": num_speculative_tokens " + std::to_string(out.tokens) + " is above " +
                                                 std::to_string(max_speculative_tokens));
  }
  if (!draft.empty() && (!j.contains("num_speculative_tokens") || out.tokens == 0)) {
    return make_error(errc::invalid_request, flag + ": a draft model needs num_speculative_tokens (1 to " +
                                                 std::to_string(max_speculative_tokens) + ")");
  }
  if (out.min_n < 1 || out.max_n < 1 || out.max_n > 64 || out.min_n > out.max_n) {
    return make_error(errc::invalid_request, flag + ": prompt_lookup_min and prompt_lookup_max must satisfy 1 <= min <= max <= 64");
  }
  c = out;
  draft_model = std::move(draft);
  return ok_status();
}

}  // namespace llmesh::actors
