// beam_search: vLLM's beam search driven by a fake model that answers each one-token step
// request with the log-softmax of logits hashed from the sequence. Checked against an
// exhaustive enumeration (a width that never prunes before the last step returns the global
// best), greedy decoding at width 1, the requests' shape (prompt plus the beam as output,
// 2 × width alternatives), end ids, masked tokens, a drawn token outside the alternatives,
// failures; and completion_group replaying the beams as a response's choices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/beam_search.hpp"
#include "llmesh/gateway/completion_group.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::gateway {
namespace {

using actors::finish_reason;
using actors::replica_request;
using actors::token_msg;
using json = nlohmann::json;

/// A deterministic next-token distribution over `vocab` ids for any sequence; ids in `masked`
/// have log-probability -inf (a model's -inf logit), ids in `boosted` +10 on their logits.
struct fake_model {
  size_t vocab = 3;
  std::vector<int32_t> masked, boosted;
  /// With a value: the token "drawn" at every step (a temperature's pick), whatever its rank.
  std::optional<int32_t> drawn;

  std::vector<double> logprobs(const std::vector<int32_t>& seq) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t t : seq) h = (h ^ static_cast<uint64_t>(t + 7)) * 1099511628211ull;
    std::vector<double> logits(vocab);
    for (size_t i = 0; i < vocab; ++i) {
      h = (h ^ (i + 1)) * 1099511628211ull;
      logits[i] = static_cast<double>((h >> 11) % 1000) / 250.0;
    }
    for (int32_t b : boosted) logits[static_cast<size_t>(b)] += 10.0;
    for (int32_t m : masked) logits[static_cast<size_t>(m)] = -std::numeric_limits<double>::infinity();
    double mx = -std::numeric_limits<double>::infinity();
    for (double l : logits) mx = std::max(mx, l);
    double sum = 0;
    for (double l : logits) sum += std::exp(l - mx);
    for (double& l : logits) l = l - mx - std::log(sum);
    return logits;
  }

  /// The one message a step request gets: its drawn token, finish length, and its row's
  /// r.sampling.logprobs most likely tokens (ties: the lower id).
  token_msg answer(const replica_request& r) const {
    const auto lp = logprobs(r.prompt);
    std::vector<int32_t> order(vocab);
    for (size_t i = 0; i < vocab; ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return lp[a] > lp[b]; });
    token_msg t;
    t.id = r.id;
    t.token = drawn.value_or(order[0]);
    t.finish = finish_reason::length;
    kernels::token_logprobs row;
    row.logprob = static_cast<float>(lp[t.token]);
    row.rank = static_cast<int32_t>(std::find(order.begin(), order.end(), t.token) - order.begin() + 1);
    for (int k = 0; k < r.sampling.logprobs && k < static_cast<int>(vocab); ++k) {
      row.top.push_back({order[k], static_cast<float>(lp[order[k]])});
    }
    t.logprobs = row;
    if (r.sampling.prompt_logprobs >= 0) t.prompt_logprobs.resize(r.prompt.size() - 1);
    return t;
  }
};

struct search_run {
  std::vector<std::vector<replica_request>> steps;  ///< every step's requests, as handed out
};

/// Runs `b` to its end against `m`, answering each step's requests in reverse order (the
/// search must not depend on the order its answers arrive in).
search_run drive(beam_search& b, const fake_model& m) {
  search_run run;
  for (int guard = 0; guard < 1000 && !b.done(); ++guard) {
    auto reqs = b.take_requests();
    if (reqs.empty()) break;
    run.steps.push_back(reqs);
    for (auto it = reqs.rbegin(); it != reqs.rend(); ++it) b.on_message(m.answer(*it));
  }
  return run;
}

beam_setup setup(std::vector<int32_t> prompt, size_t width, size_t max_tokens, std::vector<int32_t> eos,
                 double length_penalty = 1.0) {
  beam_setup s;
  s.base.prompt = std::move(prompt);
  s.base.max_tokens = max_tokens;
  s.base.eos_ids = std::move(eos);
  s.base.model = "m";
  s.width = width;
  s.length_penalty = length_penalty;
  return s;
}

std::function<uint64_t()> ids_from(uint64_t first) {
  auto next = std::make_shared<uint64_t>(first);
  return [next] { return (*next)++; };
}

/// float sums, as the search adds them (its entries are floats).
double sum_of(const fake_model& m, const std::vector<int32_t>& prompt, const std::vector<int32_t>& out) {
  double cum = 0;
  std::vector<int32_t> seq = prompt;
  for (int32_t t : out) {
    cum += static_cast<float>(m.logprobs(seq)[t]);
    seq.push_back(t);
  }
  return cum;
}

// Vocabulary {0, 1, 2 = end}, 3 steps, width 9: no live beam is dropped before the last step
// (at most 9 exist), so the result is the best 9 of every possible output — each sequence of
// 3 tokens without the end id, or one that ends with it earlier — which an enumeration finds.
TEST(BeamSearch, AWidthThatNeverPrunesReturnsTheBestOfEveryOutput) {
  for (double lp : {1.0, 0.0, 2.5}) {
    fake_model m;
    const std::vector<int32_t> prompt{0, 1, 1, 0};
    beam_search b(setup(prompt, 9, 3, {2}, lp), ids_from(100));
    drive(b, m);
    ASSERT_TRUE(b.done());
    ASSERT_FALSE(b.failure());

    struct output {
      std::vector<int32_t> tokens;
      double score;
      bool ended;
    };
    std::vector<output> all;
    std::function<void(std::vector<int32_t>)> walk = [&](std::vector<int32_t> seq) {
      for (int32_t t = 0; t < 3; ++t) {
        auto next = seq;
        next.push_back(t);
        if (t == 2 || next.size() == 3) {
          const bool ended = t == 2;
          const double len = static_cast<double>(prompt.size() + next.size() - (ended ? 1 : 0));
          all.push_back({next, sum_of(m, prompt, next) / std::pow(len, lp), ended});
        } else {
          walk(next);
        }
      }
    };
    walk({});
    ASSERT_EQ(all.size(), 15u);  // ended at 1 (1) or 2 (2 of them), or 3 tokens after 4 live prefixes (12)
    std::stable_sort(all.begin(), all.end(), [](const output& a, const output& c) { return a.score > c.score; });
    const auto& got = b.results();
    ASSERT_EQ(got.size(), 9u);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].tokens, all[i].tokens) << "rank " << i << " lp " << lp;
      EXPECT_NEAR(got[i].score, all[i].score, 1e-9) << i;
      EXPECT_EQ(got[i].ended, all[i].ended) << i;
      EXPECT_NEAR(got[i].cumulative_logprob, sum_of(m, prompt, got[i].tokens), 1e-9);
      ASSERT_EQ(got[i].logprobs.size(), got[i].tokens.size());
    }
  }
}

// Width 1 keeps the most likely token at every step: greedy decoding.
TEST(BeamSearch, WidthOneIsGreedyDecoding) {
  fake_model m;
  m.vocab = 50;
  const std::vector<int32_t> prompt{3, 9, 27};
  beam_search b(setup(prompt, 1, 12, {}), ids_from(1));
  drive(b, m);
  ASSERT_TRUE(b.done());
  ASSERT_EQ(b.results().size(), 1u);
  std::vector<int32_t> seq = prompt, greedy;
  for (int i = 0; i < 12; ++i) {
    const auto lp = m.logprobs(seq);
    const int32_t best = static_cast<int32_t>(std::max_element(lp.begin(), lp.end()) - lp.begin());
    greedy.push_back(best);
    seq.push_back(best);
  }
  EXPECT_EQ(b.results()[0].tokens, greedy);
  EXPECT_FALSE(b.results()[0].ended);
}

// Each step asks, per live beam, for one token after the prompt plus the beam (counted as
// output already generated), with 2 × width alternatives (or the client's deeper logprobs);
// only the first scores the prompt; ids are fresh.
TEST(BeamSearch, StepsExtendEachBeamAsOutputWithTwiceTheWidthOfAlternatives) {
  fake_model m;
  m.vocab = 40;
  auto s = setup({5, 6}, 3, 4, {});
  s.base.sampling.prompt_logprobs = 2;
  s.base.sampling.temperature = 0.7f;
  s.base.sampling.seed = 77;
  s.base.generated = 0;
  beam_search b(s, ids_from(10));
  const auto run = drive(b, m);
  ASSERT_EQ(run.steps.size(), 4u);
  ASSERT_EQ(run.steps[0].size(), 1u);
  std::set<uint64_t> ids;
  for (size_t k = 0; k < run.steps.size(); ++k) {
    if (k > 0) {
      EXPECT_EQ(run.steps[k].size(), 3u);
    }
    for (const auto& r : run.steps[k]) {
      EXPECT_TRUE(ids.insert(r.id).second) << "id " << r.id << " twice";
      EXPECT_EQ(r.max_tokens, 1u);
      EXPECT_EQ(r.prompt.size(), 2 + k);
      EXPECT_EQ(r.generated, k);
      EXPECT_EQ(std::vector<int32_t>(r.prompt.begin(), r.prompt.begin() + 2), (std::vector<int32_t>{5, 6}));
      EXPECT_EQ(r.sampling.logprobs, 6);
      EXPECT_EQ(r.sampling.prompt_logprobs, k == 0 ? 2 : -1);
      EXPECT_EQ(r.sampling.seed, 77u);
      EXPECT_FLOAT_EQ(r.sampling.temperature, 0.7f);
      EXPECT_EQ(r.model, "m");
    }
  }
  EXPECT_EQ(b.prompt_logprobs().size(), 1u);  // the first step's, for the prompt's second token
  EXPECT_EQ(b.results().size(), 3u);
  for (const auto& h : b.results()) EXPECT_EQ(h.tokens.size(), 4u);

  auto deeper = setup({5, 6}, 2, 1, {});
  deeper.logprobs = 7;
  beam_search d(deeper, ids_from(1));
  auto first = d.take_requests();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].sampling.logprobs, 7);
  d.on_message(m.answer(first[0]));
  ASSERT_TRUE(d.done());
  for (const auto& h : d.results()) EXPECT_EQ(h.logprobs.at(0).top.size(), 7u);  // the client's count
}

// An end id completes its beam (it is not extended further, and ranks among the results with
// its length counted without the end id); a token of log-probability -inf never enters a
// beam; a drawn token outside the alternatives is a candidate too.
TEST(BeamSearch, EndIdsCompleteBeamsMaskedTokensNeverEnterAndTheDrawnTokenCounts) {
  fake_model m;
  m.vocab = 8;
  m.masked = {4};
  beam_search b(setup({1}, 4, 6, {3}), ids_from(1));
  const auto run = drive(b, m);
  ASSERT_TRUE(b.done());
  for (const auto& step : run.steps) {
    for (const auto& r : step) {
      EXPECT_EQ(std::count(r.prompt.begin() + 1, r.prompt.end(), 3), 0) << "an ended beam was extended";
    }
  }
  for (const auto& h : b.results()) {
    EXPECT_EQ(std::count(h.tokens.begin(), h.tokens.end(), 4), 0);
    EXPECT_EQ(h.ended, !h.tokens.empty() && h.tokens.back() == 3);
    EXPECT_EQ(h.ended || h.tokens.size() == 6, true);
    const double len = 1.0 + static_cast<double>(h.tokens.size()) - (h.ended ? 1.0 : 0.0);
    EXPECT_NEAR(h.score, h.cumulative_logprob / len, 1e-12);
  }
  for (size_t i = 1; i < b.results().size(); ++i) EXPECT_GE(b.results()[i - 1].score, b.results()[i].score);

  // Width 1 asks 2 alternatives; a drawn token ranked last of 8 is still a candidate, and
  // with every other token masked it is the only one.
  fake_model only;
  only.vocab = 8;
  only.masked = {0, 1, 2, 3, 4, 5, 6};
  only.drawn = 7;
  beam_search d(setup({1}, 1, 3, {}), ids_from(1));
  drive(d, only);
  ASSERT_EQ(d.results().size(), 1u);
  EXPECT_EQ(d.results()[0].tokens, (std::vector<int32_t>{7, 7, 7}));
}

// The candidates are the 2 × width most likely (and the drawn token) however deep a row the
// client asks to see: with the two end ids the most likely at every step, width 1 ends at once
// either way (a deeper row would let other tokens live on).
TEST(BeamSearch, TheClientsLogprobsDoNotWidenTheCandidates) {
  fake_model m;
  m.vocab = 30;
  m.boosted = {4, 5};
  auto s = setup({1, 2}, 1, 6, {4, 5});
  beam_search plain(s, ids_from(1));
  drive(plain, m);
  s.logprobs = 8;
  beam_search deep(s, ids_from(1));
  const auto run = drive(deep, m);
  ASSERT_TRUE(plain.done() && deep.done());
  ASSERT_EQ(plain.results().size(), 1u);
  ASSERT_EQ(deep.results().size(), 1u);
  EXPECT_EQ(run.steps.size(), 1u);
  EXPECT_EQ(deep.results()[0].tokens, plain.results()[0].tokens);
  EXPECT_TRUE(deep.results()[0].ended);
  EXPECT_EQ(deep.results()[0].logprobs[0].top.size(), 8u);  // shown, not searched
}

// Fewer possible tokens than the width leave fewer beams; a failed step fails the search,
// which names its other running requests.
TEST(BeamSearch, FewerPossibleTokensGiveFewerBeamsAndAFailureEndsTheSearch) {
  fake_model m;
  m.vocab = 6;
  m.masked = {0, 1, 2, 3};
  beam_search narrow(setup({1}, 5, 1, {}), ids_from(1));
  drive(narrow, m);
  ASSERT_TRUE(narrow.done());
  EXPECT_EQ(narrow.results().size(), 2u);

  fake_model wide;
  wide.vocab = 30;
  beam_search b(setup({1}, 3, 5, {}), ids_from(1));
  auto first = b.take_requests();
  b.on_message(wide.answer(first[0]));
  auto second = b.take_requests();
  ASSERT_EQ(second.size(), 3u);
  b.on_message(wide.answer(second[1]));
  token_msg bad;
  bad.id = second[0].id;
  bad.failed = true;
  bad.err = make_error(errc::replica_unavailable, "gone");
  b.on_message(bad);
  ASSERT_TRUE(b.done());
  ASSERT_TRUE(b.failure());
  EXPECT_EQ(b.failure()->code, errc::replica_unavailable);
  const auto running = b.running();
  EXPECT_NE(std::find(running.begin(), running.end(), second[2].id), running.end());
  EXPECT_EQ(std::find(running.begin(), running.end(), second[1].id), running.end());
  EXPECT_TRUE(b.take_requests().empty());
  b.on_message(wide.answer(second[2]));  // after the end: ignored
  EXPECT_TRUE(b.done());
}

// Stop strings: a beam whose text shows one is complete there (by_stop; its length counts
// every token), none is extended past one, and min_tokens holds them off.
TEST(BeamSearch, AStopStringCompletesTheBeamsThatShowIt) {
  auto tok = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
  ASSERT_TRUE(tok.ok());
  const auto& d = (*tok)->decoder();
  fake_model m;
  m.vocab = 64;
  for (int32_t t = 0; t < 40; ++t) m.masked.push_back(t);  // ids 40..63: ordinary pieces
  auto s = setup({40, 41}, 3, 6, {});
  s.detok = &d;
  // A stop string: the text of a token the search is sure to meet (the most likely first one).
  const auto first = m.logprobs({40, 41});
  const int32_t top = static_cast<int32_t>(std::max_element(first.begin(), first.end()) - first.begin());
  const std::string stop = d.token_bytes(top);
  ASSERT_FALSE(stop.empty());
  s.stop = {stop};
  beam_search b(s, ids_from(1));
  const auto run = drive(b, m);
  ASSERT_TRUE(b.done());
  bool any = false;
  for (const auto& h : b.results()) {
    const std::string text = d.decode(h.tokens);
    const size_t at = text.find(stop);
    if (h.by_stop) {
      any = true;
      EXPECT_TRUE(h.ended);
      ASSERT_NE(at, std::string::npos) << text;
      EXPECT_EQ(at + stop.size(), text.size()) << "the stop ends the beam's text";
      EXPECT_NEAR(h.score, h.cumulative_logprob / static_cast<double>(2 + h.tokens.size()), 1e-12);
    } else {
      EXPECT_EQ(at, std::string::npos) << text;
    }
  }
  EXPECT_TRUE(any);
  for (const auto& step : run.steps) {
    for (const auto& r : step) {
      EXPECT_EQ(d.decode(std::vector<int32_t>(r.prompt.begin() + 2, r.prompt.end())).find(stop), std::string::npos)
          << "a stopped beam was extended";
    }
  }
  // Before min_tokens no stop string counts.
  s.base.sampling.min_tokens = 6;
  beam_search held(s, ids_from(1));
  drive(held, m);
  for (const auto& h : held.results()) EXPECT_FALSE(h.by_stop);
}

// completion_group replays a finished search's beams as the prompt's choices, best first,
// with their token ids, texts and finish reasons; choices beyond the beams found are left out.
TEST(BeamSearch, TheGroupRendersTheBeamsAsChoicesAndHandsOutEachStep) {
  auto tok = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
  ASSERT_TRUE(tok.ok()) << tok.err().message;
  fake_model m;
  m.vocab = 64;  // ids well inside kjv-tiny's vocabulary
  m.masked = {0, 1, 2};
  group_setup g;
  g.id = "cmpl-b";
  g.model = "m";
  g.n = 3;
  completion_group group(g, (*tok)->decoder(), nullptr);
  const std::vector<int32_t> prompt{40, 41};
  for (uint64_t id : {500u, 501u, 502u}) {
    stream_setup s;
    s.prompt_ids = prompt;
    s.return_token_ids = true;
    s.logprobs = 1;
    group.add_choice(id, s);
  }
  auto s = setup(prompt, 3, 4, {});
  s.logprobs = 1;
  auto search = std::make_unique<beam_search>(s, ids_from(900));
  group.add_beam_search(std::move(search), {500, 501, 502});
  beam_search reference(s, ids_from(900));
  drive(reference, m);
  size_t steps = 0;
  for (auto reqs = group.take_submissions(); !reqs.empty(); reqs = group.take_submissions()) {
    ++steps;
    for (const auto& r : reqs) EXPECT_EQ(group.on_message(m.answer(r)), "");
  }
  EXPECT_EQ(steps, 4u);
  ASSERT_TRUE(group.done());
  const auto reply = group.reply();
  ASSERT_EQ(reply.status, 200) << reply.body;
  const auto j = json::parse(reply.body);
  ASSERT_EQ(j["choices"].size(), 3u) << j;
  for (size_t i = 0; i < 3; ++i) {
    const auto& c = j["choices"][i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["token_ids"].get<std::vector<int32_t>>(), reference.results()[i].tokens) << i;
    EXPECT_EQ(c["text"], (*tok)->decoder().decode(reference.results()[i].tokens)) << i;
    EXPECT_EQ(c["finish_reason"], "length");
    ASSERT_EQ(c["logprobs"]["token_logprobs"].size(), 4u);
    double sum = 0;
    for (const auto& v : c["logprobs"]["token_logprobs"]) sum += v.get<double>();
    EXPECT_NEAR(sum, reference.results()[i].cumulative_logprob, 1e-5);
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 2);

  // A width above the tokens possible: the missing beams' choices are not in the response.
  fake_model narrow = m;
  for (int32_t t = 3; t < 62; ++t) narrow.masked.push_back(t);  // two tokens left: 62, 63
  completion_group few(g, (*tok)->decoder(), nullptr);
  for (uint64_t id : {600u, 601u, 602u}) {
    stream_setup c;
    c.prompt_ids = prompt;
    few.add_choice(id, c);
  }
  few.add_beam_search(std::make_unique<beam_search>(setup(prompt, 3, 2, {}), ids_from(1000)), {600, 601, 602});
  for (auto reqs = few.take_submissions(); !reqs.empty(); reqs = few.take_submissions()) {
    for (const auto& r : reqs) few.on_message(narrow.answer(r));
  }
  ASSERT_TRUE(few.done());
  const auto fj = json::parse(few.reply().body);
  ASSERT_EQ(fj["choices"].size(), 3u) << fj;  // 2 tokens × 2 steps: 4 outputs, the best 3
  completion_group one(g, (*tok)->decoder(), nullptr);
  for (uint64_t id : {700u, 701u, 702u}) one.add_choice(id, stream_setup{});
  one.add_beam_search(std::make_unique<beam_search>(setup(prompt, 3, 1, {}), ids_from(2000)), {700, 701, 702});
  for (auto reqs = one.take_submissions(); !reqs.empty(); reqs = one.take_submissions()) {
    for (const auto& r : reqs) one.on_message(narrow.answer(r));
  }
  ASSERT_TRUE(one.done());
  const auto oj = json::parse(one.reply().body);
  ASSERT_EQ(oj["choices"].size(), 2u) << oj;  // one step of two possible tokens
  EXPECT_EQ(oj["choices"][1]["index"], 1);

  // Streamed: the beams' chunks once the search ends, then the usage chunk and [DONE] once,
  // though the last choice has no beam.
  group_setup gs = g;
  gs.streaming = true;
  gs.include_usage = true;
  completion_group streamed(gs, (*tok)->decoder(), nullptr);
  for (uint64_t id : {800u, 801u, 802u}) streamed.add_choice(id, stream_setup{});
  streamed.add_beam_search(std::make_unique<beam_search>(setup(prompt, 3, 1, {}), ids_from(3000)), {800, 801, 802});
  std::string sse;
  for (auto reqs = streamed.take_submissions(); !reqs.empty(); reqs = streamed.take_submissions()) {
    for (const auto& r : reqs) sse += streamed.on_message(narrow.answer(r));
  }
  ASSERT_TRUE(streamed.done());
  ASSERT_TRUE(sse.ends_with("data: [DONE]\n\n")) << sse;
  EXPECT_EQ(sse.find("[DONE]"), sse.rfind("[DONE]"));
  std::set<size_t> indices;
  for (size_t at = 0; (at = sse.find("data: {", at)) != std::string::npos; at += 6) {
    const auto c = json::parse(sse.substr(at + 6, sse.find("\n\n", at) - at - 6));
    if (c["choices"].empty()) {
      EXPECT_EQ(c["usage"]["completion_tokens"], oj["usage"]["completion_tokens"]);
      continue;
    }
    indices.insert(c["choices"][0]["index"].get<size_t>());
  }
  EXPECT_EQ(indices, (std::set<size_t>{0, 1}));
}

// A failed step fails the response and cancels the search's other running requests.
TEST(BeamSearch, AFailedStepFailsTheResponseAndCancelsTheOthers) {
  auto tok = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
  ASSERT_TRUE(tok.ok());
  fake_model m;
  m.vocab = 64;
  group_setup g;
  g.id = "cmpl-f";
  g.model = "m";
  g.n = 2;
  completion_group group(g, (*tok)->decoder(), nullptr);
  group.add_choice(1, stream_setup{});
  group.add_choice(2, stream_setup{});
  group.add_beam_search(std::make_unique<beam_search>(setup({40}, 2, 3, {}), ids_from(10)), {1, 2});
  auto first = group.take_submissions();
  ASSERT_EQ(first.size(), 1u);
  group.on_message(m.answer(first[0]));
  auto second = group.take_submissions();
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(group.running_searches().size(), 2u);
  token_msg bad;
  bad.id = second[1].id;
  bad.failed = true;
  bad.err = make_error(errc::replica_unavailable, "no replica left");
  group.on_message(bad);
  ASSERT_TRUE(group.done());
  EXPECT_EQ(group.reply().status, 503) << group.reply().body;
  const auto cancels = group.take_cancellations();
  EXPECT_NE(std::find(cancels.begin(), cancels.end(), second[0].id), cancels.end());
}

}  // namespace
}  // namespace llmesh::gateway
