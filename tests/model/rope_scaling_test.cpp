// Engines of models with a scaled or partial rotary (YaRN, LongRoPE, partial_rotary_factor):
// a sequence's numbers are the same whole, chunked and token by token, alone and beside batch
// neighbours; and a LongRoPE model loaded for a context within its original one
// (load_options::max_model_len, vLLM's --max-model-len) runs its short factors: the logits of
// a twin whose long factors are the short ones, not those of the model served at length.
// (The numbers themselves: tests/cli/golden_test.cpp, against the PyTorch reference.)
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "llmesh/kernels/sampling.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/random_model.hpp"
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

std::vector<int32_t> prompt_of(size_t n, uint32_t salt) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>((i * 37 + salt * 101 + 11) % 300);
  return p;
}

/// The last prompt token's logits then 4 greedy steps', the prompt fed `chunk` tokens a step,
/// `neighbours` other sequences sharing every step.
std::vector<float> run(engine& e, const std::vector<int32_t>& prompt, size_t chunk, int neighbours = 0) {
  const size_t v = e.config().vocab;
  std::vector<float> out, logits;
  std::vector<int> others;
  std::vector<std::vector<int32_t>> other_prompts;
  for (int i = 0; i < neighbours; ++i) {
    others.push_back(e.open_sequence());
    other_prompts.push_back(prompt_of(9 + 4 * i, 50 + i));
  }
  std::vector<int32_t> other_next(neighbours, 5);
  const int seq = e.open_sequence();
  auto step = [&](std::span<const int32_t> tokens, bool want) {
    std::vector<step_item> items;
    for (int i = 0; i < neighbours; ++i) {
      if (!other_prompts[i].empty()) {
        items.push_back({others[i], other_prompts[i], true});
      } else {
        items.push_back({others[i], std::span(&other_next[i], 1), true});
      }
    }
    items.push_back({seq, tokens, want});
    EXPECT_TRUE(e.step(items, logits).ok());
    for (auto& p : other_prompts) p.clear();
    for (int i = 0; i < neighbours; ++i) other_next[i] = kernels::argmax(std::span(&logits[i * v], v));
    return want ? std::vector<float>(logits.end() - static_cast<std::ptrdiff_t>(v), logits.end()) : std::vector<float>();
  };
  std::vector<float> last;
  for (size_t at = 0; at < prompt.size(); at += chunk) {
    const size_t n = std::min(chunk, prompt.size() - at);
    last = step(std::span(prompt).subspan(at, n), at + n == prompt.size());
  }
  for (int i = 0; i < 5; ++i) {
    out.insert(out.end(), last.begin(), last.end());
    if (i == 4) break;
    const int32_t next = kernels::argmax(last);
    last = step(std::span(&next, 1), true);
  }
  e.close_sequence(seq);
  for (int s : others) e.close_sequence(s);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(RopeScaling, ScaledAndPartialRotariesKeepChunkAndBatchInvariance) {
  for (const auto& spec : {spec_of("qwen3", "yarn", 1.0), spec_of("phi3", "longrope", 0.75), spec_of("llama", "", 0.5)}) {
    SCOPED_TRACE(spec.arch);
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(spec, dir.path()).ok());
    auto e = engine_of(load(dir.path()));
    ASSERT_TRUE(e);
    const auto prompt = prompt_of(21, 2);
    const auto whole = run(*e, prompt, prompt.size());
    EXPECT_TRUE(same_bits(run(*e, prompt, 4), whole));
    EXPECT_TRUE(same_bits(run(*e, prompt, 1), whole));
    EXPECT_TRUE(same_bits(run(*e, prompt, prompt.size(), 3), whole));
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
  EXPECT_TRUE(same_bits(short_logits, run(*twin_engine, prompt, prompt.size())));
  const auto long_logits = run(*at_length, prompt, prompt.size());
  EXPECT_FALSE(same_bits(short_logits, long_logits));
  EXPECT_TRUE(same_bits(long_logits, run(*engine_of(load(dir.path())), prompt, prompt.size())));  // 0: the model's 2048
}

}  // namespace
}  // namespace llmesh::model
