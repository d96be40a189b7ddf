// Sequence classifiers (model_config::classifier, classifier.cpp): a …ForSequenceClassification
// config is its causal LM's layers with a score head — labels from id2label (else num_labels,
// else 2), the head from score.weight — and vLLM's classifier_from_token builds the head from a
// causal LM's rows (two-way: the second token's minus the first's). classify() is score · h; a
// Qwen2 reward model's is two layers (score.0, ReLU, score.2, with biases).
// Checked against what the files hold and against the causal LM's own logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>

#include "config_fixture.hpp"
#include "llmesh/kernels/dtype.hpp"
#include "llmesh/kernels/thread_pool.hpp"
#include "llmesh/model/engine.hpp"
#include "llmesh/model/random_model.hpp"
#include "llmesh/model/safetensors.hpp"
#include "llmesh/model/tokenizer.hpp"
#include "llmesh/model/weights.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;
using testing::minimal_llama;
using testing::parse_err;
using testing::parse_ok;
using testing::with_arch;

TEST(ClassifierConfig, LabelsComeFromId2LabelThenNumLabels) {
  auto j = with_arch(minimal_llama(), "LlamaForSequenceClassification");
  j["id2label"] = {{"1", "positive"}, {"0", "negative"}, {"2", "neutral"}};
  model_config c = parse_ok(j);
  EXPECT_EQ(c.arch, architecture::llama);
  EXPECT_EQ(c.classifier.labels, 3u);
  EXPECT_EQ(c.classifier.names, (std::vector<std::string>{"negative", "positive", "neutral"}));
  EXPECT_FALSE(c.has_lm_head) << "score.weight takes the head's place";
  j.erase("id2label");
  j["num_labels"] = 1;
  c = parse_ok(j);
  EXPECT_EQ(c.classifier.labels, 1u);
  EXPECT_EQ(c.classifier.names, (std::vector<std::string>{"LABEL_0"}));
  j.erase("num_labels");
  EXPECT_EQ(parse_ok(j).classifier.labels, 2u) << "transformers' default";
  EXPECT_EQ(parse_ok(with_arch(minimal_llama(), "Qwen3ForSequenceClassification")).arch, architecture::qwen3);
  EXPECT_EQ(parse_ok(minimal_llama()).classifier.labels, 0u) << "a causal LM is none";
  EXPECT_NE(parse_err(with_arch(minimal_llama(), "Gemma3ForSequenceClassification")).message.find("unknown architecture"),
            std::string::npos);
  j["id2label"] = {{"0", "a"}, {"5", "b"}};
  EXPECT_NE(parse_err(j).message.find("id2label"), std::string::npos);
  j["id2label"] = {{"0", "a"}, {"1", 2}};
  EXPECT_NE(parse_err(j).message.find("id2label"), std::string::npos);
  j.erase("id2label");
  j["num_labels"] = 0;
  EXPECT_NE(parse_err(j).message.find("num_labels"), std::string::npos);
}

TEST(ClassifierConfig, ClassifierFromTokenAsVllmReadsIt) {
  auto j = with_arch(minimal_llama(), "Qwen3ForSequenceClassification");
  j["classifier_from_token"] = {"no", "yes"};
  j["is_original_qwen3_reranker"] = true;  // Qwen3-Reranker through --hf-overrides
  model_config c = parse_ok(j);
  EXPECT_EQ(c.classifier.labels, 1u);
  EXPECT_TRUE(c.classifier.two_way);
  EXPECT_TRUE(c.has_lm_head) << "the head's rows are read";
  EXPECT_EQ(c.classifier.from_tokens, (std::vector<std::string>{"no", "yes"}));
  j.erase("is_original_qwen3_reranker");
  j["method"] = "from_2_way_softmax";
  EXPECT_TRUE(parse_ok(j).classifier.two_way);
  j["method"] = "no_post_processing";
  j["classifier_from_token"] = {"a", "b", "c"};
  c = parse_ok(j);
  EXPECT_EQ(c.classifier.labels, 3u);
  EXPECT_FALSE(c.classifier.two_way);
  j["method"] = "from_2_way_softmax";
  EXPECT_NE(parse_err(j).message.find("two classifier_from_token"), std::string::npos);
  j["method"] = "sideways";
  EXPECT_NE(parse_err(j).message.find("method must be"), std::string::npos);
  j["classifier_from_token"] = json::array();
  EXPECT_NE(parse_err(j).message.find("classifier_from_token"), std::string::npos);
  auto lone = with_arch(minimal_llama(), "Qwen3ForSequenceClassification");
  lone["is_original_qwen3_reranker"] = true;
  EXPECT_NE(parse_err(lone).message.find("needs classifier_from_token"), std::string::npos);
  // Tokens without a method are not read (vLLM's): the checkpoint's score.weight is the head.
  auto no_method = with_arch(minimal_llama(), "Qwen3ForSequenceClassification");
  no_method["classifier_from_token"] = {"no", "yes"};
  c = parse_ok(no_method);
  EXPECT_TRUE(c.classifier.from_tokens.empty());
  EXPECT_EQ(c.classifier.labels, 2u);
  EXPECT_FALSE(c.has_lm_head);
  // A pair is the tokenizer's pair template for a checkpoint's own head, one string for an LLM
  // as reranker (vLLM's use_pad_token), unless the config says.
  EXPECT_TRUE(c.classifier.use_pad_token);
  j["method"] = "from_2_way_softmax";
  j["classifier_from_token"] = {"no", "yes"};
  EXPECT_FALSE(parse_ok(j).classifier.use_pad_token);
  j["use_pad_token"] = true;
  EXPECT_TRUE(parse_ok(j).classifier.use_pad_token);
  // sentence-transformers' activation: Identity gives /score the raw logit.
  EXPECT_FALSE(c.classifier.score_identity);
  no_method["sentence_transformers"] = {{"activation_fn", "torch.nn.modules.linear.Identity"}};
  EXPECT_TRUE(parse_ok(no_method).classifier.score_identity);
  no_method.erase("sentence_transformers");
  no_method["sbert_ce_default_activation_function"] = "torch.nn.modules.activation.Sigmoid";
  EXPECT_FALSE(parse_ok(no_method).classifier.score_identity);
}

// Every classifier key set to odd values: an error or a classifier with names for each label,
// never a throw.
TEST(ClassifierConfig, OddValuesInEveryKeyNeverThrow) {
  auto base = with_arch(minimal_llama(), "Qwen3ForSequenceClassification");
  base["id2label"] = {{"0", "no"}, {"1", "yes"}};
  base["num_labels"] = 2;
  base["classifier_from_token"] = {"no", "yes"};
  base["method"] = "from_2_way_softmax";
  base["is_original_qwen3_reranker"] = true;
  base["use_pad_token"] = false;
  base["sentence_transformers"] = {{"activation_fn", "torch.nn.modules.linear.Identity"}};
  base["sbert_ce_default_activation_function"] = "x";
  ASSERT_TRUE(parse_config(base.dump()).ok());
  const std::vector<json> odd = {nullptr, true, "x", "", -1, 0, 1.5, 1e300, std::numeric_limits<uint64_t>::max(),
                                 json::array(), json::array({1, "a", nullptr}), json::array({"a", "b", "c"}),
                                 json::object(), {{"0", "a"}}, {{"1", "a"}}, {{"x", 1}}};
  size_t accepted = 0;
  for (const char* key : {"id2label", "num_labels", "classifier_from_token", "method", "is_original_qwen3_reranker",
                          "use_pad_token", "sentence_transformers", "sbert_ce_default_activation_function"}) {
    for (const json& v : odd) {
      json j = base;
      j[key] = v;
      result<model_config> c = make_error(errc::internal, "");
      EXPECT_NO_THROW(c = parse_config(j.dump())) << key << " = " << v.dump();
      if (!c.ok()) continue;
      ++accepted;
      EXPECT_GE(c->classifier.labels, 1u) << key << " = " << v.dump();
      EXPECT_EQ(c->classifier.names.size(), c->classifier.labels) << key << " = " << v.dump();
    }
  }
  EXPECT_GT(accepted, 10u);
}

/// The final hidden state of `prompt`'s last position and its logits, from the causal LM at `dir`.
struct last_row {
  std::vector<float> hidden, logits;
};
last_row run_causal(const std::string& dir, const std::vector<int32_t>& prompt) {
  auto m = model::load(dir);
  EXPECT_TRUE(m.ok()) << m.err().message;
  engine_options o;
  o.threads = 1;
  o.kv_tokens = 256;
  auto e = engine::create(*m, o);
  EXPECT_TRUE(e.ok());
  std::vector<int32_t> table(8);
  std::iota(table.begin(), table.end(), 0);
  step_sequence s;
  s.tokens = prompt;
  s.block_table = table;
  s.want_logits = false;
  s.hidden = hidden_rows::last;
  std::vector<int32_t> tokens;
  step_logprobs out;
  EXPECT_TRUE((*e)->forward_sample(std::span(&s, 1), {}, tokens, &out).ok());
  last_row r{out.hidden, {}};
  if (!(*m)->config().has_lm_head) return r;  // a classifier's: no logits
  auto e2 = engine::create(*m, o);
  step_sequence again = s;
  again.hidden = hidden_rows::none;
  again.want_logits = true;
  EXPECT_TRUE((*e2)->forward(std::span(&again, 1), r.logits).ok());
  return r;
}

TEST(Classifier, ScoreWeightTimesTheCausalModelsLastState) {
  testing::temp_dir dir;
  random_model_spec spec;
  spec.vocab = 300;
  spec.dtype = kernels::dtype::bf16;
  spec.seed = 5;
  ASSERT_TRUE(write_random_model(spec, dir / "lm").ok());
  spec.classifier_labels = 3;
  ASSERT_TRUE(write_random_model(spec, dir / "cls").ok());  // the same layers (values keyed by name and seed)
  auto m = model::load(dir / "cls");
  ASSERT_TRUE(m.ok()) << m.err().message;
  const auto& c = (*m)->config();
  EXPECT_EQ(c.arch_name, "LlamaForSequenceClassification");
  ASSERT_EQ(c.classifier.labels, 3u);
  EXPECT_EQ(c.classifier.names, (std::vector<std::string>{"LABEL_0", "LABEL_1", "LABEL_2"}));
  auto store = tensor_store::open(dir / "cls");
  ASSERT_TRUE(store.ok());
  auto score = store->get("score.weight");
  ASSERT_TRUE(score.ok());
  const std::vector<int32_t> prompt{5, 17, 42, 99, 7};
  const auto h = run_causal(dir / "lm", prompt).hidden;
  ASSERT_EQ(h.size(), c.hidden);
  EXPECT_EQ(run_causal(dir / "cls", prompt).hidden, h) << "the classifier's own layers give the causal LM's state";
  const auto got = (*m)->classify(h);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    double want = 0.0;
    for (size_t d = 0; d < c.hidden; ++d) want += static_cast<double>(kernels::load_as_f32(score->data, score->type, i * c.hidden + d)) * h[d];
    EXPECT_NEAR(got[i], want, 1e-5 * (1.0 + std::abs(want))) << i;
  }
  // A wrong head shape is refused by name.
  spec.classifier_labels = 2;
  ASSERT_TRUE(write_random_model(spec, dir / "two").ok());
  load_options three;
  three.hf_overrides = R"({"id2label": {"0": "a", "1": "b", "2": "c"}})";
  auto wrong = model::load(dir / "two", three);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.err().message.find("score.weight"), std::string::npos) << wrong.err().message;
}

// Qwen3-Reranker's recipe on a causal LM: the classifier's one logit is the LM's logit of the
// second token minus the first's, at the prompt's last position.
TEST(Classifier, FromTwoTokensIsTheDifferenceOfTheirLogits) {
  testing::temp_dir dir;
  random_model_spec spec;
  spec.vocab = 300;
  spec.arch = "qwen3";
  spec.tie_embeddings = true;
  ASSERT_TRUE(write_random_model(spec, dir.path()).ok());
  auto tok = tokenizer::load(dir.path());
  ASSERT_TRUE(tok.ok());
  const int32_t no = *(*tok)->token_id("n"), yes = *(*tok)->token_id("y");
  const std::string overrides =
      R"({"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["n", "y"], "is_original_qwen3_reranker": true})";
  load_options reranker;
  reranker.hf_overrides = overrides;
  auto m = model::load(dir.path(), reranker);
  ASSERT_TRUE(m.ok()) << m.err().message;
  ASSERT_EQ((*m)->config().classifier.labels, 1u);
  const std::vector<int32_t> prompt{72, 101, 108, 108, 111, 33};
  const auto causal = run_causal(dir.path(), prompt);
  ASSERT_EQ(causal.logits.size(), spec.vocab);
  const double want = static_cast<double>(causal.logits[yes]) - causal.logits[no];
  const auto got = (*m)->classify(causal.hidden);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_NEAR(got[0], want, 1e-4 * (1.0 + std::abs(want)));
  // A token the vocabulary lacks is refused by name.
  load_options unknown;
  unknown.hf_overrides = R"({"architectures": ["Qwen3ForSequenceClassification"],
      "classifier_from_token": ["no-such-token", "y"], "method": "from_2_way_softmax"})";
  auto bad = model::load(dir.path(), unknown);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("'no-such-token' is not a token"), std::string::npos) << bad.err().message;
}

TEST(RewardConfig, Qwen2RewardModelsAreClassifiersOfTheirArchitecturesLabels) {
  auto j = with_arch(minimal_llama(), "Qwen2ForRewardModel");
  j["num_labels"] = 7;  // vLLM sets the architecture's own
  model_config c = parse_ok(j);
  EXPECT_EQ(c.arch, architecture::qwen2);
  EXPECT_TRUE(c.classifier.reward);
  EXPECT_EQ(c.classifier.labels, 1u);
  EXPECT_EQ(c.classifier.names, (std::vector<std::string>{"LABEL_0"}));
  EXPECT_FALSE(c.has_lm_head);
  j = with_arch(minimal_llama(), "Qwen2ForProcessRewardModel");
  j["id2label"] = {{"0", "wrong"}, {"1", "right"}};
  c = parse_ok(j);
  EXPECT_EQ(c.classifier.labels, 2u);
  EXPECT_EQ(c.classifier.names, (std::vector<std::string>{"wrong", "right"})) << "id2label names them when it has two";
  EXPECT_TRUE(c.classifier.reward);
  EXPECT_FALSE(parse_ok(with_arch(minimal_llama(), "Qwen2ForSequenceClassification")).classifier.reward);
  EXPECT_NE(parse_err(with_arch(minimal_llama(), "LlamaForRewardModel")).message.find("unknown architecture"), std::string::npos);
}

// A Qwen2 reward model's head, score.2 · relu(score.0 · h + b0) + b2, recomputed in double from
// the files' tensors on the causal LM's state (the same layers, keyed by name and seed).
TEST(Reward, TheTwoLayerHeadOnTheCausalModelsState) {
  testing::temp_dir dir;
  random_model_spec spec;
  spec.vocab = 300;
  spec.arch = "qwen2";
  spec.seed = 11;
  ASSERT_TRUE(write_random_model(spec, dir / "lm").ok());
  for (const size_t labels : {size_t{1}, size_t{2}}) {
    spec.classifier_labels = labels;
    spec.reward = true;
    const auto out = dir / ("reward" + std::to_string(labels));
    ASSERT_TRUE(write_random_model(spec, out).ok());
    auto m = model::load(out);
    ASSERT_TRUE(m.ok()) << m.err().message;
    const auto& c = (*m)->config();
    EXPECT_EQ(c.arch_name, labels == 1 ? "Qwen2ForRewardModel" : "Qwen2ForProcessRewardModel");
    ASSERT_EQ(c.classifier.labels, labels);
    auto store = tensor_store::open(out);
    ASSERT_TRUE(store.ok());
    auto w0 = store->get("score.0.weight"), b0 = store->get("score.0.bias"), w2 = store->get("score.2.weight"),
         b2 = store->get("score.2.bias");
    ASSERT_TRUE(w0.ok() && b0.ok() && w2.ok() && b2.ok());
    const size_t H = c.hidden;
    for (const auto& prompt : {std::vector<int32_t>{5, 17, 42, 99, 7}, std::vector<int32_t>{200}}) {
      const auto h = run_causal(dir / "lm", prompt).hidden;
      ASSERT_EQ(h.size(), H);
      std::vector<double> mid(H);
      size_t active = 0;
      for (size_t d = 0; d < H; ++d) {
        double v = kernels::load_as_f32(b0->data, b0->type, d);
        for (size_t e = 0; e < H; ++e) v += static_cast<double>(kernels::load_as_f32(w0->data, w0->type, d * H + e)) * h[e];
        mid[d] = std::max(v, 0.0);
        active += v > 0.0;
      }
      EXPECT_GT(active, H / 8) << "the ReLU passes some of the hidden layer";
      EXPECT_LT(active, H) << "and stops some";
      const auto got = (*m)->classify(h);
      ASSERT_EQ(got.size(), labels);
      for (size_t i = 0; i < labels; ++i) {
        double want = kernels::load_as_f32(b2->data, b2->type, i);
        for (size_t d = 0; d < H; ++d) want += static_cast<double>(kernels::load_as_f32(w2->data, w2->type, i * H + d)) * mid[d];
        EXPECT_NEAR(got[i], want, 1e-4 * (1.0 + std::abs(want))) << "label " << i;
      }
      // Among other rows, on a pool: the same bits (one matmul over the rows, canonical order).
      std::vector<float> rows(3 * H);
      for (size_t d = 0; d < H; ++d) rows[d] = 0.5f * h[H - 1 - d], rows[H + d] = h[d], rows[2 * H + d] = -h[d];
      kernels::thread_pool pool(2);
      const auto batch = (*m)->classify(rows, &pool);
      ASSERT_EQ(batch.size(), 3 * labels);
      EXPECT_EQ(std::vector<float>(batch.begin() + static_cast<std::ptrdiff_t>(labels), batch.begin() + static_cast<std::ptrdiff_t>(2 * labels)), got);
      EXPECT_EQ(batch, (*m)->classify(rows)) << "one thread";
    }
  }
  // A head of the wrong shape is refused by name: a one-label model read as a process reward model.
  load_options prm;
  prm.hf_overrides = R"({"architectures": ["Qwen2ForProcessRewardModel"]})";
  auto wrong = model::load(dir / "reward1", prm);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.err().message.find("tensor 'score.2.weight' must be [2, "), std::string::npos) << wrong.err().message;
  // A causal LM's files read as a reward model: its missing head is refused by name.
  spec.classifier_labels = 1;
  load_options twin;
  twin.hf_overrides = R"({"architectures": ["Qwen2ForRewardModel"]})";
  auto plain = model::load(dir / "lm", twin);  // the causal LM's files: no score.* tensors
  ASSERT_FALSE(plain.ok());
  EXPECT_NE(plain.err().message.find("score.0.weight"), std::string::npos) << plain.err().message;
  spec.arch = "llama";
  EXPECT_FALSE(write_random_model(spec, dir / "llama-reward").ok()) << "a reward model is qwen2's";
}

TEST(TokenizerPairs, ThePairTemplateOrBothTextsInTurn) {
  testing::temp_dir dir;
  random_model_spec spec;
  spec.vocab = 300;
  ASSERT_TRUE(write_random_model(spec, dir.path()).ok());
  auto plain = tokenizer::load(dir.path());
  ASSERT_TRUE(plain.ok());
  auto a = (*plain)->encode("ab", false), b = (*plain)->encode("cd", false);
  auto both = a;
  both.insert(both.end(), b.begin(), b.end());
  EXPECT_EQ((*plain)->encode_pair("ab", "cd"), both) << "no template: A then B";
  EXPECT_EQ((*plain)->token_id("<|end_of_text|>"), 257);
  EXPECT_EQ((*plain)->token_id("a"), (*plain)->encode("a", false).at(0));
  EXPECT_FALSE((*plain)->token_id("no such token").has_value());
  // BERT-like template: [BOS] A [EOS] and [BOS] A [EOS] B [EOS].
  auto tj = json::parse(std::ifstream(dir / "tokenizer.json"));
  const json bos = {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
  const json eos = {{"SpecialToken", {{"id", "<|end_of_text|>"}, {"type_id", 0}}}};
  const json seq_a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, seq_b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
  tj["post_processor"] = {{"type", "TemplateProcessing"},
                          {"single", {bos, seq_a, eos}},
                          {"pair", {bos, seq_a, eos, seq_b, eos}},
                          {"special_tokens",
                           {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {256}}, {"tokens", {"<|begin_of_text|>"}}}},
                            {"<|end_of_text|>", {{"id", "<|end_of_text|>"}, {"ids", {257}}, {"tokens", {"<|end_of_text|>"}}}}}}};
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  auto templated = tokenizer::load(dir.path());
  ASSERT_TRUE(templated.ok()) << templated.err().message;
  std::vector<int32_t> want{256};
  want.insert(want.end(), a.begin(), a.end());
  want.push_back(257);
  want.insert(want.end(), b.begin(), b.end());
  want.push_back(257);
  EXPECT_EQ((*templated)->encode_pair("ab", "cd"), want);
  EXPECT_EQ((*templated)->encode_pair("ab", "cd", false), both) << "without special tokens: the texts alone";
  // A template without a pair form: both texts in turn (transformers' "$A $B").
  tj["post_processor"].erase("pair");
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  auto single = tokenizer::load(dir.path());
  ASSERT_TRUE(single.ok());
  EXPECT_EQ((*single)->encode_pair("ab", "cd"), both);
}

}  // namespace
}  // namespace llmesh::model
