// Engines of models with a scaled or partial rotary (YaRN, LongRoPE, partial_rotary_factor):
// a sequence's numbers are the same whole, chunked and token by token, alone and beside batch
// neighbours; and a LongRoPE model loaded for a context within its original one
// (load_options::max_model_len, vLLM's --max-model-len) runs its short factors: the logits of
// a twin whose long factors are the short ones, not those of the model served at length.
// (The numbers themselves: tests/cli/golden_test.cpp, against the PyTorch reference.)
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmesh/model/engine.hpp"
#include "llmesh/model/random_model.hpp"
#include "engine_runs.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

random_model_spec spec_of(const std::string& arch, const std::string& scaling, double partial) {
  random_model_spec s;
  s.arch = arch;
  s.hidden = 96;
  s.intermediate = 160;
  s.n_layers = 2;
  s.n_heads = 6;
  s.n_kv_heads = 2;
  s.head_dim = arch == "qwen3" ? 32 : 0;
  s.vocab = 300;
  s.dtype = kernels::dtype::bf16;
  s.yarn_scaling = scaling == "yarn";
  s.longrope_scaling = scaling == "longrope";
  s.partial_rotary = partial;
  s.seed = 91;
  return s;
}

std::shared_ptr<const model> load(const std::string& dir, size_t max_model_len = 0) {
  load_options o;
  o.max_model_len = max_model_len;
  auto m = model::load(dir, o);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
  return m.ok() ? *m : nullptr;
}

std::unique_ptr<engine> engine_of(std::shared_ptr<const model> m) {
  engine_options o;
  o.threads = 2;
  o.kv_tokens = 1024;
  o.block_size = 4;
  auto e = engine::create(std::move(m), o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.err().message);
  return e.ok() ? std::move(*e) : nullptr;
}

using testing::prompt_of;
using testing::run;
using testing::same_rows;

TEST(RopeScaling, ScaledAndPartialRotariesKeepChunkAndBatchInvariance) {
  for (const auto& spec : {spec_of("qwen3", "yarn", 1.0), spec_of("phi3", "longrope", 0.75), spec_of("llama", "", 0.5)}) {
    SCOPED_TRACE(spec.arch);
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(spec, dir.path()).ok());
    auto e = engine_of(load(dir.path()));
    ASSERT_TRUE(e);
    const auto prompt = prompt_of(21, 2);
    const auto whole = run(*e, prompt, prompt.size());
    EXPECT_TRUE(same_rows(run(*e, prompt, 4), whole));
    EXPECT_TRUE(same_rows(run(*e, prompt, 1), whole));
    EXPECT_TRUE(same_rows(run(*e, prompt, prompt.size(), 3), whole));
  }
}

TEST(RopeScaling, ALongropeModelServedWithinItsOriginalContextRunsItsShortFactors) {
  const auto spec = spec_of("phi3", "longrope", 0.75);  // original context 64, max_position_embeddings 2048
  testing::temp_dir dir, twin;
  ASSERT_TRUE(write_random_model(spec, dir.path()).ok());
  ASSERT_TRUE(write_random_model(spec, twin.path()).ok());
  {  // the twin's long factors are the short ones (its attention factor is the same: 2048 / 64)
    std::ifstream in(twin.path() + "/config.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["rope_scaling"]["long_factor"] = j["rope_scaling"]["short_factor"];
    std::ofstream(twin.path() + "/config.json") << j.dump(2);
  }
  const auto prompt = prompt_of(17, 3);
  auto within = engine_of(load(dir.path(), 64));
  auto at_length = engine_of(load(dir.path(), 65));
  auto twin_engine = engine_of(load(twin.path()));
  ASSERT_TRUE(within && at_length && twin_engine);
  const auto short_logits = run(*within, prompt, prompt.size());
  EXPECT_TRUE(same_rows(short_logits, run(*twin_engine, prompt, prompt.size())));
  const auto long_logits = run(*at_length, prompt, prompt.size());
  EXPECT_FALSE(same_rows(short_logits, long_logits));
  EXPECT_TRUE(same_rows(long_logits, run(*engine_of(load(dir.path())), prompt, prompt.size())));  // 0: the model's 2048
}

}  // namespace
}  // namespace llmesh::model
