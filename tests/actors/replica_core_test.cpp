// The replica's work loop on the real CPU engine: every request's tokens equal what
// model::generate produces for it alone — greedy and sampled, at 16 concurrent requests, with
// a small token budget (chunked prefill beside decodes), a KV pool small enough to force
// preemption, prefix-cache hits, and at --tp 2. Exact equality: the kernels are batch- and
// chunk-invariant and sampling is keyed by (seed, position).
#include "llmesh/actors/request_tracker.hpp"
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

class ReplicaCore : public testing::replica_test_base {};

std::map<uint64_t, std::vector<int32_t>> serve(replica_core& rc, const std::vector<replica_request>& reqs) {
  return testing::serve_tokens(rc, reqs);
}

TEST_F(ReplicaCore, ConcurrentRequestsMatchGenerateAlone) {
  auto reqs = requests(16);
  auto want = alone(reqs, 1);
  auto e = engine(1, 1024);
  scheduler_config cfg;
  cfg.max_batch_tokens = 48;  // prompts arrive in chunks beside other requests' decodes
  replica_core rc(*e, cfg);
  auto got = serve(rc, reqs);
  for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id;
  EXPECT_GT(rc.blocks().hit_tokens(), 0u);  // the shared system prompt came from the cache
  EXPECT_EQ(rc.blocks().free_blocks(), rc.blocks().total_blocks());
}

TEST_F(ReplicaCore, PreemptionUnderATightCacheChangesNoToken) {
  auto reqs = requests(16);
  auto want = alone(reqs, 1);
  auto e = engine(1, 160);  // 20 blocks of 8: a few requests at a time
  scheduler_config cfg;
  cfg.max_batch_tokens = 64;
  replica_core rc(*e, cfg);
  auto got = serve(rc, reqs);
  for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id;
  EXPECT_GT(rc.scheduler().preemptions(), 0u);
}

TEST_F(ReplicaCore, TensorParallelReplicaMatchesGenerate) {
  auto reqs = requests(8);
  auto want = alone(reqs, 2);
  auto e = engine(2, 1024);
  replica_core rc(*e, scheduler_config{});
  auto got = serve(rc, reqs);
  for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id;
}

TEST_F(ReplicaCore, CancelAndBadRequests) {
  auto e = engine(1, 256);
  replica_core rc(*e, scheduler_config{});
  replica_request r;
  r.id = 1;
  r.prompt = {1, 2, 3};
  r.max_tokens = 100;
  ASSERT_TRUE(rc.submit(r).ok());
  ASSERT_TRUE(rc.step().ok());
  EXPECT_TRUE(rc.cancel(1));
  EXPECT_TRUE(rc.idle());
  EXPECT_EQ(rc.blocks().free_blocks(), rc.blocks().total_blocks());
  r.id = 2;
  r.prompt = {1, 400};  // outside the vocabulary
  EXPECT_FALSE(rc.submit(r).ok());
  r.prompt = {1};
  r.max_tokens = 600;  // beyond the context
  EXPECT_FALSE(rc.submit(r).ok());
  r.max_tokens = 300;  // fits the context, not this replica's 256-token cache
  EXPECT_FALSE(rc.submit(r).ok());
}

/// Requests with penalties and min_tokens (greedy and sampled, tp 1 and 2), beside plain ones.
std::vector<replica_request> penalized(std::vector<replica_request> reqs) {
  for (auto& r : reqs) {
    switch (r.id % 4) {
      case 0: r.sampling.repetition_penalty = 1.3f; break;
      case 1: r.sampling.presence_penalty = 0.8f, r.sampling.frequency_penalty = 0.4f; break;
      case 2: r.sampling.frequency_penalty = -0.5f, r.sampling.repetition_penalty = 0.8f; break;
      default: break;  // none: the plain path beside the others
    }
    if (r.id % 3 == 1) {
      r.sampling.min_tokens = static_cast<int>(r.max_tokens);  // no end before max_tokens
      r.eos_ids = {7, 8, 9, 10, 11, 12, 13, 14};
    }
  }
  return reqs;
}

TEST_F(ReplicaCore, PenaltiesAndMinTokensMatchGenerateAlone) {
  for (int tp : {1, 2}) {
    auto reqs = penalized(requests(12));
    auto want = alone(reqs, tp);
    auto plain = alone(requests(12), tp);
    size_t changed = 0;
    for (const auto& r : reqs) changed += want[r.id] != plain[r.id];
    EXPECT_GT(changed, 4u) << "the penalties should change most outputs";
    auto e = engine(tp, 1024);
    scheduler_config cfg;
    cfg.max_batch_tokens = 48;
    replica_core rc(*e, cfg);
    auto got = serve(rc, reqs);
    for (const auto& r : reqs) {
      EXPECT_EQ(got[r.id], want[r.id]) << "tp " << tp << " request " << r.id;
      if (r.sampling.min_tokens > 0) {
        EXPECT_EQ(got[r.id].size(), r.max_tokens) << "request " << r.id;
      }
    }
  }
}

TEST_F(ReplicaCore, LogitBiasSteersEveryDrawAsInGenerate) {
  for (int tp : {1, 2}) {
    auto reqs = requests(6);
    auto plain = alone(reqs, tp);
    for (auto& r : reqs) {
      // Forbid the token the plain stream starts with, and push another one up.
      r.logit_bias = {{plain[r.id].front(), -100.0f}, {static_cast<int32_t>(17 + r.id), 4.0f}};
    }
    auto want = alone(reqs, tp);
    auto e = engine(tp, 1024);
    replica_core rc(*e, scheduler_config{});
    auto got = serve(rc, reqs);
    for (const auto& r : reqs) {
      EXPECT_EQ(got[r.id], want[r.id]) << "tp " << tp << " request " << r.id;
      EXPECT_NE(got[r.id].front(), plain[r.id].front()) << "request " << r.id;
    }
  }
  auto e = engine(1, 256);
  replica_core rc(*e, scheduler_config{});
  replica_request bad;
  bad.id = 9;
  bad.prompt = {1, 2};
  bad.logit_bias = {{300, 1.0f}};  // outside the 300-token vocabulary
  EXPECT_FALSE(rc.submit(bad).ok());
  bad.logit_bias = {{3, 1.0f}, {3, 2.0f}};
  EXPECT_FALSE(rc.submit(bad).ok());
  bad.logit_bias = {{3, std::numeric_limits<float>::infinity()}};
  EXPECT_FALSE(rc.submit(bad).ok());
}

TEST_F(ReplicaCore, MinTokensHoldsBackAnEndThatGreedyWouldPickAtOnce) {
  // The greedy first token made an end id: without min_tokens the request ends after one token.
  replica_request r;
  r.id = 1;
  r.prompt = {5, 6, 7};
  r.max_tokens = 6;
  auto first = alone({r}, 1)[1];
  ASSERT_FALSE(first.empty());
  r.eos_ids = {first[0]};
  auto e = engine(1, 256);
  replica_core rc(*e, scheduler_config{});
  EXPECT_EQ(serve(rc, {r})[1], (std::vector<int32_t>{first[0]}));
  r.id = 2;
  r.sampling.min_tokens = 4;
  auto got = serve(rc, {r})[2];
  ASSERT_GE(got.size(), 5u);
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(got[i], first[0]) << "position " << i;
  replica_request g = r;
  EXPECT_EQ(got, alone({g}, 1)[2]);
}

TEST_F(ReplicaCore, APenalizedRequestContinuedAfterFailoverGivesTheSameTokens) {
  // The request tracker's continuation (prompt + output so far, `generated` of them output)
  // on a fresh replica gives exactly the rest of the uninterrupted stream.
  auto reqs = penalized(requests(8));
  for (auto& r : reqs) r.max_tokens = std::max<size_t>(r.max_tokens, 10);
  auto want = alone(reqs, 1);
  for (const auto& r : reqs) {
    request_tracker t(r, 3);
    const size_t cut = want[r.id].size() / 2;
    for (size_t i = 0; i < cut; ++i) t.on_token(want[r.id][i], false);
    auto next = t.failover();
    ASSERT_TRUE(next.ok()) << next.err().message;
    EXPECT_EQ(next->generated, cut);
    auto e = engine(1, 512);
    replica_core rc(*e, scheduler_config{});
    auto rest = serve(rc, {*next})[r.id];
    std::vector<int32_t> joined(want[r.id].begin(), want[r.id].begin() + static_cast<std::ptrdiff_t>(cut));
    joined.insert(joined.end(), rest.begin(), rest.end());
    EXPECT_EQ(joined, want[r.id]) << "request " << r.id << " cut at " << cut;
  }
  // A continuation that claims more output than prompt is refused.
  auto e = engine(1, 256);
  replica_core rc(*e, scheduler_config{});
  replica_request bad = reqs[0];
  bad.generated = bad.prompt.size() + 1;
  EXPECT_FALSE(rc.submit(bad).ok());
}

/// What each prompt's scoring should give: prompt token i + 1's log-probability under the
/// logits a step ending at token i returns (the prompt fed one token per step, so each
/// position's logits come from a one-row LM head).
std::vector<kernels::token_logprobs> scored_alone(model::engine& e, const std::vector<int32_t>& prompt, int n) {
  const int seq = e.open_sequence();
  std::vector<kernels::token_logprobs> out;
  const size_t vocab = e.config().vocab;
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    const model::step_item it{seq, std::span(&prompt[i], 1), true};
    std::vector<float> logits;
    EXPECT_TRUE(e.step(std::span(&it, 1), logits).ok());
    out.push_back(kernels::compute_logprobs(std::span<const float>(logits).first(vocab), prompt[i + 1], n));
  }
  e.close_sequence(seq);
  return out;
}

/// Prompt scoring (vLLM's prompt_logprobs) beside plain requests, with prompts in chunks of a
/// small token budget, a shared prefix in the cache (a scored prompt must not take it: cached
/// positions have no logits), and at tp 2: every scored entry equals the one-token-per-step
/// reference, it comes with the request's first token only, and no token changes.
TEST_F(ReplicaCore, PromptLogprobsAreThoseOfTheLogitsBeforeEachPromptToken) {
  auto reqs = requests(12);
  for (auto& r : reqs) {
    if (r.id % 2 == 0) r.sampling.prompt_logprobs = static_cast<int>(r.id % 6);  // 0, 2, 4 alternatives
  }
  // tp 1 and 2 with room; then a cache so tight that scored prompts are preempted and
  // recomputed (their entries written again, the same).
  for (const auto& [tp, kv] : std::vector<std::pair<int, size_t>>{{1, 1024}, {2, 1024}, {1, 160}}) {
    auto want = alone(reqs, tp);
    auto ref = engine(tp, 512);
    std::map<uint64_t, std::vector<kernels::token_logprobs>> want_scored;
    for (const auto& r : reqs) {
      if (r.sampling.prompt_logprobs >= 0) want_scored[r.id] = scored_alone(*ref, r.prompt, r.sampling.prompt_logprobs);
    }
    auto e = engine(tp, kv);
    scheduler_config cfg;
    cfg.max_batch_tokens = 20;  // prompts of up to 64 tokens arrive in chunks
    replica_core rc(*e, cfg);
    // A plain request with the shared prefix first, so that the cache holds it.
    replica_request warm = reqs[3];
    warm.id = 100;
    for (const auto& r : std::vector{warm}) ASSERT_TRUE(rc.submit(r).ok());
    while (!rc.idle()) ASSERT_TRUE(rc.step().ok());
    std::map<uint64_t, std::vector<int32_t>> got;
    std::map<uint64_t, std::vector<kernels::token_logprobs>> got_scored;
    for (const auto& r : reqs) ASSERT_TRUE(rc.submit(r).ok());
    for (int guard = 0; !rc.idle() && guard < 10000; ++guard) {
      auto ev = rc.step();
      ASSERT_TRUE(ev.ok()) << ev.err().message;
      for (auto& x : *ev) {
        if (!got[x.id].empty() || want_scored.count(x.id) == 0) {
          EXPECT_TRUE(x.prompt_logprobs.empty()) << "request " << x.id << " token " << got[x.id].size();
        } else {
          got_scored[x.id] = x.prompt_logprobs;
        }
        got[x.id].push_back(x.token);
      }
    }
    for (const auto& r : reqs) {
      EXPECT_EQ(got[r.id], want[r.id]) << "tp " << tp << " request " << r.id;
      if (r.sampling.prompt_logprobs < 0) continue;
      const auto& g = got_scored[r.id];
      const auto& w = want_scored[r.id];
      ASSERT_EQ(g.size(), r.prompt.size() - 1) << "tp " << tp << " request " << r.id;
      for (size_t i = 0; i < w.size(); ++i) {
        EXPECT_EQ(g[i], w[i]) << "tp " << tp << " request " << r.id << " position " << i;
        EXPECT_EQ(g[i].top.size(), static_cast<size_t>(r.sampling.prompt_logprobs));
      }
    }
    if (kv == 160) {
      EXPECT_GT(rc.scheduler().preemptions(), 0u);
    }
  }
}

TEST_F(ReplicaCore, AContinuedRequestDoesNotScoreItsPromptAgain) {
  auto e = engine(1, 256);
  replica_core rc(*e, scheduler_config{});
  replica_request r;
  r.id = 1;
  r.prompt = {5, 6, 7, 8};
  r.max_tokens = 2;
  r.generated = 2;  // failover: the prompt was scored on the replica that died
  r.sampling.prompt_logprobs = 3;
  ASSERT_TRUE(rc.submit(r).ok());
  auto ev = rc.step();
  ASSERT_TRUE(ev.ok());
  ASSERT_EQ(ev->size(), 1u);
  EXPECT_TRUE((*ev)[0].prompt_logprobs.empty());
  r.id = 2;
  r.generated = 0;
  r.sampling.prompt_logprobs = kernels::max_logprobs + 1;
  EXPECT_FALSE(rc.submit(r).ok());
}

/// n choices of one prompt (as the gateway submits them) arrive together: one computes the
/// prompt, the others wait for its blocks and take them from the prefix cache, and every
/// choice still gets exactly its own tokens. A prompt asking to be scored computes its own.
TEST_F(ReplicaCore, ChoicesOfOnePromptComputeItOnce) {
  std::vector<replica_request> reqs;
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(61);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % 300);
  for (uint64_t id = 0; id < 6; ++id) {
    replica_request r;
    r.id = id;
    r.prompt = prompt;
    r.max_tokens = 5;
    r.sampling.temperature = 0.9f;
    r.sampling.seed = 50 + id;
    reqs.push_back(r);
  }
  auto want = alone(reqs, 1);
  auto e = engine(1, 1024);
  replica_core rc(*e, scheduler_config{});
  auto got = serve(rc, reqs);
  for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id;
  EXPECT_GT(rc.scheduler().deferrals(), 0u);
  EXPECT_EQ(rc.blocks().hit_tokens(), 5u * 56u);  // 7 whole blocks of 8 (never the last token's), 5 times

  auto e2 = engine(1, 1024);
  replica_core scored(*e2, scheduler_config{});
  for (auto& r : reqs) r.sampling.prompt_logprobs = 0;
  auto again = serve(scored, reqs);
  for (const auto& r : reqs) EXPECT_EQ(again[r.id], want[r.id]) << "request " << r.id;
  EXPECT_EQ(scored.scheduler().deferrals(), 0u);
  EXPECT_EQ(scored.blocks().hit_tokens(), 0u);

  // A prompt already in the cache: a plain request beside a scored one with the same prompt
  // takes the cache at once, rather than waiting for the scored one to recompute it.
  auto e3 = engine(1, 1024);
  replica_core mixed(*e3, scheduler_config{});
  replica_request warm = reqs[5];
  warm.id = 99;
  warm.sampling.prompt_logprobs = -1;
  serve(mixed, {warm});
  const size_t hits_before = mixed.blocks().hit_tokens();
  reqs[1].sampling.prompt_logprobs = -1;  // reqs[0] scores, reqs[1] does not
  auto both = serve(mixed, {reqs[0], reqs[1]});
  EXPECT_EQ(both[0], want[0]);
  EXPECT_EQ(both[1], want[1]);
  EXPECT_EQ(mixed.scheduler().deferrals(), 0u);
  EXPECT_EQ(mixed.blocks().hit_tokens() - hits_before, 56u);
}

// --- speculative decoding: drafts by prompt lookup, each kept only where the model draws it ---

/// Requests whose prompts repeat a stretch (text to copy), greedy and sampled, long enough for
/// the tiny model's output to fall into loops a lookup can follow.
std::vector<replica_request> copying_requests(std::vector<replica_request> reqs) {
  for (auto& r : reqs) {
    const auto stretch = r.prompt;
    if (r.id % 2 == 0) r.prompt.insert(r.prompt.end(), stretch.begin(), stretch.end());
    r.max_tokens = 24 + r.id * 3;
  }
  return reqs;
}

TEST_F(ReplicaCore, SpeculationGivesTheTokensOfAPlainDecode) {
  auto reqs = copying_requests(requests(12));
  reqs[3].sampling.logprobs = 3;  // logprobs ride along with speculation
  for (int tp : {1, 2}) {
    auto want = alone(reqs, tp);
    for (size_t kv : {1024, 200}) {  // roomy, and tight enough to preempt
      auto e = engine(tp, kv);
      scheduler_config cfg;
      cfg.max_batch_tokens = 48;
      cfg.speculation = {4, 3, 1};
      replica_core rc(*e, cfg);
      auto got = serve(rc, reqs);
      for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id << " tp " << tp << " kv " << kv;
      EXPECT_GT(rc.scheduler().drafted(), 0u);
      EXPECT_GT(rc.scheduler().accepted(), 0u) << "no draft kept: the test no longer exercises speculation";
      EXPECT_EQ(rc.blocks().free_blocks(), rc.blocks().total_blocks());
    }
  }
}

/// Every event of a run, by request.
std::map<uint64_t, std::vector<token_event>> events_of(replica_core& rc, const std::vector<replica_request>& reqs) {
  std::map<uint64_t, std::vector<token_event>> out;
  for (const auto& r : reqs) EXPECT_TRUE(rc.submit(r).ok());
  for (int guard = 0; !rc.idle() && guard < 10000; ++guard) {
    auto ev = rc.step();
    EXPECT_TRUE(ev.ok());
    if (!ev.ok()) break;
    for (auto& e : *ev) out[e.id].push_back(std::move(e));
  }
  return out;
}

TEST_F(ReplicaCore, SpeculatedTokensCarryTheLogprobsOfAPlainDecode) {
  auto reqs = copying_requests(requests(6));
  for (auto& r : reqs) r.sampling.logprobs = 2;
  auto e = engine(1, 1024);
  replica_core plain(*e, scheduler_config{});
  auto want = events_of(plain, reqs);
  scheduler_config cfg;
  cfg.speculation = {4, 3, 1};
  replica_core rc(*e, cfg);
  auto got = events_of(rc, reqs);
  ASSERT_GT(rc.scheduler().accepted(), 0u);
  for (const auto& r : reqs) {
    ASSERT_EQ(got[r.id].size(), want[r.id].size()) << "request " << r.id;
    for (size_t i = 0; i < want[r.id].size(); ++i) {
      const auto& a = got[r.id][i];
      const auto& b = want[r.id][i];
      EXPECT_EQ(a.token, b.token);
      ASSERT_TRUE(a.logprobs && b.logprobs) << "request " << r.id << " token " << i;
      EXPECT_EQ(a.logprobs->logprob, b.logprobs->logprob) << "request " << r.id << " token " << i;
      EXPECT_EQ(a.logprobs->top.size(), 2u);
      EXPECT_TRUE(*a.logprobs == *b.logprobs) << "request " << r.id << " token " << i;
    }
  }
}

TEST_F(ReplicaCore, SpeculationWithPenaltiesBiasAndMinTokensGivesGeneratesTokens) {
  // Each drawn row's adjustments count the drafts before it as output: the penalties, the
  // bias and min_tokens's ban see what a plain decode would have seen at that position.
  auto reqs = copying_requests(requests(12));
  for (auto& r : reqs) {
    switch (r.id % 4) {
      case 0: r.sampling.repetition_penalty = 1.3f; break;
      case 1: r.sampling.frequency_penalty = 0.4f, r.sampling.presence_penalty = 0.3f; break;
      case 2: r.sampling.min_tokens = 20, r.eos_ids = {7, 8, 9, 10, 11, 12, 13, 14}; break;
      default: r.logit_bias = {{5, 4.0f}, {6, -3.0f}};
    }
    if (r.id % 3 == 0) r.sampling.frequency_penalty = -1.5f;  // rewards repeats: drafts get kept, and counts matter
  }
  auto want = alone(reqs, 1);
  for (int tp : {1, 2}) {
    auto e = engine(tp, 1024);
    scheduler_config cfg;
    cfg.max_batch_tokens = 48;
    cfg.speculation = {4, 3, 1};
    replica_core rc(*e, cfg);
    auto got = serve(rc, reqs);
    for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id << " tp " << tp;
    EXPECT_GT(rc.scheduler().accepted(), 0u) << "no draft kept: the test no longer exercises speculation";
  }
}

TEST_F(ReplicaCore, SpeculationHoldsBackAnEndUntilMinTokensAtEveryRow) {
  // The end id is what greedy wants most (a large bias): each request ends exactly when
  // min_tokens allows it, wherever that falls among a step's drafts.
  auto reqs = copying_requests(requests(8));
  for (auto& r : reqs) {
    r.sampling = {};
    r.sampling.seed = 1000 + r.id;
    r.sampling.frequency_penalty = -1.5f;  // repeats: drafts get kept
    r.sampling.min_tokens = static_cast<int>(9 + r.id * 2);
    r.eos_ids = {7};
    r.logit_bias = {{7, 60.0f}};
    r.max_tokens = 60;
  }
  auto want = alone(reqs, 1);
  auto e = engine(1, 1024);
  scheduler_config cfg;
  cfg.speculation = {6, 3, 1};
  replica_core rc(*e, cfg);
  auto got = serve(rc, reqs);
  for (const auto& r : reqs) {
    EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id;
    EXPECT_EQ(got[r.id].size(), static_cast<size_t>(r.sampling.min_tokens) + 1) << "request " << r.id;
  }
  EXPECT_GT(rc.scheduler().accepted(), 0u);
}

}  // namespace
}  // namespace llmesh::actors

namespace llmesh::actors {
namespace {

// vLLM's allowed_token_ids: every draw (sampled, at tp 1 and 2, with speculation) is one of the
// set; an id outside the vocabulary or beside a constraint is refused; a set of end ids only
// ends the request at once even under min_tokens (no row is left with nothing to draw).
TEST_F(ReplicaCore, AllowedTokenIdsAreTheOnlyDraws) {
  const std::vector<int32_t> allowed{3, 17, 40, 41, 299};
  auto reqs = copying_requests(requests(6));
  for (auto& r : reqs) {
    r.allowed_ids = allowed;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 11 + r.id;
  }
  for (int tp : {1, 2}) {
    auto e = engine(tp, 1024);
    scheduler_config cfg;
    cfg.speculation = {4, 3, 1};
    replica_core rc(*e, cfg);
    auto got = serve(rc, reqs);
    for (const auto& r : reqs) {
      ASSERT_FALSE(got[r.id].empty());
      for (int32_t t : got[r.id]) {
        EXPECT_TRUE(std::find(allowed.begin(), allowed.end(), t) != allowed.end()) << t << " tp " << tp << " request " << r.id;
      }
    }
  }
  auto e = engine(1, 256);
  replica_core rc(*e, scheduler_config{});
  replica_request one;
  one.id = 50;
  one.prompt = {5, 6, 7};
  one.max_tokens = 6;
  one.eos_ids = {9};
  one.allowed_ids = {9};
  one.sampling.min_tokens = 4;
  EXPECT_EQ(serve(rc, {one})[50], (std::vector<int32_t>{9})) << "the only allowed token is an end id: drawn at once";
  replica_request bad = one;
  bad.id = 51;
  bad.allowed_ids = {300};  // outside the 300-token vocabulary
  EXPECT_FALSE(rc.submit(bad).ok());
  bad.allowed_ids = {3};
  bad.constraint = {model::constraint_spec::kind::regex, "[a-z]+"};
  EXPECT_FALSE(rc.submit(bad).ok());
}

}  // namespace
}  // namespace llmesh::actors
