// `llmesh serve`'s native API with several choices: n generations are HTTP's choices (each
// streamed with its index, the prefix cache's word and the serving metrics as over HTTP), and
// beam search returns /v1/completions' beams.
#include <capnp/ez-rpc.h>
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "llmesh/schemas/rpc.capnp.h"
#include "reference.hpp"
#include "rpc_client.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

/// Collects each choice's streamed ids.
class choice_sink final : public rpc::TokenSink::Server {
 public:
  explicit choice_sink(std::map<uint32_t, std::vector<int32_t>>& ids) : ids_(ids) {}
  kj::Promise<void> tokens(TokensContext ctx) override {
    for (auto id : ctx.getParams().getIds()) ids_[ctx.getParams().getChoice()].push_back(id);
    return kj::READY_NOW;
  }

 private:
  std::map<uint32_t, std::vector<int32_t>>& ids_;
};

// OpenAI's n over the native API: n generations of the prompt, choice j seeded as over HTTP
// (so each equals /v1/completions' choice j of the same request, and choice 0 the n = 1 call),
// each streamed with its index and returned in `choices` (the top-level fields choice 0's);
// n outside 1..64 is a 400 naming it.
TEST(Rpc, NGenerationsAreHttpsChoicesStreamedWithTheirIndex) {
  server_process s(bin, {"--model", model_dir});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  capnp::EzRpcClient c("127.0.0.1", static_cast<uint>(port));
  const std::vector<int32_t> prompt{1142, 258, 2078, 386, 3345};
  auto setup = [&](rpc::GenerateRequest::Builder r, uint32_t n) {
    r.setModel("kjv-tiny");
    auto ids = r.getPrompt().initIds(static_cast<unsigned>(prompt.size()));
    for (unsigned i = 0; i < prompt.size(); ++i) ids.set(i, prompt[i]);
    r.setMaxTokens(10);
    r.setTemperature(0.9f);
    r.setTopK(40);
    r.setSeed(21);
    r.setHasSeed(true);
    r.setIgnoreEos(true);
    r.setN(n);
  };
  std::map<uint32_t, std::vector<int32_t>> streamed;
  auto req = c.getMain<rpc::Llmesh>().generateRequest();
  setup(req.initRequest(), 3);
  req.setSink(kj::heap<choice_sink>(streamed));
  auto resp = req.send().wait(c.getWaitScope());
  auto r = resp.getResult();
  ASSERT_TRUE(r.getOk()) << r.getErrorMessage().cStr();
  ASSERT_EQ(r.getChoices().size(), 3u);
  nlohmann::json body = {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 10}, {"temperature", 0.9},
                         {"top_k", 40}, {"seed", 21}, {"ignore_eos", true}, {"n", 3}, {"return_token_ids", true}};
  auto http = http_request(s.port(), "POST", "/v1/completions", body.dump());
  ASSERT_EQ(http.status, 200) << http.body;
  const auto hj = nlohmann::json::parse(http.body);
  std::set<std::vector<int32_t>> distinct;
  for (unsigned k = 0; k < 3; ++k) {
    std::vector<int32_t> ids;
    for (auto id : r.getChoices()[k].getTokenIds()) ids.push_back(id);
    EXPECT_EQ(ids.size(), 10u);
    EXPECT_EQ(ids, hj["choices"][k]["token_ids"].get<std::vector<int32_t>>()) << "choice " << k;
    EXPECT_EQ(std::string(r.getChoices()[k].getText().cStr()), hj["choices"][k]["text"].get<std::string>());
    EXPECT_EQ(std::string(r.getChoices()[k].getFinishReason().cStr()), "length");
    EXPECT_EQ(streamed[k], ids) << "choice " << k;
    distinct.insert(ids);
  }
  EXPECT_EQ(distinct.size(), 3u);
  std::vector<int32_t> top;
  for (auto id : r.getTokenIds()) top.push_back(id);
  EXPECT_EQ(top, streamed[0]);
  EXPECT_EQ(r.getPromptTokens(), prompt.size());
  auto one = generate(c, [&](auto q) { setup(q, 1); });
  ASSERT_TRUE(one.ok) << one.message;
  EXPECT_EQ(one.ids, streamed[0]);  // choice 0 samples as the n = 1 call
  {  // The prefix cache: a long prompt's second call finds the first's blocks (choice 0's word).
    std::vector<int32_t> long_prompt;
    for (int i = 0; i < 50; ++i) long_prompt.push_back(200 + i * 7);
    size_t generated = 0;
    auto ask = [&] {
      auto q = c.getMain<rpc::Llmesh>().generateRequest();
      auto in = q.initRequest();
      in.setModel("kjv-tiny");
      auto ids = in.getPrompt().initIds(static_cast<unsigned>(long_prompt.size()));
      for (unsigned i = 0; i < long_prompt.size(); ++i) ids.set(i, long_prompt[i]);
      in.setMaxTokens(2);
      std::map<uint32_t, std::vector<int32_t>> ignored;
      q.setSink(kj::heap<choice_sink>(ignored));
      auto got = q.send().wait(c.getWaitScope());
      EXPECT_TRUE(got.getResult().getOk());
      for (const auto& [choice, ids] : ignored) generated += ids.size();
      return got.getResult().getCachedPromptTokens();
    };
    auto metric = [&](const std::string& name) {
      const std::string body = http_request(s.port(), "GET", "/metrics").body;
      const std::string series = "\n" + name + " ";
      const auto at = body.find(series);
      return at == std::string::npos ? -1.0 : std::atof(body.c_str() + at + series.size());
    };
    auto cached_metric = [&] { return metric("llmesh_prompt_tokens_cached_total"); };
    const double before = cached_metric(), prompt_before = metric("llmesh_prompt_tokens_total"),
                 generated_before = metric("llmesh_generation_tokens_total"),
                 ttft_before = metric("llmesh_time_to_first_token_seconds_count"),
                 e2e_before = metric("llmesh_e2e_request_latency_seconds_count");
    EXPECT_EQ(ask(), 0u);
    const uint32_t cached = ask();
    EXPECT_GT(cached, 0u);
    EXPECT_LT(cached, long_prompt.size());
    EXPECT_EQ(cached_metric() - before, static_cast<double>(cached));
    // Native calls are in the serving metrics as HTTP requests are (the hit rate's denominator too).
    EXPECT_EQ(metric("llmesh_prompt_tokens_total") - prompt_before, 2.0 * static_cast<double>(long_prompt.size()));
    EXPECT_GT(generated, 0u);
    EXPECT_EQ(metric("llmesh_generation_tokens_total") - generated_before, static_cast<double>(generated));
    EXPECT_EQ(metric("llmesh_time_to_first_token_seconds_count") - ttft_before, 2.0);
    EXPECT_EQ(metric("llmesh_e2e_request_latency_seconds_count") - e2e_before, 2.0);
  }

  for (uint32_t bad : {0u, 65u}) {
    auto o = generate(c, [&](auto q) { setup(q, bad); });
    EXPECT_FALSE(o.ok) << bad;
    EXPECT_EQ(o.code, 400);
    EXPECT_NE(o.message.find("'n' must be between 1 and 64"), std::string::npos) << o.message;
  }
  EXPECT_EQ(s.stop(), 0) << s.log();
}

// vLLM's beam search over the native API: the same beams as /v1/completions' (ids, text, finish,
// log-probabilities), best first, a stop string cutting them as over HTTP; each choice's tokens
// reach the sink (when the search ends) with its index; n above 10 is a 400 naming it.
TEST(Rpc, BeamSearchReturnsHttpsBeams) {
  server_process s(bin, {"--model", model_dir, "--replicas", "2"});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  capnp::EzRpcClient c("127.0.0.1", static_cast<uint>(port));
  const std::vector<int32_t> prompt{1142, 258, 2078, 386, 3345};
  for (const bool with_stop : {false, true}) {
    SCOPED_TRACE(with_stop ? "with a stop string" : "plain");
    auto setup = [&](rpc::GenerateRequest::Builder r, uint32_t n) {
      r.setModel("kjv-tiny");
      auto ids = r.getPrompt().initIds(static_cast<unsigned>(prompt.size()));
      for (unsigned i = 0; i < prompt.size(); ++i) ids.set(i, prompt[i]);
      r.setMaxTokens(8);
      r.setN(n);
      r.setUseBeamSearch(true);
      r.setLengthPenalty(0.5f);
      r.setLogprobs(1);
      if (with_stop) r.initStop(1).set(0, "the");
    };
    std::map<uint32_t, std::vector<int32_t>> streamed;
    auto req = c.getMain<rpc::Llmesh>().generateRequest();
    setup(req.initRequest(), 4);
    req.setSink(kj::heap<choice_sink>(streamed));
    auto resp = req.send().wait(c.getWaitScope());
    auto r = resp.getResult();
    ASSERT_TRUE(r.getOk()) << r.getErrorMessage().cStr();
    nlohmann::json body = {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 8}, {"n", 4}, {"use_beam_search", true},
                           {"length_penalty", 0.5}, {"logprobs", 1}, {"return_token_ids", true}};
    if (with_stop) body["stop"] = {"the"};
    auto http = http_request(s.port(), "POST", "/v1/completions", body.dump());
    ASSERT_EQ(http.status, 200) << http.body;
    const auto hj = nlohmann::json::parse(http.body);
    ASSERT_EQ(r.getChoices().size(), hj["choices"].size());
    ASSERT_EQ(r.getChoices().size(), 4u);
    std::set<std::vector<int32_t>> distinct;
    for (unsigned k = 0; k < 4; ++k) {
      const auto ch = r.getChoices()[k];
      const auto& want = hj["choices"][k];
      std::vector<int32_t> ids;
      for (auto id : ch.getTokenIds()) ids.push_back(id);
      EXPECT_EQ(ids, want["token_ids"].get<std::vector<int32_t>>()) << "beam " << k;
      EXPECT_EQ(std::string(ch.getText().cStr()), want["text"].get<std::string>()) << "beam " << k;
      EXPECT_EQ(std::string(ch.getFinishReason().cStr()), want["finish_reason"].get<std::string>()) << "beam " << k;
      ASSERT_EQ(ch.getLogprobs().size(), ids.size());
      for (unsigned i = 0; i < ids.size(); ++i) {
        EXPECT_FLOAT_EQ(ch.getLogprobs()[i].getLogprob(), want["logprobs"]["token_logprobs"][i].get<float>()) << k << "," << i;
        EXPECT_EQ(ch.getLogprobs()[i].getTop().size(), 1u);
      }
      EXPECT_EQ(streamed[k], ids) << "beam " << k;
      distinct.insert(ids);
    }
    EXPECT_EQ(distinct.size(), 4u);
    if (with_stop) {
      bool cut = false;
      for (const auto& ch : hj["choices"]) cut = cut || ch["finish_reason"] == "stop";
      EXPECT_TRUE(cut) << "no beam met the stop string: " << http.body;
    }
    // Width 1 is greedy decoding.
    auto one = generate(c, [&](auto q) {
      setup(q, 1);
      q.setLogprobs(-1);
    });
    auto greedy = generate(c, [&](auto q) {
      setup(q, 1);
      q.setUseBeamSearch(false);
      q.setLogprobs(-1);
      q.setTemperature(0);
    });
    ASSERT_TRUE(one.ok && greedy.ok) << one.message << greedy.message;
    EXPECT_EQ(one.ids, greedy.ids);
    EXPECT_EQ(one.streamed, one.ids);
  }
  auto wide = generate(c, [&](auto q) {
    q.setModel("kjv-tiny");
    q.getPrompt().setText("In the beginning");
    q.setN(11);
    q.setUseBeamSearch(true);
  });
  EXPECT_FALSE(wide.ok);
  EXPECT_EQ(wide.code, 400);
  EXPECT_NE(wide.message.find("'n' must be at most 10 with 'use_beam_search'"), std::string::npos) << wide.message;
  auto nan_penalty = generate(c, [&](auto q) {
    q.setModel("kjv-tiny");
    q.getPrompt().setText("In the beginning");
    q.setUseBeamSearch(true);
    q.setLengthPenalty(std::numeric_limits<float>::infinity());
  });
  EXPECT_EQ(nan_penalty.code, 400) << nan_penalty.message;
  EXPECT_EQ(s.stop(), 0) << s.log();
}

}  // namespace
}  // namespace llmesh::testing
