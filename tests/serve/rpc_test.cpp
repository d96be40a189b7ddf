// `llmesh serve`'s native API (schemas/rpc.capnp) over real TCP with Cap'n Proto's own client:
// greedy tokens equal `llmesh generate`'s, streamed in order to the client's sink and adding up
// to the result; text prompts are tokenized as /v1/completions does; the API key, the model
// name, the context and the concurrency bound give HTTP-like codes; sampling fields and the
// max-tokens limit are checked as over HTTP; a client that drops its call mid-stream frees its slot;
// logprobs stream with their tokens and are /v1/completions' numbers (n choices and beam search:
// rpc_choices_test.cpp).
#include <capnp/ez-rpc.h>
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "../cli/subprocess.hpp"
#include "llmesh/schemas/rpc.capnp.h"
#include "reference.hpp"
#include "rpc_client.hpp"
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

TEST(Rpc, GreedyTokensEqualGenerateAndStreamInOrder) {
  server_process s(bin, {"--model", model_dir, "--api-key", "sesame"});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  capnp::EzRpcClient c("127.0.0.1", static_cast<uint>(port));
  EXPECT_EQ(std::string(c.getMain<rpc::Llmesh>().modelRequest().send().wait(c.getWaitScope()).getName().cStr()), "kjv-tiny");
  auto listed = c.getMain<rpc::Llmesh>().modelsRequest().send().wait(c.getWaitScope());  // owns the message
  auto names = listed.getNames();
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(std::string(names[0].cStr()), "kjv-tiny");

  const std::vector<int32_t> prompt{1142, 258, 2078, 386, 3345};
  const auto want = generate_ids(bin, model_dir, "--prompt-ids " + id_list(prompt), 24);
  auto o = generate(c, [&](auto r) {
    r.setApiKey("sesame");
    r.setModel("kjv-tiny");
    auto ids = r.getPrompt().initIds(static_cast<unsigned>(prompt.size()));
    for (unsigned i = 0; i < prompt.size(); ++i) ids.set(i, prompt[i]);
    r.setMaxTokens(24);
    r.setIgnoreEos(true);
  });
  ASSERT_TRUE(o.ok) << o.code << " " << o.message;
  EXPECT_EQ(o.ids, want);
  EXPECT_EQ(o.streamed, want);  // every token streamed, in order, before the call returned
  EXPECT_EQ(o.streamed_text, o.text);
  EXPECT_EQ(o.finish, "length");
  EXPECT_FALSE(o.text.empty());

  // A text prompt is tokenized as /v1/completions does (BOS and all): the same tokens.
  const auto want_text = generate_ids(bin, model_dir, "--prompt 'In the beginning God created'", 16);
  auto t = generate(c, [&](auto r) {
    r.setApiKey("sesame");
    r.setModel("kjv-tiny");
    r.getPrompt().setText("In the beginning God created");
    r.setMaxTokens(16);
    r.setIgnoreEos(true);
  });
  ASSERT_TRUE(t.ok) << t.message;
  EXPECT_EQ(t.ids, want_text);
}

TEST(Rpc, ErrorsCarryHttpLikeCodesAndADroppedCallFreesItsSlot) {
  server_process s(bin, {"--model", model_dir, "--api-key", "sesame", "--max-concurrent", "1"});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  capnp::EzRpcClient c("127.0.0.1", static_cast<uint>(port));
  auto base = [](auto r) {
    r.setApiKey("sesame");
    r.setModel("kjv-tiny");
    r.getPrompt().setText("The LORD is my shepherd");
    r.setMaxTokens(8);
  };
  auto wrong_key = generate(c, [&](auto r) { base(r), r.setApiKey("open sesame"); });
  EXPECT_FALSE(wrong_key.ok);
  EXPECT_EQ(wrong_key.code, 401) << wrong_key.message;
  auto wrong_model = generate(c, [&](auto r) { base(r), r.setModel("gpt-5"); });
  EXPECT_EQ(wrong_model.code, 404) << wrong_model.message;
  // Within the max-tokens limit (4096) but past the model's context (256).
  auto too_long = generate(c, [&](auto r) { base(r), r.setMaxTokens(255); });
  EXPECT_EQ(too_long.code, 400) << too_long.message;
  EXPECT_NE(too_long.message.find("context"), std::string::npos) << too_long.message;
  auto bad_id = generate(c, [&](auto r) {
    base(r);
    r.getPrompt().initIds(1).set(0, 1 << 30);
  });
  EXPECT_EQ(bad_id.code, 400) << bad_id.message;

  // A long generation holds the only slot: a second call is refused with 429.
  auto& ws = c.getWaitScope();
  auto main = c.getMain<rpc::Llmesh>();
  std::vector<int32_t> ids;
  std::string text;
  auto paf = kj::newPromiseAndFulfiller<void>();
  auto req = main.generateRequest();
  base(req.initRequest());
  req.getRequest().setMaxTokens(200);
  req.getRequest().setIgnoreEos(true);
  req.setSink(kj::heap<sink>(ids, text, 3, kj::mv(paf.fulfiller)));
  auto call = req.send();
  paf.promise.wait(ws);  // streaming
  auto busy = generate(c, base);
  EXPECT_EQ(busy.code, 429) << busy.message;
  { auto dropped = kj::mv(call); }  // the client gives up mid-stream: the call is cancelled
  // The server cancels the generation and frees the slot: the next call succeeds.
  outcome next;
  for (int attempt = 0; attempt < 100 && !next.ok; ++attempt) {
    next = generate(c, base);
    if (!next.ok) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(next.ok) << next.code << " " << next.message;
  EXPECT_LT(ids.size(), 200u);
  EXPECT_EQ(s.stop(), 0) << s.log();
}

// The sampling fields get the HTTP API's checks (one shared function): ranges, NaN, and the
// server's max-tokens limit — also when max_tokens is left at 0 ("until EOS").
TEST(Rpc, SamplingFieldsAreCheckedAsOverHttp) {
  server_process s(bin, {"--model", model_dir, "--api-key", "sesame", "--max-tokens-limit", "12"});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  capnp::EzRpcClient c("127.0.0.1", static_cast<uint>(port));
  auto base = [](auto r) {
    r.setApiKey("sesame");
    r.setModel("kjv-tiny");
    r.getPrompt().setText("The LORD is my shepherd");
    r.setMaxTokens(4);
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::pair<request_setup, std::string> refused[] = {
      {[&](auto r) { base(r), r.setTemperature(nan); }, "'temperature'"},
      {[&](auto r) { base(r), r.setTemperature(-0.5f); }, "'temperature'"},
      {[&](auto r) { base(r), r.setTemperature(2.5f); }, "'temperature'"},
      {[&](auto r) { base(r), r.setTemperature(inf); }, "'temperature'"},
      {[&](auto r) { base(r), r.setTopP(nan); }, "'top_p'"},
      {[&](auto r) { base(r), r.setTopP(1.5f); }, "'top_p'"},
      {[&](auto r) { base(r), r.setTopP(-0.1f); }, "'top_p'"},
      {[&](auto r) { base(r), r.setTopK(-2); }, "'top_k'"},
      {[&](auto r) { base(r), r.setMaxTokens(13); }, "'max_tokens' must be between 1 and 12"},
  };
  for (const auto& [setup, needle] : refused) {
    auto o = generate(c, setup);
    EXPECT_FALSE(o.ok) << needle;
    EXPECT_EQ(o.code, 400) << o.message;
    EXPECT_NE(o.message.find(needle), std::string::npos) << o.message;
    EXPECT_TRUE(o.streamed.empty());
  }
  // The API key is checked first, as over HTTP.
  auto wrong_key = generate(c, [&](auto r) { base(r), r.setApiKey("x"), r.setTemperature(nan); });
  EXPECT_EQ(wrong_key.code, 401) << wrong_key.message;

  // The bounds themselves pass; top_k -1 means off (as vLLM's).
  auto edges = generate(c, [&](auto r) {
    base(r);
    r.setMaxTokens(12);
    r.setTemperature(2.0f);
    r.setTopP(1.0f);
    r.setTopK(-1);
    r.setIgnoreEos(true);
  });
  ASSERT_TRUE(edges.ok) << edges.code << " " << edges.message;
  EXPECT_EQ(edges.ids.size(), 12u);
  // max_tokens 0 runs until EOS or the context (256 here), bounded by the server's limit.
  auto unset = generate(c, [&](auto r) {
    base(r);
    r.setMaxTokens(0);
    r.setIgnoreEos(true);
  });
  ASSERT_TRUE(unset.ok) << unset.code << " " << unset.message;
  EXPECT_EQ(unset.ids.size(), 12u);
  EXPECT_EQ(unset.finish, "length");
  EXPECT_EQ(s.stop(), 0) << s.log();
}

// The HTTP API's other generation fields over the native API: penalties give generate's
// tokens, stop_token_ids end the generation, logit_bias steers it, a constraint shapes the text;
// bad values are refused with the HTTP API's messages, after the API key.
TEST(Rpc, PenaltiesStopIdsBiasAndConstraintsAreServedAsOverHttp) {
  server_process s(bin, {"--model", model_dir, "--api-key", "sesame"});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  capnp::EzRpcClient c("127.0.0.1", static_cast<uint>(port));
  const std::vector<int32_t> prompt{1, 2, 3, 4};
  auto base = [&](auto r) {
    r.setApiKey("sesame");
    r.setModel("kjv-tiny");
    auto ids = r.getPrompt().initIds(static_cast<unsigned>(prompt.size()));
    for (unsigned i = 0; i < prompt.size(); ++i) ids.set(i, prompt[i]);
    r.setMaxTokens(16);
  };
  const std::string prompt_flags = "--prompt-ids " + id_list(prompt);
  // Penalties: generate's tokens.
  auto pen = generate(c, [&](auto r) { base(r), r.setRepetitionPenalty(1.5f), r.setFrequencyPenalty(0.5f); });
  ASSERT_TRUE(pen.ok) << pen.message;
  EXPECT_EQ(pen.ids, generate_ids(bin, model_dir, prompt_flags, 16, "--temperature 0 --repetition-penalty 1.5 --frequency-penalty 0.5"));
  // stop_token_ids: the greedy output's third token ends it there.
  auto plain = generate(c, [&](auto r) { base(r); });
  ASSERT_TRUE(plain.ok && plain.ids.size() == 16) << plain.message;
  auto stopped = generate(c, [&](auto r) { base(r), r.initStopTokenIds(1).set(0, plain.ids[2]); });
  ASSERT_TRUE(stopped.ok) << stopped.message;
  const auto first = std::find(plain.ids.begin(), plain.ids.end(), plain.ids[2]) - plain.ids.begin();
  EXPECT_EQ(stopped.ids, std::vector<int32_t>(plain.ids.begin(), plain.ids.begin() + first + 1));
  EXPECT_EQ(stopped.finish, "stop");
  // A stop string: the text ends before it; what streamed adds up to the result.
  ASSERT_GT(plain.text.size(), 12u) << plain.text;
  const std::string stop_at = plain.text.substr(plain.text.size() / 2, 3);
  auto cut = generate(c, [&](auto r) { base(r), r.initStop(1).set(0, stop_at); });
  ASSERT_TRUE(cut.ok) << cut.message;
  EXPECT_EQ(cut.text, plain.text.substr(0, plain.text.find(stop_at)));
  EXPECT_EQ(cut.streamed_text, cut.text);
  EXPECT_EQ(cut.finish, "stop");
  EXPECT_LE(cut.ids.size(), plain.ids.size());
  // With min_tokens, and a stop token id beside the stop string: the text and ids HTTP gives.
  for (uint32_t min_tokens : {0u, 6u}) {
    auto rpc = generate(c, [&](auto r) {
      base(r);
      r.initStop(1).set(0, stop_at);
      r.setMinTokens(min_tokens);
      r.initStopTokenIds(1).set(0, plain.ids[10]);
    });
    ASSERT_TRUE(rpc.ok) << rpc.message;
    const nlohmann::json body = {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0},
                                 {"stop", {stop_at}}, {"min_tokens", min_tokens}, {"stop_token_ids", {plain.ids[10]}},
                                 {"return_token_ids", true}};
    auto http = http_request(s.port(), "POST", "/v1/completions", body.dump(), "Authorization: Bearer sesame\r\n");
    ASSERT_EQ(http.status, 200) << http.body;
    const auto choice = nlohmann::json::parse(http.body)["choices"][0];
    EXPECT_EQ(rpc.text, choice["text"].get<std::string>()) << "min_tokens " << min_tokens;
    EXPECT_EQ(rpc.ids, choice["token_ids"].get<std::vector<int32_t>>()) << "min_tokens " << min_tokens;
    EXPECT_EQ(rpc.finish, choice["finish_reason"].get<std::string>()) << "min_tokens " << min_tokens;
    EXPECT_EQ(rpc.streamed_text, rpc.text);
  }
  // logit_bias: a large bias makes greedy draw that token.
  auto biased = generate(c, [&](auto r) {
    base(r);
    auto b = r.initLogitBias(1);
    b[0].setId(42);
    b[0].setBias(100.0f);
  });
  ASSERT_TRUE(biased.ok) << biased.message;
  EXPECT_EQ(biased.ids.front(), 42);
  // allowed_token_ids: one allowed id is every draw; outside the vocabulary, the HTTP 400's words.
  auto only = generate(c, [&](auto r) { base(r), r.initAllowedTokenIds(1).set(0, 340); });
  ASSERT_TRUE(only.ok) << only.message;
  EXPECT_EQ(only.ids, std::vector<int32_t>(16, 340));
  auto outside = generate(c, [&](auto r) { base(r), r.initAllowedTokenIds(1).set(0, 1 << 20); });
  EXPECT_FALSE(outside.ok);
  EXPECT_NE(outside.message.find("'allowed_token_ids'"), std::string::npos) << outside.message;
  // A constraint: the text is one of the choices.
  auto chosen = generate(c, [&](auto r) {
    base(r);
    r.setTemperature(1.0f);
    r.getConstraint().setKind(rpc::OutputConstraint::Kind::CHOICE);
    r.getConstraint().setText(R"(["alpha", "omega"])");
  });
  ASSERT_TRUE(chosen.ok) << chosen.message;
  EXPECT_TRUE(chosen.text == "alpha" || chosen.text == "omega") << chosen.text;
  EXPECT_EQ(chosen.finish, "stop");

  const std::pair<request_setup, std::string> refused[] = {
      {[&](auto r) { base(r), r.setPresencePenalty(3.0f); }, "'presence_penalty'"},
      {[&](auto r) { base(r), r.setRepetitionPenalty(0.0f); }, "'repetition_penalty'"},
      {[&](auto r) { base(r), r.setMinTokens(17); }, "'min_tokens'"},
      {[&](auto r) { base(r), r.setMinP(1.5f); }, "'min_p'"},
      {[&](auto r) {
         base(r);
         auto b = r.initLogitBias(2);
         b[0].setId(5), b[0].setBias(1.0f), b[1].setId(5), b[1].setBias(2.0f);
       },
       "twice"},
      {[&](auto r) {
         base(r);
         auto b = r.initLogitBias(1);
         b[0].setId(5), b[0].setBias(200.0f);
       },
       "'logit_bias'"},
      {[&](auto r) { base(r), r.initStopTokenIds(1).set(0, 1 << 30); }, "stop_token_ids"},
      {[&](auto r) {
         base(r);
         auto st = r.initStop(5);
         for (unsigned i = 0; i < 5; ++i) st.set(i, "x");
       },
       "'stop' holds at most 4"},
      {[&](auto r) { base(r), r.initStop(1).set(0, ""); }, "'stop'"},
      {[&](auto r) {
         base(r);
         r.getConstraint().setKind(rpc::OutputConstraint::Kind::REGEX);
         r.getConstraint().setText("(unclosed");
       },
       "'guided_regex'"},
      {[&](auto r) {
         base(r);
         r.getConstraint().setKind(rpc::OutputConstraint::Kind::CHOICE);
         r.getConstraint().setText("not json");
       },
       "'guided_choice'"},
  };
  for (const auto& [setup, needle] : refused) {
    auto o = generate(c, setup);
    EXPECT_FALSE(o.ok) << needle;
    EXPECT_EQ(o.code, 400) << o.message;
    EXPECT_NE(o.message.find(needle), std::string::npos) << o.message;
  }
  auto wrong_key = generate(c, [&](auto r) {
    base(r);
    r.setApiKey("x");
    auto b = r.initLogitBias(2);
    b[0].setId(5), b[1].setId(5);
  });
  EXPECT_EQ(wrong_key.code, 401) << wrong_key.message;
  EXPECT_EQ(s.stop(), 0) << s.log();
}

struct logprob_entry {
  int32_t id = 0, rank = 0;
  float logprob = 0;
  std::string bytes;
  std::vector<logprob_entry> top;
  bool operator==(const logprob_entry&) const = default;
};

logprob_entry read_logprob(rpc::TokenLogprob::Reader r) {
  logprob_entry e{r.getId(), r.getRank(), r.getLogprob(), std::string(r.getBytes().asChars().begin(), r.getBytes().size()), {}};
  for (auto t : r.getTop()) e.top.push_back(read_logprob(t));
  return e;
}

/// Collects the streamed logprobs; a call that carries any carries one per id.
class logprob_sink final : public rpc::TokenSink::Server {
 public:
  explicit logprob_sink(std::vector<logprob_entry>& out) : out_(out) {}
  kj::Promise<void> tokens(TokensContext ctx) override {
    auto p = ctx.getParams();
    if (p.getLogprobs().size() > 0) {
      EXPECT_EQ(p.getLogprobs().size(), p.getIds().size());
    }
    for (auto lp : p.getLogprobs()) out_.push_back(read_logprob(lp));
    return kj::READY_NOW;
  }

 private:
  std::vector<logprob_entry>& out_;
};

TEST(Rpc, LogprobsStreamWithTheirTokensAndAreHttpsNumbers) {
  server_process s(bin, {"--model", model_dir});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  capnp::EzRpcClient c("127.0.0.1", static_cast<uint>(port));
  const std::vector<int32_t> prompt{1142, 258, 2078, 386, 3345};
  auto setup = [&](rpc::GenerateRequest::Builder r, int logprobs, int prompt_logprobs) {
    r.setModel("kjv-tiny");
    auto ids = r.getPrompt().initIds(static_cast<unsigned>(prompt.size()));
    for (unsigned i = 0; i < prompt.size(); ++i) ids.set(i, prompt[i]);
    r.setMaxTokens(8);
    r.setIgnoreEos(true);
    r.setLogprobs(logprobs);
    r.setPromptLogprobs(prompt_logprobs);
  };
  auto req = c.getMain<rpc::Llmesh>().generateRequest();
  setup(req.initRequest(), 3, 2);
  std::vector<logprob_entry> streamed;
  req.setSink(kj::heap<logprob_sink>(streamed));
  auto resp = req.send().wait(c.getWaitScope());
  auto r = resp.getResult();
  ASSERT_TRUE(r.getOk()) << r.getErrorMessage().cStr();
  ASSERT_EQ(r.getTokenIds().size(), 8u);
  ASSERT_EQ(r.getLogprobs().size(), 8u);
  std::vector<logprob_entry> result;
  for (auto lp : r.getLogprobs()) result.push_back(read_logprob(lp));
  EXPECT_EQ(streamed, result);  // the same entries, streamed with their tokens
  std::string bytes;
  for (unsigned i = 0; i < 8; ++i) {
    const auto& e = result[i];
    EXPECT_EQ(e.id, r.getTokenIds()[i]);
    ASSERT_EQ(e.top.size(), 3u);
    EXPECT_EQ(e.top[0].id, e.id);  // greedy: the most likely
    EXPECT_EQ(e.top[0].logprob, e.logprob);
    EXPECT_EQ(e.rank, 1);
    EXPECT_LT(e.logprob, 0.0f);
    EXPECT_GE(e.top[0].logprob, e.top[1].logprob);
    EXPECT_GE(e.top[1].logprob, e.top[2].logprob);
    EXPECT_EQ(e.top[2].rank, 3);
    EXPECT_FALSE(e.bytes.empty());
    bytes += e.bytes;
  }
  EXPECT_EQ(bytes, std::string(r.getText().cStr()));
  ASSERT_EQ(r.getPromptLogprobs().size(), prompt.size() - 1);
  std::vector<logprob_entry> scored;
  for (auto lp : r.getPromptLogprobs()) scored.push_back(read_logprob(lp));
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    EXPECT_EQ(scored[i].id, prompt[i + 1]);
    EXPECT_EQ(scored[i].top.size(), 2u);
    EXPECT_GE(scored[i].rank, 1);
  }

  // The numbers /v1/completions gives for the same request.
  const nlohmann::json body = {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0},
                               {"ignore_eos", true}, {"logprobs", 3}, {"prompt_logprobs", 2}, {"return_token_ids", true}};
  auto http = http_request(s.port(), "POST", "/v1/completions", body.dump());
  ASSERT_EQ(http.status, 200) << http.body;
  const auto choice = nlohmann::json::parse(http.body)["choices"][0];
  std::vector<int32_t> ids;
  for (auto id : r.getTokenIds()) ids.push_back(id);
  ASSERT_EQ(choice["token_ids"].get<std::vector<int32_t>>(), ids);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_FLOAT_EQ(choice["logprobs"]["token_logprobs"][i].get<float>(), result[i].logprob) << i;
    float best = -std::numeric_limits<float>::infinity();
    for (const auto& [text, lp] : choice["logprobs"]["top_logprobs"][i].items()) best = std::max(best, lp.get<float>());
    EXPECT_FLOAT_EQ(best, result[i].top[0].logprob) << i;
  }
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    const auto& at = choice["prompt_logprobs"][i + 1];
    const auto& own = at[std::to_string(prompt[i + 1])];
    EXPECT_FLOAT_EQ(own["logprob"].get<float>(), scored[i].logprob) << i;
    EXPECT_EQ(own["rank"].get<int>(), scored[i].rank) << i;
    for (const auto& t : scored[i].top) EXPECT_FLOAT_EQ(at[std::to_string(t.id)]["logprob"].get<float>(), t.logprob) << i;
  }

  // Without logprobs nothing is sent; out of range is a 400 that names the field.
  std::vector<logprob_entry> none;
  auto plain = c.getMain<rpc::Llmesh>().generateRequest();
  setup(plain.initRequest(), -1, -1);
  plain.setSink(kj::heap<logprob_sink>(none));
  auto plain_resp = plain.send().wait(c.getWaitScope());
  EXPECT_TRUE(plain_resp.getResult().getOk());
  EXPECT_EQ(plain_resp.getResult().getLogprobs().size(), 0u);
  EXPECT_EQ(plain_resp.getResult().getPromptLogprobs().size(), 0u);
  EXPECT_TRUE(none.empty());
  for (auto [lp, plp, needle] : {std::tuple{21, -1, "'logprobs'"}, std::tuple{-1, -2, "'prompt_logprobs'"}}) {
    std::vector<logprob_entry> ignored;
    auto bad = c.getMain<rpc::Llmesh>().generateRequest();
    setup(bad.initRequest(), lp, plp);
    bad.setSink(kj::heap<logprob_sink>(ignored));
    auto bad_resp = bad.send().wait(c.getWaitScope());
    EXPECT_FALSE(bad_resp.getResult().getOk());
    EXPECT_EQ(bad_resp.getResult().getErrorCode(), 400);
    EXPECT_NE(std::string(bad_resp.getResult().getErrorMessage().cStr()).find(needle), std::string::npos)
        << bad_resp.getResult().getErrorMessage().cStr();
  }
  EXPECT_EQ(s.stop(), 0) << s.log();
}

// vLLM's skip_special_tokens, include_stop_str_in_output, truncate_prompt_tokens and
// add_special_tokens over the native API, as /v1/completions serves them: special tokens'
// text kept or skipped, the end token's left out unless asked; a stop string kept at the
// text's end; the prompt cut to its last k tokens (its tokens then those of the cut prompt).
TEST(Rpc, TextFieldsAndPromptTruncationAreServedAsOverHttp) {
  server_process s(bin, {"--model", model_dir});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  capnp::EzRpcClient c("127.0.0.1", static_cast<uint>(port));
  const std::vector<int32_t> prompt{1142, 258, 2078, 386, 3345, 17};
  auto with_prompt = [](auto r, const std::vector<int32_t>& ids) {
    r.setModel("kjv-tiny");
    auto out = r.getPrompt().initIds(static_cast<unsigned>(ids.size()));
    for (unsigned i = 0; i < ids.size(); ++i) out.set(i, ids[i]);
  };
  constexpr int32_t bos = 4094, eos = 4095;  // kjv-tiny's special tokens
  auto forced = [&](int32_t id, bool skip, bool include) {
    return generate(c, [&](auto r) {
      with_prompt(r, prompt);
      r.setMaxTokens(2);
      r.setIgnoreEos(id == bos);
      auto b = r.initLogitBias(1);
      b[0].setId(id);
      b[0].setBias(100.0f);
      r.setSkipSpecialTokens(skip);
      r.setIncludeStopStr(include);
    });
  };
  auto kept = forced(bos, false, false);
  ASSERT_TRUE(kept.ok) << kept.message;
  EXPECT_EQ(kept.ids, (std::vector<int32_t>{bos, bos}));
  EXPECT_EQ(kept.text, "<|begin_of_text|><|begin_of_text|>");
  EXPECT_EQ(kept.streamed_text, kept.text);
  EXPECT_EQ(forced(bos, true, false).text, "");
  for (auto [skip, include, want] : {std::tuple{false, false, ""}, std::tuple{false, true, "<|end_of_text|>"},
                                     std::tuple{true, true, ""}}) {
    auto o = forced(eos, skip, include);
    ASSERT_TRUE(o.ok) << o.message;
    EXPECT_EQ(o.ids, (std::vector<int32_t>{eos}));
    EXPECT_EQ(o.finish, "stop");
    EXPECT_EQ(o.text, want) << skip << include;
  }

  // A stop string: cut before it, or kept with include_stop_str_in_output.
  auto plain = generate(c, [&](auto r) { with_prompt(r, prompt), r.setMaxTokens(12); });
  ASSERT_TRUE(plain.ok && plain.text.size() > 8) << plain.message << plain.text;
  const std::string stop = plain.text.substr(4, 3);
  const std::string before = plain.text.substr(0, plain.text.find(stop));
  for (bool include : {false, true}) {
    auto o = generate(c, [&](auto r) {
      with_prompt(r, prompt), r.setMaxTokens(12), r.setIncludeStopStr(include);
      r.initStop(1).set(0, stop);
    });
    ASSERT_TRUE(o.ok) << o.message;
    EXPECT_EQ(o.text, include ? before + stop : before);
    EXPECT_EQ(o.streamed_text, o.text);
    EXPECT_EQ(o.finish, "stop");
  }

  // truncate_prompt_tokens: the last 3 tokens, whose own output it is; -1 keeps a short prompt.
  const std::vector<int32_t> tail(prompt.end() - 3, prompt.end());
  auto cut = generate(c, [&](auto r) { with_prompt(r, prompt), r.setMaxTokens(6), r.setTruncatePromptTokens(3); });
  auto short_one = generate(c, [&](auto r) { with_prompt(r, tail), r.setMaxTokens(6); });
  ASSERT_TRUE(cut.ok && short_one.ok) << cut.message << short_one.message;
  EXPECT_EQ(cut.prompt_tokens, 3u);
  EXPECT_EQ(cut.ids, short_one.ids);
  auto whole = generate(c, [&](auto r) { with_prompt(r, prompt), r.setMaxTokens(2), r.setTruncatePromptTokens(-1); });
  EXPECT_EQ(whole.prompt_tokens, prompt.size()) << whole.message;
  for (int64_t bad : {int64_t{-2}, int64_t{1} << 40}) {
    auto o = generate(c, [&](auto r) { with_prompt(r, prompt), r.setTruncatePromptTokens(bad); });
    EXPECT_FALSE(o.ok) << bad;
    EXPECT_EQ(o.code, 400);
    EXPECT_NE(o.message.find("'truncate_prompt_tokens'"), std::string::npos) << o.message;
  }

  // add_special_tokens: kjv-tiny's tokenizer adds no BOS, so PromptFields (tests/gateway)
  // checks it on Llama 3.1's.

  // cacheSalt and promptCacheKey are checked as over HTTP (they change no token here).
  auto keyed = generate(c, [&](auto r) { with_prompt(r, prompt), r.setMaxTokens(6), r.setPromptCacheKey("user-17"), r.setCacheSalt("t"); });
  ASSERT_TRUE(keyed.ok) << keyed.message;
  EXPECT_EQ(keyed.ids, generate(c, [&](auto r) { with_prompt(r, prompt), r.setMaxTokens(6); }).ids);
  const std::string long_key(1025, 'k');
  auto too_long = generate(c, [&](auto r) { with_prompt(r, prompt), r.setPromptCacheKey(long_key); });
  EXPECT_EQ(too_long.code, 400);
  EXPECT_NE(too_long.message.find("'prompt_cache_key'"), std::string::npos) << too_long.message;
  EXPECT_EQ(s.stop(), 0) << s.log();
}

}  // namespace
}  // namespace llmesh::testing
