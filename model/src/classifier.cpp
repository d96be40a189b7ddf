// A sequence classifier's score head (model_config::classifier): transformers'
// …ForSequenceClassification keeps it as score.weight [labels, hidden]; vLLM's
// classifier_from_token builds it from a causal LM's head (Qwen3-Reranker: the "yes" row minus
// the "no" row, so that sigmoid(score · h) is softmax([no, yes])'s yes). Held in float32 and
// applied to one final hidden state per request, summed in double: a few thousand operations,
// never on the batch's path.
#include <string>

#include "llmesh/kernels/dtype.hpp"
#include "llmesh/model/tokenizer.hpp"
#include "llmesh/model/weights.hpp"

namespace llmesh::model {

status model::bind_classifier(const std::string& tokenizer_dir) {
  const auto& k = config_.classifier;
  if (k.labels == 0) return ok_status();
  const size_t h = config_.hidden;
  auto& score = weights_.score;
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

std::vector<float> model::classify(std::span<const float> row) const {
  const size_t labels = config_.classifier.labels, h = config_.hidden;
  std::vector<float> out(labels);
  for (size_t i = 0; i < labels && row.size() >= h; ++i) {
    double sum = 0.0;
    for (size_t d = 0; d < h; ++d) sum += static_cast<double>(weights_.score[i * h + d]) * row[d];
    out[i] = static_cast<float>(sum);
  }
  return out;
}

}  // namespace llmesh::model
