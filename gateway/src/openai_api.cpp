// OpenAI API bodies (openai_api.hpp). Every JSON exception is caught here and becomes an
// invalid_request error naming the field.
#include "llmesh/gateway/openai_api.hpp"
#include "llmesh/gateway/beam_search.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "llmesh/kernels/sampling.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

error bad(const std::string& msg) { return make_error(errc::invalid_request, msg); }

/// Deepest nesting a request body may have (DESIGN.md §6); the real ones need 4.
constexpr int max_json_depth = 32;

result<json> parse_object(std::string_view body) {
  bool too_deep = false;
  json::parser_callback_t depth_guard = [&too_deep](int depth, json::parse_event_t, json&) {
    if (depth > max_json_depth) too_deep = true;
    return !too_deep;
  };
  json j = json::parse(body, depth_guard, /*allow_exceptions=*/false);
  if (too_deep) return bad("the request body nests deeper than " + std::to_string(max_json_depth) + " levels");
  if (j.is_discarded()) return bad("the request body is not valid JSON");
  if (!j.is_object()) return bad("the request body must be a JSON object");
  return j;
}

/// An integer as int64_t, saturating (a huge unsigned value must not wrap into range).
int64_t wide_integer(const json& v) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return std::numeric_limits<int64_t>::max();
  }
  return v.get<int64_t>();
}

/// An optional number field's value, type-checked only (apply_sampling checks its range);
/// absent or null leaves `out` empty.
status number_field(const json& j, const char* name, std::optional<double>& out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_number()) return bad(std::string("'") + name + "' must be a number");
  out = it->get<double>();
  return ok_status();
}

/// An optional integer field's value, type-checked only; absent or null leaves `out` empty.
status integer_field(const json& j, const char* name, std::optional<int64_t>& out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_number_integer()) return bad(std::string("'") + name + "' must be an integer");
  out = wide_integer(*it);
  return ok_status();
}

/// A real field within [lo, hi] (NaN and infinities are outside).
status check_range(const char* name, double v, double lo, double hi) {
  if (std::isfinite(v) && v >= lo && v <= hi) return ok_status();
  return bad(std::string("'") + name + "' must be between " + std::to_string(lo).substr(0, 4) + " and " +
             std::to_string(hi).substr(0, 4));
}

status bool_field(const json& j, const char* name, bool& out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_boolean()) return bad(std::string("'") + name + "' must be true or false");
  out = it->get<bool>();
  return ok_status();
}

/// A request for something this server does not implement: refused, naming the field and
/// the values it takes, rather than served without it.
error unsupported(const char* name, const char* neutral) {
  return bad(std::string("'") + name + "' is not supported by this server (send " + neutral + ", or leave it out)");
}

/// Fields OpenAI or vLLM define for behaviour this server does not implement. A client that
/// asks for one must learn it will not get it (silently ignoring them returns results the
/// client did not ask for); their neutral values — null, false, 0, and 1 for best_of — pass,
/// since many clients send them on every request. best_of (OpenAI's completions field) is
/// served on /v1/completions and refused above 1 on chat.
status refuse_unsupported(const json& j, bool chat, generation_fields& g) {
  if (auto it = j.find("best_of"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || wide_integer(*it) < 1) return bad("'best_of' must be a positive integer");
    if (chat && wide_integer(*it) > 1) return unsupported("best_of", "1 or null");
    g.best_of = static_cast<size_t>(std::min<int64_t>(wide_integer(*it), std::numeric_limits<int32_t>::max()));
  }
  // Empty values ask for nothing: {} / [] / "" pass.
  auto empty_only = [&](const char* name, const char* neutral) -> status {
    auto it = j.find(name);
    if (it == j.end() || it->is_null() || ((it->is_object() || it->is_array()) && it->empty()) ||
        (it->is_string() && it->get_ref<const std::string&>().empty())) {
      return ok_status();
    }
    return unsupported(name, neutral);
  };
  LLMESH_TRY(empty_only("suffix", "\"\" or null"));
  // Tools are chat's (parse_tools); the legacy endpoint has no message to carry their calls.
  if (!chat && !empty_only("tools", "").ok()) {
    return bad("'tools' is not supported on /v1/completions (a /v1/chat/completions field; send [] or null, or leave it out)");
  }
  return ok_status();
}

/// vLLM's fields on the output's text and the prompt's length, shared with the native API
/// (apply_extra_fields): include_stop_str_in_output, skip_special_tokens,
/// return_tokens_as_token_ids, truncate_prompt_tokens.
status parse_output_fields(const json& j, generation_fields& g) {
  LLMESH_TRY(bool_field(j, "include_stop_str_in_output", g.include_stop_str));
  LLMESH_TRY(bool_field(j, "skip_special_tokens", g.skip_special_tokens));
  LLMESH_TRY(bool_field(j, "return_tokens_as_token_ids", g.tokens_as_ids));
  std::optional<int64_t> t;
  LLMESH_TRY(integer_field(j, "truncate_prompt_tokens", t));
  if (t && (*t == 0 || *t < -1)) return bad("'truncate_prompt_tokens' must be -1 (the model's context) or at least 1");
  if (t) g.truncate_prompt_tokens = *t;
  return ok_status();
}

/// vLLM's use_beam_search and length_penalty. A search of width n returns n beams; each step
/// asks 2n alternatives, so n is at most max_beam_width. The result comes whole (vLLM does not
/// stream it either: here a stream request is a 400 rather than a silent plain reply).
status parse_beam_search(const json& j, int max_logprobs, generation_fields& g) {
  LLMESH_TRY(bool_field(j, "use_beam_search", g.beam_search));
  std::optional<double> lp;
  LLMESH_TRY(number_field(j, "length_penalty", lp));
  if (lp) {
    if (!std::isfinite(*lp)) return bad("'length_penalty' must be a finite number");
    g.length_penalty = *lp;
  }
  if (!g.beam_search) return ok_status();
  // vLLM checks a step's 2 × width alternatives against --max-logprobs.
  const size_t widest = std::min<size_t>(max_beam_width, static_cast<size_t>(std::max(max_logprobs, 0)) / 2);
  if (g.n > widest) {
    return bad("'n' must be at most " + std::to_string(widest) +
               " with 'use_beam_search' (the beam width; each step asks twice as many alternatives, at most " +
               std::to_string(max_logprobs) + ")");
  }
  if (g.best_of > 1) return bad("'use_beam_search' cannot be combined with 'best_of' above 1");
  return ok_status();
}

uint64_t cache_salt_key(std::string_view salt) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : salt) h = (h ^ c) * 1099511628211ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h == 0 ? 1 : h;
}

/// vLLM's cache_salt: a non-empty string.
status parse_cache_salt(const json& j, generation_fields& g) {
  auto it = j.find("cache_salt");
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_string() || it->get_ref<const std::string&>().empty()) return bad("'cache_salt' must be a non-empty string");
  const std::string& s = it->get_ref<const std::string&>();
  if (s.size() > max_cache_salt) return bad("'cache_salt' is longer than " + std::to_string(max_cache_salt) + " bytes");
  g.cache_salt = cache_salt_key(s);
  return ok_status();
}

/// OpenAI's prompt_cache_key: a string (empty: none).
status parse_prompt_cache_key(const json& j, generation_fields& g) {
  auto it = j.find("prompt_cache_key");
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_string()) return bad("'prompt_cache_key' must be a string");
  const std::string& s = it->get_ref<const std::string&>();
  if (s.size() > max_cache_salt) return bad("'prompt_cache_key' is longer than " + std::to_string(max_cache_salt) + " bytes");
  g.route_key = s.empty() ? 0 : cache_salt_key(s);
  return ok_status();
}

/// vLLM's priority: an integer within int32 (lower first).
status parse_priority(const json& j, generation_fields& g) {
  std::optional<int64_t> p;
  LLMESH_TRY(integer_field(j, "priority", p));
  if (!p) return ok_status();
  if (*p < INT32_MIN || *p > INT32_MAX) return bad("'priority' must be an integer within 32 bits (lower is served first)");
  g.priority = static_cast<int32_t>(*p);
  return ok_status();
}

/// A bound as the error messages show it: its shortest decimal form ("2", "-2", "10").
std::string bound_text(double v) {
  char buf[32];
  auto written = std::to_chars(buf, buf + sizeof buf, v);
  return written.ec == std::errc() ? std::string(buf, written.ptr) : std::to_string(v);
}

/// The penalties (OpenAI's presence and frequency, vLLM's repetition) and vLLM's min_tokens;
/// null or absent leaves the neutral value. min_tokens is checked against max_tokens here
/// (g.max_tokens is final: the client's, or the endpoint's default); api_service checks it
/// again against what the context leaves when max_tokens was left out.
status parse_penalties(const json& j, const sampling_input& in, bool chat, generation_fields& g) {
  for (auto [name, out] : {std::pair{"presence_penalty", &g.presence_penalty},
                           std::pair{"frequency_penalty", &g.frequency_penalty}}) {
    std::optional<double> v;
    LLMESH_TRY(number_field(j, name, v));
    if (!v) continue;
    if (!std::isfinite(*v) || *v < -penalty_bound || *v > penalty_bound) {
      return bad(std::string("'") + name + "' must be a number between " + bound_text(-penalty_bound) + " and " +
                 bound_text(penalty_bound));
    }
    *out = static_cast<float>(*v);
  }
  std::optional<double> rep;
  LLMESH_TRY(number_field(j, "repetition_penalty", rep));
  if (rep) {
    // vLLM's rule (> 0: it divides and multiplies logits), and this server's upper bound.
    if (!std::isfinite(*rep) || *rep <= 0.0 || *rep > max_repetition_penalty) {
      return bad("'repetition_penalty' must be a number greater than 0 and at most " +
                 bound_text(max_repetition_penalty));
    }
    g.repetition_penalty = static_cast<float>(*rep);
  }
  std::optional<int64_t> min_tokens;
  LLMESH_TRY(integer_field(j, "min_tokens", min_tokens));
  if (min_tokens) {
    if (*min_tokens < 0) return bad("'min_tokens' must be a non-negative integer");
    // vLLM's rule: min_tokens <= max_tokens (a request cannot be made to outlive its limit).
    if (static_cast<uint64_t>(*min_tokens) > g.max_tokens) {
      const std::string head = "'min_tokens' (" + std::to_string(*min_tokens) + ") must be at most ";
      const std::string max = std::to_string(g.max_tokens);
      if (g.max_tokens_given) return bad(head + "'" + in.max_tokens_name + "' (" + max + ")");
      if (chat) return bad(head + "the server's max_tokens limit (" + max + ")");
      return bad(head + "'max_tokens' (" + max + ", its default when left out)");
    }
    if (*min_tokens > std::numeric_limits<int>::max()) {  // only with a max_tokens limit past 2^31
      return bad("'min_tokens' must be at most " + std::to_string(std::numeric_limits<int>::max()));
    }
    g.min_tokens = static_cast<int>(*min_tokens);
  }
  return ok_status();
}

/// Log-probabilities: completions' `logprobs` is how many alternatives (an integer); chat's is
/// a boolean, with `top_logprobs` for how many. The bound is the server's (--max-logprobs; at
/// most the engine's kernels::max_logprobs, OpenAI's 20).
static_assert(request_limits{}.max_logprobs == kernels::max_logprobs);

status parse_logprobs(const json& j, bool chat, int max_logprobs, generation_fields& g) {
  const std::string bound = std::to_string(max_logprobs);
  std::optional<int64_t> top;
  LLMESH_TRY(integer_field(j, "top_logprobs", top));
  if (top && (*top < 0 || *top > max_logprobs)) return bad("'top_logprobs' must be between 0 and " + bound);
  auto it = j.find("logprobs");
  const bool sent = it != j.end() && !it->is_null();
  if (!chat) {
    // false is accepted as none (clients written for chat send it); true is not a count.
    if (sent && !(it->is_boolean() && !it->get<bool>())) {
      if (!it->is_number_integer() || wide_integer(*it) < 0 || wide_integer(*it) > max_logprobs) {
        return bad("'logprobs' must be an integer between 0 and " + bound + " (how many alternatives), or null");
      }
      g.logprobs = static_cast<int>(wide_integer(*it));
    }
    // top_logprobs is chat's; its neutral 0 passes, as before this endpoint knew logprobs.
    if (top && *top > 0) return bad("'top_logprobs' is a chat field; /v1/completions takes 'logprobs': n");
    return ok_status();
  }
  bool on = false;
  if (sent) {
    // 0 and 1 pass as false and true: vLLM's pydantic model coerces them, and clients send 0.
    if (it->is_boolean()) {
      on = it->get<bool>();
    } else if (it->is_number_integer() && (wide_integer(*it) == 0 || wide_integer(*it) == 1)) {
      on = wide_integer(*it) == 1;
    } else {
      return bad("'logprobs' must be true or false");
    }
  }
  // top_logprobs 0 without logprobs passes (a neutral value clients send; vLLM accepts it too).
  if (top && *top > 0 && !on) return bad("'top_logprobs' needs 'logprobs': true");
  if (on) g.logprobs = top ? static_cast<int>(*top) : 0;
  return ok_status();
}

/// An array of non-negative token ids (null: none), at most `max`: vLLM's stop_token_ids and
/// allowed_token_ids (api_service checks them against the vocabulary, which the parser does
/// not know).
status parse_token_ids(const json& j, const char* name, size_t max, std::vector<int32_t>& out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return ok_status();
  const std::string field = std::string("'") + name + "'";
  if (!it->is_array()) return bad(field + " must be an array of token ids");
  if (it->size() > max) return bad(field + " holds at most " + std::to_string(max) + " ids");
  for (const auto& t : *it) {
    if (!t.is_number_integer() || wide_integer(t) < 0 || wide_integer(t) > std::numeric_limits<int32_t>::max()) {
      return bad(field + " must hold non-negative integer token ids");
    }
    out.push_back(static_cast<int32_t>(wide_integer(t)));
  }
  return ok_status();
}

status parse_stop_token_ids(const json& j, const request_limits& lim, std::vector<int32_t>& out) {
  return parse_token_ids(j, "stop_token_ids", lim.max_stop_token_ids, out);
}

/// vLLM's allowed_token_ids ([] or null: no restriction), kept as a set.
status parse_allowed_token_ids(const json& j, const request_limits& lim, std::vector<int32_t>& out) {
  LLMESH_TRY(parse_token_ids(j, "allowed_token_ids", lim.max_allowed_token_ids, out));
  std::sort(out.begin(), out.end());  // each choice carries each id once
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return ok_status();
}

/// vLLM's bad_words: a list of non-empty strings ([] or null: none).
status parse_bad_words(const json& j, const request_limits& lim, std::vector<std::string>& out) {
  auto it = j.find("bad_words");
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_array()) return bad("'bad_words' must be a list of strings");
  if (it->size() > lim.max_bad_words) return bad("'bad_words' holds at most " + std::to_string(lim.max_bad_words) + " words");
  out.clear();
  for (const auto& w : *it) {
    if (!w.is_string()) return bad("'bad_words' must be a list of strings");
    const auto& s = w.get_ref<const std::string&>();
    if (s.empty() || s.size() > lim.max_stop_bytes) {
      return bad("each of 'bad_words' must be 1 to " + std::to_string(lim.max_stop_bytes) + " bytes");
    }
    out.push_back(s);
  }
  return ok_status();
}

/// OpenAI's logit_bias: {"token id": bias}, ids as decimal strings, biases within [-100, 100].
status parse_logit_bias(const json& j, generation_fields& g) {
  auto it = j.find("logit_bias");
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_object()) return bad("'logit_bias' must be an object of token ids to numbers");
  if (it->size() > max_logit_bias_entries) {
    return bad("'logit_bias' holds at most " + std::to_string(max_logit_bias_entries) + " entries");
  }
  for (const auto& [key, value] : it->items()) {
    int64_t id = -1;
    const bool digits = !key.empty() && key.size() <= 10 && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) id = std::stoll(key);
    if (!digits || id > std::numeric_limits<int32_t>::max()) {
      return bad("'logit_bias' keys must be token ids (non-negative integers as strings), got '" + key.substr(0, 32) + "'");
    }
    if (!value.is_number()) return bad("'logit_bias' values must be numbers");
    const double v = value.get<double>();
    if (!std::isfinite(v) || v < -max_logit_bias || v > max_logit_bias) {
      return bad("'logit_bias' values must be between -100 and 100");
    }
    for (const auto& [known, b] : g.logit_bias) {  // "7" and "007" are one token
      if (known == id) return bad("'logit_bias' names token " + std::to_string(id) + " twice");
    }
    g.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(v));
  }
  return ok_status();
}

/// A request's generations (prompts × n, or × best_of when larger) within lim.max_choices;
/// each factor is checked first, so the product cannot overflow. `field` names the per-prompt
/// count ("'n'", "'best_of'").
status check_choices(const request_limits& lim, uint64_t per_prompt, uint64_t prompts, const char* field = "'n'") {
  if (per_prompt <= lim.max_choices && prompts <= lim.max_choices && per_prompt * prompts <= lim.max_choices) {
    return ok_status();
  }
  const std::string asked = prompts > 1 ? std::string("prompts × ") + field : std::string(field);
  return bad("the request asks for more choices (" + asked + ") than this server's limit of " +
             std::to_string(lim.max_choices) + " per request");
}

/// OpenAI's stop: a string or an array of at most lim.max_stop strings of 1..max_stop_bytes.
status parse_stop(const json& j, const request_limits& lim, std::vector<std::string>& out) {
  auto it = j.find("stop");
  if (it == j.end() || it->is_null()) return ok_status();
  if (it->is_string()) {
    out.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (const auto& s : *it) {
      if (!s.is_string()) return bad("'stop' must be a string or an array of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    return bad("'stop' must be a string or an array of strings");
  }
  if (out.size() > lim.max_stop) return bad("'stop' holds at most " + std::to_string(lim.max_stop) + " strings");
  for (const auto& s : out) {
    if (s.empty() || s.size() > lim.max_stop_bytes) {
      return bad("each 'stop' string must be 1 to " + std::to_string(lim.max_stop_bytes) + " bytes");
    }
  }
  return ok_status();
}

/// vLLM's prompt_logprobs: an integer 0..max_logprobs (true and false pass as 1 and none, as
/// vLLM's pydantic model coerces them), never with stream (vLLM's rule).
status parse_prompt_logprobs(const json& j, int max_logprobs, generation_fields& g) {
  auto it = j.find("prompt_logprobs");
  if (it == j.end() || it->is_null() || (it->is_boolean() && !it->get<bool>())) return ok_status();
  const std::string bound = std::to_string(max_logprobs);
  if (it->is_boolean()) {
    g.prompt_logprobs_shown = 1;
  } else if (it->is_number_integer() && wide_integer(*it) >= 0 && wide_integer(*it) <= max_logprobs) {
    g.prompt_logprobs_shown = static_cast<int>(wide_integer(*it));
  } else {
    return bad("'prompt_logprobs' must be an integer between 0 and " + bound + " (how many alternatives), or null");
  }
  if (g.stream) return bad("'prompt_logprobs' cannot be streamed (send 'stream': false)");
  return ok_status();
}

status parse_generation(const json& j, const request_limits& lim, bool chat, generation_fields& g) {
  sampling_input in;
  // Chat's newer name wins when both are sent (OpenAI deprecated max_tokens for chat).
  for (const char* name : {chat ? "max_completion_tokens" : "", "max_tokens"}) {
    if (!*name) continue;
    LLMESH_TRY(integer_field(j, name, in.max_tokens));
    if (in.max_tokens) {
      in.max_tokens_name = name;
      break;
    }
  }
  LLMESH_TRY(number_field(j, "temperature", in.temperature));
  LLMESH_TRY(number_field(j, "top_p", in.top_p));
  LLMESH_TRY(integer_field(j, "top_k", in.top_k));
  LLMESH_TRY(apply_sampling(in, lim, g));
  if (chat && !g.max_tokens_given) g.max_tokens = lim.max_tokens;  // chat: until EOS, bounded by the server
  LLMESH_TRY(parse_penalties(j, in, chat, g));
  LLMESH_TRY(parse_logit_bias(j, g));
  std::optional<double> min_p;
  LLMESH_TRY(number_field(j, "min_p", min_p));
  if (min_p) {
    LLMESH_TRY(check_range("min_p", *min_p, 0.0, 1.0));
    g.min_p = static_cast<float>(*min_p);
  }
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) return bad("'seed' must be an integer");
    g.seed = it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
  }
  if (auto it = j.find("n"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || wide_integer(*it) < 1) return bad("'n' must be a positive integer");
    LLMESH_TRY(check_choices(lim, static_cast<uint64_t>(wide_integer(*it)), 1));
    g.n = static_cast<size_t>(wide_integer(*it));
  }
  LLMESH_TRY(parse_stop(j, lim, g.stop));
  LLMESH_TRY(bool_field(j, "stream", g.stream));
  LLMESH_TRY(bool_field(j, "return_token_ids", g.return_token_ids));
  LLMESH_TRY(bool_field(j, "ignore_eos", g.ignore_eos));
  LLMESH_TRY(parse_output_fields(j, g));
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return bad("'stream_options' must be an object");
    LLMESH_TRY(bool_field(*it, "include_usage", g.include_usage));
    LLMESH_TRY(bool_field(*it, "continuous_usage_stats", g.continuous_usage));
    g.continuous_usage = g.continuous_usage && g.include_usage;  // vLLM's rule: only with include_usage
  }
  LLMESH_TRY(parse_stop_token_ids(j, lim, g.stop_token_ids));
  LLMESH_TRY(parse_allowed_token_ids(j, lim, g.allowed_ids));
  LLMESH_TRY(parse_bad_words(j, lim, g.bad_words));
  LLMESH_TRY(parse_logprobs(j, chat, lim.max_logprobs, g));
  LLMESH_TRY(parse_prompt_logprobs(j, lim.max_logprobs, g));
  LLMESH_TRY(refuse_unsupported(j, chat, g));
  // best_of (completions): more candidates than choices, the best returned (api_service); 1
  // (or null) is the neutral value, whatever n. vLLM's rules: at least n, not streamed.
  if (g.best_of > 1) {
    if (g.best_of < g.n) {
      return bad("'best_of' (" + std::to_string(g.best_of) + ") must be at least 'n' (" + std::to_string(g.n) + ")");
    }
    if (g.stream) return bad("'best_of' above 1 cannot be streamed (send 'stream': false)");
    LLMESH_TRY(check_choices(lim, g.best_of, 1, "'best_of'"));
  }
  LLMESH_TRY(parse_beam_search(j, lim.max_logprobs, g));
  LLMESH_TRY(parse_cache_salt(j, g));
  LLMESH_TRY(parse_prompt_cache_key(j, g));
  return parse_priority(j, g);
}

status parse_model(const json& j, std::string& model) {
  auto it = j.find("model");
  if (it == j.end() || !it->is_string() || it->get<std::string>().empty()) return bad("'model' must be a non-empty string");
  model = it->get<std::string>();
  return ok_status();
}


/// A message's content given as parts ([{"type":"text","text":"..."}, ...]) as one string.
/// The text parts are joined with "\n", as vLLM does for text-only content
/// (vllm/entrypoints/chat_utils.py, _parse_chat_message_content_parts: "\n".join(texts));
/// other parts (image_url, input_audio, ...) are refused: this server serves text models only.
result<std::string> join_text_parts(const json& parts) {
  std::string text;
  bool first = true;
  for (const auto& part : parts) {
    if (!part.is_object()) return bad("each content part must be an object with a 'type'");
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return bad("each content part needs a string 'type'");
    if (type->get_ref<const std::string&>() != "text") {
      return bad("content parts of type '" + type->get<std::string>() + "' are not supported (only 'text')");
    }
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) return bad("each 'text' content part needs a string 'text'");
    if (!first) text += '\n';
    text += t->get_ref<const std::string&>();
    first = false;
  }
  return text;
}

}  // namespace

status parse_prompt_ids(const json& p, const std::string& name, prompt_input& out) {
  if (p.empty()) return bad(name + " is empty");
  for (const auto& t : p) {
    if (!t.is_number_integer() || wide_integer(t) < 0 || wide_integer(t) > std::numeric_limits<int32_t>::max()) {
      return bad(name + " token ids must be non-negative integers");
    }
    out.ids.push_back(static_cast<int32_t>(wide_integer(t)));
  }
  return ok_status();
}

namespace {

/// `prompt`: a string, an array of token ids, or a batch — an array of strings or an array of
/// token-id arrays, one kind throughout (vLLM's four forms). A batch of one is one prompt.
status parse_prompts(const json& j, const request_limits& lim, std::vector<prompt_input>& out) {
  auto p = j.find("prompt");
  if (p == j.end()) return bad("'prompt' is required");
  const char* forms = "'prompt' must be a string, an array of token ids, or an array of strings or of token-id arrays";
  if (p->is_string()) {
    if (p->get_ref<const std::string&>().empty()) return bad("'prompt' is empty");
    out.push_back({p->get<std::string>(), {}});
    return ok_status();
  }
  if (!p->is_array()) return bad(forms);
  if (p->empty()) return bad("'prompt' is an empty array");
  if ((*p)[0].is_number()) return parse_prompt_ids(*p, "'prompt'", out.emplace_back());
  // A batch: bounded before it is read (each prompt is at least one choice).
  LLMESH_TRY(check_choices(lim, 1, p->size()));
  const bool strings = (*p)[0].is_string();
  for (size_t i = 0; i < p->size(); ++i) {
    const json& e = (*p)[i];
    const std::string name = p->size() > 1 ? "'prompt[" + std::to_string(i) + "]'" : "'prompt'";
    if (strings && e.is_string()) {
      // As before batches: a batch of one string takes it as given, "" included.
      if (p->size() > 1 && e.get_ref<const std::string&>().empty()) return bad(name + " is empty");
      out.push_back({e.get<std::string>(), {}});
    } else if (!strings && e.is_array()) {
      LLMESH_TRY(parse_prompt_ids(e, name, out.emplace_back()));
    } else {
      return bad(std::string(forms) + " (one kind throughout)");
    }
  }
  return ok_status();
}

result<completion_request> parse_completion(std::string_view body, const request_limits& lim) {
  auto j = parse_object(body);
  if (!j) return j.take_error();
  completion_request r;
  LLMESH_TRY(parse_model(*j, r.model));
  LLMESH_TRY(parse_prompts(*j, lim, r.prompts));
  LLMESH_TRY(bool_field(*j, "echo", r.echo));
  LLMESH_TRY(bool_field(*j, "add_special_tokens", r.add_special_tokens));
  LLMESH_TRY(parse_generation(*j, lim, false, r.gen));
  LLMESH_TRY(check_choices(lim, r.gen.candidates(), r.prompts.size(), r.gen.best_of > r.gen.n ? "'best_of'" : "'n'"));
  LLMESH_TRY(parse_output_constraint(*j, nullptr, r.gen.constraint));  // last: it compiles
  // Echo with logprobs reports the prompt's tokens too, as OpenAI's legacy endpoint does: the
  // engine scores them (the first has no context: null).
  if (r.echo && r.gen.logprobs >= 0) r.gen.prompt_logprobs = r.gen.logprobs;
  return r;
}

/// add_generation_prompt (default true) and continue_final_message (default false), not both
/// true (vLLM's rule: the final message is either closed with a new turn opened, or continued).
status parse_turn_fields(const json& j, bool& add_generation_prompt, bool& continue_final_message) {
  LLMESH_TRY(bool_field(j, "add_generation_prompt", add_generation_prompt));
  LLMESH_TRY(bool_field(j, "continue_final_message", continue_final_message));
  if (add_generation_prompt && continue_final_message && j.contains("add_generation_prompt") &&
      j["add_generation_prompt"].is_boolean()) {
    return bad("'continue_final_message' and 'add_generation_prompt' cannot both be true");
  }
  if (continue_final_message) add_generation_prompt = false;  // left out: continuing implies it
  return ok_status();
}

/// Chat messages, checked: objects with a string role and a string, null or text-parts content
/// (joined into one string), their tool calls normalized.
status parse_messages(json& j, const request_limits& lim, json& out) {
  auto m = j.find("messages");
  if (m == j.end() || !m->is_array() || m->empty()) return bad("'messages' must be a non-empty array");
  if (m->size() > lim.max_messages) return bad("'messages' holds at most " + std::to_string(lim.max_messages) + " entries");
  for (size_t i = 0; i < m->size(); ++i) {
    json& msg = (*m)[i];
    if (!msg.is_object()) return bad("each message must be an object");
    auto role = msg.find("role");
    if (role == msg.end() || !role->is_string()) return bad("each message needs a string 'role'");
    LLMESH_TRY(normalize_tool_calls(msg, i));  // an assistant's tool calls: content may be left out
    auto content = msg.find("content");
    if (content == msg.end()) return bad("each message needs a 'content' (a string or an array of text parts)");
    if (content->is_array()) {
      auto text = join_text_parts(*content);
      if (!text) return text.take_error();
      *content = std::move(*text);  // the chat template sees a plain string, as with vLLM
    } else if (!(content->is_string() || content->is_null())) {
      return bad("each message's 'content' must be a string or an array of text parts");
    }
  }
  out = std::move(*m);
  return ok_status();
}

/// vLLM's chat_template_kwargs: an object of template variables (null: none); `tools` is the
/// request's own, never these.
status parse_template_kwargs(const json& j, json& out) {
  auto it = j.find("chat_template_kwargs");
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_object()) return bad("'chat_template_kwargs' must be an object of template variables");
  out = *it;
  out.erase("tools");
  return ok_status();
}

result<chat_request> parse_chat(std::string_view body, const request_limits& lim) {
  auto j = parse_object(body);
  if (!j) return j.take_error();
  chat_request r;
  LLMESH_TRY(parse_model(*j, r.model));
  LLMESH_TRY(parse_messages(*j, lim, r.messages));
  LLMESH_TRY(parse_turn_fields(*j, r.add_generation_prompt, r.continue_final_message));
  LLMESH_TRY(bool_field(*j, "add_special_tokens", r.add_special_tokens));
  LLMESH_TRY(parse_template_kwargs(*j, r.template_kwargs));
  LLMESH_TRY(bool_field(*j, "include_reasoning", r.include_reasoning));
  // Chat has no echo (a completions field): true would ask for the prompt in the answer.
  bool echo = false;
  LLMESH_TRY(bool_field(*j, "echo", echo));
  if (echo) return unsupported("echo", "false or null; /v1/completions echoes");
  LLMESH_TRY(parse_generation(*j, lim, true, r.gen));
  LLMESH_TRY(parse_tools(*j, r.tools));
  LLMESH_TRY(parse_output_constraint(*j, &r.tools, r.gen.constraint));  // last: it compiles
  return r;
}

/// An optional model: absent or null leaves it empty.
status optional_model(const json& j, std::string& model) {
  auto it = j.find("model");
  if (it == j.end() || it->is_null()) return ok_status();
  return parse_model(j, model);
}

result<tokenize_request> parse_tokenize(std::string_view body, const request_limits& lim) {
  auto j = parse_object(body);
  if (!j) return j.take_error();
  tokenize_request r;
  LLMESH_TRY(optional_model(*j, r.model));
  const bool has_prompt = j->contains("prompt"), has_messages = j->contains("messages");
  if (has_prompt == has_messages) return bad("send exactly one of 'prompt' (a string) and 'messages'");
  if (has_prompt) {
    const auto& p = (*j)["prompt"];
    if (!p.is_string()) return bad("'prompt' must be a string");
    r.prompt = p.get<std::string>();
  } else {
    json messages;
    LLMESH_TRY(parse_messages(*j, lim, messages));
    r.messages = std::move(messages);
    r.add_special_tokens = false;  // the template writes them, as for chat completions
    tool_request tools;  // checked as chat's: the template sees what chat would render
    LLMESH_TRY(parse_tools(*j, tools));
    if (!tools.tools.empty()) r.tools = std::move(tools.tools);
  }
  LLMESH_TRY(bool_field(*j, "add_special_tokens", r.add_special_tokens));
  LLMESH_TRY(parse_turn_fields(*j, r.add_generation_prompt, r.continue_final_message));
  LLMESH_TRY(bool_field(*j, "return_token_strs", r.return_token_strs));
  LLMESH_TRY(parse_template_kwargs(*j, r.template_kwargs));
  return r;
}

result<detokenize_request> parse_detokenize(std::string_view body) {
  auto j = parse_object(body);
  if (!j) return j.take_error();
  detokenize_request r;
  LLMESH_TRY(optional_model(*j, r.model));
  auto t = j->find("tokens");
  if (t == j->end() || !t->is_array()) return bad("'tokens' must be an array of token ids");
  r.tokens.reserve(t->size());
  for (const auto& v : *t) {
    if (!v.is_number_integer() || wide_integer(v) < 0 || wide_integer(v) > std::numeric_limits<int32_t>::max()) {
      return bad("'tokens' must hold non-negative integer token ids");
    }
    r.tokens.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return r;
}

}  // namespace

status apply_sampling(const sampling_input& in, const request_limits& lim, generation_fields& g) {
  if (in.max_tokens) {
    const int64_t v = *in.max_tokens;
    if (v < 1 || static_cast<uint64_t>(v) > lim.max_tokens) {
      return bad(std::string("'") + in.max_tokens_name + "' must be between 1 and " + std::to_string(lim.max_tokens));
    }
    g.max_tokens = static_cast<size_t>(v);
    g.max_tokens_given = true;
  }
  // OpenAI's ranges: temperature 0 (greedy) to 2, top_p a probability mass.
  if (in.temperature) {
    LLMESH_TRY(check_range("temperature", *in.temperature, 0.0, 2.0));
    g.temperature = static_cast<float>(*in.temperature);
    g.temperature_given = true;
  }
  if (in.top_p) {
    LLMESH_TRY(check_range("top_p", *in.top_p, 0.0, 1.0));
    g.top_p = static_cast<float>(*in.top_p);
    g.top_p_given = true;
  }
  if (in.top_k) {
    const int64_t v = *in.top_k;
    if (v < -1 || v > std::numeric_limits<int>::max()) return bad("'top_k' must be -1, 0 or positive");
    g.top_k = v < 0 ? 0 : static_cast<int>(v);  // vLLM's -1 and 0 both mean off
    g.top_k_given = true;
  }
  return ok_status();
}

// nlohmann::json throws on some inputs (deep nesting, type errors we did not foresee): any such
// exception becomes a 400 naming the JSON problem, never a crash.
template <class F>
auto guarded(F parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const std::exception& e) {
    return bad(std::string("malformed request: ") + e.what());
  }
}

result<completion_request> parse_completion_request(std::string_view body, const request_limits& lim) {
  return guarded([&] { return parse_completion(body, lim); });
}

result<chat_request> parse_chat_request(std::string_view body, const request_limits& lim) {
  return guarded([&] { return parse_chat(body, lim); });
}

status apply_extra_fields(const json& j, const request_limits& lim, generation_fields& g) {
  return guarded([&]() -> status {
    if (!j.is_object()) return bad("the extra fields must be an object");
    sampling_input in;
    LLMESH_TRY(parse_penalties(j, in, /*chat=*/false, g));
    LLMESH_TRY(parse_logit_bias(j, g));
    std::optional<double> min_p;
    LLMESH_TRY(number_field(j, "min_p", min_p));
    if (min_p) {
      LLMESH_TRY(check_range("min_p", *min_p, 0.0, 1.0));
      g.min_p = static_cast<float>(*min_p);
    }
    LLMESH_TRY(parse_stop_token_ids(j, lim, g.stop_token_ids));
    LLMESH_TRY(parse_allowed_token_ids(j, lim, g.allowed_ids));
    LLMESH_TRY(parse_bad_words(j, lim, g.bad_words));
    LLMESH_TRY(parse_stop(j, lim, g.stop));
    LLMESH_TRY(parse_output_fields(j, g));
    LLMESH_TRY(parse_beam_search(j, lim.max_logprobs, g));
    LLMESH_TRY(parse_priority(j, g));
    LLMESH_TRY(parse_cache_salt(j, g));
    LLMESH_TRY(parse_prompt_cache_key(j, g));
    return parse_output_constraint(j, nullptr, g.constraint);
  });
}

result<nlohmann::ordered_json> parse_request_object(std::string_view body) {
  return guarded([&] { return parse_object(body); });
}

result<tokenize_request> parse_tokenize_request(std::string_view body, const request_limits& lim) {
  return guarded([&] { return parse_tokenize(body, lim); });
}

result<detokenize_request> parse_detokenize_request(std::string_view body) {
  return guarded([&] { return parse_detokenize(body); });
}

}  // namespace llmesh::gateway
