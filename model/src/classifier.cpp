// A sequence classifier's score head (model_config::classifier): transformers'
// …ForSequenceClassification keeps it as score.weight [labels, hidden]; vLLM's
// classifier_from_token builds it from a causal LM's head (Qwen3-Reranker: the "yes" row minus
// the "no" row, so that sigmoid(score · h) is softmax([no, yes])'s yes); a Qwen2 reward model's
// is two layers, score.0 (hidden × hidden) and score.2, with biases and a ReLU between. Held in
// float32 and applied to final hidden states by the replica between steps: the last layer
// summed in double (labels × hidden a row), a reward model's hidden layer as one kernels::matmul
// over a chunk's rows (hidden² multiply-adds a row: 13 M for a 7B model; canonical order, so a
// row's bits do not depend on the chunk).
#include <algorithm>
#include <string>

#include "llmesh/kernels/dtype.hpp"
#include "llmesh/kernels/matmul.hpp"
#include "llmesh/model/tokenizer.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model {

namespace {

/// Tensor `name` of `shape` from `store`, in float32; an error naming both otherwise.
result<std::vector<float>> read_f32(const tensor_store& store, const std::string& name, const std::vector<size_t>& shape) {
  auto t = store.get(name);
  if (!t) return t.take_error();
  if (t->shape != shape) {
    std::string want;
    for (size_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    return make_error(errc::invalid_request, "tensor '" + name + "' must be [" + want + "]");
  }
  size_t n = 1;
  for (size_t d : shape) n *= d;
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = kernels::load_as_f32(t->data, t->type, i);
  return out;
}

}  // namespace

status model::bind_classifier(const std::string& tokenizer_dir) {
  const auto& k = config_.classifier;
  if (k.labels == 0) return ok_status();
  const size_t h = config_.hidden;
  auto& score = weights_.score;
  if (k.reward) {  // score.0 → ReLU → score.2, as vLLM's Qwen2RewardBaseModel
    const std::pair<std::vector<float>*, std::pair<const char*, std::vector<size_t>>> parts[] = {
        {&weights_.score_hidden, {"score.0.weight", {h, h}}},
        {&weights_.score_hidden_bias, {"score.0.bias", {h}}},
        {&score, {"score.2.weight", {k.labels, h}}},
        {&weights_.score_bias, {"score.2.bias", {k.labels}}}};
    for (const auto& [out, spec] : parts) {
      auto v = read_f32(store_, spec.first, spec.second);
      if (!v) return v.take_error();
      *out = std::move(*v);
    }
    return ok_status();
  }
  if (k.from_tokens.empty()) {
    auto t = store_.get("score.weight");
    if (!t) return t.take_error();
    if (t->shape != std::vector<size_t>{k.labels, h}) {
      return make_error(errc::invalid_request, "tensor 'score.weight' must be [" + std::to_string(k.labels) + ", " +
                                                   std::to_string(h) + "] (the config's labels × hidden_size)");
    }
    score.resize(k.labels * h);
    for (size_t i = 0; i < score.size(); ++i) score[i] = kernels::load_as_f32(t->data, t->type, i);
    return ok_status();
  }
  auto tok = tokenizer::load(tokenizer_dir);
  if (!tok) {
    error e = tok.take_error();
    e.message = "classifier_from_token needs the model's tokenizer: " + e.message;
    return e;
  }
  std::vector<size_t> rows;
  for (const auto& t : k.from_tokens) {
    auto id = (*tok)->token_id(t);
    if (!id || *id < 0 || static_cast<size_t>(*id) >= config_.vocab) {
      return make_error(errc::invalid_request, "classifier_from_token: '" + t + "' is not a token of the model's vocabulary");
    }
    rows.push_back(static_cast<size_t>(*id));
  }
  const weight_matrix& head = weights_.lm_head;
  auto at = [&](size_t row, size_t d) { return kernels::load_as_f32(head.data, head.type, row * head.ld() + d); };
  score.resize(k.labels * h);
  for (size_t d = 0; d < h; ++d) {
    if (k.two_way) {
      score[d] = at(rows[1], d) - at(rows[0], d);
    } else {
      for (size_t i = 0; i < rows.size(); ++i) score[i * h + d] = at(rows[i], d);
    }
  }
  return ok_status();
}

std::vector<float> model::classify(std::span<const float> rows, kernels::thread_pool* pool) const {
  const size_t labels = config_.classifier.labels, h = config_.hidden;
  const size_t n = rows.size() / h;
  std::vector<float> hidden;  // a reward model's: relu(score_hidden · row + bias), [n][h]
  std::span<const float> last = rows;
  if (config_.classifier.reward) {
    hidden.resize(n * h);
    kernels::matmul_args a;
    a.x = rows.data();
    a.ldx = h;
    a.w = weights_.score_hidden.data();
    a.ldw = h;
    a.w_type = kernels::dtype::f32;
    a.bias = weights_.score_hidden_bias.data();
    a.y = hidden.data();
    a.ldy = h;
    a.m = n;
    a.n = h;
    a.k = h;
    const bool pooled = pool != nullptr && n > 0 && kernels::matmul(a, *pool).ok();
    for (size_t i = 0; !pooled && i < n; ++i) {  // the same canonical dot products, on this thread
      for (size_t d = 0; d < h; ++d) {
        hidden[i * h + d] = kernels::dot(&weights_.score_hidden[d * h], &rows[i * h], h) + weights_.score_hidden_bias[d];
      }
    }
    for (float& v : hidden) v = std::max(v, 0.0f);
    last = hidden;
  }
  std::vector<float> out(n * labels);
  for (size_t r = 0; r < n; ++r) {
    for (size_t i = 0; i < labels; ++i) {
      double sum = config_.classifier.reward ? static_cast<double>(weights_.score_bias[i]) : 0.0;
      for (size_t d = 0; d < h; ++d) sum += static_cast<double>(weights_.score[i * h + d]) * last[r * h + d];
      out[r * labels + i] = static_cast<float>(sum);
    }
  }
  return out;
}

}  // namespace llmesh::model
