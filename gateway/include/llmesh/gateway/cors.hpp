// Cross-origin requests (CORS), as vLLM's --allowed-origins, --allowed-methods,
// --allowed-headers and --allow-credentials configure Starlette's CORSMiddleware: a browser
// page from an allowed origin may call the API. Off unless origins are given (unlike vLLM,
// whose default allows every origin: a page on any site could then drive a local server).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/gateway/completion_stream.hpp"

namespace llmesh::gateway {

struct cors_options {
  std::vector<std::string> origins;            ///< "*": any; empty: CORS off
  std::vector<std::string> methods = {"*"};    ///< methods a preflight may ask for, in capitals ("*": the 7 standard ones)
  std::vector<std::string> headers = {"*"};    ///< request headers a preflight may ask for ("*": any)
  bool credentials = false;                    ///< Access-Control-Allow-Credentials: true
  bool enabled() const { return !origins.empty(); }
};

/// Parses one of the flags' values: vLLM's JSON list of strings ('["http://a", "http://b"]'),
/// or names separated by commas. invalid_request names `flag` otherwise.
[[nodiscard]] result<std::vector<std::string>> parse_cors_list(std::string_view value, const std::string& flag);

using header_list = std::vector<std::pair<std::string, std::string>>;

/// The headers an actual response carries for a request whose Origin header is `origin`:
/// none when CORS is off, the request has no Origin, or the origin is not allowed. With
/// credentials the origin is echoed even where "*" allows any (Starlette sends "*" unless the
/// request has cookies; browsers refuse "*" with credentials either way).
header_list cors_headers(const cors_options& o, std::string_view origin);

/// A preflight (OPTIONS with Origin and Access-Control-Request-Method): 200 with the allowed
/// origin, methods, headers and a max-age of 600 s, or 400 "Disallowed CORS origin, method,
/// headers" naming what is refused (Starlette's answers). nullopt when CORS is off or the
/// request is no preflight.
std::optional<http_reply> cors_preflight(const cors_options& o, std::string_view method, std::string_view origin,
                                         std::string_view request_method, std::string_view request_headers);

}  // namespace llmesh::gateway
