// CORS (cors.hpp) as Starlette's CORSMiddleware answers it under vLLM's flags: the lists parse
// from JSON or commas, actual responses carry the origin headers only for allowed origins
// ("*" without credentials, else the origin echoed with Vary), and preflights get 200 with the
// allowed methods and headers or 400 naming what is refused.
#include <gtest/gtest.h>

#include "llmesh/gateway/cors.hpp"

namespace llmesh::gateway {
namespace {

std::string header(const header_list& h, const std::string& name) {
  for (const auto& [k, v] : h) {
    if (k == name) return v;
  }
  return "(none)";
}

TEST(Cors, ListsParseFromJsonOrCommas) {
  EXPECT_EQ(*parse_cors_list(R"(["http://a", "https://b:8443"])", "--allowed-origins"),
            (std::vector<std::string>{"http://a", "https://b:8443"}));
  EXPECT_EQ(*parse_cors_list(" http://a , http://b ", "--allowed-origins"), (std::vector<std::string>{"http://a", "http://b"}));
  EXPECT_EQ(*parse_cors_list("*", "--allowed-methods"), (std::vector<std::string>{"*"}));
  for (const char* bad : {"[1]", "[\"a\"", "a,,b", "", R"([""])"}) {
    auto r = parse_cors_list(bad, "--allowed-origins");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.err().message.find("--allowed-origins"), std::string::npos) << r.err().message;
  }
}

TEST(Cors, ResponsesCarryTheOriginOnlyWhenItIsAllowed) {
  cors_options off;
  EXPECT_TRUE(cors_headers(off, "http://a").empty());
  cors_options any{{"*"}};
  EXPECT_TRUE(cors_headers(any, "").empty()) << "no Origin: no CORS";
  auto h = cors_headers(any, "http://a");
  EXPECT_EQ(header(h, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(header(h, "Vary"), "(none)");
  cors_options some{{"http://a", "http://b"}};
  h = cors_headers(some, "http://b");
  EXPECT_EQ(header(h, "Access-Control-Allow-Origin"), "http://b");
  EXPECT_EQ(header(h, "Vary"), "Origin");
  EXPECT_TRUE(cors_headers(some, "http://evil").empty());
  cors_options creds{{"*"}, {"*"}, {"*"}, true};
  h = cors_headers(creds, "http://a");
  EXPECT_EQ(header(h, "Access-Control-Allow-Origin"), "http://a") << "credentials never go with *";
  EXPECT_EQ(header(h, "Access-Control-Allow-Credentials"), "true");
}

TEST(Cors, PreflightsAreAnsweredOrRefusedByName) {
  cors_options some{{"http://ui"}, {"GET", "POST"}, {"Authorization"}};
  EXPECT_FALSE(cors_preflight(some, "POST", "http://ui", "POST", "").has_value()) << "not OPTIONS";
  EXPECT_FALSE(cors_preflight(some, "OPTIONS", "http://ui", "", "").has_value()) << "no requested method";
  EXPECT_FALSE(cors_preflight(cors_options{}, "OPTIONS", "http://ui", "POST", "").has_value()) << "CORS off";
  auto ok = cors_preflight(some, "OPTIONS", "http://ui", "POST", "authorization, content-type");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->body, "OK");
  EXPECT_EQ(header(ok->headers, "Access-Control-Allow-Origin"), "http://ui");
  EXPECT_EQ(header(ok->headers, "Access-Control-Allow-Methods"), "GET, POST");
  EXPECT_EQ(header(ok->headers, "Access-Control-Allow-Headers"), "accept, accept-language, content-language, content-type, authorization");
  EXPECT_EQ(header(ok->headers, "Access-Control-Max-Age"), "600");
  auto bad = cors_preflight(some, "OPTIONS", "http://evil", "DELETE", "x-secret");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  EXPECT_EQ(bad->body, "Disallowed CORS origin, method, headers");
  EXPECT_EQ(header(bad->headers, "Access-Control-Allow-Origin"), "(none)") << "a refused origin is not echoed";
  EXPECT_EQ(header(bad->headers, "Vary"), "Origin");
  auto lower_case = cors_preflight(some, "OPTIONS", "http://ui", "post", "");
  ASSERT_TRUE(lower_case);
  EXPECT_EQ(lower_case->status, 400) << "methods compare as sent";
  cors_options any{{"*"}};
  auto echoed = cors_preflight(any, "OPTIONS", "http://x", "PUT", "X-Custom, Authorization");
  ASSERT_TRUE(echoed);
  EXPECT_EQ(echoed->status, 200);
  EXPECT_EQ(header(echoed->headers, "Access-Control-Allow-Origin"), "*");
  EXPECT_EQ(header(echoed->headers, "Access-Control-Allow-Headers"), "X-Custom, Authorization") << "any header: echoed";
  EXPECT_EQ(header(echoed->headers, "Access-Control-Allow-Methods"), "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT");
  auto odd = cors_preflight(any, "OPTIONS", "http://x", "PROPFIND", "");
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->status, 400) << "* is the seven standard methods";
  EXPECT_EQ(odd->body, "Disallowed CORS method");
}

}  // namespace
}  // namespace llmesh::gateway
