// `llmesh serve --lora-modules` over real HTTP (vLLM's multi-LoRA serving): each adapter is a
// model of its own in /v1/models (parent: the base model); its completions run the base model's
// replicas with the adapter — the same greedy tokens on either replica, alone or while the base
// model and another adapter run in the same batches, and other tokens than the base model's; a
// bad adapter stops the server at start with one line naming it. --lora-dtype holds the
// adapters in another type: the tokens are `llmesh generate --lora-dtype`'s.
#include <gtest/gtest.h>

#include <future>
#include <nlohmann/json.hpp>

#include "../model/temp_dir.hpp"
#include "reference.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;

std::vector<int32_t> complete(int port, const std::string& model, const std::vector<int32_t>& prompt, int* status = nullptr) {
  const json body = {{"model", model}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"return_token_ids", true}};
  auto r = http_request(port, "POST", "/v1/completions", body.dump());
  if (status) *status = r.status;
  if (r.status != 200) {
    ADD_FAILURE() << model << ": " << r.status << " " << r.body;
    return {};
  }
  return json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>();
}

TEST(ServeLora, AdaptersAreModelsThatRunOnTheBaseModelsReplicas) {
  model::testing::temp_dir dir;
  const std::string base = dir.path() + "/base";
  const std::string shape = " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 --vocab 300 --seed 9";
  ASSERT_EQ(std::system((bin + " model random --out " + base + shape + " 2>/dev/null").c_str()), 0);
  ASSERT_EQ(std::system((bin + " model random-lora --model " + base + " --out " + dir.path() + "/psalms 2>/dev/null").c_str()), 0);
  ASSERT_EQ(std::system((bin + " model random-lora --model " + base + " --out " + dir.path() +
                         "/proverbs --rank 4 --targets q_proj,v_proj,down_proj --seed 5 --dtype bf16 2>/dev/null")
                            .c_str()),
            0);
  server_process s(bin, {"--model", base, "--replicas", "2", "--enable-lora", "--lora-modules", "psalms=" + dir.path() + "/psalms",
                         R"({"name": "proverbs", "path": ")" + dir.path() + R"(/proverbs"})"});
  ASSERT_GT(s.port(), 0) << s.log();
  EXPECT_NE(s.log().find("2 LoRA adapter(s)"), std::string::npos) << s.log();

  auto models = http_request(s.port(), "GET", "/v1/models", "");
  ASSERT_EQ(models.status, 200);
  const json data = json::parse(models.body)["data"];
  ASSERT_EQ(data.size(), 3u) << models.body;
  EXPECT_EQ(data[1]["id"], "psalms");
  EXPECT_EQ(data[1]["parent"], "base");
  EXPECT_EQ(data[1]["root"], dir.path() + "/psalms");
  EXPECT_EQ(data[2]["id"], "proverbs");

  const std::vector<int32_t> prompt = {5, 17, 100, 42, 8, 99, 1, 259, 33, 71};
  const auto want_base = complete(s.port(), "base", prompt);
  const auto want_psalms = complete(s.port(), "psalms", prompt);
  const auto want_proverbs = complete(s.port(), "proverbs", prompt);
  ASSERT_EQ(want_psalms.size(), 12u);
  EXPECT_NE(want_psalms, want_base);
  EXPECT_NE(want_proverbs, want_base);
  EXPECT_NE(want_psalms, want_proverbs);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(complete(s.port(), "psalms", prompt), want_psalms) << "either replica";
  // All three at once, several times: shared batches on both replicas, and prefix-cache hits
  // only within each adapter.
  std::vector<std::future<std::vector<int32_t>>> runs;
  const std::vector<std::string> names = {"base", "psalms", "proverbs"};
  for (int i = 0; i < 9; ++i) {
    runs.push_back(std::async(std::launch::async, [&, i] { return complete(s.port(), names[i % 3], prompt); }));
  }
  for (int i = 0; i < 9; ++i) {
    const auto got = runs[i].get();
    EXPECT_EQ(got, i % 3 == 0 ? want_base : i % 3 == 1 ? want_psalms : want_proverbs) << names[i % 3];
  }
  // Chat and text prompts take the adapter too (the base model's tokenizer).
  auto t = http_request(s.port(), "POST", "/v1/completions",
                        json({{"model", "psalms"}, {"prompt", "Hi"}, {"max_tokens", 2}}).dump());
  EXPECT_EQ(t.status, 200) << t.body;
  EXPECT_EQ(json::parse(t.body)["model"], "psalms");
  auto unknown = http_request(s.port(), "POST", "/v1/completions", R"({"model":"hymns","prompt":[5],"max_tokens":1})");
  EXPECT_EQ(unknown.status, 404) << unknown.body;
}

TEST(ServeLora, LoraDtypeHoldsAdaptersInTheTypeAsked) {
  model::testing::temp_dir dir;
  const std::string base = dir.path() + "/base", ad = dir.path() + "/psalms";
  ASSERT_EQ(std::system((bin + " model random --out " + base + " --hidden 64 --intermediate 128 --layers 2 --heads 4 --kv-heads 2 "
                         "--vocab 300 --seed 9 2>/dev/null").c_str()), 0);
  ASSERT_EQ(std::system((bin + " model random-lora --model " + base + " --out " + ad + " --strength 2 2>/dev/null").c_str()), 0);
  const std::vector<int32_t> prompt = {5, 17, 100, 42, 8, 99, 1, 259, 33, 71};
  // Sampled (seed 3): a draw near a boundary tells the adapter's rounding apart.
  const std::string flags = "--prompt-ids " + id_list(prompt) + " --lora " + ad;
  const std::string sampling = " --temperature 1 --seed 3 --lora-dtype ";
  const auto as_stored = generate_ids(bin, base, flags, 40, sampling + "auto");
  for (const std::string type : {"float16", "bfloat16"}) {
    const auto want = generate_ids(bin, base, flags, 40, sampling + type);
    ASSERT_EQ(want.size(), 40u);
    ASSERT_NE(want, as_stored) << type << ": this seed must tell the adapter's type apart";
    server_process s(bin, {"--model", base, "--lora-modules", "psalms=" + ad, "--lora-dtype", type});
    ASSERT_GT(s.port(), 0) << s.log();
    const json body = {{"model", "psalms"}, {"prompt", prompt}, {"max_tokens", 40}, {"temperature", 1}, {"seed", 3},
                       {"ignore_eos", true}, {"return_token_ids", true}};
    auto r = http_request(s.port(), "POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), want) << type;
  }
  server_process bad(bin, {"--model", base, "--lora-modules", "psalms=" + ad, "--lora-dtype", "int8"});
  EXPECT_LE(bad.port(), 0);
  EXPECT_NE(bad.log().find("--lora-dtype must be auto, bfloat16, float16 (half) or float32 (float), not 'int8'"), std::string::npos)
      << bad.log();
}

TEST(ServeLora, ABadAdapterIsOneLineAndAnExit) {
  model::testing::temp_dir dir;
  const std::string base = dir.path() + "/base";
  ASSERT_EQ(std::system((bin + " model random --out " + base + " --hidden 64 --intermediate 128 --layers 2 2>/dev/null").c_str()), 0);
  {
    server_process s(bin, {"--model", base, "--lora-modules", "gone=" + dir.path() + "/missing"});
    EXPECT_LE(s.port(), 0);
    EXPECT_NE(s.log().find("LoRA adapter 'gone'"), std::string::npos) << s.log();
  }
  {
    server_process s(bin, {"--model", base, "--lora-modules", "base=" + dir.path()});
    EXPECT_LE(s.port(), 0);
    EXPECT_NE(s.log().find("is the base model's name"), std::string::npos) << s.log();
  }
  {
    server_process s(bin, {"--model", base, "--lora-modules", "no-path"});
    EXPECT_LE(s.port(), 0);
    EXPECT_NE(s.log().find("NAME=PATH"), std::string::npos) << s.log();
  }
}

}  // namespace
}  // namespace llmesh::testing
