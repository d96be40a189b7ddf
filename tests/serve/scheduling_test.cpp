// `llmesh serve` over real HTTP, the scheduling and prefix-cache fields: usage's cached_tokens
// (completions, chat, the Responses API, a beam search, /metrics), vLLM's cache_salt,
// priority under --scheduling-policy priority, and vLLM's partial-prefill flags.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "reference.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";
const std::string prompt = "In the beginning God created";

json completion(int port, const json& body, int* status) {
  auto r = http_request(port, "POST", "/v1/completions", body.dump());
  *status = r.status;
  auto j = json::parse(r.body, nullptr, false);
  return j.is_discarded() ? json{{"raw", r.body}} : j;
}

// vLLM's POST /reset_prefix_cache (SGLang's /flush_cache): every replica's prefix cache is
// emptied — a prompt cached before is computed again, with the same tokens, then cached again.
TEST(Serve, ResetPrefixCacheEmptiesEveryReplicasCache) {
  server_process s(bin, {"--model", model_dir, "--replicas", "2", "--policy", "round-robin"});
  ASSERT_GT(s.port(), 0) << s.log();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(100 + (i * 41) % 900);
  const json body = {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"return_token_ids", true}};
  auto cached_of = [&](const json& want) {
    int status = 0;
    const json r = completion(s.port(), body, &status);
    EXPECT_EQ(status, 200) << r;
    if (!want.is_null()) EXPECT_EQ(r["choices"][0]["token_ids"], want);
    return std::make_pair(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<size_t>(), r["choices"][0]["token_ids"]);
  };
  const auto [first, tokens] = cached_of(json());
  EXPECT_EQ(first, 0u);
  EXPECT_EQ(cached_of(tokens).first, 0u);  // round-robin: the other replica's first time
  const size_t cached = cached_of(tokens).first;
  EXPECT_GT(cached, 0u);
  EXPECT_EQ(cached_of(tokens).first, cached);  // both replicas hold it
  auto r = http_request(s.port(), "POST", "/reset_prefix_cache", "");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body), json({{"status", "ok"}, {"replicas", 2}}));
  EXPECT_EQ(cached_of(tokens).first, 0u);
  EXPECT_EQ(cached_of(tokens).first, 0u);
  EXPECT_EQ(cached_of(tokens).first, cached);  // cached again, on both
  EXPECT_EQ(cached_of(tokens).first, cached);
  EXPECT_EQ(http_request(s.port(), "GET", "/flush_cache", "").status, 200);
  EXPECT_EQ(cached_of(tokens).first, 0u);
}

// OpenAI's cached_tokens: a prompt the prefix cache already holds says how much of it was not
// computed again (whole KV blocks, never its last token), in completions', chat's and the
// Responses API's usage and in /metrics; the tokens are the same as without the cache.
TEST(Serve, UsageSaysHowManyPromptTokensThePrefixCacheHeld) {
  server_process s(bin, {"--model", model_dir});
  ASSERT_GT(s.port(), 0) << s.log();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(100 + (i * 37) % 900);
  const json body = {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"return_token_ids", true}};
  int status = 0;
  const json first = completion(s.port(), body, &status);
  ASSERT_EQ(status, 200) << first;
  EXPECT_EQ(first["usage"]["prompt_tokens_details"], json({{"cached_tokens", 0}})) << first["usage"];
  const json second = completion(s.port(), body, &status);
  ASSERT_EQ(status, 200) << second;
  const size_t cached = second["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GT(cached, 0u) << second["usage"];
  EXPECT_LT(cached, prompt.size());
  EXPECT_EQ(second["choices"][0]["token_ids"], first["choices"][0]["token_ids"]);
  auto metrics = http_request(s.port(), "GET", "/metrics").body;
  EXPECT_NE(metrics.find("\nllmesh_prompt_tokens_cached_total " + std::to_string(cached) + "\n"), std::string::npos) << metrics;
  // vLLM's cache_salt: a salted request finds only its salt's blocks, with the same tokens.
  auto salted_cached = [&](const std::string& salt) {
    json b = body;
    b["cache_salt"] = salt;
    const json r = completion(s.port(), b, &status);
    EXPECT_EQ(status, 200) << r;
    EXPECT_EQ(r["choices"][0]["token_ids"], first["choices"][0]["token_ids"]);
    return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<size_t>();
  };
  EXPECT_EQ(salted_cached("tenant-a"), 0u);  // the unsalted requests' blocks are not its
  EXPECT_EQ(salted_cached("tenant-a"), cached);
  EXPECT_EQ(salted_cached("tenant-b"), 0u);
  {  // A beam search's usage: its first step's word.
    json b = body;
    b["use_beam_search"] = true;
    b["n"] = 2;
    const json r = completion(s.port(), b, &status);
    ASSERT_EQ(status, 200) << r;
    EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<size_t>(), cached) << r["usage"];
  }
  // Chat and the Responses API: the second of two equal requests finds the first's blocks.
  const std::string words = "And God said, Let there be light: and there was light. And God saw the light, that it was good.";
  for (int round = 0; round < 2; ++round) {
    auto c = http_request(s.port(), "POST", "/v1/chat/completions",
                          json{{"model", "kjv-tiny"}, {"messages", {{{"role", "user"}, {"content", words}}}}, {"max_tokens", 2}}.dump());
    ASSERT_EQ(c.status, 200) << c.body;
    const size_t chat_cached = json::parse(c.body)["usage"]["prompt_tokens_details"]["cached_tokens"];
    if (round == 0) {
      EXPECT_EQ(chat_cached, 0u);
    } else {
      EXPECT_GT(chat_cached, 0u) << c.body;
    }
    auto r = http_request(s.port(), "POST", "/v1/responses",
                          json{{"model", "kjv-tiny"}, {"input", words}, {"max_output_tokens", 2}, {"store", false}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    // The same prompt as the chat request's: cached from the first round's chat on.
    EXPECT_GT(json::parse(r.body)["usage"]["input_tokens_details"]["cached_tokens"].get<size_t>(), 0u) << r.body;
  }
}

// vLLM's partial-prefill flags change who waits, never a token: a long prompt computed 8 tokens
// a step beside short ones that pass it gives each the tokens `llmesh generate` gives. The
// server says what its scheduler does with them.
TEST(Serve, PartialPrefillFlagsChangeNoToken) {
  server_process s(bin, {"--model", model_dir, "--long-prefill-token-threshold", "8", "--max-num-partial-prefills", "2",
                         "--max-long-partial-prefills", "1"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_NE(s.log().find("llmesh: scheduler: prompts at most 8 tokens a step, at most 2 at once, 1 of them long"), std::string::npos)
      << s.log();
  std::vector<std::vector<int32_t>> prompts(4);
  for (int i = 0; i < 150; ++i) prompts[0].push_back(100 + (i * 37) % 900);
  for (int i = 0; i < 90; ++i) prompts[1].push_back(200 + (i * 53) % 800);
  for (int i = 0; i < 5; ++i) prompts[2].push_back(300 + i * 7);
  for (int i = 0; i < 11; ++i) prompts[3].push_back(400 + i * 3);
  std::vector<json> got(prompts.size());
  std::vector<std::thread> clients;
  for (size_t p = 0; p < prompts.size(); ++p) {
    clients.emplace_back([&, p] {
      int status = 0;
      got[p] = completion(s.port(), {{"model", "kjv-tiny"}, {"prompt", prompts[p]}, {"max_tokens", 6}, {"temperature", 0},
                                     {"return_token_ids", true}}, &status);
      EXPECT_EQ(status, 200) << got[p];
    });
  }
  for (auto& c : clients) c.join();
  for (size_t p = 0; p < prompts.size(); ++p) {
    EXPECT_EQ(got[p]["choices"][0]["token_ids"], json(generate_ids(bin, model_dir, "--prompt-ids " + id_list(prompts[p]), 6)))
        << "prompt " << p;
  }
}

// vLLM's priority scheduling: with --scheduling-policy priority, requests of any priority are
// served their own tokens (priority orders the queue, never the numbers); without it a
// non-zero priority is a 400.
TEST(Serve, PrioritiesAreServedUnderThePriorityPolicyOnly) {
  const auto want = testing::generate_ids(bin, model_dir, "--prompt '" + prompt + "'", 12);
  server_process s(bin, {"--model", model_dir, "--scheduling-policy", "priority"});
  ASSERT_GT(s.port(), 0) << s.log();
  for (int prio : {-5, 0, 9}) {
    int status = 0;
    const json r = completion(s.port(), {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0},
                                         {"return_token_ids", true}, {"priority", prio}}, &status);
    ASSERT_EQ(status, 200) << r;
    EXPECT_EQ(r["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want) << prio;
  }
  server_process plain(bin, {"--model", model_dir});
  ASSERT_GT(plain.port(), 0) << plain.log();
  int status = 0;
  const json r = completion(plain.port(), {{"model", "kjv-tiny"}, {"prompt", prompt}, {"priority", 1}}, &status);
  EXPECT_EQ(status, 400) << r;
}

}  // namespace
}  // namespace llmesh::testing
