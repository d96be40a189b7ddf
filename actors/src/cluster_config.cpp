// Cluster config parsing and validation (cluster_config.hpp). yaml-cpp stays in this file:
// every yaml-cpp exception is caught here and becomes an invalid_request error.
//
// yaml-cpp habits this file works around (0.7):
// - YAML::Load returns the first document and drops the rest: we LoadAll and want exactly one.
// - Duplicate keys load silently (lookup gives the first): we walk every map and refuse them.
// - as<int>() reads "010" as octal 8 and "0x10" as 16, and every scalar is a string to it
//   (no types): integers and booleans are read here, plain (unquoted) decimal / true|false only.
// - A non-const Node's operator[] inserts the key: maps are read once into a std::map instead.
// - Its recursion guard allows ~2000 levels and reports "bad file": a pre-scan refuses deep
//   nesting first, with a line number.
#include "llmesh/actors/cluster_config.hpp"
#include "llmesh/model/engine.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <tuple>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "llmesh/actors/balancer.hpp"
#include "llmesh/actors/speculative_config.hpp"

namespace llmesh::actors {
namespace {

// Configs are a few KB; a bound keeps a wrong file (a model, a log) from being parsed at length.
constexpr size_t max_config_bytes = size_t{1} << 20;
// Configs nest four levels (file → nodes → node → roles); 64 leaves room for any hand-written
// flow style while keeping yaml-cpp's recursive parser far from the stack's end.
constexpr int max_flow_nesting = 64;
// Block nesting costs at least one column per level; 128 columns is far past any real config.
constexpr size_t max_indent_columns = 128;

/// `v` with its control characters as \xNN: a one-line message (yaml-cpp's may quote the input's,
/// e.g. "unknown escape character: " and a newline).
std::string one_line(std::string_view v) {
  std::string out;
  for (char ch : v) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

/// A value for an error message: quoted, at most 60 characters, control characters escaped, so
/// that the message stays one line.
std::string shown(std::string_view v) {
  return "'" + one_line(v.substr(0, 60)) + (v.size() > 60 ? "...'" : "'");
}

/// What a YAML node holds, for "must be X, got Y": the quoted value of a scalar, else its kind.
std::string kind_of(const YAML::Node& node) {
  if (node.IsScalar()) return shown(node.Scalar());
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a mapping";
  return "nothing";  // `key:`, `key: ~`, `key: null`
}

bool is_name(std::string_view s) {  // mesh and node names: used on command lines and in labels
  return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

bool is_printable_word(std::string_view s) {  // no spaces or control characters
  return std::all_of(s.begin(), s.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

/// Why `s` is not HOST:PORT (a phrase to follow the field's name), or nothing when it is.
std::optional<std::string> endpoint_problem(std::string_view s, endpoint& out) {
  const std::string bad = "must be HOST:PORT, got " + shown(s);
  std::string_view host, port;
  if (!s.empty() && s.front() == '[') {
    size_t close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':') return bad;
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
    bool ipv6 = host.find(':') != std::string_view::npos &&
                std::all_of(host.begin(), host.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.'; });
    if (!ipv6) return "must be [IPV6]:PORT, got " + shown(s);
  } else {
    size_t colon = s.rfind(':');
    if (colon == std::string_view::npos) return bad;
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) return "needs brackets around an IPv6 host ([::1]:PORT), got " + shown(s);
    bool name = host.size() <= 253 && std::all_of(host.begin(), host.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-';
    });
    if (host.empty() || !name) return bad;
  }
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  bool digits = !port.empty() && port.size() <= 5 && std::isdigit(static_cast<unsigned char>(port[0]));
  if (!digits || ec != std::errc() || end != port.data() + port.size()) return bad;
  if (value < 1 || value > 65535) return "port must be 1..65535, got " + shown(s);
  out = endpoint{std::string(host), static_cast<uint16_t>(value)};
  return std::nullopt;
}

/// Refuses, before yaml-cpp sees the text, what it handles badly: too much of it, tabs as
/// indentation (yaml-cpp says only "illegal map value"), deep nesting (see the limits above),
/// and a ',' that starts a token outside flow collections (yaml-cpp exhausts memory on it). Approximate on purpose (a bracket inside a block scalar counts); yaml-cpp's own
/// guard backs it.
status prescan(std::string_view text, const std::string& source) {
  auto fail = [&](size_t line, const std::string& what) {
    return make_error(errc::invalid_request, source + ":" + std::to_string(line) + ": " + what);
  };
  if (text.size() > max_config_bytes)
    return make_error(errc::invalid_request, source + ": larger than 1 MiB (" + std::to_string(text.size()) + " bytes); not a cluster config");
  int depth = 0;
  size_t line = 1;
  bool line_start = true, token_start = true;
  size_t indent = 0;  // width of the line's leading spaces and "- ", "? ", ": " indicators
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\n') {
      ++line;
      line_start = token_start = true;
      indent = 0;
      continue;
    }
    if (quote != 0) {
      if (quote == '"' && c == '\\') ++i;
      else if (quote == '\'' && c == '\'' && i + 1 < text.size() && text[i + 1] == '\'') ++i;
      else if (c == quote) quote = 0;
      token_start = false;
      continue;
    }
    if (line_start) {
      bool indicator = (c == '-' || c == '?' || c == ':') &&
                       (i + 1 == text.size() || text[i + 1] == ' ' || text[i + 1] == '\n' || text[i + 1] == '\r');
      if (c == ' ' || indicator) {
        if (++indent > max_indent_columns) return fail(line, "indented deeper than " + std::to_string(max_indent_columns) + " columns; not a cluster config");
        continue;
      }
      if (c == '\t' && depth == 0) {
        size_t j = text.find_first_not_of(" \t", i);
        if (j != std::string_view::npos && text[j] != '\n' && text[j] != '\r' && text[j] != '#')
          return fail(line, "tab in indentation; YAML indents with spaces");
      }
      line_start = false;
    }
    if (c == '#' && token_start) {
      size_t nl = text.find('\n', i);
      i = (nl == std::string_view::npos ? text.size() : nl) - 1;
      continue;
    }
    if ((c == '"' || c == '\'') && token_start) {
      quote = c;
    } else if (c == ',' && depth == 0 && token_start) {
      // Invalid YAML (no plain value starts with ','), and yaml-cpp 0.7 meets a ',' that begins a
      // token outside any [...] or {...} at the top level (",", "&a ,", "[a]\n,") by allocating
      // without bound: 24 GB and the OOM killer, found by the mutation test.
      return fail(line, "',' outside a [...] or {...} list");
    } else if ((c == '[' || c == '{') && (token_start || depth > 0)) {
      if (++depth > max_flow_nesting) return fail(line, "nested deeper than " + std::to_string(max_flow_nesting) + " levels; not a cluster config");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
    token_start = c == ' ' || c == '\t' || c == '[' || c == '{' || (depth > 0 && c == ',');
  }
  return ok_status();
}

/// Reads YAML nodes into config values, prefixing every error with the file and the entry.
class reader {
 public:
  explicit reader(const std::string& source) : source_(source) {}

  /// The entry the next errors name: "" (top level) or "nodes[2] (replica-b)".
  void at(std::string where) { where_ = std::move(where); }

  error fail(const std::string& what) const {
    return make_error(errc::invalid_request, source_ + ": " + (where_.empty() ? "" : where_ + ": ") + what);
  }

  using fields = std::map<std::string, YAML::Node, std::less<>>;

  /// The mapping's entries; refuses non-mappings, non-string, repeated and unknown keys.
  result<fields> map(const YAML::Node& node, std::initializer_list<std::string_view> known) const {
    std::string names;
    for (auto k : known) names += (names.empty() ? "" : ", ") + std::string(k);
    if (!node.IsMap()) return fail("must be a mapping with keys " + names);
    fields out;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) return fail("keys must be strings");
      std::string key = kv.first.Scalar();
      if (std::find(known.begin(), known.end(), key) == known.end())
        return fail("unknown key " + shown(key) + " (known: " + names + ")");
      if (!out.emplace(key, kv.second).second) return fail("key " + shown(key) + " appears twice");
    }
    return out;
  }

  result<std::optional<std::string>> string(const fields& f, std::string_view key, bool required) const {
    auto it = f.find(key);
    if (it == f.end()) {
      if (required) return fail("'" + std::string(key) + "' is required");
      return std::optional<std::string>{};
    }
    if (!it->second.IsScalar()) return fail("'" + std::string(key) + "' must be a string, got " + kind_of(it->second));
    return std::optional<std::string>{it->second.Scalar()};
  }

  /// A plain decimal integer in [lo, hi] (missing: nothing).
  result<std::optional<int64_t>> integer(const fields& f, std::string_view key, int64_t lo, int64_t hi) const {
    auto it = f.find(key);
    if (it == f.end()) return std::optional<int64_t>{};
    const std::string range = "an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
    const std::string k = "'" + std::string(key) + "'";
    if (!it->second.IsScalar()) return fail(k + " must be " + range + ", got " + kind_of(it->second));
    const std::string& s = it->second.Scalar();
    if (it->second.Tag() != "?") return fail(k + " must be " + range + " (unquoted), got " + shown(s));
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) return fail(k + " must be " + range + ", got " + shown(s));
    return std::optional<int64_t>{v};
  }

  result<bool> boolean(const fields& f, std::string_view key) const {
    auto it = f.find(key);
    if (it == f.end()) return false;
    bool plain = it->second.IsScalar() && it->second.Tag() == "?";
    if (plain && it->second.Scalar() == "true") return true;
    if (plain && it->second.Scalar() == "false") return false;
    return fail("'" + std::string(key) + "' must be true or false, got " + kind_of(it->second));
  }

  result<std::optional<endpoint>> address(const fields& f, std::string_view key, bool required, bool allow_public) const {
    auto s = string(f, key, required);
    if (!s.ok()) return s.take_error();
    if (!s->has_value()) return std::optional<endpoint>{};
    endpoint e;
    if (auto problem = endpoint_problem(**s, e)) return fail("'" + std::string(key) + "' " + *problem);
    if (!allow_public && is_unspecified_host(e.host))
      return fail("'" + std::string(key) + "' " + shown(e.str()) + " listens on every interface; use a specific address or set 'allow_public: true'");
    return std::optional<endpoint>{e};
  }

 private:
  const std::string& source_;
  std::string where_;
};

#define LLMESH_READ(var, expr)          \
  auto var##_read_ = (expr);            \
  if (!var##_read_.ok()) return var##_read_.take_error(); \
  auto var = std::move(var##_read_).value()

/// "nodes[2] (replica-b)", or "nodes[2]" while the entry has no usable name, so that every
/// error about an entry (unknown keys included) names it.
std::string entry_label(std::string_view list, size_t index, const YAML::Node& entry) {
  std::string label = std::string(list) + "[" + std::to_string(index) + "]";
  if (!entry.IsMap()) return label;
  for (const auto& kv : entry) {
    if (kv.first.IsScalar() && kv.first.Scalar() == "name" && kv.second.IsScalar()) {
      const std::string& name = kv.second.Scalar();
      if (!name.empty() && name.size() <= 128 && is_printable_word(name)) label += " (" + name + ")";
      break;
    }
  }
  return label;
}

std::optional<node_role> parse_role(const YAML::Node& node) {
  if (!node.IsScalar()) return std::nullopt;
  for (auto r : {node_role::coordinator, node_role::gateway, node_role::router, node_role::replica})
    if (node_role_name(r) == node.Scalar()) return r;
  return std::nullopt;
}

result<node_spec> read_node(reader& r, const YAML::Node& node, size_t index, bool allow_public) {
  r.at(entry_label("nodes", index, node));
  LLMESH_READ(f, r.map(node, {"name", "roles", "listen", "http", "rpc", "metrics", "slots"}));
  LLMESH_READ(name, r.string(f, "name", true));
  if (!is_name(*name)) return r.fail("'name' must be 1..64 letters, digits, '-', '_' or '.', got " + shown(*name));
  node_spec out;
  out.name = *name;
  auto roles = f.find("roles");
  if (roles == f.end()) return r.fail("'roles' is required");
  if (!roles->second.IsSequence() || roles->second.size() == 0)
    return r.fail("'roles' must be a non-empty list of coordinator, gateway, router, replica, got " +
                  (roles->second.IsSequence() ? "[]" : kind_of(roles->second)));
  for (const auto& role : roles->second) {
    auto parsed = parse_role(role);
    if (!parsed)
      return r.fail("'roles' has unknown role " + shown(role.IsScalar() ? role.Scalar() : "(not a string)") +
                    " (known: coordinator, gateway, router, replica)");
    if (out.has(*parsed)) return r.fail("'roles' lists " + shown(role.Scalar()) + " twice");
    out.roles.push_back(*parsed);
  }
  LLMESH_READ(listen, r.address(f, "listen", true, allow_public));
  out.listen = *listen;
  LLMESH_READ(http, r.address(f, "http", false, allow_public));
  LLMESH_READ(rpc, r.address(f, "rpc", false, allow_public));
  out.http = http;
  out.rpc = rpc;
  LLMESH_READ(metrics, r.address(f, "metrics", false, allow_public));
  out.metrics = metrics;
  if (!out.has(node_role::gateway) && (http || rpc))
    return r.fail(std::string(http ? "'http'" : "'rpc'") + " is only for gateway nodes");
  if (out.has(node_role::gateway) && !http) return r.fail("'http' is required on a gateway node");
  LLMESH_READ(slots, r.integer(f, "slots", 1, 1024));  // 1024: far past any node's devices or cores
  if (slots && !out.has(node_role::replica)) return r.fail("'slots' is only for replica nodes");
  if (slots) out.slots = static_cast<int>(*slots);
  return out;
}

/// A YAML node as JSON: plain scalars that read as numbers or booleans become those. Nothing
/// (discarded) for a mapping with a non-scalar or repeated key, or past `budget` nodes (aliases
/// may repeat a subtree many times over).
nlohmann::json yaml_as_json(const YAML::Node& n, size_t& budget) {
  const auto bad = nlohmann::json(nlohmann::json::value_t::discarded);
  if (budget == 0) return bad;
  --budget;
  if (n.IsMap()) {
    nlohmann::json o = nlohmann::json::object();
    for (const auto& kv : n) {
      if (!kv.first.IsScalar()) return bad;
      const std::string key = kv.first.as<std::string>();
      if (o.contains(key)) return bad;
      auto v = yaml_as_json(kv.second, budget);
      if (v.is_discarded()) return bad;
      o[key] = std::move(v);
    }
    return o;
  }
  if (n.IsSequence()) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& e : n) {
      auto v = yaml_as_json(e, budget);
      if (v.is_discarded()) return bad;
      a.push_back(std::move(v));
    }
    return a;
  }
  if (n.IsNull()) return nullptr;
  const std::string v = n.as<std::string>();
  if (n.Tag() == "?") {  // plain (unquoted, untagged) scalars: numbers and booleans as such
    auto parsed = nlohmann::json::parse(v, nullptr, false);
    if (!parsed.is_discarded() && (parsed.is_number() || parsed.is_boolean())) return parsed;
  }
  return v;
}

result<model_spec> read_model(reader& r, const YAML::Node& node, size_t index) {
  r.at(entry_label("models", index, node));
  LLMESH_READ(f, r.map(node, {"name", "path", "tp", "replicas", "policy", "kv_cache_mb", "placement", "quantization",
                                 "dtype", "kv_cache_dtype", "chat_template", "max_model_len", "reasoning_parser", "tool_call_parser", "pooling", "loras",
                                 "enable_lora", "max_loras", "expert_parallel", "speculative_config", "prefill_for",
                                 "max_local_prefill_length", "max_prefill_queue_size", "max_num_batched_tokens", "max_num_seqs",
                                 "long_prefill_token_threshold", "max_num_partial_prefills", "max_long_partial_prefills"}));
  model_spec out;
  LLMESH_READ(name, r.string(f, "name", true));
  if (name->empty() || name->size() > 128 || !is_printable_word(*name))
    return r.fail("'name' must be 1..128 characters without spaces, got " + shown(*name));
  out.name = *name;
  LLMESH_READ(path, r.string(f, "path", true));
  if (path->empty()) return r.fail("'path' must not be empty");
  out.path = *path;
  LLMESH_READ(tp, r.integer(f, "tp", 1, 64));  // 64: the most devices one replica's collective spans
  if (tp) out.tp = static_cast<int>(*tp);
  LLMESH_READ(replicas, r.integer(f, "replicas", 0, 1024));  // 0: declared now, scaled up with `llmesh ctl scale`
  if (replicas) out.replicas = static_cast<int>(*replicas);
  LLMESH_READ(policy, r.string(f, "policy", false));
  if (policy) {
    if (!parse_balance_policy(*policy).ok())
      return r.fail("'policy' must be round-robin, least-load, power-of-two or prefix-aware, got " + shown(*policy));
    out.policy = *policy;
  }
  LLMESH_READ(kv, r.integer(f, "kv_cache_mb", 1, int64_t{1} << 24));  // 16 TiB: byte counts stay far from overflow
  if (kv) out.kv_cache_mb = static_cast<size_t>(*kv);
  LLMESH_READ(place, r.string(f, "placement", false));
  if (place && *place == "spread") out.place = placement::spread;
  else if (place && *place != "packed") return r.fail("'placement' must be packed or spread, got " + shown(*place));
  LLMESH_READ(quant, r.string(f, "quantization", false));
  if (quant) {
    auto q = model::parse_quantization(*quant);
    if (!q) return r.fail("'quantization': " + q.err().message);
    out.quantization = std::string(model::quantization_name(*q));  // vLLM's aliases (awq_marlin) by their method
  }
  LLMESH_READ(dtype, r.string(f, "dtype", false));
  if (dtype) {
    auto t = model::parse_weight_dtype(*dtype);
    if (!t) return r.fail("'dtype' must be auto, bfloat16, float16 (half) or float32 (float), got " + shown(*dtype));
    out.dtype = std::string(model::weight_dtype_name(*t));
  }
  LLMESH_READ(kv_dtype, r.string(f, "kv_cache_dtype", false));
  if (kv_dtype) {
    auto t = model::parse_kv_cache_dtype(*kv_dtype);
    if (!t) return r.fail("'kv_cache_dtype' must be auto, float32, bfloat16, fp8, fp8_e4m3 or fp8_e5m2, got " + shown(*kv_dtype));
    out.kv_cache_dtype = std::string(model::kv_cache_dtype_name(*t));
  }
  LLMESH_READ(chat, r.string(f, "chat_template", false));
  if (chat) {
    if (chat->empty()) return r.fail("'chat_template' must not be empty");
    out.chat_template = *chat;
  }
  LLMESH_READ(max_len, r.integer(f, "max_model_len", 1, int64_t{1} << 30));
  if (max_len) out.max_model_len = static_cast<size_t>(*max_len);
  LLMESH_READ(reasoning, r.string(f, "reasoning_parser", false));
  if (reasoning) {
    if (*reasoning != "none" && *reasoning != "deepseek_r1" && *reasoning != "qwen3" && *reasoning != "openai_gptoss")
      return r.fail("'reasoning_parser' must be none, deepseek_r1, qwen3 or openai_gptoss, got " + shown(*reasoning));
    out.reasoning_parser = *reasoning;
  }
  LLMESH_READ(tools, r.string(f, "tool_call_parser", false));
  if (tools) {
    if (*tools != "hermes" && *tools != "llama3_json" && *tools != "mistral" && *tools != "pythonic" && *tools != "qwen3_coder" &&
        *tools != "qwen3_xml" && *tools != "granite" && *tools != "phi4_mini_json" && *tools != "openai")
      return r.fail("'tool_call_parser' must be hermes, llama3_json, mistral, pythonic, qwen3_coder, granite, phi4_mini_json or openai, got " +
                    shown(*tools));
    out.tool_call_parser = *tools;
  }
  LLMESH_READ(pooling, r.string(f, "pooling", false));
  if (pooling) {
    if (*pooling != "model" && *pooling != "last" && *pooling != "mean" && *pooling != "cls")
      return r.fail("'pooling' must be model, last, mean or cls, got " + shown(*pooling));
    out.pooling = *pooling;
  }
  if (auto loras = f.find("loras"); loras != f.end()) {
    if (!loras->second.IsSequence()) return r.fail("'loras' must be a list of {name, path}, got " + kind_of(loras->second));
    for (size_t i = 0; i < loras->second.size(); ++i) {
      const std::string at = "loras[" + std::to_string(i) + "]";
      auto lf = r.map(loras->second[i], {"name", "path"});
      if (!lf) return r.fail(at + ": must be a mapping with keys name, path");
      LLMESH_READ(lname, r.string(*lf, "name", true));
      LLMESH_READ(lpath, r.string(*lf, "path", true));
      if (!model::valid_lora_name(*lname)) return r.fail(at + ": name " + shown(*lname) + " must be 1..128 letters, digits or -_.:/");
      if (lpath->empty()) return r.fail(at + ": 'path' must not be empty");
      out.loras.push_back({*lname, *lpath});
    }
    if (auto s = model::check_lora_names(out.loras, out.name); !s) return r.fail(s.err().message);
  }
  LLMESH_READ(max_loras, r.integer(f, "max_loras", 1, 65536));
  if (max_loras) {
    out.max_loras = static_cast<size_t>(*max_loras);
    if (out.max_loras < out.loras.size()) {
      return r.fail("'max_loras' (" + std::to_string(out.max_loras) + ") is below the " + std::to_string(out.loras.size()) +
                    " adapters 'loras' lists");
    }
  }
  LLMESH_READ(expert_parallel, r.boolean(f, "expert_parallel"));
  out.expert_parallel = expert_parallel;
  if (auto spec = f.find("speculative_config"); spec != f.end()) {
    // vLLM's speculative_config: a mapping (or its JSON as a string), checked here; the
    // replica nodes load a draft model it names.
    size_t budget = 256;  // nodes: a handful of keys
    nlohmann::json j = spec->second.IsScalar() ? nlohmann::json::parse(spec->second.as<std::string>(), nullptr, false)
                                               : yaml_as_json(spec->second, budget);
    if (j.is_discarded() || !j.is_object()) {
      return r.fail("'speculative_config' must be a mapping of distinct keys such as {model: DIR, num_speculative_tokens: 3}");
    }
    speculation_config c;
    std::string draft;
    if (auto ok = apply_speculative_config(j.dump(), c, draft, "'speculative_config'"); !ok) return r.fail(ok.err().message);
    if (c.tokens == 0) return r.fail("'speculative_config': num_speculative_tokens is needed (1 to " +
                                     std::to_string(max_speculative_tokens) + ")");
    out.speculative_config = j.dump();
  }
  LLMESH_READ(prefill_for, r.string(f, "prefill_for", false));
  if (prefill_for) out.prefill_for = *prefill_for;
  LLMESH_READ(max_local, r.integer(f, "max_local_prefill_length", 1, int64_t{1} << 30));
  if (max_local) {
    if (out.prefill_for.empty()) return r.fail("'max_local_prefill_length' goes with 'prefill_for' (the prefill replicas' entry)");
    out.max_local_prefill_length = static_cast<size_t>(*max_local);
  }
  LLMESH_READ(max_queue, r.integer(f, "max_prefill_queue_size", 0, int64_t{1} << 30));
  if (max_queue) {
    if (out.prefill_for.empty()) return r.fail("'max_prefill_queue_size' goes with 'prefill_for' (the prefill replicas' entry)");
    out.max_prefill_queue_size = static_cast<size_t>(*max_queue);
  }
  if (!out.prefill_for.empty() && out.place == placement::spread) {
    return r.fail("'prefill_for': prefill replicas hand over their KV blocks from one process; use placement packed");
  }
  // The scheduler's limits, with serve's ranges.
  LLMESH_READ(batched, r.integer(f, "max_num_batched_tokens", 16, int64_t{1} << 20));
  if (batched) out.max_num_batched_tokens = static_cast<size_t>(*batched);
  LLMESH_READ(seqs, r.integer(f, "max_num_seqs", 1, int64_t{1} << 16));
  if (seqs) out.max_num_seqs = static_cast<size_t>(*seqs);
  LLMESH_READ(threshold, r.integer(f, "long_prefill_token_threshold", 0, int64_t{1} << 30));
  if (threshold) {
    if (out.max_model_len > 0 && static_cast<size_t>(*threshold) > out.max_model_len) {
      return r.fail("'long_prefill_token_threshold' (" + std::to_string(*threshold) + ") exceeds 'max_model_len' (" +
                    std::to_string(out.max_model_len) + ")");
    }
    out.long_prefill_token_threshold = static_cast<size_t>(*threshold);
  }
  LLMESH_READ(partial, r.integer(f, "max_num_partial_prefills", 1, int64_t{1} << 16));
  if (partial) out.max_num_partial_prefills = static_cast<size_t>(*partial);
  LLMESH_READ(long_partial, r.integer(f, "max_long_partial_prefills", 1, int64_t{1} << 16));
  if (long_partial) {
    if (*long_partial > std::max<int64_t>(partial ? *partial : 1, 1)) {
      return r.fail("'max_long_partial_prefills' must be at most 'max_num_partial_prefills' (" +
                    std::to_string(partial ? *partial : 1) + ")");
    }
    out.max_long_partial_prefills = static_cast<size_t>(*long_partial);
  }
  LLMESH_READ(enable_lora, r.boolean(f, "enable_lora"));
  out.enable_lora = enable_lora;  // an opt-in of its own: listing loras does not open the runtime routes
  if (enable_lora && out.place == placement::spread) {
    return r.fail("'enable_lora': adapters added while serving reach packed replicas only (a spread replica's ranks "
                  "name adapters by their place in the config's 'loras'); list them as 'loras' instead");
  }
  return out;
}

/// Rules between entries: unique names and addresses, one coordinator at the seed, the roles a
/// mesh needs, unique model names and enough replica nodes for each model.
status check_mesh(reader& r, const cluster_config& c) {
  std::map<std::string, std::string> bound;  // address → "nodes[i] (name) 'field'"
  const node_spec* coordinator = nullptr;
  size_t replica_nodes = 0;
  for (size_t i = 0; i < c.nodes.size(); ++i) {
    const node_spec& n = c.nodes[i];
    const std::string where = "nodes[" + std::to_string(i) + "] (" + n.name + ")";
    r.at(where);
    for (size_t j = 0; j < i; ++j)
      if (c.nodes[j].name == n.name) return r.fail("name " + shown(n.name) + " is already used by nodes[" + std::to_string(j) + "]");
    for (auto [field, e] : {std::pair{"listen", std::optional(n.listen)}, std::pair{"http", n.http}, std::pair{"rpc", n.rpc},
                            std::pair{"metrics", n.metrics}}) {
      if (!e) continue;
      auto [it, fresh] = bound.emplace(e->str(), where + " '" + field + "'");
      if (!fresh) return r.fail(std::string("'") + field + "' " + shown(e->str()) + " is already used by " + it->second);
    }
    if (n.has(node_role::coordinator)) {
      if (coordinator) return r.fail("a second coordinator (the first is " + shown(coordinator->name) + "); a mesh has exactly one");
      coordinator = &n;
    }
    if (n.has(node_role::replica)) ++replica_nodes;
  }
  r.at("");
  if (!coordinator) return r.fail("no node has the coordinator role; a mesh has exactly one");
  if (!(coordinator->listen == c.seed))
    return r.fail("'seed' " + shown(c.seed.str()) + " must equal the coordinator's 'listen' (" + coordinator->name + ": " + coordinator->listen.str() + ")");
  for (auto role : {node_role::gateway, node_role::router})
    if (std::none_of(c.nodes.begin(), c.nodes.end(), [&](const node_spec& n) { return n.has(role); }))
      return r.fail("no node has the " + std::string(node_role_name(role)) + " role; a mesh needs at least one");
  for (size_t i = 0; i < c.models.size(); ++i) {
    const model_spec& m = c.models[i];
    r.at("models[" + std::to_string(i) + "] (" + m.name + ")");
    for (size_t j = 0; j < i; ++j)
      if (c.models[j].name == m.name) return r.fail("name " + shown(m.name) + " is already used by models[" + std::to_string(j) + "]");
    // Adapters answer as models of their own: their names are the API's model names too.
    for (size_t j = 0; j < c.models.size(); ++j) {
      for (const auto& l : c.models[j].loras) {
        if (l.name == m.name) return r.fail("name " + shown(m.name) + " is already a LoRA adapter's of models[" + std::to_string(j) + "]");
        if (j < i) {
          for (const auto& mine : m.loras) {
            if (mine.name == l.name) return r.fail("LoRA adapter " + shown(l.name) + " is already models[" + std::to_string(j) + "]'s");
          }
        }
      }
    }
    if (!m.prefill_for.empty()) {
      auto target = std::find_if(c.models.begin(), c.models.end(), [&](const model_spec& t) { return t.name == m.prefill_for; });
      if (target == c.models.end() || &*target == &m || !target->prefill_for.empty()) {
        return r.fail("'prefill_for' " + shown(m.prefill_for) + " must name another model entry that serves requests");
      }
      // Its KV blocks must be the ones the target's replicas would compute: the same weights held
      // the same way, and a cache they can take.
      for (auto [field, mine, theirs] : {std::tuple{"path", &m.path, &target->path},
                                         std::tuple{"quantization", &m.quantization, &target->quantization},
                                         std::tuple{"dtype", &m.dtype, &target->dtype},
                                         std::tuple{"kv_cache_dtype", &m.kv_cache_dtype, &target->kv_cache_dtype}}) {
        const bool same = std::string_view(field) == "path"  // models/m and ./models/m are one directory
                              ? std::filesystem::path(*mine).lexically_normal() == std::filesystem::path(*theirs).lexically_normal()
                              : *mine == *theirs;
        if (!same) {
          return r.fail(std::string("'") + field + "' " + shown(*mine) + " differs from " + shown(target->name) + "'s " +
                        shown(*theirs) + ": a prefill entry computes its target's KV blocks (same weights, same cache)");
        }
      }
      if (target->place != placement::packed) {
        return r.fail("'prefill_for' " + shown(target->name) + " is spread over nodes: its replicas cannot take KV blocks "
                      "(packed targets only)");
      }
      for (size_t j = 0; j < i; ++j) {
        if (c.models[j].prefill_for == m.prefill_for) {
          return r.fail("models[" + std::to_string(j) + "] already prefills for " + shown(m.prefill_for) + " (one prefill entry a model)");
        }
      }
      if (!m.loras.empty() || m.enable_lora) {
        return r.fail("'prefill_for': a prefill entry serves its model's adapters by name; give 'loras' to " + shown(target->name));
      }
    }
    if (m.replicas > 0 && replica_nodes == 0) return r.fail("'replicas' is " + std::to_string(m.replicas) + " but no node has the replica role");
    if (m.place == placement::spread && replica_nodes < static_cast<size_t>(m.tp))
      return r.fail("'placement' spread puts each of tp=" + std::to_string(m.tp) + " shards on its own node, but only " +
                    std::to_string(replica_nodes) + " nodes have the replica role");
  }
  r.at("");
  return ok_status();
}

result<cluster_config> read_config(reader& r, const YAML::Node& root) {
  LLMESH_READ(f, r.map(root, {"mesh", "seed", "token", "heartbeat_ms", "failure_timeout_ms", "allow_public", "kv_events", "nodes",
                               "models"}));
  cluster_config c;
  LLMESH_READ(allow_public, r.boolean(f, "allow_public"));
  c.allow_public = allow_public;
  LLMESH_READ(kv_events, r.boolean(f, "kv_events"));
  c.kv_events = kv_events || f.find("kv_events") == f.end();  // on unless the file says false
  LLMESH_READ(mesh, r.string(f, "mesh", true));
  if (!is_name(*mesh)) return r.fail("'mesh' must be 1..64 letters, digits, '-', '_' or '.', got " + shown(*mesh));
  c.mesh = *mesh;
  LLMESH_READ(seed, r.address(f, "seed", true, allow_public));
  c.seed = *seed;
  LLMESH_READ(token, r.string(f, "token", true));
  // 16: short enough to type, long enough that guessing it is not the easy way in.
  if (token->size() < 16 || token->size() > 1024 || !is_printable_word(*token))
    return r.fail("'token' must be 16..1024 characters without spaces (got " + std::to_string(token->size()) + " characters)");
  c.token = *token;
  LLMESH_READ(heartbeat, r.integer(f, "heartbeat_ms", 1, 60'000));  // past a minute, failures go unnoticed too long
  if (heartbeat) c.heartbeat = std::chrono::milliseconds(*heartbeat);
  LLMESH_READ(timeout, r.integer(f, "failure_timeout_ms", 1, 600'000));
  if (timeout) c.failure_timeout = std::chrono::milliseconds(*timeout);
  if (c.heartbeat >= c.failure_timeout)
    return r.fail("'heartbeat_ms' (" + std::to_string(c.heartbeat.count()) + ") must be less than 'failure_timeout_ms' (" +
                  std::to_string(c.failure_timeout.count()) + ")");
  auto nodes = f.find("nodes");
  if (nodes == f.end()) return r.fail("'nodes' is required");
  if (!nodes->second.IsSequence() || nodes->second.size() == 0) return r.fail("'nodes' must be a non-empty list, got " + (nodes->second.IsSequence() ? "[]" : kind_of(nodes->second)));
  size_t index = 0;
  for (const YAML::Node& node : nodes->second) {
    LLMESH_READ(n, read_node(r, node, index++, allow_public));
    c.nodes.push_back(std::move(n));
    r.at("");
  }
  if (auto models = f.find("models"); models != f.end()) {
    if (!models->second.IsSequence()) return r.fail("'models' must be a list, got " + kind_of(models->second));
    index = 0;
    for (const YAML::Node& model : models->second) {
      LLMESH_READ(m, read_model(r, model, index++));
      c.models.push_back(std::move(m));
      r.at("");
    }
  }
  LLMESH_TRY(check_mesh(r, c));
  return c;
}

#undef LLMESH_READ

}  // namespace

std::string endpoint::str() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

result<endpoint> parse_endpoint(std::string_view host_port) {
  endpoint e;
  if (auto problem = endpoint_problem(host_port, e)) return make_error(errc::invalid_request, "address " + *problem);
  return e;
}

bool is_unspecified_host(std::string_view host) {
  if (host.find(':') != std::string_view::npos)  // IPv6: every group zero ("::", "0:0::0")
    return std::all_of(host.begin(), host.end(), [](char c) { return c == '0' || c == ':'; });
  // IPv4 as inet_aton reads it: "0", "0.0.0.0", "00.0" all mean 0.0.0.0.
  return !host.empty() && std::all_of(host.begin(), host.end(), [](char c) { return c == '0' || c == '.'; }) &&
         host.find('0') != std::string_view::npos;
}

std::string_view node_role_name(node_role role) {
  switch (role) {
    case node_role::coordinator: return "coordinator";
    case node_role::gateway: return "gateway";
    case node_role::router: return "router";
    case node_role::replica: return "replica";
  }
  return "unknown";
}

bool node_spec::has(node_role role) const { return std::find(roles.begin(), roles.end(), role) != roles.end(); }

const node_spec* cluster_config::node(std::string_view name) const {
  for (const auto& n : nodes)
    if (n.name == name) return &n;
  return nullptr;
}

result<cluster_config> parse_cluster_config(std::string_view yaml_text, const std::string& source) {
  LLMESH_TRY(prescan(yaml_text, source));
  reader r(source);
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(std::string(yaml_text));
    if (docs.empty() || (docs.size() == 1 && docs[0].IsNull())) return r.fail("is empty; a cluster config is a YAML mapping");
    if (docs.size() != 1) return r.fail("must hold exactly one YAML document, found " + std::to_string(docs.size()));
    return read_config(r, docs[0]);
  } catch (const YAML::Exception& e) {
    std::string at = e.mark.is_null() ? "" : ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1);
    return make_error(errc::invalid_request, source + at + ": malformed YAML: " + one_line(e.msg));
  } catch (const std::exception& e) {  // bad_alloc and the like: still an answer, not a crash
    return make_error(errc::invalid_request, source + ": cannot parse: " + one_line(e.what()));
  }
}

result<cluster_config> load_cluster_config(const std::string& path) {
  std::error_code ec;
  auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) return make_error(errc::not_found, path + ": no such cluster config");
  if (!std::filesystem::is_regular_file(st)) return make_error(errc::io_error, path + ": not a regular file");
  auto size = std::filesystem::file_size(path, ec);
  if (ec) return make_error(errc::io_error, path + ": cannot read: " + ec.message());
  if (size > max_config_bytes)
    return make_error(errc::invalid_request, path + ": larger than 1 MiB (" + std::to_string(size) + " bytes); not a cluster config");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) return make_error(errc::io_error, path + ": cannot read");
  return parse_cluster_config(text.str(), path);
}

}  // namespace llmesh::actors
