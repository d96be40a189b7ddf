// Speculative decoding with a draft model: the proposer's drafts are the draft model's greedy
// continuation (model::generate's), its KV follows each history (only new tokens run), it
// evicts and forgets; load_draft_model checks the vocabulary; and a replica speculating with a
// draft model gives exactly the tokens of a plain decode, at tp 1 and 2, under preemption.
#include <fstream>
#include <nlohmann/json.hpp>

#include "llmesh/actors/draft_model_proposer.hpp"
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

using testing::replica_test_base;
using testing::serve_tokens;

class DraftModel : public replica_test_base {
 protected:
  /// A second random model of the same vocabulary (another seed: its guesses are often wrong).
  std::shared_ptr<const model::model> other_model(model::testing::temp_dir& dir, size_t vocab = 300) {
    model::random_model_spec spec;
    spec.hidden = 32;
    spec.intermediate = 64;
    spec.n_layers = 1;
    spec.n_heads = 2;
    spec.n_kv_heads = 1;
    spec.vocab = vocab;
    spec.max_positions = 512;
    spec.seed = 77;
    EXPECT_TRUE(model::write_random_model(spec, dir.path()).ok());
    auto m = model::model::load(dir.path());
    EXPECT_TRUE(m.ok());
    return m.ok() ? *m : nullptr;
  }

  std::unique_ptr<draft_model_proposer> proposer(std::shared_ptr<const model::model> m, size_t kv_tokens = 512,
                                                 int32_t target_vocab = 300) {
    draft_model_proposer::options o;
    o.threads = 2;
    o.kv_tokens = kv_tokens;
    o.block_size = 8;
    o.target_vocab = target_vocab;
    o.chunk = 16;  // prompts catch up over several forwards
    auto p = draft_model_proposer::create(std::move(m), o);
    EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.err().message);
    return p.ok() ? std::move(*p) : nullptr;
  }

  /// The model's greedy continuation of `prompt`, `n` tokens (model::generate alone).
  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, size_t n) {
    auto e = engine(1, 512);
    model::generate_request g;
    g.prompt = prompt;
    g.max_tokens = n;
    auto r = model::generate(*e, g);
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->tokens : std::vector<int32_t>{};
  }

  static std::vector<int32_t> prompt(uint32_t seed, size_t n) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p(n);
    for (auto& t : p) t = static_cast<int32_t>(rng() % 300);
    return p;
  }
};

TEST_F(DraftModel, DraftsAreTheDraftModelsGreedyContinuation) {
  auto p = proposer(model_);
  ASSERT_TRUE(p);
  const auto a = prompt(1, 37), b = prompt(2, 5);
  std::vector<draft_query> q{{1, a, 5}, {2, b, 3}};
  std::vector<std::vector<int32_t>> out;
  ASSERT_TRUE(p->propose(q, out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0], greedy(a, 5));
  EXPECT_EQ(out[1], greedy(b, 3));
  EXPECT_EQ(p->tokens_run(), a.size() + 4 + b.size() + 2) << "the histories once, then k - 1 decodes each";
  EXPECT_EQ(p->sequences(), 2u);
}

TEST_F(DraftModel, ItsKvFollowsTheHistoryTheTargetKept) {
  auto p = proposer(model_);
  ASSERT_TRUE(p);
  auto h = prompt(3, 20);
  std::vector<std::vector<int32_t>> out;
  ASSERT_TRUE(p->propose(std::vector<draft_query>{{9, h, 4}}, out).ok());
  const auto first = out[0];
  ASSERT_EQ(first.size(), 4u);
  // The target kept the first draft and drew something else after it.
  h.push_back(first[0]);
  h.push_back((first[1] + 1) % 300);
  const size_t before = p->tokens_run();
  ASSERT_TRUE(p->propose(std::vector<draft_query>{{9, h, 3}}, out).ok());
  EXPECT_EQ(out[0], greedy(h, 3));
  EXPECT_EQ(p->tokens_run() - before, 1 + 2u) << "only the token drawn instead of draft 2 catches up, then 2 decodes";
  // Every draft kept, and the token after them: the last draft and that token catch up.
  const auto second = out[0];
  h.insert(h.end(), second.begin(), second.end());
  h.push_back(7);
  const size_t mid = p->tokens_run();
  ASSERT_TRUE(p->propose(std::vector<draft_query>{{9, h, 2}}, out).ok());
  EXPECT_EQ(out[0], greedy(h, 2));
  EXPECT_EQ(p->tokens_run() - mid, 2 + 1u);
}

TEST_F(DraftModel, ALongHistoryCatchesUpOverSeveralCalls) {
  draft_model_proposer::options o;
  o.threads = 2;
  o.kv_tokens = 512;
  o.block_size = 8;
  o.target_vocab = 300;
  o.chunk = 8;
  o.catch_up = 16;  // history tokens a call
  auto made = draft_model_proposer::create(model_, o);
  ASSERT_TRUE(made.ok());
  auto& p = *made;
  const auto h = prompt(12, 40);
  std::vector<std::vector<int32_t>> out;
  for (size_t call = 1; call <= 2; ++call) {
    ASSERT_TRUE(p->propose(std::vector<draft_query>{{1, h, 3}}, out).ok());
    EXPECT_TRUE(out[0].empty()) << "call " << call << ": still catching up";
    EXPECT_EQ(p->tokens_run(), 16 * call);
  }
  ASSERT_TRUE(p->propose(std::vector<draft_query>{{1, h, 3}}, out).ok());
  EXPECT_EQ(out[0], greedy(h, 3)) << "caught up: the drafts of a history run whole";
  EXPECT_EQ(p->tokens_run(), 40 + 2u);
}

TEST_F(DraftModel, ForgetFreesAndAShortCacheEvictsWhoWasNotAsked) {
  auto p = proposer(model_, 64);  // 8 blocks of 8 positions
  ASSERT_TRUE(p);
  const size_t all = p->free_blocks();
  ASSERT_EQ(all, 8u);
  const auto a = prompt(4, 30), b = prompt(5, 30);  // 4 blocks each with their drafts
  std::vector<std::vector<int32_t>> out;
  ASSERT_TRUE(p->propose(std::vector<draft_query>{{1, a, 3}}, out).ok());
  EXPECT_EQ(out[0].size(), 3u);
  ASSERT_TRUE(p->propose(std::vector<draft_query>{{2, b, 3}}, out).ok());
  EXPECT_EQ(out[0], greedy(b, 3));
  // Both asked at once, with more than the cache holds: the second gets none, the first its drafts.
  const auto c = prompt(6, 40);
  ASSERT_TRUE(p->propose(std::vector<draft_query>{{1, a, 3}, {3, c, 4}}, out).ok());
  EXPECT_EQ(out[0], greedy(a, 3));
  EXPECT_TRUE(out[1].empty());
  // Alone, the longer one evicts the others' state.
  ASSERT_TRUE(p->propose(std::vector<draft_query>{{3, c, 4}}, out).ok());
  EXPECT_EQ(out[0], greedy(c, 4));
  for (uint64_t id : {1, 2, 3}) p->forget(id);
  p->forget(42);  // unknown: ignored
  EXPECT_EQ(p->free_blocks(), all);
  EXPECT_EQ(p->sequences(), 0u);
}

TEST_F(DraftModel, DraftsOutsideTheTargetsVocabularyOrPositionsAreCut) {
  const auto h = prompt(7, 12);
  const auto want = greedy(h, 4);
  ASSERT_GT(want[0], 0) << "a target vocabulary of want[0] ids must hold at least one";
  std::vector<std::vector<int32_t>> out;
  // A target whose vocabulary ends below the first greedy draft: nothing to propose.
  auto p = proposer(model_, 512, want[0]);
  ASSERT_TRUE(p);
  ASSERT_TRUE(p->propose(std::vector<draft_query>{{1, h, 4}}, out).ok());
  EXPECT_TRUE(out[0].empty());
  // Near the draft's last position (512): k shrinks so that the last draft fed fits.
  auto q = proposer(model_);
  const auto longest = prompt(8, 510);
  ASSERT_TRUE(q->propose(std::vector<draft_query>{{1, longest, 8}, {2, prompt(9, 513), 4}, {3, h, 0}}, out).ok());
  EXPECT_EQ(out[0].size(), 3u);
  EXPECT_TRUE(out[1].empty()) << "a history past the draft's positions";
  EXPECT_TRUE(out[2].empty());
}

TEST_F(DraftModel, AHistoryTokenTheDraftLacksGetsNoDraftsAndHarmsNoOther) {
  model::testing::temp_dir small_dir;
  auto small = other_model(small_dir, 270);  // a target of 300 ids: its ids 270..299 are not the draft's
  ASSERT_TRUE(small);
  auto p = proposer(small);
  ASSERT_TRUE(p);
  auto odd = prompt(10, 9);
  odd[4] = 285;
  auto fine = prompt(11, 9);
  for (auto& t : fine) t %= 270;
  std::vector<std::vector<int32_t>> out;
  ASSERT_TRUE(p->propose(std::vector<draft_query>{{1, odd, 3}, {2, fine, 3}}, out).ok());
  EXPECT_TRUE(out[0].empty());
  EXPECT_EQ(out[1].size(), 3u);
}

/// Copying text so that drafts from a weak model sometimes land, plus the fixture's requests.
std::vector<replica_request> speculating_requests(std::vector<replica_request> reqs) {
  for (auto& r : reqs) r.max_tokens = 16 + r.id * 2;
  return reqs;
}

TEST_F(DraftModel, AReplicaSpeculatingWithADraftGivesThePlainTokens) {
  model::testing::temp_dir other_dir;
  auto other = other_model(other_dir);
  ASSERT_TRUE(other);
  auto reqs = speculating_requests(requests(10));
  reqs[3].sampling.logprobs = 2;
  for (int tp : {1, 2}) {
    auto want = alone(reqs, tp);
    for (auto draft : {model_, other}) {
      for (size_t kv : {1024, 200}) {  // roomy, and tight enough to preempt
        auto e = engine(tp, kv);
        scheduler_config cfg;
        cfg.max_batch_tokens = 48;
        cfg.speculation.tokens = 4;
        cfg.draft_model = draft;
        replica_core rc(*e, cfg);
        auto got = serve_tokens(rc, reqs);
        const std::string what = std::string(draft == model_ ? "self" : "other") + " draft, tp " + std::to_string(tp) +
                                 ", kv " + std::to_string(kv);
        for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id << ", " << what;
        EXPECT_GT(rc.scheduler().drafted(), 0u) << what;
        if (draft == model_) {
          // The target itself drafting: every greedy request's drafts are drawn as proposed.
          EXPECT_GT(rc.scheduler().accepted() * 2, rc.scheduler().drafted()) << what;
        }
        EXPECT_EQ(rc.scheduler().draft_failures(), 0u);
        ASSERT_NE(rc.scheduler().draft_model(), nullptr);
        EXPECT_EQ(rc.scheduler().draft_model()->sequences(), 0u) << "finished requests leave no draft state";
        EXPECT_EQ(rc.blocks().free_blocks(), rc.blocks().total_blocks());
      }
    }
  }
}

TEST_F(DraftModel, GreedyRequestsKeepEveryDraftOfTheTargetItself) {
  // Every draft is the target's own greedy token, so each is kept: a draft KV out of step with
  // the history (after an eviction, a preemption, a partial catch-up) would show as a miss.
  auto reqs = requests(8);
  for (auto& r : reqs) {
    r.sampling = {};
    r.eos_ids.clear();
    r.max_tokens = 30;
  }
  for (int tp : {1, 2}) {
    auto want = alone(reqs, tp);
    for (size_t kv : {1024, 200}) {  // the draft's KV as tight as the replica's: it evicts
      auto e = engine(tp, kv);
      scheduler_config cfg;
      cfg.max_batch_tokens = 40;  // prompts catch up over several steps too
      cfg.speculation.tokens = 5;
      cfg.draft_model = model_;
      replica_core rc(*e, cfg);
      auto got = serve_tokens(rc, reqs);
      for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << r.id << " tp " << tp << " kv " << kv;
      EXPECT_GT(rc.scheduler().drafted(), 0u);
      EXPECT_EQ(rc.scheduler().accepted(), rc.scheduler().drafted())
          << "the model drafting for itself is always right when greedy; tp " << tp << " kv " << kv;
    }
  }
}

TEST_F(DraftModel, NoDraftEngineWhereNothingCouldSpeculate) {
  auto e = engine(1, 256);
  scheduler_config cfg;
  cfg.draft_model = model_;  // but speculation.tokens 0
  replica_core off(*e, cfg);
  EXPECT_EQ(off.scheduler().draft_model(), nullptr);
  cfg.speculation.tokens = 2;
  replica_core on(*e, cfg);
  EXPECT_NE(on.scheduler().draft_model(), nullptr);
}

TEST_F(DraftModel, ADraftModelThatIsNotRunningMeansNoDraftsNotPromptLookup) {
  // A draft model named but no proposer (it did not start, or failed and was dropped): the
  // scheduler drafts nothing rather than fall back to a prompt lookup nobody configured.
  for (bool named : {true, false}) {
    block_manager m(64, 8, false);
    scheduler_config cfg;
    cfg.speculation.tokens = 4;
    cfg.speculation.min_n = 1;
    if (named) cfg.draft_model = model_;
    batch_scheduler s(cfg, m);
    request_spec r;
    r.id = 1;
    r.prompt = {5, 6, 7, 5, 6, 7, 5, 6};
    r.max_tokens = 12;
    r.speculate = true;
    ASSERT_TRUE(s.add(r).ok());
    const std::vector<int32_t> cycle{7, 5, 6};  // what the lookup guesses
    size_t i = 0;
    for (int guard = 0; s.running() + s.waiting() > 0 && guard < 100; ++guard) {
      auto plan = s.schedule();
      ASSERT_FALSE(plan.seqs.empty());
      std::vector<int32_t> sampled;
      for (const auto& q : plan.seqs) {
        for (uint32_t d = 0; q.want_logits && d < q.draws; ++d) sampled.push_back(cycle[i++ % 3]);
      }
      auto events = s.complete(plan, sampled);
      EXPECT_FALSE(events.empty());
    }
    if (named) {
      EXPECT_EQ(s.drafted(), 0u);
    } else {
      EXPECT_GT(s.drafted(), 0u) << "prompt lookup drafts this text: the test would not see a fallback";
    }
  }
}

TEST_F(DraftModel, LoadChecksTheVocabulary) {
  ASSERT_TRUE(load_draft_model(dir_.path(), *model_, dir_.path()).ok());
  model::testing::temp_dir same, far, respelled;
  ASSERT_TRUE(other_model(same, 300));
  auto ok = load_draft_model(same.path(), *model_, dir_.path());
  EXPECT_TRUE(ok.ok()) << (ok.ok() ? "" : ok.err().message);
  ASSERT_TRUE(other_model(far, 600));
  auto big = load_draft_model(far.path(), *model_, dir_.path());
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.err().message.find("600"), std::string::npos) << big.err().message;
  // The same sizes, two tokens' spellings swapped.
  ASSERT_TRUE(other_model(respelled, 300));
  const std::string tj = respelled.path() + "/tokenizer.json";
  nlohmann::json j;
  {
    std::ifstream in(tj);
    j = nlohmann::json::parse(in);
  }
  auto& vocab = j["model"]["vocab"];
  std::string x, y;
  for (auto& [tok, id] : vocab.items()) {
    if (id == 100) x = tok;
    if (id == 101) y = tok;
  }
  ASSERT_FALSE(x.empty());
  ASSERT_FALSE(y.empty());
  vocab[x] = 101;
  vocab[y] = 100;
  std::ofstream(tj) << j.dump();
  auto swapped = load_draft_model(respelled.path(), *model_, dir_.path());
  ASSERT_FALSE(swapped.ok());
  EXPECT_NE(swapped.err().message.find("token 100"), std::string::npos) << swapped.err().message;
  auto missing = load_draft_model(respelled.path() + "/nowhere", *model_, dir_.path());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.err().message.find("draft model"), std::string::npos) << missing.err().message;
}

}  // namespace
}  // namespace llmesh::actors
