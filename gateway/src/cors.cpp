// CORS answers (cors.hpp), after Starlette's CORSMiddleware, which vLLM's flags configure.
#include "llmesh/gateway/cors.hpp"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>

namespace llmesh::gateway {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

bool any(const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), "*") != v.end(); }

bool origin_allowed(const cors_options& o, std::string_view origin) {
  return any(o.origins) || std::find(o.origins.begin(), o.origins.end(), origin) != o.origins.end();
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

/// What "*" allows as methods (Starlette's ALL_METHODS).
const std::vector<std::string> all_methods = {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"};

/// The headers a browser may always send (CORS-safelisted), which Starlette always allows.
const std::vector<std::string> safelisted = {"accept", "accept-language", "content-language", "content-type"};

}  // namespace

result<std::vector<std::string>> parse_cors_list(std::string_view value, const std::string& flag) {
  const std::string v = trimmed(value);
  std::vector<std::string> out;
  if (!v.empty() && v.front() == '[') {
    auto j = nlohmann::json::parse(v, nullptr, false);
    if (j.is_discarded() || !j.is_array()) return make_error(errc::invalid_request, flag + " must be a JSON list of strings");
    for (const auto& x : j) {
      if (!x.is_string() || x.get<std::string>().empty()) {
        return make_error(errc::invalid_request, flag + " must be a JSON list of strings");
      }
      out.push_back(x.get<std::string>());
    }
    return out;
  }
  size_t at = 0;
  while (at <= v.size()) {
    const size_t comma = std::min(v.find(',', at), v.size());
    std::string item = trimmed(std::string_view(v).substr(at, comma - at));
    if (item.empty()) return make_error(errc::invalid_request, flag + " has an empty entry in '" + v + "'");
    out.push_back(std::move(item));
    at = comma + 1;
  }
  return out;
}

header_list cors_headers(const cors_options& o, std::string_view origin) {
  header_list h;
  if (!o.enabled() || origin.empty() || !origin_allowed(o, origin)) return h;
  if (any(o.origins) && !o.credentials) {
    h.emplace_back("Access-Control-Allow-Origin", "*");
  } else {
    h.emplace_back("Access-Control-Allow-Origin", std::string(origin));
    h.emplace_back("Vary", "Origin");
  }
  if (o.credentials) h.emplace_back("Access-Control-Allow-Credentials", "true");
  return h;
}

std::optional<http_reply> cors_preflight(const cors_options& o, std::string_view method, std::string_view origin,
                                         std::string_view request_method, std::string_view request_headers) {
  if (!o.enabled() || method != "OPTIONS" || origin.empty() || request_method.empty()) return std::nullopt;
  std::vector<std::string> refused;
  if (!origin_allowed(o, origin)) refused.push_back("origin");
  // "*" stands for the seven methods Starlette lists; methods compare as sent (capitals).
  const std::vector<std::string>& methods = any(o.methods) ? all_methods : o.methods;
  const bool method_ok = std::find(methods.begin(), methods.end(), request_method) != methods.end();
  if (!method_ok) refused.push_back("method");
  std::vector<std::string> asked;  // the request headers the page wants to send, lower-cased
  for (size_t at = 0; at < request_headers.size();) {
    const size_t comma = std::min(request_headers.find(',', at), request_headers.size());
    std::string h = lower(trimmed(request_headers.substr(at, comma - at)));
    if (!h.empty()) asked.push_back(std::move(h));
    at = comma + 1;
  }
  if (!any(o.headers)) {
    for (const auto& h : asked) {
      const bool ok = std::find(safelisted.begin(), safelisted.end(), h) != safelisted.end() ||
                      std::any_of(o.headers.begin(), o.headers.end(), [&](const std::string& a) { return lower(a) == h; });
      if (!ok) {
        refused.push_back("headers");
        break;
      }
    }
  }
  http_reply r;
  r.content_type = "text/plain; charset=utf-8";
  if (!refused.empty()) {
    r.status = 400;
    r.body = "Disallowed CORS " + joined(refused);
  } else {
    r.status = 200;
    r.body = "OK";
  }
  // Starlette's preflight headers: an actual answer's (the origin only when it is allowed), and
  // for a refused origin still Vary and the credentials flag.
  r.headers = cors_headers(o, origin);
  if (r.headers.empty()) {
    r.headers.emplace_back("Vary", "Origin");
    if (o.credentials) r.headers.emplace_back("Access-Control-Allow-Credentials", "true");
  }
  r.headers.emplace_back("Access-Control-Allow-Methods", joined(methods));
  r.headers.emplace_back("Access-Control-Max-Age", "600");
  if (any(o.headers)) {
    if (!asked.empty()) r.headers.emplace_back("Access-Control-Allow-Headers", std::string(trimmed(request_headers)));
  } else {
    std::vector<std::string> allowed = safelisted;
    for (const auto& h : o.headers) {
      if (std::find(allowed.begin(), allowed.end(), lower(h)) == allowed.end()) allowed.push_back(lower(h));
    }
    r.headers.emplace_back("Access-Control-Allow-Headers", joined(allowed));
  }
  return r;
}

}  // namespace llmesh::gateway
