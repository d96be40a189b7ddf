// /v1/embeddings' parts (embeddings_api.hpp).
#include "llmesh/gateway/embeddings_api.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "llmesh/actors/serving_metrics.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

error bad(const std::string& msg) { return make_error(errc::invalid_request, msg); }

result<json> read_json(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return make_error(errc::io_error, "cannot read " + p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || (!j.is_object() && !j.is_array())) return make_error(errc::invalid_request, p.string() + " is not valid JSON");
  return j;
}

bool flag(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

status parse_inputs(const json& j, std::vector<prompt_input>& out) {
  auto p = j.find("input");
  if (p == j.end() || p->is_null()) return bad("'input' is required");
  const char* forms = "'input' must be a string, an array of strings, an array of token ids or an array of token-id arrays";
  if (p->is_string()) {
    if (p->get_ref<const std::string&>().empty()) return bad("'input' is an empty string");
    out.push_back({p->get<std::string>(), {}});
    return ok_status();
  }
  if (!p->is_array()) return bad(forms);
  if (p->empty()) return bad("'input' is an empty array");
  if ((*p)[0].is_number()) return parse_prompt_ids(*p, "'input'", out.emplace_back());
  if (p->size() > max_embedding_inputs) {
    return bad("'input' holds " + std::to_string(p->size()) + " inputs (at most " + std::to_string(max_embedding_inputs) + ")");
  }
  const bool strings = (*p)[0].is_string();
  for (size_t i = 0; i < p->size(); ++i) {
    const json& e = (*p)[i];
    const std::string name = "'input[" + std::to_string(i) + "]'";
    if (strings && e.is_string()) {
      if (e.get_ref<const std::string&>().empty()) return bad(name + " is an empty string");
      out.push_back({e.get<std::string>(), {}});
    } else if (!strings && e.is_array()) {
      LLMESH_TRY(parse_prompt_ids(e, name, out.emplace_back()));
    } else {
      return bad(std::string(forms) + " (one kind throughout)");
    }
  }
  return ok_status();
}

/// An optional integer field within [lo, hi]; absent or null leaves `out` as it is.
status integer_in(const json& j, const char* name, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return ok_status();
  const bool fits = it->is_number_integer() && !(it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi));
  if (!fits || it->get<int64_t>() < lo || it->get<int64_t>() > hi) {
    return bad(std::string("'") + name + "' must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  }
  out = it->get<int64_t>();
  return ok_status();
}

status boolean(const json& j, const char* name, std::optional<bool>& out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return ok_status();
  if (!it->is_boolean()) return bad(std::string("'") + name + "' must be a boolean");
  out = it->get<bool>();
  return ok_status();
}

/// The fields every pooling endpoint shares (vLLM's): add_special_tokens, truncate_prompt_tokens, priority.
template <class R>
status common_fields(const json& j, R& r) {
  if (auto m = j.find("model"); m != j.end() && !m->is_null()) {
    if (!m->is_string()) return bad("'model' must be a string");
    r.model = m->get<std::string>();
  }
  std::optional<bool> special;
  LLMESH_TRY(boolean(j, "add_special_tokens", special));
  r.add_special_tokens = special.value_or(true);
  std::optional<int64_t> truncate;
  LLMESH_TRY(integer_in(j, "truncate_prompt_tokens", -1, std::numeric_limits<int32_t>::max(), truncate));
  if (truncate == 0) return bad("'truncate_prompt_tokens' must be -1 (the model's context) or at least 1");
  r.truncate_prompt_tokens = truncate.value_or(0);
  std::optional<int64_t> priority;
  LLMESH_TRY(integer_in(j, "priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), priority));
  r.priority = static_cast<int32_t>(priority.value_or(0));
  return ok_status();
}

/// A string or a non-empty array of non-empty strings (at most max_embedding_inputs).
status texts(const json& j, const char* name, std::vector<std::string>& out) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return bad(std::string("'") + name + "' is required");
  if (it->is_string()) {
    out.push_back(it->get<std::string>());
  } else if (it->is_array() && !it->empty() && it->size() <= max_embedding_inputs) {
    for (const auto& t : *it) {
      if (!t.is_string()) return bad(std::string("'") + name + "' must hold strings only");
      out.push_back(t.get<std::string>());
    }
  } else {
    return bad(std::string("'") + name + "' must be a string or an array of 1 to " + std::to_string(max_embedding_inputs) +
               " strings");
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].empty()) return bad(std::string("'") + name + "' holds an empty string (at " + std::to_string(i) + ")");
  }
  return ok_status();
}

result<score_request> parse_score(std::string_view body) {
  auto parsed = parse_request_object(body);
  if (!parsed) return parsed.take_error();
  const json& j = *parsed;
  score_request r;
  LLMESH_TRY(common_fields(j, r));
  LLMESH_TRY(texts(j, "text_1", r.text_1));
  LLMESH_TRY(texts(j, "text_2", r.text_2));
  const size_t a = r.text_1.size(), b = r.text_2.size();
  if (a == 1) {
    for (size_t i = 0; i < b; ++i) r.pairs.emplace_back(0, i);
  } else if (b == 1) {
    for (size_t i = 0; i < a; ++i) r.pairs.emplace_back(i, 0);
  } else if (a == b) {
    for (size_t i = 0; i < a; ++i) r.pairs.emplace_back(i, i);
  } else {
    return bad("'text_1' holds " + std::to_string(a) + " texts and 'text_2' " + std::to_string(b) +
               ": one side must hold one text, or both as many");
  }
  return r;
}

result<rerank_request> parse_rerank(std::string_view body) {
  auto parsed = parse_request_object(body);
  if (!parsed) return parsed.take_error();
  const json& j = *parsed;
  rerank_request r;
  LLMESH_TRY(common_fields(j, r));
  auto q = j.find("query");
  if (q == j.end() || !q->is_string() || q->get_ref<const std::string&>().empty()) return bad("'query' must be a non-empty string");
  r.query = q->get<std::string>();
  auto d = j.find("documents");
  if (d == j.end() || !d->is_array() || d->empty() || d->size() > max_embedding_inputs) {
    return bad("'documents' must be an array of 1 to " + std::to_string(max_embedding_inputs) + " documents");
  }
  for (size_t i = 0; i < d->size(); ++i) {
    const json& e = (*d)[i];
    const json* text = e.is_string() ? &e : e.is_object() && e.contains("text") ? &e["text"] : nullptr;
    if (text == nullptr || !text->is_string() || text->get_ref<const std::string&>().empty()) {
      return bad("'documents[" + std::to_string(i) + "]' must be a non-empty string or an object with a non-empty 'text'");
    }
    r.documents.push_back(text->get<std::string>());
  }
  std::optional<int64_t> top_n;
  LLMESH_TRY(integer_in(j, "top_n", 0, std::numeric_limits<int32_t>::max(), top_n));
  r.top_n = static_cast<size_t>(top_n.value_or(0));
  std::optional<bool> docs;
  LLMESH_TRY(boolean(j, "return_documents", docs));
  r.return_documents = docs.value_or(true);
  return r;
}

result<embeddings_request> parse(std::string_view body) {
  auto parsed = parse_request_object(body);
  if (!parsed) return parsed.take_error();
  const json& j = *parsed;
  embeddings_request r;
  LLMESH_TRY(common_fields(j, r));
  LLMESH_TRY(parse_inputs(j, r.inputs));
  if (auto f = j.find("encoding_format"); f != j.end() && !f->is_null()) {
    if (!f->is_string() || (*f != "float" && *f != "base64")) return bad("'encoding_format' must be \"float\" or \"base64\"");
    r.base64 = *f == "base64";
  }
  LLMESH_TRY(integer_in(j, "dimensions", 1, std::numeric_limits<int32_t>::max(), r.dimensions));
  if (auto u = j.find("user"); u != j.end() && !u->is_null() && !u->is_string()) return bad("'user' must be a string");
  LLMESH_TRY(boolean(j, "normalize", r.normalize));
  return r;
}

/// vLLM's get_use_activation without `normalize`: softmax, then activation (both deprecated),
/// then use_activation.
result<std::optional<bool>> use_activation_of(const json& j) {
  std::optional<bool> softmax, activation, use_activation;
  LLMESH_TRY(boolean(j, "softmax", softmax));
  LLMESH_TRY(boolean(j, "activation", activation));
  LLMESH_TRY(boolean(j, "use_activation", use_activation));
  return softmax ? softmax : activation ? activation : use_activation;
}

result<std::optional<bool>> parse_activation(std::string_view body) {
  auto parsed = parse_request_object(body);
  if (!parsed) return parsed.take_error();
  return use_activation_of(*parsed);
}

result<pooling_fields> parse_fields(std::string_view body) {
  auto parsed = parse_request_object(body);
  if (!parsed) return parsed.take_error();
  const json& j = *parsed;
  pooling_fields f;
  if (auto t = j.find("task"); t != j.end() && !t->is_null()) {
    const char* tasks = "'task' must be one of embed, classify, token_embed and token_classify";
    if (!t->is_string()) return bad(tasks);
    for (auto k : {pooling_task::embed, pooling_task::classify, pooling_task::token_embed, pooling_task::token_classify}) {
      if (*t == task_name(k)) f.task = k;
    }
    if (!f.task) return bad(std::string(tasks) + ", not " + t->dump());
  }
  auto a = use_activation_of(j);
  if (!a) return a.take_error();
  f.activation = *a;
  return f;
}

constexpr char base64_digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// RFC 4648 base64, padded.
std::string base64(std::span<const unsigned char> in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t v = uint32_t{in[i]} << 16 | uint32_t{in[i + 1]} << 8 | in[i + 2];
    for (int k = 3; k >= 0; --k) out += base64_digits[(v >> (6 * k)) & 63];
  }
  if (const size_t rest = in.size() - i; rest > 0) {
    const uint32_t v = uint32_t{in[i]} << 16 | (rest == 2 ? uint32_t{in[i + 1]} << 8 : 0u);
    out += base64_digits[(v >> 18) & 63];
    out += base64_digits[(v >> 12) & 63];
    out += rest == 2 ? base64_digits[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace

namespace {

result<embedding_defaults> load_defaults(const std::string& dir, const std::string& pooling) {
  std::optional<actors::pooling> forced;
  if (pooling == "last") forced = actors::pooling::last;
  else if (pooling == "mean") forced = actors::pooling::mean;
  else if (pooling == "cls") forced = actors::pooling::cls;
  else if (pooling != "model") return make_error(errc::invalid_request, "pooling must be model, last, mean or cls, not '" + pooling + "'");
  embedding_defaults d;
  if (forced) d.pool = *forced;
  const std::filesystem::path root(dir);
  std::error_code ec;
  if (!std::filesystem::exists(root / "modules.json", ec)) return d;
  auto modules = read_json(root / "modules.json");
  if (!modules) return modules.take_error();
  if (!modules->is_array()) return make_error(errc::invalid_request, (root / "modules.json").string() + " must be an array");
  d.normalize = false;
  for (const auto& m : *modules) {
    const std::string type = m.is_object() && m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "";
    const std::string path = m.is_object() && m.contains("path") && m["path"].is_string() ? m["path"].get<std::string>() : "";
    if (type.ends_with(".Normalize")) {
      d.normalize = true;
      continue;
    }
    if (type.ends_with(".Transformer")) continue;
    // Another module (Dense, a projection...) would change the vectors: refused, not skipped.
    if (!type.ends_with(".Pooling")) {
      return make_error(errc::unsupported, (root / "modules.json").string() + ": module '" + type +
                                               "' is not computed by this server (it computes Transformer, Pooling, Normalize)");
    }
    if (forced) continue;  // its pooling is replaced: its config is not read
    const std::string where = (root / path / "config.json").string();
    auto cfg = read_json(root / path / "config.json");
    if (!cfg) return cfg.take_error();
    const int modes = flag(*cfg, "pooling_mode_lasttoken") + flag(*cfg, "pooling_mode_mean_tokens") +
                      flag(*cfg, "pooling_mode_cls_token") + flag(*cfg, "pooling_mode_max_tokens") +
                      flag(*cfg, "pooling_mode_mean_sqrt_len_tokens") + flag(*cfg, "pooling_mode_weightedmean_tokens");
    if (auto ip = cfg->find("include_prompt"); ip != cfg->end() && ip->is_boolean() && !ip->get<bool>()) {
      return make_error(errc::unsupported, where + ": include_prompt false (pooling without the instruction) is not computed");
    }
    if (modes == 1 && flag(*cfg, "pooling_mode_lasttoken")) d.pool = actors::pooling::last;
    else if (modes == 1 && flag(*cfg, "pooling_mode_mean_tokens")) d.pool = actors::pooling::mean;
    else if (modes == 1 && flag(*cfg, "pooling_mode_cls_token")) d.pool = actors::pooling::cls;
    else return make_error(errc::unsupported, where + ": a pooling this server does not compute (it computes one of lasttoken, "
                                                      "mean_tokens and cls_token)");
  }
  return d;
}

template <class F>
auto guarded(F parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const std::exception& e) {
    return bad(std::string("malformed request: ") + e.what());
  }
}

}  // namespace

result<embedding_defaults> load_embedding_defaults(const std::string& dir, const std::string& pooling_flag,
                                                   const pooler_config& config) {
  if (config.pooling != "model" && pooling_flag != "model" && pooling_flag != config.pooling) {
    return make_error(errc::invalid_request, "--pooling " + pooling_flag + " and --pooler-config's pooling_type " + config.pooling +
                                                 " disagree: give one");
  }
  auto d = load_defaults(dir, config.pooling != "model" ? config.pooling : pooling_flag);
  if (!d) return d;
  if (config.normalize) d->normalize = *config.normalize;
  if (config.activation) d->activation = *config.activation;
  return d;
}

result<pooler_config> parse_pooler_config(std::string_view json_text) {
  pooler_config c;
  if (json_text.empty()) return c;
  return guarded([&]() -> result<pooler_config> {
    const json j = json::parse(json_text, nullptr, false);
    if (!j.is_object()) return bad("--pooler-config must be a JSON object (PoolerConfig's keys), not " + std::string(json_text));
    for (const auto& [key, value] : j.items()) {
      if (value.is_null()) continue;  // as unset
      if (key == "pooling_type") {
        std::string t = value.is_string() ? value.get<std::string>() : "";
        std::transform(t.begin(), t.end(), t.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
        if (t != "last" && t != "mean" && t != "cls") {
          return bad("--pooler-config: pooling_type " + value.dump() + " is not computed here (LAST, MEAN or CLS; /pooling's "
                     "token tasks give every position's rows)");
        }
        c.pooling = t;
      } else if (key == "normalize" || key == "use_activation" || key == "softmax" || key == "activation") {
        if (!value.is_boolean()) return bad("--pooler-config: " + key + " must be a boolean");
      } else {
        return bad("--pooler-config: '" + key + "' is not taken here (pooling_type, normalize, use_activation)");
      }
    }
    LLMESH_TRY(boolean(j, "normalize", c.normalize));  // (types checked above)
    auto a = use_activation_of(j);
    if (!a) return a.take_error();
    c.activation = *a;
    return c;
  });
}

result<embeddings_request> parse_embeddings_request(std::string_view body) {
  return guarded([&] { return parse(body); });
}

result<score_request> parse_score_request(std::string_view body) {
  return guarded([&] { return parse_score(body); });
}

result<rerank_request> parse_rerank_request(std::string_view body) {
  return guarded([&] { return parse_rerank(body); });
}

result<pooling_fields> parse_pooling_fields(std::string_view body) {
  return guarded([&] { return parse_fields(body); });
}

result<std::optional<bool>> parse_use_activation(std::string_view body) {
  return guarded([&] { return parse_activation(body); });
}

const char* task_name(pooling_task t) {
  switch (t) {
    case pooling_task::embed: return "embed";
    case pooling_task::classify: return "classify";
    case pooling_task::token_embed: return "token_embed";
    case pooling_task::token_classify: return "token_classify";
  }
  return "?";
}

std::string embedding_json(std::span<const float> v, bool as_base64) {
  if (as_base64) {
    std::vector<unsigned char> bytes(v.size() * 4);
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &v[i], 4);
      for (int b = 0; b < 4; ++b) bytes[i * 4 + b] = static_cast<unsigned char>(u >> (8 * b));  // little-endian
    }
    std::string out = "\"";
    out += base64(bytes);
    out += '"';
    return out;
  }
  std::string out = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out += ',';
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v[i]);  // the shortest text that reads back as v[i]
    out.append(buf, ec == std::errc() ? end : buf);
  }
  out += ']';
  return out;
}

embeddings_output::embeddings_output(setup s, std::vector<actors::replica_request> requests) : s_(std::move(s)) {
  s_.window = std::max<size_t>(s_.window, 1);
  inputs_.reserve(requests.size());
  for (auto& r : requests) {
    prompt_tokens_ += r.prompt.size();
    inputs_.push_back({std::move(r), false, false, {}});
  }
  done_ = inputs_.empty();
}

std::vector<actors::replica_request> embeddings_output::take_submissions() {
  std::vector<actors::replica_request> out;
  while (!done_ && next_ < inputs_.size() && in_flight_ < s_.window) {
    out.push_back(inputs_[next_].request);
    inputs_[next_++].submitted = true;
    ++in_flight_;
  }
  return out;
}

std::vector<uint64_t> embeddings_output::running() const {
  std::vector<uint64_t> out;
  for (const auto& in : inputs_) {
    if (in.submitted && !in.ended) out.push_back(in.request.id);
  }
  return out;
}

void embeddings_output::fail(error e) {
  failure_ = std::move(e);
  done_ = true;
}

std::vector<float> embeddings_output::finish_vector(std::vector<float> v) const {
  if (s_.dimensions > 0 && s_.dimensions < v.size()) v.resize(s_.dimensions);
  if (!s_.normalize) return v;
  double sum = 0.0;
  for (float x : v) sum += static_cast<double>(x) * x;
  // torch.nn.functional.normalize's: x / max(‖x‖, 1e-12).
  const double norm = std::max(std::sqrt(sum), 1e-12);
  for (float& x : v) x = static_cast<float>(x / norm);
  return v;
}

void embeddings_output::on_message(const actors::token_msg& t) {
  if (done_) return;
  auto it = std::find_if(inputs_.begin(), inputs_.end(), [&](const input& in) { return in.request.id == t.id; });
  if (it == inputs_.end() || !it->submitted || it->ended) return;
  if (t.finish == actors::finish_reason::none && !t.failed) return;  // not an embedding's message: nothing ends here
  it->ended = true;
  if (t.failed) return fail(t.err);
  --in_flight_;
  times_.keep_slower(t.times);
  if (s_.metrics) actors::metric::observe_replica_times(*s_.metrics, t.times, true);
  if (t.embedding.empty()) {
    return fail(make_error(errc::internal, "the replica sent no embedding for input " + std::to_string(it - inputs_.begin())));
  }
  for (float x : t.embedding) {
    if (!std::isfinite(x)) return fail(make_error(errc::internal, "the model's embedding is not finite"));
  }
  if (s_.per_token) {  // every position's values, each row finished on its own
    const size_t width = s_.width;
    const size_t rows = it->request.prompt.size();
    if (width == 0 || t.embedding.size() != rows * width) {
      return fail(make_error(errc::internal, "the replica sent " + std::to_string(t.embedding.size()) + " values for " +
                                                 std::to_string(rows) + " positions of " + std::to_string(width)));
    }
    it->rows = rows;
    it->vector.clear();
    for (size_t r = 0; r < rows; ++r) {
      const auto row = finish_vector({t.embedding.begin() + static_cast<std::ptrdiff_t>(r * width),
                                      t.embedding.begin() + static_cast<std::ptrdiff_t>((r + 1) * width)});
      it->vector.insert(it->vector.end(), row.begin(), row.end());
    }
  } else if (!s_.labels.empty() && t.embedding.size() != s_.labels.size()) {  // a replica that returned a hidden state
    return fail(make_error(errc::internal, "the replica sent " + std::to_string(t.embedding.size()) + " values for a classifier of " +
                                               std::to_string(s_.labels.size()) + " labels (a replica of an earlier build?)"));
  } else {
    it->vector = finish_vector(t.embedding);
  }
  if (s_.metrics) s_.metrics->get_counter(actors::metric::prompt_tokens)->add(static_cast<double>(it->request.prompt.size()));
  if (++ended_ == inputs_.size()) done_ = true;
}

double embeddings_output::similarity(size_t a, size_t b) const {
  const auto& x = inputs_.at(a).vector;
  const auto& y = inputs_.at(b).vector;
  double dot = 0.0;
  for (size_t d = 0; d < std::min(x.size(), y.size()); ++d) dot += static_cast<double>(x[d]) * y[d];
  return dot;
}

double embeddings_output::pair_score(size_t i) const {
  if (s_.cross_encoder) {
    const auto& v = inputs_.at(i).vector;
    const double logit = v.empty() ? 0.0 : static_cast<double>(v[0]);
    return s_.activation ? 1.0 / (1.0 + std::exp(-logit)) : logit;
  }
  return s_.kind == shape::rerank ? similarity(0, i + 1) : similarity(s_.pairs.at(i).first, s_.pairs.at(i).second);
}

namespace {

/// A classifier's logits as vLLM's activation makes them: softmax over two or more labels, a
/// sigmoid for one; without `activation` the logits as they are.
std::vector<double> activated(std::span<const float> v, bool activation) {
  std::vector<double> probs(v.begin(), v.end());
  if (!activation) return probs;
  if (v.size() == 1) {
    probs[0] = 1.0 / (1.0 + std::exp(-static_cast<double>(v[0])));
    return probs;
  }
  const double top = v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  double sum = 0.0;
  for (size_t k = 0; k < v.size(); ++k) sum += probs[k] = std::exp(static_cast<double>(v[k]) - top);
  for (double& p : probs) p /= sum;
  return probs;
}

}  // namespace

http_reply embeddings_output::classify_reply() const {
  json data = json::array();
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const auto& v = inputs_[i].vector;
    const std::vector<double> probs = activated(v, s_.activation);
    const size_t best = static_cast<size_t>(std::max_element(probs.begin(), probs.end()) - probs.begin());
    json label = best < s_.labels.size() ? json(s_.labels[best]) : json(nullptr);
    data.push_back({{"index", i}, {"label", std::move(label)}, {"probs", probs}, {"num_classes", v.size()}});
  }
  const json out = {{"id", s_.id},
                    {"object", "list"},
                    {"created", s_.created},
                    {"model", s_.model},
                    {"data", std::move(data)},
                    {"usage", {{"prompt_tokens", prompt_tokens_}, {"total_tokens", prompt_tokens_}, {"completion_tokens", 0},
                               {"prompt_tokens_details", nullptr}}}};
  http_reply r;
  r.body = out.dump(-1, ' ', false, json::error_handler_t::replace);
  return r;
}

std::string embeddings_output::list_head() const {
  return "{\"id\":" + json(s_.id).dump() + ",\"object\":\"list\",\"created\":" + std::to_string(s_.created) +
         ",\"model\":" + json(s_.model).dump(-1, ' ', false, json::error_handler_t::replace) + ",\"data\":[";
}

http_reply embeddings_output::pooling_reply() const {
  std::string body = list_head();
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const auto& in = inputs_[i];
    std::vector<float> values = in.vector;
    const size_t width = in.rows > 0 ? values.size() / in.rows : values.size();
    if (!s_.labels.empty()) {  // a classifier's: probabilities (or logits), row by row
      for (size_t r = 0; r * width < values.size(); ++r) {
        const auto p = activated(std::span<const float>(in.vector).subspan(r * width, width), s_.activation);
        for (size_t k = 0; k < width; ++k) values[r * width + k] = static_cast<float>(p[k]);
      }
    }
    if (i > 0) body += ',';
    body += "{\"index\":" + std::to_string(i) + ",\"object\":\"pooling\",\"data\":";
    if (!s_.per_token || s_.base64) {  // base64: every row's float32 bytes in one string, as vLLM encodes a tensor
      body += embedding_json(values, s_.base64);
    } else {
      body += '[';
      for (size_t r = 0; r < in.rows; ++r) {
        if (r > 0) body += ',';
        body += embedding_json(std::span<const float>(values).subspan(r * width, width), false);
      }
      body += ']';
    }
    body += '}';
  }
  body += "],\"usage\":{\"prompt_tokens\":" + std::to_string(prompt_tokens_) + ",\"total_tokens\":" +
          std::to_string(prompt_tokens_) + ",\"completion_tokens\":0,\"prompt_tokens_details\":null}}";
  http_reply r;
  r.body = std::move(body);
  return r;
}

http_reply embeddings_output::reply() const {
  if (failure_) return error_reply(*failure_);
  if (s_.kind == shape::classify) return classify_reply();
  if (s_.kind == shape::pooling) return pooling_reply();
  if (s_.kind == shape::score) {
    json data = json::array();
    for (size_t i = 0; i < s_.pairs.size(); ++i) data.push_back({{"index", i}, {"object", "score"}, {"score", pair_score(i)}});
    const json out = {{"id", s_.id}, {"object", "list"}, {"created", s_.created}, {"model", s_.model}, {"data", std::move(data)},
                      {"usage", {{"prompt_tokens", prompt_tokens_}, {"total_tokens", prompt_tokens_}}}};
    http_reply r;
    r.body = out.dump(-1, ' ', false, json::error_handler_t::replace);
    return r;
  }
  if (s_.kind == shape::rerank) {
    std::vector<std::pair<double, size_t>> ranked;  // (similarity to the query, document)
    const size_t documents = s_.cross_encoder ? inputs_.size() : inputs_.size() - 1;
    for (size_t d = 0; d < documents; ++d) ranked.emplace_back(pair_score(d), d);
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    if (s_.top_n > 0 && s_.top_n < ranked.size()) ranked.resize(s_.top_n);
    json results = json::array();
    for (const auto& [score, d] : ranked) {
      json one = {{"index", d}};
      if (d < s_.documents.size()) one["document"] = {{"text", s_.documents[d]}};
      one["relevance_score"] = score;
      results.push_back(std::move(one));
    }
    const json out = {{"id", s_.id}, {"model", s_.model}, {"usage", {{"total_tokens", prompt_tokens_}}}, {"results", std::move(results)}};
    http_reply r;
    r.body = out.dump(-1, ' ', false, json::error_handler_t::replace);
    return r;
  }
  std::string body = list_head();
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (i > 0) body += ',';
    body += "{\"object\":\"embedding\",\"index\":";
    body += std::to_string(i);
    body += ",\"embedding\":";
    body += embedding_json(inputs_[i].vector, s_.base64);
    body += '}';
  }
  body += "],\"usage\":{\"prompt_tokens\":" + std::to_string(prompt_tokens_) + ",\"total_tokens\":" +
          std::to_string(prompt_tokens_) + "}}";
  http_reply r;
  r.body = std::move(body);
  return r;
}

}  // namespace llmesh::gateway
