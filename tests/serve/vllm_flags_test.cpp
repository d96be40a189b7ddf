// vLLM's serve flags on `llmesh serve`: --chat-template (inline here; the file form is
// chat_template_test's) gives a model without a template a chat endpoint rendering exactly that
// template, --max-model-len is the context the API grants (/v1/models reports it; a request
// past it is a 400; one within it runs), and --host/--port replace --http's parts, with
// --tensor-parallel-size, --max-num-seqs and --max-num-batched-tokens taken for --tp,
// --max-seqs and --max-batch-tokens, --block-size sizing the KV blocks, the model as the first
// argument, --generation-config vllm leaving generation_config.json's sampling out, and
// --no-enable-prefix-caching (no cached prompt tokens where the default caches a block), and
// --served-model-name with several names (the model answers to each). A --max-model-len above the model's stops the start.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "../cli/subprocess.hpp"
#include "../model/temp_dir.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;

TEST(ServeVllmFlags, ChatTemplateMaxModelLenHostPortAndAliases) {
  model::testing::temp_dir dir;
  const std::string m = dir.path() + "/m";
  ASSERT_EQ(std::system((bin + " model random --out " + m +
                         " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --max-positions 512 --seed 4"
                         " 2>/dev/null")
                            .c_str()),
            0);
  // The model recommends greedy decoding: requests that leave temperature out get it (auto).
  {
    std::ofstream g(m + "/generation_config.json");
    g << R"({"bos_token_id": 256, "eos_token_id": 257, "temperature": 0.0})";
  }
  const std::string tmpl = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}";
  // --http names an address this machine does not have: only --host and --port make it listen.
  // The model as the first argument, as `vllm serve MODEL`; vLLM's always-on features accepted.
  child_process s({bin, "serve", m, "--http", "203.0.113.7:1", "--host", "127.0.0.1", "--port", "0", "--rpc", "none",
                   "--tensor-parallel-size", "1", "--max-num-seqs", "1", "--max-num-batched-tokens", "64", "--max-model-len", "48",
                   "--chat-template", tmpl, "--block-size", "32", "--enforce-eager", "--enable-prefix-caching",
                   "--enable-chunked-prefill", "--trust-remote-code", "--enable-auto-tool-choice", "--disable-log-requests",
                   "--enable-expert-parallel"});  // a dense model: no effect, as in vLLM
  ASSERT_TRUE(s.wait_for("on http://127.0.0.1:")) << s.log();
  // One sequence of at most 48 positions in blocks of 32: two blocks (16-position blocks: 48).
  EXPECT_NE(s.log().find(", KV 64 positions per replica"), std::string::npos) << s.log();
  const int port = std::atoi(s.log().c_str() + s.log().find("on http://127.0.0.1:") + std::strlen("on http://127.0.0.1:"));
  ASSERT_GT(port, 0) << s.log();

  auto models = http_request(port, "GET", "/v1/models", "");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(json::parse(models.body)["data"][0]["max_model_len"], 48) << models.body;

  // The chat prompt is the template's rendering: its tokens are those of the text it renders.
  const json messages = json::array({{{"role", "user"}, {"content", "Hi there"}}});
  auto chat_ids = http_request(port, "POST", "/tokenize", json({{"model", "m"}, {"messages", messages}}).dump());
  auto text_ids = http_request(port, "POST", "/tokenize",
                               json({{"model", "m"}, {"prompt", "<user>Hi there<a>"}, {"add_special_tokens", false}}).dump());
  ASSERT_EQ(chat_ids.status, 200) << chat_ids.body;
  ASSERT_EQ(text_ids.status, 200) << text_ids.body;
  EXPECT_EQ(json::parse(chat_ids.body)["tokens"], json::parse(text_ids.body)["tokens"]);
  EXPECT_EQ(json::parse(chat_ids.body)["max_model_len"], 48);
  auto chat = http_request(port, "POST", "/v1/chat/completions",
                           json({{"model", "m"}, {"messages", messages}, {"max_tokens", 4}, {"temperature", 0}}).dump());
  EXPECT_EQ(chat.status, 200) << chat.body;

  // 40 prompt tokens: 8 more fit in 48, 9 do not.
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(5 + i);
  auto fits = http_request(port, "POST", "/v1/completions", json({{"model", "m"}, {"prompt", prompt}, {"max_tokens", 8}}).dump());
  EXPECT_EQ(fits.status, 200) << fits.body;
  auto cached = [&](int p) {  // the prompt's tokens a replica's prefix cache held
    auto r = http_request(p, "POST", "/v1/completions", json({{"model", "m"}, {"prompt", prompt}, {"max_tokens", 2}}).dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? json::parse(r.body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>() : -1;
  };
  EXPECT_EQ(cached(port), 32) << "one whole 32-position block of the prompt, cached by the request before";
  auto over = http_request(port, "POST", "/v1/completions", json({{"model", "m"}, {"prompt", prompt}, {"max_tokens", 9}}).dump());
  EXPECT_EQ(over.status, 400) << over.body;
  EXPECT_NE(over.body.find("context of 48"), std::string::npos) << over.body;

  // --generation-config: auto (above) takes the model's temperature 0, vllm the API's 1.
  const json unset = {{"model", "m"}, {"prompt", "In the beginning"}, {"max_tokens", 12}};
  auto ids = [&](int p) {
    auto r = http_request(p, "POST", "/v1/completions", unset.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return r.status == 200 ? json::parse(r.body)["choices"][0]["text"].get<std::string>() : std::string();
  };
  EXPECT_EQ(ids(port), ids(port)) << "the model's temperature 0";
  {
    server_process v(bin, {"--model", m, "--generation-config", "vllm", "--no-enable-prefix-caching", "--served-model-name", "m",
                           "org/m-instruct"});
    ASSERT_GT(v.port(), 0) << v.log();
    // Both names are models; a request under the second answers under it; others are 404s.
    auto listed = http_request(v.port(), "GET", "/v1/models", "");
    ASSERT_EQ(listed.status, 200);
    const json data = json::parse(listed.body)["data"];
    ASSERT_EQ(data.size(), 2u) << listed.body;
    EXPECT_EQ(data[1]["id"], "org/m-instruct");
    auto named = http_request(v.port(), "POST", "/v1/completions",
                              json({{"model", "org/m-instruct"}, {"prompt", "Hi"}, {"max_tokens", 2}}).dump());
    ASSERT_EQ(named.status, 200) << named.body;
    EXPECT_EQ(json::parse(named.body)["model"], "org/m-instruct");
    EXPECT_EQ(http_request(v.port(), "POST", "/v1/completions", json({{"model", "n"}, {"prompt", "Hi"}}).dump()).status, 404);
    auto tok = http_request(v.port(), "POST", "/tokenize", json({{"prompt", "Hi"}}).dump());
    EXPECT_EQ(tok.status, 200) << "one model under two names needs no 'model': " << tok.body;
    cached(v.port());
    EXPECT_EQ(cached(v.port()), 0) << "--no-enable-prefix-caching";
    std::set<std::string> texts;
    for (int i = 0; i < 4; ++i) texts.insert(ids(v.port()));
    EXPECT_GT(texts.size(), 1u) << "temperature 1 with a fresh seed each time";
  }

  auto twice = run_command(bin + " serve " + m + " --http 127.0.0.1:0 --rpc none --served-model-name a b a");
  EXPECT_NE(twice.exit_code, 0);
  EXPECT_NE(twice.err.find("--served-model-name: 'a' is empty, given twice"), std::string::npos) << twice.err;
  auto too_long = run_command(bin + " serve --model " + m + " --http 127.0.0.1:0 --rpc none --max-model-len 513");
  EXPECT_NE(too_long.exit_code, 0);
  EXPECT_NE(too_long.err.find("--max-model-len 513 exceeds m's context of 512 positions"), std::string::npos) << too_long.err;
}

}  // namespace
}  // namespace llmesh::testing
