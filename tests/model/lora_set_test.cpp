// LoRA adapters added and removed while a model serves (lora_set.hpp, model::load_lora): ids
// are never given twice, a removed adapter stays alive for whoever holds it (a step, a running
// request) and its id names nothing afterwards, the capacity and names are checked; an adapter
// added at run time gives the bits of one loaded at start, and a step that holds a removed
// adapter still runs with it while one that names its id alone is refused.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "llmesh/model/engine.hpp"
#include "llmesh/model/lora_set.hpp"
#include "llmesh/model/random_model.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

std::shared_ptr<const lora_adapter> named(const std::string& n) {
  auto a = std::make_shared<lora_adapter>();
  a->name = n;
  return a;
}

TEST(LoraSet, IdsAreNeverGivenTwiceAndARemovedAdapterLivesWhileHeld) {
  lora_set s(2);
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(*s.add(named("a")), 0);
  EXPECT_EQ(*s.add(named("b")), 1);
  auto full = s.add(named("c"));
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.err().code, errc::invalid_request) << "not a retry: an unload makes room";
  EXPECT_NE(full.err().message.find("--max-cpu-loras"), std::string::npos) << full.err().message;
  auto held = s.get(0);
  ASSERT_TRUE(s.remove("a").ok());
  EXPECT_EQ(s.get(0), nullptr) << "a removed id names nothing";
  EXPECT_EQ(held->name, "a") << "a holder keeps the adapter";
  EXPECT_EQ(s.find("a").first, -1);
  EXPECT_EQ(s.remove("a").err().code, errc::not_found);
  auto dup = s.add(named("b"));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.err().code, errc::invalid_request);
  EXPECT_EQ(*s.add(named("a")), 2) << "loaded again: a new id";
  EXPECT_EQ(s.ids(), 3);
  EXPECT_EQ(s.size(), 2u);
  EXPECT_EQ(s.find("a").first, 2);
  const auto loaded = s.loaded();
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded[0]->name, "b");
  EXPECT_EQ(loaded[1]->name, "a");
}

struct runtime_model {
  runtime_model() {
    random_model_spec spec;
    spec.hidden = 64, spec.intermediate = 160, spec.n_layers = 2, spec.n_heads = 4, spec.n_kv_heads = 2, spec.vocab = 300;
    spec.seed = 21;
    EXPECT_TRUE(write_random_model(spec, dir.path() + "/m").ok());
    random_lora_spec l;
    l.strength = 0.5f;
    EXPECT_TRUE(write_random_lora(l, dir.path() + "/m", dir.path() + "/a").ok());
  }
  testing::temp_dir dir;
};

std::unique_ptr<engine> make_engine(std::shared_ptr<const model> m) {
  engine_options o;
  o.threads = 2;
  o.kv_tokens = 256;
  auto e = engine::create(std::move(m), o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
  return e.ok() ? std::move(*e) : nullptr;
}

const std::vector<int32_t> prompt = {1, 7, 42, 250, 5, 99, 128, 256, 17, 3, 64, 200};

/// The logits after the prompt, run with adapter `id` (pinned as `adapter` when given).
result<std::vector<float>> run(engine& e, int32_t id, const lora_adapter* adapter = nullptr) {
  std::vector<int32_t> table((prompt.size() + e.kv_block_size() - 1) / e.kv_block_size());
  std::iota(table.begin(), table.end(), 0);
  step_sequence s;
  s.tokens = prompt;
  s.block_table = table;
  s.lora = id;
  s.adapter = adapter;
  std::vector<float> logits;
  LLMESH_TRY(e.forward(std::span(&s, 1), logits));
  return logits;
}

TEST(LoraSet, AnAdapterAddedAtRunTimeGivesTheBitsOfOneLoadedAtStart) {
  runtime_model rm;
  const lora_source src{"a", rm.dir.path() + "/a"};
  auto at_start = model::load(rm.dir.path() + "/m", {.dtype = {}, .quant = {}, .loras = {src}});
  auto later = model::load(rm.dir.path() + "/m", {.dtype = {}, .quant = {}, .loras = {}, .enable_lora = true});
  ASSERT_TRUE(at_start.ok() && later.ok());
  auto es = make_engine(*at_start), el = make_engine(*later);
  ASSERT_TRUE(es && el);
  auto before = run(*el, 0);
  EXPECT_FALSE(before.ok()) << "no adapter yet";
  auto id = (*later)->load_lora(src);
  ASSERT_TRUE(id.ok()) << id.err().message;
  EXPECT_EQ(*id, 0);
  auto want = run(*es, 0), got = run(*el, 0), plain = run(*el, -1);
  ASSERT_TRUE(want.ok() && got.ok() && plain.ok());
  EXPECT_EQ(std::memcmp(want->data(), got->data(), want->size() * 4), 0);
  EXPECT_NE(std::memcmp(plain->data(), got->data(), got->size() * 4), 0) << "the adapter must change the logits";

  // Removed: a step that holds it still runs with it; one naming the id alone is refused.
  auto pin = (*later)->loras().get(0);
  ASSERT_TRUE((*later)->loras().remove("a").ok());
  auto held = run(*el, 0, pin.get());
  ASSERT_TRUE(held.ok()) << held.err().message;
  EXPECT_EQ(std::memcmp(want->data(), held->data(), want->size() * 4), 0);
  auto refused = run(*el, 0);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.err().message.find("LoRA adapter 0 is not loaded"), std::string::npos) << refused.err().message;
  auto again = run(*el, -1);
  ASSERT_TRUE(again.ok()) << "a refused step leaves the engine usable: " << again.err().message;
  EXPECT_EQ(*(*later)->load_lora(src), 1) << "loaded again: a new id";
}

TEST(LoraSet, AModelLoadedWithoutLoraRefusesAdaptersAndBadOnesAreRefusedByName) {
  runtime_model rm;
  auto plain = model::load(rm.dir.path() + "/m");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->lora_enabled());
  auto r = (*plain)->load_lora({"a", rm.dir.path() + "/a"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.err().code, errc::unsupported);
  auto on = model::load(rm.dir.path() + "/m", {.dtype = {}, .quant = {}, .loras = {}, .enable_lora = true, .max_loras = 1});
  ASSERT_TRUE(on.ok());
  auto missing = (*on)->load_lora({"b", rm.dir.path() + "/nowhere"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.err().message.find("nowhere"), std::string::npos) << missing.err().message;
  EXPECT_TRUE((*on)->load_lora({"a", rm.dir.path() + "/a"}).ok());
  EXPECT_EQ((*on)->load_lora({"c", rm.dir.path() + "/a"}).err().code, errc::invalid_request) << "max_loras 1";
  EXPECT_EQ((*on)->loras().size(), 1u);
  auto below = model::load(rm.dir.path() + "/m", {.dtype = {}, .quant = {}, .loras = {{"a", rm.dir.path() + "/a"}, {"b", rm.dir.path() + "/a"}},
                                                  .enable_lora = true, .max_loras = 1});
  ASSERT_FALSE(below.ok());
  EXPECT_NE(below.err().message.find("--max-cpu-loras 1 is below the 2 adapters given"), std::string::npos) << below.err().message;
}

}  // namespace
}  // namespace llmesh::model
