// vLLM's use_beam_search over real HTTP, with two replicas (a search's steps spread over
// both): width 1 is greedy decoding; a wider search's choices are distinct, each token's
// log-probability is the one the model gives that token after the prompt and the choice's
// earlier tokens (re-scored by echo), and the choices are ordered by vLLM's score; a
// structured output's beams all match it and a banned token enters none; a stop string ends
// the beams that show it, their text cut before it; chat; streamed, the same choices once the
// search ends; the fields' errors.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "server_process.hpp"

namespace llmesh::testing {
namespace {

using json = nlohmann::json;

const std::string bin = LLMESH_BINARY;
const std::string model_dir = std::string(LLMESH_SOURCE_DIR) + "/models/kjv-tiny";

json post(int port, const std::string& path, const json& body, int& status) {
  auto r = http_request(port, "POST", path, body.dump());
  status = r.status;
  auto j = json::parse(r.body, nullptr, false);
  return j.is_discarded() ? json{{"raw", r.body}} : j;
}

TEST(ServeBeamSearch, WidthOneIsGreedyAndWiderBeamsCarryTheModelsLogprobsInScoreOrder) {
  server_process s(bin, {"--model", model_dir, "--replicas", "2"});
  ASSERT_GT(s.port(), 0) << s.log();
  const std::vector<int32_t> prompt{1142, 258, 2078, 386, 3345};
  int status = 0;
  const json base = {{"model", "kjv-tiny"}, {"prompt", prompt}, {"max_tokens", 7}, {"temperature", 0},
                     {"return_token_ids", true}};
  auto greedy = post(s.port(), "/v1/completions", base, status);
  ASSERT_EQ(status, 200) << greedy;
  json one = base;
  one["use_beam_search"] = true;
  auto b1 = post(s.port(), "/v1/completions", one, status);
  ASSERT_EQ(status, 200) << b1;
  ASSERT_EQ(b1["choices"].size(), 1u) << b1;
  EXPECT_EQ(b1["choices"][0]["token_ids"], greedy["choices"][0]["token_ids"]) << b1;
  EXPECT_EQ(b1["choices"][0]["text"], greedy["choices"][0]["text"]);
  EXPECT_EQ(b1["choices"][0]["finish_reason"], greedy["choices"][0]["finish_reason"]);

  json wide = base;
  wide["use_beam_search"] = true;
  wide["n"] = 4;
  wide["logprobs"] = 1;
  wide["length_penalty"] = 0.5;
  auto b4 = post(s.port(), "/v1/completions", wide, status);
  ASSERT_EQ(status, 200) << b4;
  ASSERT_EQ(b4["choices"].size(), 4u) << b4;
  std::set<std::vector<int32_t>> distinct;
  double last_score = 0;
  size_t completion_tokens = 0;
  for (size_t i = 0; i < 4; ++i) {
    const json& c = b4["choices"][i];
    EXPECT_EQ(c["index"], i);
    const auto ids = c["token_ids"].get<std::vector<int32_t>>();
    ASSERT_FALSE(ids.empty()) << c;
    completion_tokens += ids.size();
    distinct.insert(ids);
    const auto& lp = c["logprobs"]["token_logprobs"];
    ASSERT_EQ(lp.size(), ids.size()) << c;
    // The same tokens re-scored as a prompt: the engine is batch- and chunk-invariant, so each
    // log-probability is the very number the search saw.
    std::vector<int32_t> whole = prompt;
    whole.insert(whole.end(), ids.begin(), ids.end());
    auto e = post(s.port(), "/v1/completions",
                  {{"model", "kjv-tiny"}, {"prompt", whole}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 1},
                   {"echo", true}},
                  status);
    ASSERT_EQ(status, 200) << e;
    double cum = 0;
    for (size_t k = 0; k < ids.size(); ++k) {
      EXPECT_EQ(lp[k], e["choices"][0]["logprobs"]["token_logprobs"][prompt.size() + k]) << "choice " << i << " token " << k;
      cum += lp[k].get<double>();
    }
    const bool ended = c["finish_reason"] == "stop";
    const double len = static_cast<double>(prompt.size() + ids.size() - (ended ? 1 : 0));
    const double score = cum / std::pow(len, 0.5);
    if (i > 0) EXPECT_LE(score, last_score + 1e-6) << "choice " << i << " ranks above the one before it";
    last_score = score;
  }
  EXPECT_EQ(distinct.size(), 4u) << b4;
  EXPECT_EQ(b4["usage"]["completion_tokens"], completion_tokens);
  EXPECT_EQ(b4["usage"]["prompt_tokens"], prompt.size());

  // The steps rank processed log-probabilities: a grammar's beams all match it (guided_choice:
  // each beam one of the choices, distinct), and a token biased to -100 enters no beam.
  const std::vector<std::string> options = {" Moses", " Aaron", " Pharaoh", " Joshua"};
  json guided = base;
  guided["use_beam_search"] = true;
  guided["n"] = 3;
  guided["max_tokens"] = 12;
  guided["guided_choice"] = options;
  auto g3 = post(s.port(), "/v1/completions", guided, status);
  ASSERT_EQ(status, 200) << g3;
  ASSERT_EQ(g3["choices"].size(), 3u) << g3;
  std::set<std::string> seen;
  for (const auto& c : g3["choices"]) {
    const std::string text = c["text"];
    EXPECT_NE(std::find(options.begin(), options.end(), text), options.end()) << text;
    seen.insert(text);
    EXPECT_EQ(c["finish_reason"], "stop") << c;  // the grammar ends: only an end id may follow
  }
  EXPECT_EQ(seen.size(), 3u) << g3;
  const int32_t first = b4["choices"][0]["token_ids"][0];
  json banned = wide;
  banned["logit_bias"] = {{std::to_string(first), -100}};
  auto b4b = post(s.port(), "/v1/completions", banned, status);
  ASSERT_EQ(status, 200) << b4b;
  for (const auto& c : b4b["choices"]) {
    const auto ids = c["token_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(std::count(ids.begin(), ids.end(), first), 0) << c;
  }

  // A stop string taken from a beam's text: the beams that show it end there (finish "stop",
  // the text cut before it, as a plain request's), and no beam's text holds it.
  const std::string beam_text = b4["choices"][0]["text"];
  ASSERT_GT(beam_text.size(), 6u);
  const std::string stop = beam_text.substr(3, 3);
  json stopped = wide;
  stopped["stop"] = {stop};
  auto bs = post(s.port(), "/v1/completions", stopped, status);
  ASSERT_EQ(status, 200) << bs;
  bool some_stopped = false;
  for (const auto& c : bs["choices"]) {
    const std::string text = c["text"];
    EXPECT_EQ(text.find(stop), std::string::npos) << text;
    if (c["finish_reason"] == "stop") some_stopped = true;
  }
  EXPECT_TRUE(some_stopped) << bs;

  // Chat: the beams are the messages.
  auto chat = post(s.port(), "/v1/chat/completions",
                   {{"model", "kjv-tiny"}, {"messages", {{{"role", "user"}, {"content", "Who is the LORD?"}}}},
                    {"max_tokens", 6}, {"use_beam_search", true}, {"n", 2}},
                   status);
  ASSERT_EQ(status, 200) << chat;
  ASSERT_EQ(chat["choices"].size(), 2u) << chat;
  EXPECT_NE(chat["choices"][0]["message"]["content"], chat["choices"][1]["message"]["content"]) << chat;

  // Streamed: once the search ends, each beam's chunks (by index) add up to the whole reply's
  // choices, then the usage chunk and [DONE].
  for (const std::string path : {"/v1/completions", "/v1/chat/completions"}) {
    const bool is_chat = path == "/v1/chat/completions";
    json req = is_chat ? json{{"model", "kjv-tiny"}, {"messages", {{{"role", "user"}, {"content", "Who is the LORD?"}}}}}
                       : json{{"model", "kjv-tiny"}, {"prompt", prompt}};
    req["max_tokens"] = 6;
    req["use_beam_search"] = true;
    req["n"] = 3;
    auto whole = post(s.port(), path, req, status);
    ASSERT_EQ(status, 200) << whole;
    req["stream"] = true;
    req["stream_options"] = {{"include_usage", true}};
    auto r = http_request(s.port(), "POST", path, req.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const auto payloads = sse_payloads(r.body);
    ASSERT_GE(payloads.size(), 3u) << r.body;
    EXPECT_EQ(payloads.back(), "[DONE]");
    std::vector<std::string> texts(whole["choices"].size());
    std::vector<std::string> finishes(texts.size());
    for (size_t i = 0; i + 2 < payloads.size(); ++i) {
      const json c = json::parse(payloads[i]);
      ASSERT_EQ(c["choices"].size(), 1u) << payloads[i];
      const size_t idx = c["choices"][0]["index"];
      ASSERT_LT(idx, texts.size());
      texts[idx] += is_chat ? c["choices"][0]["delta"].value("content", "") : c["choices"][0]["text"].get<std::string>();
      if (c["choices"][0]["finish_reason"].is_string()) finishes[idx] = c["choices"][0]["finish_reason"];
    }
    const json usage = json::parse(payloads[payloads.size() - 2]);
    EXPECT_EQ(usage["usage"], whole["usage"]) << path;
    for (size_t i = 0; i < texts.size(); ++i) {
      EXPECT_EQ(texts[i], is_chat ? whole["choices"][i]["message"]["content"] : whole["choices"][i]["text"]) << path << " " << i;
      EXPECT_EQ(finishes[i], whole["choices"][i]["finish_reason"]) << path << " " << i;
    }
  }

  for (const auto& [field, needle] : std::vector<std::pair<json, std::string>>{
           {{{"n", 11}}, "'n' must be at most 10"},
           {{{"best_of", 2}}, "'best_of'"},
           {{{"length_penalty", "long"}}, "'length_penalty'"},
           {{{"use_beam_search", 1}}, "'use_beam_search' must be true or false"}}) {
    json bad = one;
    bad.update(field);
    auto r = post(s.port(), "/v1/completions", bad, status);
    EXPECT_EQ(status, 400) << field << r;
    EXPECT_NE(r.dump().find(needle), std::string::npos) << field << r;
  }
}

}  // namespace
}  // namespace llmesh::testing
