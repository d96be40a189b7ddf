// The native API's request fields and logprob entries (rpc_fields.hpp).
#include "rpc_fields.hpp"

#include <algorithm>
#include <string>
#include <unordered_set>

#include "llmesh/gateway/openai_api.hpp"
#include "llmesh/gateway/structured_output.hpp"
#include "llmesh/model/constraint.hpp"

namespace llmesh::gateway {

void set_logprob(rpc::TokenLogprob::Builder out, int32_t id, const kernels::token_logprobs& lp, const model::detokenizer& d) {
  auto bytes_of = [&](int32_t t) {
    const std::string& b = d.token_bytes(t);
    return kj::arrayPtr(reinterpret_cast<const kj::byte*>(b.data()), b.size());
  };
  out.setId(id);
  out.setLogprob(lp.logprob);
  out.setRank(lp.rank);
  out.setBytes(bytes_of(id));
  auto top = out.initTop(static_cast<unsigned>(lp.top.size()));
  for (unsigned i = 0; i < lp.top.size(); ++i) {
    top[i].setId(lp.top[i].id);
    top[i].setLogprob(lp.top[i].logprob);
    top[i].setRank(static_cast<int32_t>(i + 1));
    top[i].setBytes(bytes_of(lp.top[i].id));
  }
}

result<nlohmann::ordered_json> extra_fields(rpc::GenerateRequest::Reader in, int max_logprobs) {
  for (auto [name, n] : {std::pair{"logprobs", in.getLogprobs()}, std::pair{"prompt_logprobs", in.getPromptLogprobs()}}) {
    if (n < -1 || n > max_logprobs) {
      return make_error(errc::invalid_request, "'" + std::string(name) + "' must be between 0 and " +
                                                   std::to_string(max_logprobs) +
                                                   " (how many alternatives), or -1 for none");
    }
  }
  nlohmann::ordered_json j = {{"presence_penalty", in.getPresencePenalty()},
                              {"frequency_penalty", in.getFrequencyPenalty()},
                              {"repetition_penalty", in.getRepetitionPenalty()},
                              {"min_tokens", in.getMinTokens()},
                              {"min_p", in.getMinP()},
                              {"include_stop_str_in_output", in.getIncludeStopStr()},
                              {"skip_special_tokens", in.getSkipSpecialTokens()}};
  if (in.getTruncatePromptTokens() != 0) j["truncate_prompt_tokens"] = in.getTruncatePromptTokens();
  if (in.getUseBeamSearch()) j["use_beam_search"] = true;
  if (in.getLengthPenalty() != 1.0f) j["length_penalty"] = in.getLengthPenalty();
  if (in.getPriority() != 0) j["priority"] = in.getPriority();
  if (in.hasCacheSalt() && in.getCacheSalt().size() > 0) {
    j["cache_salt"] = std::string(in.getCacheSalt().cStr(), std::min<size_t>(in.getCacheSalt().size(), max_cache_salt + 1));
  }
  if (in.hasPromptCacheKey() && in.getPromptCacheKey().size() > 0) {
    j["prompt_cache_key"] =
        std::string(in.getPromptCacheKey().cStr(), std::min<size_t>(in.getPromptCacheKey().size(), max_cache_salt + 1));
  }
  // Sizes first (this runs before the API key is checked): a message may be tens of MiB.
  if (in.hasStop()) {
    if (in.getStop().size() > request_limits{}.max_stop) return make_error(errc::invalid_request, "'stop' holds at most 4 strings");
    auto stops = nlohmann::ordered_json::array();
    for (auto s : in.getStop()) stops.push_back(std::string(s.cStr(), std::min<size_t>(s.size(), 4096)));
    j["stop"] = std::move(stops);
  }
  if (in.hasAllowedTokenIds()) {
    if (in.getAllowedTokenIds().size() > request_limits{}.max_allowed_token_ids) {
      return make_error(errc::invalid_request,
                        "'allowed_token_ids' holds at most " + std::to_string(request_limits{}.max_allowed_token_ids) + " ids");
    }
    auto ids = nlohmann::ordered_json::array();
    for (auto id : in.getAllowedTokenIds()) ids.push_back(id);
    j["allowed_token_ids"] = std::move(ids);
  }
  if (in.hasBadWords()) {
    if (in.getBadWords().size() > request_limits{}.max_bad_words) {
      return make_error(errc::invalid_request,
                        "'bad_words' holds at most " + std::to_string(request_limits{}.max_bad_words) + " words");
    }
    auto words = nlohmann::ordered_json::array();
    for (auto w : in.getBadWords()) words.push_back(std::string(w.cStr(), std::min<size_t>(w.size(), 4096)));
    j["bad_words"] = std::move(words);
  }
  if (in.hasStopTokenIds()) {
    auto ids = nlohmann::ordered_json::array();
    for (auto id : in.getStopTokenIds()) ids.push_back(id);
    j["stop_token_ids"] = std::move(ids);
  }
  if (in.hasLogitBias()) {
    if (in.getLogitBias().size() > max_logit_bias_entries) {
      return make_error(errc::invalid_request, "'logit_bias' holds at most " + std::to_string(max_logit_bias_entries) + " entries");
    }
    auto bias = nlohmann::ordered_json::object();
    std::unordered_set<int32_t> seen;
    for (auto b : in.getLogitBias()) {
      if (b.getId() < 0) return make_error(errc::invalid_request, "'logit_bias' keys must be token ids (non-negative)");
      if (!seen.insert(b.getId()).second) {
        return make_error(errc::invalid_request, "'logit_bias' names token " + std::to_string(b.getId()) + " twice");
      }
      bias[std::to_string(b.getId())] = b.getBias();
    }
    j["logit_bias"] = std::move(bias);
  }
  if (in.hasConstraint()) {
    auto c = in.getConstraint();
    if (c.getText().size() > model::max_constraint_bytes) {
      return make_error(errc::invalid_request, "constraint: the text is longer than " + std::to_string(model::max_constraint_bytes) + " bytes");
    }
    const std::string text(c.getText().cStr(), c.getText().size());
    using kind = rpc::OutputConstraint::Kind;
    if ((c.getKind() == kind::NONE || c.getKind() == kind::JSON_OBJECT) && !text.empty()) {
      return make_error(errc::invalid_request, "constraint: this kind takes no text");
    }
    switch (c.getKind()) {
      case kind::NONE: break;
      case kind::JSON_SCHEMA: j["guided_json"] = text; break;
      case kind::JSON_OBJECT: j["response_format"] = {{"type", "json_object"}}; break;
      case kind::REGEX: j["guided_regex"] = text; break;
      case kind::CHOICE: {
        auto choices = parse_embedded_json(text);  // depth-bounded
        if (!choices) return make_error(errc::invalid_request, "'guided_choice': the text must be a JSON array of strings");
        j["guided_choice"] = std::move(*choices);
        break;
      }
      case kind::GRAMMAR: j["guided_grammar"] = text; break;
      default: return make_error(errc::invalid_request, "constraint: unknown kind " + std::to_string(static_cast<int>(c.getKind())));
    }
  }
  return j;
}

}  // namespace llmesh::gateway
