// `llmesh serve --model FILE.gguf` over real HTTP: the model is named after the file, and a
// greedy completion of a golden GGUF (tests/data/gguf, whose Q4_0..Q6_K blocks the loader turns
// into int8 ones) gives the PyTorch reference's tokens, from ids and from text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <fstream>

#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string gguf_dir = std::string(LLMESH_SOURCE_DIR) + "/tests/data/gguf";

std::vector<int32_t> ids_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<int32_t> ids;
  for (int32_t x; in >> x;) ids.push_back(x);
  return ids;
}

TEST(ServeGguf, AGgufFileServesTheReferenceTokens) {
  const std::string model = gguf_dir + "/llama_blocks_mixed/model.gguf";
  server_process s(bin, {"--model", model, "--replicas", "2"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_NE(s.log().find("int8 weights"), std::string::npos) << s.log();
  auto models = http_request(s.port(), "GET", "/v1/models", "");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "model.gguf");

  const std::vector<int32_t> want = ids_of(gguf_dir + "/llama_blocks_mixed/ids.txt");
  const json body = {{"model", "model.gguf"}, {"prompt", {5, 17, 100, 42, 8, 99, 1, 259}}, {"max_tokens", 32},
                     {"temperature", 0}, {"return_token_ids", true}};
  for (int i = 0; i < 2; ++i) {  // either replica
    auto r = http_request(s.port(), "POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want);
  }
  // Text goes through the file's tokenizer (its byte-level vocabulary: one id per byte).
  auto t = http_request(s.port(), "POST", "/v1/completions",
                        json({{"model", "model.gguf"}, {"prompt", "Hi"}, {"max_tokens", 3}, {"return_token_ids", true}}).dump());
  ASSERT_EQ(t.status, 200) << t.body;
  const json tj = json::parse(t.body);
  EXPECT_EQ(tj["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>(), (std::vector<int32_t>{72, 105}));
  EXPECT_EQ(tj["choices"][0]["token_ids"].size(), 3u);
}

TEST(ServeGguf, AnUnreadableGgufIsOneLineAndAnExit) {
  server_process s(bin, {"--model", gguf_dir + "/cases.txt"});  // neither a directory nor a GGUF file
  EXPECT_LE(s.port(), 0);
  EXPECT_NE(s.log().find("cases.txt"), std::string::npos) << s.log();
}

// GPT-OSS from llama.cpp's GGUF with OpenAI's harmony chat template (macros and all): greedy
// completions give the PyTorch reference's tokens; chat renders through the template with
// tools and answers (the random model writes no harmony, so its output is content, as it came);
// a forced tool call is refused as GPT-OSS's calls are the model's own.
TEST(ServeGguf, GptOssServesTheReferenceTokensAndHarmonyChat) {
  const std::string model = gguf_dir + "/gpt_oss_mxfp4/model.gguf";
  const std::string tmpl = std::string(LLMESH_SOURCE_DIR) + "/tests/data/chat_templates/gpt_oss.jinja";
  server_process s(bin, {"--model", model, "--chat-template", tmpl, "--enable-auto-tool-choice"});
  ASSERT_GT(s.port(), 0) << s.log();
  const std::vector<int32_t> want = ids_of(gguf_dir + "/gpt_oss_mxfp4/ids.txt");
  const json body = {{"model", "model.gguf"}, {"prompt", {5, 50, 150, 250, 350, 450, 550, 9, 90, 190}}, {"max_tokens", 32},
                     {"temperature", 0}, {"return_token_ids", true}, {"ignore_eos", true}};
  auto r = http_request(s.port(), "POST", "/v1/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want);

  const json tools = json::array({{{"type", "function"},
                                   {"function", {{"name", "get_weather"},
                                                 {"description", "Weather"},
                                                 {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
  const json chat = {{"model", "model.gguf"}, {"max_tokens", 8}, {"temperature", 0}, {"tools", tools},
                     {"messages", json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Weather in Paris?"}}})}};
  auto c = http_request(s.port(), "POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(c.status, 200) << c.body;
  const json msg = json::parse(c.body)["choices"][0];
  EXPECT_TRUE(msg["message"]["content"].is_string()) << c.body;
  EXPECT_FALSE(msg["message"].contains("tool_calls")) << c.body;
  EXPECT_EQ(json::parse(c.body)["usage"]["completion_tokens"], 8) << c.body;
  // The template's prompt: harmony's system and developer messages, the tool's TypeScript, the
  // generation prompt (tokenize renders it as chat does).
  auto t = http_request(s.port(), "POST", "/tokenize", json{{"model", "model.gguf"}, {"messages", chat["messages"]}, {"tools", tools}}.dump());
  ASSERT_EQ(t.status, 200) << t.body;
  auto d = http_request(s.port(), "POST", "/detokenize", json{{"model", "model.gguf"}, {"tokens", json::parse(t.body)["tokens"]}}.dump());
  ASSERT_EQ(d.status, 200) << d.body;
  const std::string prompt = json::parse(d.body)["prompt"];
  EXPECT_NE(prompt.find("<|start|>developer<|message|># Instructions\n\nBe brief."), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("// Weather\ntype get_weather = (_: {\ncity?: string,\n}) => any;"), std::string::npos) << prompt;
  EXPECT_TRUE(prompt.ends_with("<|start|>assistant")) << prompt;

  json forced = chat;
  forced["tool_choice"] = "required";
  auto f = http_request(s.port(), "POST", "/v1/chat/completions", forced.dump());
  EXPECT_EQ(f.status, 400) << f.body;
  EXPECT_NE(f.body.find("harmony"), std::string::npos) << f.body;
}

}  // namespace
}  // namespace llmesh::testing
