// api_service against a fake mesh: routes, API key, model name, context limits, the
// concurrency bound (429 + Retry-After), seeds, ignore_eos and the chat template's prompt
// (api_fields_test.cpp: one model's card, priority and cache_salt).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include <nlohmann/json.hpp>

#include "api_fixture.hpp"
#include "llmesh/gateway/version.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;

TEST_F(ApiService, PublicRoutesAndTheApiKey) {
  EXPECT_EQ(status(call("GET", "/health", "", "")), 200);
  EXPECT_EQ(status(call("GET", "/ready", "", "")), 200);
  mesh_.ready = 0;
  EXPECT_EQ(status(call("GET", "/ready", "", "")), 503);
  EXPECT_EQ(status(call("GET", "/metrics", "", "")), 200);
  auto v = call("GET", "/version", "", "");  // vLLM's: the build's version, open as /health is
  ASSERT_EQ(status(v), 200);
  EXPECT_EQ(json::parse(std::get<http_reply>(v).body), json({{"version", std::string(version())}}));
  EXPECT_FALSE(version().empty());
  EXPECT_EQ(status(call("GET", "/v1/models", "", "")), 401);
  EXPECT_EQ(status(call("GET", "/v1/models", "", "Bearer wrong!")), 401);
  EXPECT_EQ(status(call("GET", "/v1/models", "", "Basic sekret")), 401);
  auto ok = call("GET", "/v1/models?x=1");
  ASSERT_EQ(status(ok), 200);
  auto j = json::parse(std::get<http_reply>(ok).body);
  EXPECT_EQ(j["data"][0]["id"], "kjv");
  EXPECT_EQ(j["data"][0]["max_model_len"], cfg_.max_positions);
  auto err = json::parse(std::get<http_reply>(call("GET", "/v1/models", "", "")).body);
  EXPECT_EQ(err["error"]["type"], "authentication_error");
}

TEST_F(ApiService, UnknownRoutesMethodsAndModels) {
  EXPECT_EQ(status(call("GET", "/v2/anything")), 404);
  auto wrong = call("GET", "/v1/completions");
  EXPECT_EQ(status(wrong), 405);
  EXPECT_EQ(std::get<http_reply>(wrong).headers.at(0).second, "POST");
  EXPECT_EQ(status(call("POST", "/v1/completions", R"({"model":"other","prompt":"a"})")), 404);
  EXPECT_EQ(status(call("POST", "/v1/completions", R"({"model":"kjv","prompt":"a","max_tokens":0})")), 400);
  EXPECT_EQ(status(call("POST", "/v1/completions", "not json")), 400);
}

TEST_F(ApiService, PromptsAreBoundedByTheContext) {
  const size_t ctx = cfg_.max_positions;
  json ids = json::array();
  for (size_t i = 0; i < ctx; ++i) ids.push_back(5);
  EXPECT_EQ(status(call("POST", "/v1/completions", json{{"model", "kjv"}, {"prompt", ids}}.dump())), 400);
  ids.erase(ids.begin() + 10, ids.end());
  auto too_long = json{{"model", "kjv"}, {"prompt", ids}, {"max_tokens", ctx}};
  EXPECT_EQ(status(call("POST", "/v1/completions", too_long.dump())), 400);
  EXPECT_EQ(status(call("POST", "/v1/completions", json{{"model", "kjv"}, {"prompt", {1, 99999}}}.dump())), 400);
  // Chat without max_tokens: up to the context's end.
  auto chat = call("POST", "/v1/chat/completions", R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}]})");
  ASSERT_EQ(status(chat), 0);
  EXPECT_EQ(req(chat).prompt.size() + req(chat).max_tokens, ctx);
}

TEST_F(ApiService, ConcurrencyIsBoundedWith429) {
  const std::string body = R"({"model":"kjv","prompt":"In the beginning","max_tokens":4})";
  auto a = call("POST", "/v1/completions", body);
  auto b = call("POST", "/v1/completions", body);
  ASSERT_EQ(status(a), 0);
  ASSERT_EQ(status(b), 0);
  EXPECT_EQ(api_->inflight(), 2u);
  auto c = call("POST", "/v1/completions", body);
  ASSERT_EQ(status(c), 429);
  EXPECT_EQ(std::get<http_reply>(c).headers.at(0), (std::pair<std::string, std::string>{"Retry-After", "1"}));
  a = http_reply{};  // the first job ends: its slot is free
  EXPECT_EQ(api_->inflight(), 1u);
  EXPECT_EQ(status(call("POST", "/v1/completions", body)), 0);
}

// Each choice (prompts × n) is a generation and takes a slot: a request whose choices the
// free slots cannot all hold gets the 429 and takes none; one that could never fit is a 400.
TEST_F(ApiService, EachChoiceTakesASlotAllOrNone) {
  auto two = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"In the","n":2})");
  ASSERT_EQ(status(two), 0);
  EXPECT_EQ(job(two).requests.size(), 2u);
  EXPECT_EQ(api_->inflight(), 2u);
  EXPECT_EQ(status(call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x"})")), 429);
  two = http_reply{};
  EXPECT_EQ(api_->inflight(), 0u);
  // One slot taken: 2 choices (n = 2, or a batch of 2 prompts, or chat's n = 2) do not fit.
  auto one = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x"})");
  ASSERT_EQ(status(one), 0);
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v1/completions", R"({"model":"kjv","prompt":"In the","n":2})"},
           {"/v1/completions", R"({"model":"kjv","prompt":["In the","And"]})"},
           {"/v1/chat/completions", R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"n":2})"}}) {
    auto full = call("POST", path, body);
    ASSERT_EQ(status(full), 429) << body;
    EXPECT_EQ(std::get<http_reply>(full).headers.at(0), (std::pair<std::string, std::string>{"Retry-After", "1"}));
    EXPECT_EQ(json::parse(std::get<http_reply>(full).body)["error"]["message"],
              "the server is at its limit of 2 concurrent requests (this request's 2 choices need as many); retry shortly");
    EXPECT_EQ(api_->inflight(), 1u) << "a refused request took a slot: " << body;
  }
  one = http_reply{};
  // More choices than the bound: never servable, so a 400 rather than a 429 to retry.
  auto three = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","n":3})");
  ASSERT_EQ(status(three), 400);
  EXPECT_EQ(json::parse(std::get<http_reply>(three).body)["error"]["message"],
            "the request asks for 3 choices; this server runs at most 2 generations at once");
  EXPECT_EQ(api_->inflight(), 0u);
}

// Choice j of every prompt samples with seed S_j: S_0 the request's seed (the client's, or
// the one drawn for a seedless request), S_j (j >= 1) SplitMix64's j-th output from S_0.
// Choices have their own consecutive ids, in index order (prompt index * n + j).
TEST_F(ApiService, ChoicesHaveTheirOwnIdsAndSeedsDerivedFromTheRequestsSeed) {
  // SplitMix64's reference outputs from state 0, and from 42.
  EXPECT_EQ(choice_seed(0, 1), 0xe220a8397b1dcdafull);
  EXPECT_EQ(choice_seed(0, 2), 0x6e789e6aa1b965f4ull);
  EXPECT_EQ(choice_seed(42, 0), 42u);
  EXPECT_EQ(choice_seed(42, 1), 13679457532755275413ull);
  EXPECT_EQ(choice_seed(42, 2), 2949826092126892291ull);

  api_options o;
  o.model_name = "kjv";
  o.max_concurrent = 16;
  served_model m = kjv_tiny("kjv");
  api_service api(o, m.tok, m.chat, cfg_, mesh_, metrics_);
  auto post = [&](const std::string& body) { return api.handle("POST", "/v1/completions", "", body); };
  auto t = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
  const auto in_the = (*t)->encode("In the", true), and_god = (*t)->encode("And God", true);
  uint64_t first_round_id = 0;
  for (int round = 0; round < 2; ++round) {  // the same request twice: the same seeds
    auto a = post(R"({"model":"kjv","prompt":["In the","And God"],"n":3,"seed":42,"max_tokens":5})");
    ASSERT_EQ(status(a), 0);
    const auto& reqs = job(a).requests;
    ASSERT_EQ(reqs.size(), 6u);
    std::vector<uint64_t> seeds;
    for (size_t k = 0; k < reqs.size(); ++k) {
      EXPECT_EQ(reqs[k].id, reqs[0].id + k);
      EXPECT_EQ(reqs[k].prompt, k < 3 ? in_the : and_god) << k;
      EXPECT_EQ(reqs[k].max_tokens, 5u);
      seeds.push_back(reqs[k].sampling.seed);
    }
    EXPECT_EQ(seeds, (std::vector<uint64_t>{42u, 13679457532755275413ull, 2949826092126892291ull, 42u,
                                            13679457532755275413ull, 2949826092126892291ull}));
    if (round == 0) {
      first_round_id = reqs[0].id;
    } else {
      EXPECT_EQ(reqs[0].id, first_round_id + 6);  // new ids, the same seeds
    }
  }
  // A prompt's first choice is the request an n = 1 request with that prompt and seed makes.
  auto single = post(R"({"model":"kjv","prompt":"And God","seed":42,"max_tokens":5})");
  auto batched = post(R"({"model":"kjv","prompt":["In the","And God"],"n":2,"seed":42,"max_tokens":5})");
  ASSERT_EQ(status(single), 0);
  ASSERT_EQ(status(batched), 0);
  const auto& one = job(single).requests.at(0);
  const auto& third = job(batched).requests.at(2);  // prompt 1, j = 0
  EXPECT_EQ(third.prompt, one.prompt);
  EXPECT_EQ(third.sampling.seed, one.sampling.seed);
  EXPECT_EQ(third.max_tokens, one.max_tokens);
  // Seedless: S_0 is drawn (as for any request), the others follow from it; chat alike.
  auto drawn = post(R"({"model":"kjv","prompt":[1,2],"n":2})");
  ASSERT_EQ(status(drawn), 0);
  const uint64_t s0 = job(drawn).requests.at(0).sampling.seed;
  EXPECT_EQ(job(drawn).requests.at(1).sampling.seed, choice_seed(s0, 1));
  EXPECT_NE(choice_seed(s0, 1), s0);
  auto chat = api.handle("POST", "/v1/chat/completions", "",
                         R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"n":2,"seed":7})");
  ASSERT_EQ(status(chat), 0);
  ASSERT_EQ(job(chat).requests.size(), 2u);
  EXPECT_EQ(job(chat).requests[0].prompt, job(chat).requests[1].prompt);
  EXPECT_EQ(job(chat).requests[0].sampling.seed, 7u);
  EXPECT_EQ(job(chat).requests[1].sampling.seed, choice_seed(7, 1));
}

// best_of: best_of candidates per prompt, each a generation with its seed S_j and a slot,
// their log-probabilities computed (the group ranks by them) whether or not the client asked.
TEST_F(ApiService, BestOfRunsItsCandidatesWithLogprobs) {
  auto b = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","best_of":2,"seed":42})");
  ASSERT_EQ(status(b), 0);
  ASSERT_EQ(job(b).requests.size(), 2u);
  EXPECT_EQ(api_->inflight(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(job(b).requests[k].sampling.logprobs, 0) << k;
    EXPECT_EQ(job(b).requests[k].sampling.seed, choice_seed(42, k)) << k;
  }
  b = http_reply{};
  auto shown = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","best_of":2,"logprobs":3})");
  ASSERT_EQ(status(shown), 0);
  EXPECT_EQ(job(shown).requests.at(1).sampling.logprobs, 3);
  shown = http_reply{};
  auto plain = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","n":2,"best_of":2})");
  ASSERT_EQ(status(plain), 0);
  EXPECT_EQ(job(plain).requests.at(1).sampling.logprobs, -1);  // best_of = n: nothing to rank
  plain = http_reply{};
  EXPECT_EQ(status(call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","best_of":3})")), 400);
  auto streamed = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","best_of":2,"stream":true})");
  ASSERT_EQ(status(streamed), 400);
  EXPECT_NE(std::get<http_reply>(streamed).body.find("cannot be streamed"), std::string::npos);
}

// Each prompt of a batch is checked against the context on its own, and its error names it;
// without max_tokens, each gets what its own context leaves.
TEST_F(ApiService, EachPromptOfABatchIsCheckedAgainstTheContext) {
  const size_t ctx = cfg_.max_positions;
  std::string long_ids = "[5";
  for (size_t i = 1; i < ctx - 10; ++i) long_ids += ",5";
  long_ids += "]";
  const std::string batch = R"({"model":"kjv","prompt":[[1,2],)" + long_ids + "]";
  auto fit = call("POST", "/v1/completions", batch + "}");
  ASSERT_EQ(status(fit), 0);
  EXPECT_EQ(job(fit).requests.at(0).max_tokens, 16u);
  EXPECT_EQ(job(fit).requests.at(1).max_tokens, 10u);  // what the context leaves it
  fit = http_reply{};
  auto over = call("POST", "/v1/completions", batch + R"(,"max_tokens":11})");
  ASSERT_EQ(status(over), 400);
  EXPECT_EQ(json::parse(std::get<http_reply>(over).body)["error"]["message"],
            "prompt[1]: the prompt (" + std::to_string(ctx - 10) + " tokens) plus max_tokens (11) exceeds this model's context of " +
                std::to_string(ctx));
  auto vocab = call("POST", "/v1/completions", R"({"model":"kjv","prompt":[[1,99999],[2]]})");
  ASSERT_EQ(status(vocab), 400);
  EXPECT_EQ(json::parse(std::get<http_reply>(vocab).body)["error"]["message"],
            "prompt[0]: prompt token id 99999 is outside the vocabulary of 4096");
  auto empty = call("POST", "/v1/completions", R"({"model":"kjv","prompt":["a",""]})");
  ASSERT_EQ(status(empty), 400);
  EXPECT_EQ(json::parse(std::get<http_reply>(empty).body)["error"]["message"], "'prompt[1]' is empty");
  EXPECT_EQ(api_->inflight(), 0u);
}

// echo: each choice's text begins with its prompt's text — a string as sent, token ids decoded
// with their special tokens' text (HF's decode defaults, as vLLM echoes them).
TEST_F(ApiService, EchoPrependsEachChoicesPromptText) {
  auto t = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
  std::vector<int32_t> with_bos{4094};  // <|begin_of_text|>, this model's BOS
  for (int32_t id : (*t)->encode("And God", false)) with_bos.push_back(id);
  const auto gen = (*t)->encode(" said", false);
  ASSERT_EQ(gen.size(), 1u);
  auto run = [&](const json& prompt, bool streaming) {
    auto o = call("POST", "/v1/completions",
                  json{{"model", "kjv"}, {"prompt", prompt}, {"echo", true}, {"stream", streaming}}.dump());
    std::string out;
    if (status(o) != 0) return std::get<http_reply>(o).body;
    for (const auto& r : job(o).requests) {
      actors::token_msg last;
      last.id = r.id;
      last.token = gen[0];
      last.finish = actors::finish_reason::length;
      out += job(o).output->on_message(last);
    }
    return streaming ? out : job(o).output->reply().body;
  };
  auto texts = json::parse(run(json::array({"In the beginning", "And"}), false));
  ASSERT_EQ(texts["choices"].size(), 2u) << texts;
  EXPECT_EQ(texts["choices"][0]["text"], "In the beginning said");
  EXPECT_EQ(texts["choices"][1]["text"], "And said");
  EXPECT_EQ(texts["usage"]["completion_tokens"], 2);  // the echoed prompt is not output
  auto ids = json::parse(run(with_bos, false));
  ASSERT_EQ(ids["choices"].size(), 1u) << ids;
  EXPECT_EQ(ids["choices"][0]["text"], "<|begin_of_text|>And God said");
  // Streamed: the prompt's text rides on the choice's first chunk.
  const std::string sse = run("In the", true);
  ASSERT_EQ(sse.rfind("data: {", 0), 0u) << sse;
  const auto first = json::parse(sse.substr(6, sse.find("\n\n") - 6));
  EXPECT_EQ(first["choices"][0]["text"], "In the said") << sse;
}

TEST_F(ApiService, RequestsCarryTokensSeedsAndEos) {
  auto a = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"In the beginning","max_tokens":4,"seed":42})");
  ASSERT_EQ(status(a), 0);
  auto t = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
  EXPECT_EQ(req(a).prompt, (*t)->encode("In the beginning", true));
  EXPECT_EQ(req(a).sampling.seed, 42u);
  EXPECT_EQ(req(a).max_tokens, 4u);
  EXPECT_EQ(req(a).eos_ids, cfg_.eos_ids);
  a = http_reply{};
  // Seedless requests get different seeds; ignore_eos drops the EOS ids.
  auto b = call("POST", "/v1/completions", R"({"model":"kjv","prompt":[1,2,3],"ignore_eos":true})");
  auto c = call("POST", "/v1/completions", R"({"model":"kjv","prompt":[1,2,3]})");
  ASSERT_EQ(status(b), 0);
  ASSERT_EQ(status(c), 0);
  EXPECT_NE(req(b).sampling.seed, req(c).sampling.seed);
  EXPECT_TRUE(req(b).eos_ids.empty());
  EXPECT_EQ(req(b).prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(req(b).max_tokens, 16u);  // OpenAI's default for completions
}

TEST_F(ApiService, TheModelsGenerationConfigSamplingIsTheDefault) {
  // Without generation_config sampling, OpenAI's defaults.
  auto plain = call("POST", "/v1/completions", R"({"model":"kjv","prompt":[1,2]})");
  ASSERT_EQ(status(plain), 0);
  EXPECT_EQ(req(plain).sampling.temperature, 1.0f);
  EXPECT_EQ(req(plain).sampling.top_p, 1.0f);
  EXPECT_EQ(req(plain).sampling.top_k, 0);
  // With it (Llama-3-Instruct's 0.6 / 0.9, and a top_k): fields left out take the model's values.
  model::model_config c = cfg_;
  c.sampling.temperature = 0.6f;
  c.sampling.top_p = 0.9f;
  c.sampling.top_k = 40;
  api_options o;
  o.model_name = "kjv";
  auto t = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
  api_service api(o, *t, std::nullopt, c, mesh_, metrics_);
  auto d = api.handle("POST", "/v1/completions", "", R"({"model":"kjv","prompt":[1,2]})");
  ASSERT_EQ(status(d), 0);
  EXPECT_EQ(req(d).sampling.temperature, 0.6f);
  EXPECT_EQ(req(d).sampling.top_p, 0.9f);
  EXPECT_EQ(req(d).sampling.top_k, 40);
  // A request's own values win, greedy included.
  auto e = api.handle("POST", "/v1/completions", "", R"({"model":"kjv","prompt":[1,2],"temperature":0,"top_p":1,"top_k":0})");
  ASSERT_EQ(status(e), 0);
  EXPECT_EQ(req(e).sampling.temperature, 0.0f);
  EXPECT_EQ(req(e).sampling.top_p, 1.0f);
  EXPECT_EQ(req(e).sampling.top_k, 0);
}

TEST_F(ApiService, StopTokenIdsEndGenerationAsEosIdsDoEvenWithIgnoreEos) {
  ASSERT_FALSE(cfg_.eos_ids.empty());
  auto a = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"In the","stop_token_ids":[17,4095,5]})");
  ASSERT_EQ(status(a), 0);
  std::vector<int32_t> want = cfg_.eos_ids;
  for (int32_t t : {17, 4095, 5}) {
    if (std::find(want.begin(), want.end(), t) == want.end()) want.push_back(t);
  }
  EXPECT_EQ(req(a).eos_ids, want);  // the model's EOS ids, then the request's, once each
  a = http_reply{};
  // vLLM's ignore_eos drops the model's EOS, not the stop ids the client asked for.
  auto b = call("POST", "/v1/chat/completions",
                R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"ignore_eos":true,"stop_token_ids":[9]})");
  ASSERT_EQ(status(b), 0);
  EXPECT_EQ(req(b).eos_ids, (std::vector<int32_t>{9}));
  b = http_reply{};
  // Ids outside the vocabulary are refused, naming the field.
  const std::string out = R"({"model":"kjv","prompt":"x","stop_token_ids":[1,)" + std::to_string(cfg_.vocab) + "]}";
  auto c = call("POST", "/v1/completions", out);
  ASSERT_EQ(status(c), 400);
  EXPECT_NE(std::get<http_reply>(c).body.find("'stop_token_ids'"), std::string::npos) << std::get<http_reply>(c).body;
  const std::string last = R"({"model":"kjv","prompt":"x","stop_token_ids":[)" + std::to_string(cfg_.vocab - 1) + "]}";
  EXPECT_EQ(status(call("POST", "/v1/completions", last)), 0);
}

TEST_F(ApiService, MinPGoesIntoTheRequest) {
  auto a = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","min_p":0.05})");
  ASSERT_EQ(status(a), 0);
  EXPECT_EQ(req(a).sampling.min_p, 0.05f);
  a = http_reply{};
  auto b = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x"})");
  ASSERT_EQ(status(b), 0);
  EXPECT_EQ(req(b).sampling.min_p, 0.0f);
  b = http_reply{};
  EXPECT_EQ(status(call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","min_p":2})")), 400);
}

TEST_F(ApiService, LogitBiasGoesIntoTheRequestWithinTheVocabulary) {
  auto a = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","logit_bias":{"5":-100,"0017":2.5}})");
  ASSERT_EQ(status(a), 0);
  const std::vector<kernels::token_bias> want{{5, -100.0f}, {17, 2.5f}};
  auto got = req(a).logit_bias;
  std::sort(got.begin(), got.end(), [](const auto& x, const auto& y) { return x.id < y.id; });
  EXPECT_EQ(got, want);
  a = http_reply{};
  auto c = call("POST", "/v1/chat/completions",
                R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"logit_bias":{"9":1}})");
  ASSERT_EQ(status(c), 0);
  EXPECT_EQ(req(c).logit_bias, (std::vector<kernels::token_bias>{{9, 1.0f}}));
  c = http_reply{};
  const std::string outside = R"({"model":"kjv","prompt":"x","logit_bias":{")" + std::to_string(cfg_.vocab) + R"(":1}})";
  auto o = call("POST", "/v1/completions", outside);
  ASSERT_EQ(status(o), 400);
  EXPECT_NE(std::get<http_reply>(o).body.find("outside the vocabulary"), std::string::npos) << std::get<http_reply>(o).body;
  for (const char* bad : {R"({"x":1})", R"({"-1":1})", R"({"5":101})", R"({"5":"1"})", R"([5])", R"({"5":1,"05":2})",
                          R"({"99999999999":1})"}) {
    auto r = call("POST", "/v1/completions", std::string(R"({"model":"kjv","prompt":"x","logit_bias":)") + bad + "}");
    ASSERT_EQ(status(r), 400) << bad;
    EXPECT_NE(std::get<http_reply>(r).body.find("'logit_bias'"), std::string::npos) << std::get<http_reply>(r).body;
  }
}

TEST_F(ApiService, UnsupportedFieldsAnswer400NamingThem) {
  auto r = call("POST", "/v1/chat/completions",
                R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"best_of":3})");  // completions' field
  ASSERT_EQ(status(r), 400);
  auto j = json::parse(std::get<http_reply>(r).body);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_NE(j["error"]["message"].get<std::string>().find("'best_of' is not supported"), std::string::npos) << j;
  // Tools are served on chat (structured_output_test.cpp), refused on the legacy endpoint.
  auto c = call("POST", "/v1/completions",
                R"({"model":"kjv","prompt":"Hi","tools":[{"type":"function","function":{"name":"f"}}]})");
  ASSERT_EQ(status(c), 400);
  EXPECT_NE(std::get<http_reply>(c).body.find("'tools' is not supported on /v1/completions"), std::string::npos);
  auto t = call("POST", "/v1/chat/completions",
                R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"tools":[{"type":"function"}]})");
  ASSERT_EQ(status(t), 400);
  EXPECT_NE(std::get<http_reply>(t).body.find("'tools[0].function' must be an object"), std::string::npos);
  // The neutral values a client sends by default are served.
  EXPECT_EQ(status(call("POST", "/v1/chat/completions",
                        R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"logprobs":false,
                            "presence_penalty":0,"frequency_penalty":0,"repetition_penalty":1,"min_tokens":0,
                            "top_logprobs":0,"min_p":0,"logit_bias":{}})")),
            0);
}

// The penalties and min_tokens reach the mesh request's sampling on both endpoints (neutral
// when left out); out of range they are a 400 naming the field; min_tokens is checked against
// the max_tokens the context leaves, and the job's stream looks for stop strings only after it.
TEST_F(ApiService, PenaltiesAndMinTokensGoIntoTheRequest) {
  auto a = call("POST", "/v1/completions",
                R"({"model":"kjv","prompt":"x","max_tokens":8,"presence_penalty":0.5,"frequency_penalty":-1.5,
                    "repetition_penalty":1.3,"min_tokens":6})");
  ASSERT_EQ(status(a), 0);
  EXPECT_EQ(req(a).sampling.presence_penalty, 0.5f);
  EXPECT_EQ(req(a).sampling.frequency_penalty, -1.5f);
  EXPECT_EQ(req(a).sampling.repetition_penalty, 1.3f);
  EXPECT_EQ(req(a).sampling.min_tokens, 6);
  EXPECT_EQ(req(a).max_tokens, 8u);
  a = http_reply{};  // free the concurrency slot
  auto b = call("POST", "/v1/chat/completions",
                R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"presence_penalty":-2,
                    "frequency_penalty":2,"repetition_penalty":0.8,"min_tokens":3,"max_completion_tokens":3})");
  ASSERT_EQ(status(b), 0);
  EXPECT_EQ(req(b).sampling.presence_penalty, -2.0f);
  EXPECT_EQ(req(b).sampling.frequency_penalty, 2.0f);
  EXPECT_EQ(req(b).sampling.repetition_penalty, 0.8f);
  EXPECT_EQ(req(b).sampling.min_tokens, 3);
  b = http_reply{};
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    const std::string body = std::string(path) == "/v1/completions"
                                 ? R"({"model":"kjv","prompt":"x"})"
                                 : R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}]})";
    auto n = call("POST", path, body);
    ASSERT_EQ(status(n), 0) << path;
    EXPECT_EQ(req(n).sampling.presence_penalty, 0.0f) << path;
    EXPECT_EQ(req(n).sampling.frequency_penalty, 0.0f) << path;
    EXPECT_EQ(req(n).sampling.repetition_penalty, 1.0f) << path;
    EXPECT_EQ(req(n).sampling.min_tokens, 0) << path;
  }
  const std::pair<std::string, std::string> bad[] = {
      {R"({"model":"kjv","prompt":"x","presence_penalty":2.5})", "'presence_penalty' must be a number between -2 and 2"},
      {R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"frequency_penalty":-3})",
       "'frequency_penalty' must be a number between -2 and 2"},
      {R"({"model":"kjv","prompt":"x","repetition_penalty":0})",
       "'repetition_penalty' must be a number greater than 0 and at most 10"},
      {R"({"model":"kjv","prompt":"x","max_tokens":4,"min_tokens":5})",
       "'min_tokens' (5) must be at most 'max_tokens' (4)"},
  };
  for (const auto& [body, needle] : bad) {
    auto e = call("POST", body.find("messages") != std::string::npos ? "/v1/chat/completions" : "/v1/completions", body);
    ASSERT_EQ(status(e), 400) << body;
    auto ej = json::parse(std::get<http_reply>(e).body);
    EXPECT_EQ(ej["error"]["type"], "invalid_request_error");
    EXPECT_NE(ej["error"]["message"].get<std::string>().find(needle), std::string::npos) << body << " -> " << ej;
  }
  // Without max_tokens, the context may leave fewer tokens than min_tokens (vLLM's rule
  // against the effective max_tokens): 3 left after a prompt of ctx - 3 ids.
  const size_t ctx = cfg_.max_positions;
  json ids = json::array();
  for (size_t i = 0; i + 3 < ctx; ++i) ids.push_back(5);
  auto fits = call("POST", "/v1/completions", json{{"model", "kjv"}, {"prompt", ids}, {"min_tokens", 3}}.dump());
  ASSERT_EQ(status(fits), 0);
  EXPECT_EQ(req(fits).max_tokens, 3u);
  EXPECT_EQ(req(fits).sampling.min_tokens, 3);
  fits = http_reply{};
  auto over = call("POST", "/v1/completions", json{{"model", "kjv"}, {"prompt", ids}, {"min_tokens", 4}}.dump());
  ASSERT_EQ(status(over), 400);
  EXPECT_EQ(json::parse(std::get<http_reply>(over).body)["error"]["message"],
            "'min_tokens' (4) must be at most the 3 tokens this model's context of " + std::to_string(ctx) +
                " leaves after the prompt (" + std::to_string(ctx - 3) + " tokens)");
  auto chat_over = call("POST", "/v1/chat/completions",
                        json{{"model", "kjv"},
                             {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                             {"min_tokens", ctx}}
                            .dump());
  ASSERT_EQ(status(chat_over), 400);
  EXPECT_NE(std::get<http_reply>(chat_over).body.find("leaves after the prompt"), std::string::npos)
      << std::get<http_reply>(chat_over).body;

  // The job's stream: a stop string in the first min_tokens tokens' text does not end it (vLLM's
  // detokenizer); the same one after them does.
  auto t = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
  ASSERT_TRUE(t.ok());
  const std::vector<int32_t> first = (*t)->encode("the end", false);
  std::vector<int32_t> out = first;
  for (int32_t id : (*t)->encode(" the end", false)) out.push_back(id);
  const std::string whole = (*t)->decoder().decode(out);
  ASSERT_EQ(whole, "the end the end");
  for (size_t min_tokens : {size_t{0}, first.size()}) {
    auto s = call("POST", "/v1/completions",
                  json{{"model", "kjv"}, {"prompt", "x"}, {"max_tokens", 16}, {"stop", "the"},
                       {"min_tokens", min_tokens}}.dump());
    ASSERT_EQ(status(s), 0);
    for (size_t i = 0; i < out.size() && !job(s).output->done(); ++i) {
      job(s).output->on_message(actors::token_msg{req(s).id, out[i], actors::finish_reason::none, false, {}, {}, {}});
    }
    ASSERT_TRUE(job(s).output->done()) << "min_tokens " << min_tokens;
    auto r = json::parse(job(s).output->reply().body)["choices"][0];
    EXPECT_EQ(r["finish_reason"], "stop");
    EXPECT_EQ(r["text"], min_tokens == 0 ? "" : "the end ") << "min_tokens " << min_tokens;
  }
}

// logprobs reach the mesh request (sampling.logprobs) and the job's stream, which renders them;
// out of range they are a 400 naming the field.
TEST_F(ApiService, LogprobsGoIntoTheRequestAndItsStream) {
  auto a = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","logprobs":3})");
  ASSERT_EQ(status(a), 0);
  EXPECT_EQ(req(a).sampling.logprobs, 3);
  auto b = call("POST", "/v1/chat/completions",
                R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":2})");
  ASSERT_EQ(status(b), 0);
  EXPECT_EQ(req(b).sampling.logprobs, 2);
  b = http_reply{};  // free the concurrency slot
  auto none = call("POST", "/v1/chat/completions", R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}]})");
  ASSERT_EQ(status(none), 0);
  EXPECT_EQ(req(none).sampling.logprobs, -1);
  none = http_reply{};
  // The stream renders what the mesh sends, the 3 alternatives asked for (not a 4th).
  actors::token_msg t{req(a).id, 5, actors::finish_reason::length, false, {}, {}, {}};
  t.logprobs = kernels::token_logprobs{-1.5f, {{7, -0.5f}, {9, -1.0f}, {5, -1.5f}, {11, -2.0f}}};
  job(a).output->on_message(t);
  ASSERT_TRUE(job(a).output->done());
  auto lp = json::parse(job(a).output->reply().body)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["token_logprobs"], json::parse("[-1.5]"));
  EXPECT_EQ(lp["top_logprobs"][0].size(), 3u);  // ids 5 (chosen, also among the 3), 7 and 9
  auto c = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"x","logprobs":21})");
  ASSERT_EQ(status(c), 400);
  EXPECT_NE(std::get<http_reply>(c).body.find("'logprobs' must be an integer between 0 and 20"), std::string::npos)
      << std::get<http_reply>(c).body;
}

TEST_F(ApiService, ChatPromptsComeFromTheTemplateWithoutExtraSpecialTokens) {
  auto a = call("POST", "/v1/chat/completions",
                R"({"model":"kjv","messages":[{"role":"user","content":"Hi"}],"max_tokens":3})");
  ASSERT_EQ(status(a), 0);
  auto t = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
  EXPECT_EQ(req(a).prompt, (*t)->encode("user: Hi\nassistant:", false));
}

}  // namespace
}  // namespace llmesh::gateway

namespace llmesh::gateway {
namespace {

// Two models behind one gateway: "kjv" (the tiny model, with its chat template) and "short"
// (the same tokenizer, a 64-token context, generation_config sampling, no chat template).
class TwoModels : public ::testing::Test {
 protected:
  void SetUp() override {
    served_model kjv = kjv_tiny("kjv");
    ASSERT_TRUE(kjv.tok);
    kjv_cfg_ = kjv.cfg;
    std::vector<served_model> models{kjv};
    model::model_config short_cfg = kjv.cfg;
    short_cfg.max_positions = 64;
    short_cfg.sampling.temperature = 0.5f;
    short_cfg.eos_ids = {7};
    models.push_back({"short", kjv.tok, std::nullopt, short_cfg});
    api_ = std::make_unique<api_service>(api_options{}, std::move(models), mesh_, metrics_);
  }
  api_outcome post(const std::string& path, const std::string& body) { return api_->handle("POST", path, "", body); }
  static int status(const api_outcome& o) {
    return std::holds_alternative<http_reply>(o) ? std::get<http_reply>(o).status : 0;
  }
  static std::string body(const api_outcome& o) { return std::get<http_reply>(o).body; }
  static generation_job& job(api_outcome& o) { return std::get<generation_job>(o); }
  /// The mesh request of a job's first (for n = 1: only) choice.
  static actors::replica_request& req(api_outcome& o) { return job(o).requests.at(0); }

  fake_mesh mesh_;
  actors::metrics_registry metrics_;
  model::model_config kjv_cfg_;
  std::unique_ptr<api_service> api_;
};

TEST_F(TwoModels, ModelsListsBothInOrderWithTheirContexts) {
  auto r = api_->handle("GET", "/v1/models", "", "");
  ASSERT_EQ(status(r), 200);
  auto j = json::parse(body(r));
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][0]["id"], "kjv");
  EXPECT_EQ(j["data"][0]["max_model_len"], kjv_cfg_.max_positions);
  EXPECT_EQ(j["data"][1]["id"], "short");
  EXPECT_EQ(j["data"][1]["max_model_len"], 64);
  EXPECT_EQ(api_->model_names(), (std::vector<std::string>{"kjv", "short"}));
}

TEST_F(TwoModels, EachRequestCarriesItsModelAndThatModelsRules) {
  auto a = post("/v1/completions", R"({"model":"kjv","prompt":"In the beginning"})");
  ASSERT_EQ(status(a), 0);
  EXPECT_EQ(req(a).model, "kjv");
  EXPECT_EQ(req(a).eos_ids, kjv_cfg_.eos_ids);
  EXPECT_EQ(req(a).sampling.temperature, 1.0f);
  a = http_reply{};
  auto b = post("/v1/completions", R"({"model":"short","prompt":"In the beginning"})");
  ASSERT_EQ(status(b), 0);
  EXPECT_EQ(req(b).model, "short");
  EXPECT_EQ(req(b).eos_ids, (std::vector<int32_t>{7}));
  EXPECT_EQ(req(b).sampling.temperature, 0.5f);  // its generation_config, not the other's
  ASSERT_NE(job(b).tok, nullptr);
  b = http_reply{};
  // The streamed chunks name the model the client asked for.
  auto s = post("/v1/completions", R"({"model":"short","prompt":[1,2],"stream":true})");
  ASSERT_EQ(status(s), 0);
  const std::string sse = job(s).output->on_message(actors::token_msg{req(s).id, 5, actors::finish_reason::length, false, {}, {}, {}});
  EXPECT_NE(sse.find(R"("model":"short")"), std::string::npos) << sse;
  s = http_reply{};
  // Context limits are per model: 70 tokens fit kjv's context, not short's 64.
  std::string ids = "[1";
  for (int i = 1; i < 70; ++i) ids += ",1";
  ids += "]";
  EXPECT_EQ(status(post("/v1/completions", R"({"model":"kjv","max_tokens":4,"prompt":)" + ids + "}")), 0);
  auto over = post("/v1/completions", R"({"model":"short","max_tokens":4,"prompt":)" + ids + "}");
  ASSERT_EQ(status(over), 400);
  EXPECT_NE(body(over).find("context is 64"), std::string::npos) << body(over);
}

TEST_F(TwoModels, UnknownModelsAndMissingTemplatesAreNamed) {
  auto r = post("/v1/completions", R"({"model":"llama","prompt":"x"})");
  ASSERT_EQ(status(r), 404);
  EXPECT_NE(body(r).find("'llama' does not exist; this server serves 'kjv', 'short'"), std::string::npos) << body(r);
  const std::string chat = R"("messages":[{"role":"user","content":"Hi"}]})";
  auto c = post("/v1/chat/completions", R"({"model":"kjv",)" + chat);
  ASSERT_EQ(status(c), 0);
  EXPECT_EQ(req(c).model, "kjv");
  c = http_reply{};
  auto n = post("/v1/chat/completions", R"({"model":"short",)" + chat);
  ASSERT_EQ(status(n), 400);
  EXPECT_NE(body(n).find("'short' has no chat template"), std::string::npos) << body(n);
}

TEST_F(TwoModels, TheNativeApiChecksTheModelsOwnReplicas) {
  mesh_.ready_of["short"] = 0;
  sampling_input none;
  auto a = api_->native_generate("", "short", std::nullopt, {1, 2}, none, {});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.err().code, errc::replica_unavailable);
  EXPECT_NE(a.err().message.find("'short'"), std::string::npos) << a.err().message;
  auto b = api_->native_generate("", "kjv", std::string("In the"), {}, none, {});
  ASSERT_TRUE(b.ok()) << b.err().message;
  EXPECT_EQ(b->requests.at(0).model, "kjv");
  auto c = api_->native_generate("", "nope", std::nullopt, {1}, none, {});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.err().code, errc::not_found);
}

// vLLM's tokenizer endpoints: /tokenize gives the ids a completion or chat request would run
// (prompt_token_ids), /detokenize the text back; both behind the API key, bad input a 400.
TEST_F(ApiService, TokenizeGivesTheIdsARequestWouldRunAndDetokenizeTheText) {
  auto body_of = [&](const api_outcome& o) { return json::parse(std::get<http_reply>(o).body); };
  auto t = call("POST", "/tokenize", R"({"model":"kjv","prompt":"In the beginning God created"})");
  ASSERT_EQ(status(t), 200) << std::get<http_reply>(t).body;
  auto j = body_of(t);
  auto c = call("POST", "/v1/completions", R"({"model":"kjv","prompt":"In the beginning God created"})");
  ASSERT_EQ(c.index(), 1u);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), req(c).prompt);
  EXPECT_EQ(j["count"], req(c).prompt.size());
  EXPECT_EQ(j["max_model_len"], cfg_.max_positions);
  EXPECT_FALSE(j.contains("token_strs"));

  // Chat messages through the template, as /v1/chat/completions renders them; no model: the one served.
  const std::string messages = R"([{"role":"user","content":"Who is the LORD?"}])";
  auto tc = body_of(call("POST", "/tokenize", R"({"messages":)" + messages + "}"));
  auto cc = call("POST", "/v1/chat/completions", R"({"model":"kjv","messages":)" + messages + "}");
  ASSERT_EQ(cc.index(), 1u);
  EXPECT_EQ(tc["tokens"].get<std::vector<int32_t>>(), req(cc).prompt);
  auto no_gen = body_of(call("POST", "/tokenize", R"({"messages":)" + messages + R"(,"add_generation_prompt":false})"));
  EXPECT_LT(no_gen["count"].get<size_t>(), tc["count"].get<size_t>());

  // Token strings, then the ids back to the text.
  auto ts = body_of(call("POST", "/tokenize", R"({"prompt":"The LORD is my shepherd","return_token_strs":true})"));
  std::string joined;
  for (const auto& s : ts["token_strs"]) joined += s.get<std::string>();
  EXPECT_NE(joined.find("LORD is my shepherd"), std::string::npos) << joined;
  auto d = call("POST", "/detokenize", json{{"model", "kjv"}, {"tokens", ts["tokens"]}}.dump());
  ASSERT_EQ(status(d), 200);
  EXPECT_NE(body_of(d)["prompt"].get<std::string>().find("The LORD is my shepherd"), std::string::npos);

  // Refusals: the key, the shape, the vocabulary, an unknown model.
  EXPECT_EQ(status(call("POST", "/tokenize", R"({"prompt":"a"})", "")), 401);
  EXPECT_EQ(status(call("POST", "/detokenize", R"({"tokens":[1]})", "Bearer no")), 401);
  EXPECT_EQ(status(call("GET", "/tokenize")), 405);
  for (const char* bad : {R"({})", R"({"prompt":"a","messages":[{"role":"user","content":"b"}]})", R"({"prompt":[1,2]})",
                          R"({"messages":[]})", R"({"prompt":"a","add_special_tokens":"yes"})",
                          R"({"messages":[{"role":"user","content":"a"}],"continue_final_message":true,"add_generation_prompt":true})",
                          "[1]"}) {
    auto r = call("POST", "/tokenize", bad);
    EXPECT_EQ(status(r), 400) << bad;
  }
  for (const char* bad : {R"({})", R"({"tokens":"1 2"})", R"({"tokens":[1,-2]})", R"({"tokens":[1,1e3]})",
                          R"({"tokens":[99999999]})", R"({"tokens":[4294967296]})"}) {
    auto r = call("POST", "/detokenize", bad);
    EXPECT_EQ(status(r), 400) << bad;
    EXPECT_NE(body_of(r)["error"]["message"].get<std::string>().find("tok"), std::string::npos) << bad;
  }
  EXPECT_EQ(status(call("POST", "/tokenize", R"({"model":"other","prompt":"a"})")), 404);
}

// An assistant prefill (continue_final_message): the prompt ends inside the final message, as
// the template renders it, so the model continues that text; /tokenize renders it the same way.
TEST_F(ApiService, ContinueFinalMessagePrefillsTheAnswer) {
  const std::string msgs = R"([{"role":"user","content":"Who is the LORD?"},{"role":"assistant","content":"The LORD is"}])";
  // Each job's prompt, the job dropped at once (this server allows 2 in flight).
  auto prompt_of = [&](const std::string& fields) {
    auto o = call("POST", "/v1/chat/completions", R"({"model":"kjv",)" + fields + R"("messages":)" + msgs + "}");
    EXPECT_EQ(o.index(), 1u) << (o.index() == 0 ? std::get<http_reply>(o).body : "");
    return o.index() == 1 ? req(o).prompt : std::vector<int32_t>{};
  };
  const auto prompt = prompt_of(R"("continue_final_message":true,)");
  const std::string text = kjv_tiny("kjv").tok->decoder().decode(prompt, /*skip_special=*/false);
  ASSERT_GE(text.size(), 11u);
  EXPECT_EQ(text.substr(text.size() - 11), "The LORD is") << text;
  auto t = json::parse(std::get<http_reply>(call("POST", "/tokenize", R"({"continue_final_message":true,"messages":)" + msgs + "}")).body);
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), prompt);
  // Without it the assistant's turn is closed and (by default) a new one opened: other prompts.
  const auto closed = prompt_of("");
  const auto no_turn = prompt_of(R"("add_generation_prompt":false,)");
  EXPECT_GT(closed.size(), no_turn.size());
  EXPECT_GT(no_turn.size(), prompt.size());
  EXPECT_EQ(status(call("POST", "/v1/chat/completions",
                        R"({"model":"kjv","continue_final_message":true,"add_generation_prompt":true,"messages":)" + msgs + "}")),
            400);
}

// vLLM's POST /reset_prefix_cache and SGLang's /flush_cache (GET or POST): the mesh's replicas
// empty their prefix caches; the API key guards them (a reset costs every later request its
// cache hits); a mesh that cannot reset says so.
TEST_F(ApiService, PrefixCacheResetRoutes) {
  auto r = call("POST", "/reset_prefix_cache");
  ASSERT_EQ(status(r), 200);
  EXPECT_EQ(json::parse(std::get<http_reply>(r).body), json({{"status", "ok"}, {"replicas", 3}}));
  EXPECT_EQ(mesh_.resets, 1u);
  EXPECT_EQ(status(call("POST", "/flush_cache")), 200);
  EXPECT_EQ(status(call("GET", "/flush_cache")), 200);
  EXPECT_EQ(mesh_.resets, 3u);
  EXPECT_EQ(status(call("POST", "/reset_prefix_cache", "", "")), 401);
  EXPECT_EQ(status(call("GET", "/flush_cache", "", "Bearer wrong")), 401);
  auto get = call("GET", "/reset_prefix_cache");
  ASSERT_EQ(status(get), 405);
  const auto& headers = std::get<http_reply>(get).headers;
  EXPECT_NE(std::find(headers.begin(), headers.end(), std::pair<std::string, std::string>("Allow", "POST")), headers.end());
  EXPECT_EQ(mesh_.resets, 3u);
  mesh_.can_reset = false;
  auto refused = call("POST", "/reset_prefix_cache");
  EXPECT_EQ(status(refused), 400);
  EXPECT_NE(std::get<http_reply>(refused).body.find("cannot reset its replicas' prefix caches"), std::string::npos);
}

}  // namespace
}  // namespace llmesh::gateway
