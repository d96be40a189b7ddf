// config.json's rotary settings -> kernels::rope_config: rope_theta, partial_rotary_factor and
// rope_scaling (linear, llama3, yarn, longrope, dynamic; transformers v5's rope_parameters too), read as
// vLLM reads them, with the context a scaling gives; choose_longrope's factors by the served
// context.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "config_fields.hpp"
#include "config_rope.hpp"
#include "llmesh/model/config.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;
using detail::bad;
using detail::get_bool;
using detail::get_number;
using detail::get_string;

/// A number of rope_scaling `s` (fallback when absent), its error naming rope_scaling.
result<double> scaling_number(const json& s, const char* key, double fallback) {
  auto r = get_number(s, key, fallback);
  if (!r) return bad("rope_scaling: " + r.err().message.substr(std::string("config.json: ").size()));
  return r;
}

/// HF's partial_rotary_factor (top level, or in transformers v5's rope_parameters): only the
/// first head_dim × factor entries of each head rotate (Phi-4-mini: 0.75).
status parse_partial_rotary(const json& j, const json* params, model_config& c) {
  const bool nested = params && params->is_object() && params->contains("partial_rotary_factor");
  auto partial = get_number(nested ? *params : j, "partial_rotary_factor", 1.0);
  if (!partial) return partial.take_error();
  if (!(*partial > 0.0 && *partial <= 1.0)) return bad("partial_rotary_factor must be in (0, 1]");
  const auto rot = static_cast<size_t>(static_cast<double>(c.head_dim) * *partial);  // HF's int()
  if (rot == 0 || rot % 2 != 0) {
    return bad("partial_rotary_factor " + std::to_string(*partial) + " gives a rotary dimension of " + std::to_string(rot) +
               " (of head_dim " + std::to_string(c.head_dim) + "); it must be even and positive");
  }
  c.rope.head_dim = rot;
  return ok_status();
}

/// The served context a rope_scaling gives (vLLM's derived max_model_len), at most 2^30.
status stretch_context(model_config& c, double positions) {
  if (!(positions <= static_cast<double>(size_t{1} << 30))) {
    return bad("rope_scaling: the scaled context (" + std::to_string(positions) + " positions) exceeds 2^30");
  }
  c.max_positions = static_cast<size_t>(positions);
  return ok_status();
}

/// YaRN (Qwen2.5/Qwen3's long-context recipe): factor, original_max_position_embeddings (the
/// model's max_position_embeddings when absent), beta_fast (32), beta_slow (1), truncate (true);
/// cos and sin times HF's attention_factor, else 0.1·ln(factor) + 1 (or HF's ratio for
/// mscale / mscale_all_dim), times vLLM's attn_factor. The factor is the config's, as vLLM
/// takes it.
status parse_yarn(const json& s, model_config& c) {
  c.rope.yarn = true;
  if (!s.contains("factor")) return bad("rope_scaling: a yarn rope_scaling needs factor");
  auto factor = scaling_number(s, "factor", 0.0);
  auto orig = scaling_number(s, "original_max_position_embeddings", static_cast<double>(c.max_positions));
  auto fast = scaling_number(s, "beta_fast", 32.0);
  auto slow = scaling_number(s, "beta_slow", 1.0);
  auto attn = scaling_number(s, "attention_factor", 0.0);
  auto attn_mult = scaling_number(s, "attn_factor", 1.0);  // vLLM's
  auto mscale = scaling_number(s, "mscale", 0.0);
  auto mscale_all = scaling_number(s, "mscale_all_dim", 0.0);
  for (auto* r : {&factor, &orig, &fast, &slow, &attn, &attn_mult, &mscale, &mscale_all}) {
    if (!*r) return r->take_error();
  }
  auto truncate = get_bool(s, "truncate", true);
  if (!truncate) return bad("rope_scaling: field 'truncate' must be true or false");
  if (!(*factor > 0.0)) return bad("rope_scaling: a yarn rope_scaling needs factor > 0");
  if (!(*orig >= 1.0)) return bad("rope_scaling: original_max_position_embeddings must be positive");
  if (!(*fast > 0.0 && *slow > 0.0)) return bad("rope_scaling: beta_fast and beta_slow must be positive");
  if (!(*attn >= 0.0) || !(*attn_mult > 0.0)) return bad("rope_scaling: attention_factor and attn_factor must be positive");
  auto get_mscale = [&](double m) { return *factor <= 1.0 ? 1.0 : 0.1 * m * std::log(*factor) + 1.0; };
  double a = *attn;
  if (a == 0.0) a = *mscale != 0.0 && *mscale_all != 0.0 ? get_mscale(*mscale) / get_mscale(*mscale_all) : get_mscale(1.0);
  c.rope.factor = *factor;
  c.rope.original_max_position = *orig;
  c.rope.beta_fast = *fast;
  c.rope.beta_slow = *slow;
  c.rope.yarn_truncate = *truncate;
  c.rope.attention_factor = a * *attn_mult;
  // vLLM's context for a yarn model: the original one times the factor (Qwen2.5's 32768 × 4;
  // Gemma 3's max_position_embeddings already counts its scaling).
  if (c.arch != architecture::gemma3) LLMESH_TRY(stretch_context(c, *orig * std::max(*factor, 1.0)));
  return ok_status();
}

/// Dynamic NTK (rope_scaling type "dynamic"), as vLLM computes it: one rotary base for every
/// position, NTK-aware scaling's at the longest context L = max_position_embeddings × factor,
/// theta · (factor · L / max_position_embeddings − (factor − 1))^(r / (r − 2)) for rotary
/// dimension r, and the context stretched to L. (HF rescales by the sequence's current length
/// instead: a key's rotation would then depend on when it was computed, against chunk
/// invariance.) Hunyuan's form with `alpha`: theta · alpha^(r / (r − 2)), the context
/// stretched by a `factor` beside it if any (vLLM's max_model_len rule). Gemma 3's context
/// already counts its scaling, as for linear and yarn.
status parse_dynamic_ntk(const json& s, model_config& c) {
  if (c.rope.head_dim <= 2) return bad("rope_scaling: a dynamic rope_scaling needs a rotary dimension above 2");
  const double r = static_cast<double>(c.rope.head_dim), exponent = r / (r - 2.0);
  const bool alpha_form = s.contains("alpha");
  if (!alpha_form && !s.contains("factor")) return bad("rope_scaling: a dynamic rope_scaling needs factor (or alpha)");
  auto factor = scaling_number(s, "factor", 1.0);
  if (!factor) return factor.take_error();
  if (!(*factor > 0.0)) return bad("rope_scaling: a dynamic rope_scaling needs factor > 0");
  const double original = static_cast<double>(c.max_positions), longest = original * *factor;
  if (c.arch != architecture::gemma3) LLMESH_TRY(stretch_context(c, original * std::max(*factor, 1.0)));
  if (alpha_form) {
    auto alpha = scaling_number(s, "alpha", 0.0);
    if (!alpha) return alpha.take_error();
    if (!(*alpha > 0.0)) return bad("rope_scaling: a dynamic rope_scaling needs alpha > 0");
    c.rope.theta *= std::pow(*alpha, exponent);
  } else {
    c.rope.theta *= std::pow(*factor * longest / original - (*factor - 1.0), exponent);
  }
  if (!std::isfinite(c.rope.theta) || !(c.rope.theta > 0.0)) return bad("rope_scaling: the dynamic scaling gives no finite rotary base");
  return ok_status();
}

/// A list of rope_scaling numbers, each positive, `n` of them.
result<std::vector<double>> scaling_list(const json& s, const char* key, size_t n) {
  const std::string what = std::string("rope_scaling: ") + key;
  if (!s.contains(key) || !s[key].is_array()) return bad(what + " must be a list of numbers");
  std::vector<double> out;
  for (const auto& v : s[key]) {
    if (!v.is_number() || !(v.get<double>() > 0.0)) return bad(what + " must hold positive numbers");
    out.push_back(v.get<double>());
  }
  if (out.size() != n) {
    return bad(what + " has " + std::to_string(out.size()) + " entries; the rotary dimension " + std::to_string(2 * n) +
               " needs " + std::to_string(n));
  }
  return out;
}

/// LongRoPE (Phi-3.5, Phi-3-128k, Phi-4-mini): short_factor and long_factor (one divisor per
/// frequency), original_max_position_embeddings (rope_scaling's or the top level's; required);
/// the long factors while the context exceeds it (vLLM's rule, by max_model_len:
/// choose_longrope), cos and sin times sqrt(1 + ln(s) / ln(original)) for s =
/// max_position_embeddings / original (1 when s <= 1), or HF's attention_factor, or vLLM's
/// short_mscale / long_mscale.
status parse_longrope(const json& j, const json& s, model_config& c) {
  c.rope.longrope = true;
  const size_t n = c.rope.head_dim / 2;
  auto short_f = scaling_list(s, "short_factor", n);
  if (!short_f) return short_f.take_error();
  auto long_f = scaling_list(s, "long_factor", n);
  if (!long_f) return long_f.take_error();
  const json& where = s.contains("original_max_position_embeddings") ? s : j;
  if (!where.contains("original_max_position_embeddings")) {
    return bad("a longrope rope_scaling needs original_max_position_embeddings");
  }
  auto orig = get_number(where, "original_max_position_embeddings", 0.0);
  if (!orig) return orig.take_error();
  if (!(*orig >= 2.0)) return bad("original_max_position_embeddings must be at least 2");
  const double scale = static_cast<double>(c.max_positions) / *orig;
  auto attn = scaling_number(s, "attention_factor", scale <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(scale) / std::log(*orig)));
  if (!attn) return attn.take_error();
  auto short_m = scaling_number(s, "short_mscale", *attn);
  auto long_m = scaling_number(s, "long_mscale", *attn);
  for (auto* r : {&short_m, &long_m}) {
    if (!*r) return r->take_error();
  }
  if (!(*attn > 0.0 && *short_m > 0.0 && *long_m > 0.0)) return bad("rope_scaling: the longrope attention factors must be positive");
  c.rope.short_factor = std::move(*short_f);
  c.rope.long_factor = std::move(*long_f);
  c.rope.original_max_position = *orig;
  c.rope.short_mscale = *short_m;
  c.rope.long_mscale = *long_m;
  choose_longrope(c, 0);
  return ok_status();
}

}  // namespace

status detail::parse_rope(const json& j, model_config& c) {
  // transformers v5 writes rope_theta and the scaling together as rope_parameters.
  const json* params = nullptr;
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    params = &j["rope_parameters"];
    if (!params->is_object() || !(params->contains("rope_theta") || params->contains("rope_type"))) {
      return make_error(errc::unsupported,
                        "config.json: rope_parameters must be one object with rope_theta or rope_type (per-layer-type "
                        "rope parameters are not supported)");
    }
  }
  auto theta = get_number(j.contains("rope_theta") || !params ? j : *params, "rope_theta", 10000.0);
  if (!theta) return theta.take_error();
  if (!(*theta > 0.0)) return bad("rope_theta must be positive");
  c.rope.head_dim = c.head_dim;
  c.rope.theta = *theta;
  LLMESH_TRY(parse_partial_rotary(j, params, c));
  const json* scaling = j.contains("rope_scaling") && !j["rope_scaling"].is_null() ? &j["rope_scaling"] : params;
  if (!scaling) return ok_status();
  const auto& s = *scaling;
  if (!s.is_object()) return bad("rope_scaling must be an object or null");
  auto legacy = get_string(s, "type", "default");
  if (!legacy) return legacy.take_error();
  auto type_r = get_string(s, "rope_type", *legacy);
  if (!type_r) return type_r.take_error();
  const std::string& type = *type_r;
  if (type == "default") return ok_status();
  if (type == "linear") {  // HF's linear interpolation: every frequency divided by the factor
    auto factor = scaling_number(s, "factor", 0.0);
    if (!factor) return factor.take_error();
    if (!(*factor > 0.0)) return bad("rope_scaling: a linear rope_scaling needs factor > 0");
    c.rope.linear_factor = *factor;
    // vLLM's context: max_position_embeddings times the factor (Gemma 3's already counts it).
    if (c.arch != architecture::gemma3) LLMESH_TRY(stretch_context(c, static_cast<double>(c.max_positions) * std::max(*factor, 1.0)));
    return ok_status();
  }
  if (type == "yarn") return parse_yarn(s, c);
  if (type == "longrope" || type == "su") return parse_longrope(j, s, c);  // "su": its name in early Phi-3 configs
  if (type == "dynamic") return parse_dynamic_ntk(s, c);
  if (type != "llama3") {
    return make_error(errc::unsupported, "config.json: unsupported rope_scaling type '" + type +
                                             "' (supported: linear, llama3, yarn, longrope, dynamic)");
  }
  c.rope.llama3 = true;
  auto factor = scaling_number(s, "factor", 8.0);
  auto low = scaling_number(s, "low_freq_factor", 1.0);
  auto high = scaling_number(s, "high_freq_factor", 4.0);
  auto orig = scaling_number(s, "original_max_position_embeddings", 8192.0);
  for (auto* r : {&factor, &low, &high, &orig}) {
    if (!*r) return r->take_error();
  }
  if (*high <= *low || *factor <= 0.0) return bad("rope_scaling: need high_freq_factor > low_freq_factor and factor > 0");
  c.rope.factor = *factor;
  c.rope.low_freq_factor = *low;
  c.rope.high_freq_factor = *high;
  c.rope.original_max_position = *orig;
  return ok_status();
}

void choose_longrope(model_config& c, size_t max_model_len) {
  if (!c.rope.longrope) return;
  const size_t context = max_model_len != 0 ? std::min(max_model_len, c.max_positions) : c.max_positions;
  c.rope.use_long = static_cast<double>(context) > c.rope.original_max_position;
}

}  // namespace llmesh::model
