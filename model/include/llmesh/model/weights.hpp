// A loaded model: its config and its weights as views into the mapped safetensors files.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/safetensors.hpp"

namespace llmesh::model {

/// A 2-D weight in HF [out, in] layout, pointing into the mapping (no copy).
struct weight_matrix {
  const void* data = nullptr;
  kernels::dtype type = kernels::dtype::f32;
  size_t rows = 0;  ///< out features
  size_t cols = 0;  ///< in features
  size_t bytes() const { return rows * cols * kernels::dtype_size(type); }
};

/// One decoder layer. Norm weights and biases are small and converted to float32 at load.
struct layer_weights {
  std::vector<float> attn_norm, mlp_norm;
  weight_matrix q, k, v, o, gate, up, down;
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  ///< empty when the model has none
};

struct model_weights {
  weight_matrix embed;  ///< [vocab, hidden]
  std::vector<layer_weights> layers;
  std::vector<float> final_norm;
  weight_matrix lm_head;  ///< the embedding when tied
};

/// An immutable loaded model, shared by every shard executor that runs it.
class token_vocabulary;

class model {
 public:
  /// Loads DIR/config.json and the safetensors, checking every tensor's presence and shape.
  [[nodiscard]] static result<std::shared_ptr<const model>> load(const std::string& dir);

  const model_config& config() const { return config_; }
  const model_weights& weights() const { return weights_; }
  const std::string& dir() const { return dir_; }
  /// The token bytes of DIR/tokenizer.json, for structured outputs (token_mask.hpp); null when
  /// the directory has no tokenizer the detokenizer reads.
  const std::shared_ptr<const token_vocabulary>& vocabulary() const { return vocabulary_; }

  /// Weight bytes a decode step reads per token at batch 1: every layer matrix and the LM
  /// head (the embedding row is negligible).
  size_t decode_weight_bytes() const;

 private:
  model(std::string dir, model_config cfg, tensor_store store)
      : dir_(std::move(dir)), config_(std::move(cfg)), store_(std::move(store)) {}
  status bind_weights();

  std::string dir_;
  model_config config_;
  tensor_store store_;
  model_weights weights_;
  std::shared_ptr<const token_vocabulary> vocabulary_;
};

}  // namespace llmesh::model
