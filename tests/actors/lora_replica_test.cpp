// LoRA adapters in the replica's work loop (replica_request::lora): requests with two adapters
// and none, mixed in one batch, in chunks and at tp 2, each get the tokens model::generate gives
// it alone with its adapter; the prefix cache never hands one adapter's blocks to another (nor
// to the base model), but does to the same adapter; an adapter the model did not load is a
// not_found.
#include "llmesh/model/random_model.hpp"
#include "replica_fixture.hpp"

namespace llmesh::actors {
namespace {

class LoraReplica : public testing::replica_test_base {
 protected:
  void SetUp() override {
    replica_test_base::SetUp();
    model::random_lora_spec a, b;
    b.seed = 7, b.rank = 4, b.targets = {"q_proj", "v_proj", "down_proj"};
    ASSERT_TRUE(model::write_random_lora(a, dir_.path(), dir_.path() + "/lora-a").ok());
    ASSERT_TRUE(model::write_random_lora(b, dir_.path(), dir_.path() + "/lora-b").ok());
    model::load_options lo;
    lo.loras = {{"a", dir_.path() + "/lora-a"}, {"b", dir_.path() + "/lora-b"}};
    auto m = model::model::load(dir_.path(), lo);
    ASSERT_TRUE(m.ok()) << m.err().message;
    model_ = *m;
  }

  /// The fixture's requests, each given adapter a, b or none in turn.
  std::vector<replica_request> mixed(size_t n) {
    auto reqs = requests(n);
    for (auto& r : reqs) r.lora = r.id % 3 == 0 ? "" : r.id % 3 == 1 ? "a" : "b";
    return reqs;
  }
};

TEST_F(LoraReplica, MixedAdaptersInOneBatchGiveEachItsTokensAlone) {
  for (int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    auto reqs = mixed(12);
    auto want = alone(reqs, tp);
    auto e = engine(tp, 1024);
    scheduler_config cfg;
    cfg.max_batch_tokens = 32;  // prompts in chunks, beside decodes of other adapters
    replica_core rc(*e, cfg);
    auto got = testing::serve_tokens(rc, reqs);
    for (const auto& r : reqs) EXPECT_EQ(got[r.id], want[r.id]) << "request " << r.id << " adapter '" << r.lora << "'";
    // The adapters matter: the same prompts without them give other tokens.
    auto plain = reqs;
    for (auto& r : plain) r.lora.clear();
    auto base = alone(plain, tp);
    size_t differ = 0;
    for (const auto& r : reqs) differ += !r.lora.empty() && base[r.id] != want[r.id];
    EXPECT_GE(differ, 6u);
  }
}

TEST_F(LoraReplica, ThePrefixCacheKeepsAdaptersApart) {
  auto e = engine(1, 1024);
  replica_core rc(*e, scheduler_config{});
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 37) % 297 + 2);
  auto run = [&](uint64_t id, const std::string& lora) {
    replica_request r;
    r.id = id;
    r.prompt = prompt;
    r.max_tokens = 6;
    r.lora = lora;
    EXPECT_TRUE(rc.submit(r).ok());
    int32_t cached = -1;
    std::vector<int32_t> tokens;
    for (int guard = 0; !rc.idle() && guard < 1000; ++guard) {
      auto ev = rc.step();
      EXPECT_TRUE(ev.ok());
      if (!ev.ok()) break;
      for (const auto& t : *ev) {
        if (cached < 0) cached = t.cached_tokens;
        tokens.push_back(t.token);
      }
    }
    return std::pair(cached, tokens);
  };
  const auto [c1, t1] = run(1, "a");
  const auto [c2, t2] = run(2, "b");   // another adapter: no hit
  const auto [c3, t3] = run(3, "");    // the base model: no hit
  const auto [c4, t4] = run(4, "a");   // the same adapter: a hit, and the same tokens
  EXPECT_EQ(c1, 0);
  EXPECT_EQ(c2, 0);
  EXPECT_EQ(c3, 0);
  EXPECT_GT(c4, 0);
  EXPECT_EQ(t4, t1);
  auto want = alone({[&] {
                                    replica_request r;
                                    r.id = 2, r.prompt = prompt, r.max_tokens = 6, r.lora = "b";
                                    return r;
                                  }()},
                                  1);
  EXPECT_EQ(t2, want[2]);
}

TEST_F(LoraReplica, AnAdapterTheModelDidNotLoadIsNotFound) {
  auto e = engine(1, 512);
  replica_core rc(*e, scheduler_config{});
  replica_request r;
  r.id = 1;
  r.prompt = {5, 6, 7};
  r.max_tokens = 2;
  r.lora = "c";
  auto s = rc.submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::not_found);
  EXPECT_NE(s.err().message.find("'c'"), std::string::npos) << s.err().message;
  EXPECT_TRUE(rc.idle());
}

}  // namespace
}  // namespace llmesh::actors
