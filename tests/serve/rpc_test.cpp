// `llmesh serve`'s native API (schemas/rpc.capnp) over real TCP with Cap'n Proto's own client:
// greedy tokens equal `llmesh generate`'s, streamed in order to the client's sink and adding up
// to the result; text prompts are tokenized as /v1/completions does; the API key, the model
// name, the context and the concurrency bound give HTTP-like codes; sampling fields and the
// max-tokens limit are checked as over HTTP; a client that drops its call mid-stream frees its slot;
// logprobs stream with their tokens and are /v1/completions' numbers; n generations are HTTP's
// choices.
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
#include "server_process.hpp"

namespace llmesh::testing {
namespace {

const std::string bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";

int rpc_port(server_process& s) {
  const std::string marker = "(Cap'n Proto RPC, schemas/rpc.capnp) on 127.0.0.1:";
  const auto at = s.log().find(marker);
  return at == std::string::npos ? 0 : std::atoi(s.log().c_str() + at + marker.size());
}

/// Collects what the server streams; `at_least` tokens fulfil `enough`.
class sink final : public rpc::TokenSink::Server {
 public:
  sink(std::vector<int32_t>& ids, std::string& text) : ids_(ids), text_(text) {}
  sink(std::vector<int32_t>& ids, std::string& text, size_t at_least, kj::Own<kj::PromiseFulfiller<void>> enough)
      : ids_(ids), text_(text), at_least_(at_least), enough_(kj::mv(enough)) {}
  kj::Promise<void> tokens(TokensContext ctx) override {
    for (auto id : ctx.getParams().getIds()) ids_.push_back(id);
    text_ += ctx.getParams().getText().cStr();
    if (enough_.get() != nullptr && ids_.size() >= at_least_) enough_->fulfill();
    return kj::READY_NOW;
  }

 private:
  std::vector<int32_t>& ids_;
  std::string& text_;
  size_t at_least_ = 0;
  kj::Own<kj::PromiseFulfiller<void>> enough_;
};

struct outcome {
  bool ok = false;
  int code = 0;
  std::string message, finish, text, streamed_text;
  std::vector<int32_t> ids, streamed;
  size_t prompt_tokens = 0;
};

using request_setup = std::function<void(rpc::GenerateRequest::Builder)>;

outcome generate(capnp::EzRpcClient& c, const request_setup& setup) {
  auto main = c.getMain<rpc::Llmesh>();
  auto req = main.generateRequest();
  setup(req.initRequest());
  outcome o;
  req.setSink(kj::heap<sink>(o.streamed, o.streamed_text));
  auto resp = req.send().wait(c.getWaitScope());
  auto r = resp.getResult();
  o.ok = r.getOk();
  o.code = r.getErrorCode();
  o.message = r.getErrorMessage().cStr();
  o.finish = r.getFinishReason().cStr();
  o.text = r.getText().cStr();
  o.prompt_tokens = r.getPromptTokens();
  for (auto id : r.getTokenIds()) o.ids.push_back(id);
  return o;
}

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
  EXPECT_EQ(s.stop(), 0) << s.log();
}

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
