// A loaded model: its config and its weights as views into the mapped safetensors files.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/model/config.hpp"
#include "llmesh/model/lora.hpp"
#include "llmesh/model/lora_set.hpp"

namespace llmesh::kernels {
class thread_pool;
}
#include "llmesh/model/safetensors.hpp"

namespace llmesh::model {

/// A 2-D weight in HF [out, in] layout, pointing into the mapping (no copy: a GGUF file's Q4_K
/// and Q6_K blocks too), or, quantized or cast at load, into the model's own copy.
struct weight_matrix {
  const void* data = nullptr;
  kernels::dtype type = kernels::dtype::f32;
  size_t rows = 0;  ///< out features
  size_t cols = 0;  ///< in features
  /// Elements from one row to the next: cols, or for a block type cols rounded up to whole
  /// blocks (a K-quant row is whole super-blocks already).
  size_t ld() const {
    const size_t b = kernels::dtype_block(type);
    return (cols + b - 1) / b * b;
  }
  size_t bytes() const { return kernels::dtype_bytes(type, rows * ld()); }
};

/// How the projection weights are held in memory (`--quantization`).
enum class quantization : uint8_t {
  none,  ///< as the checkpoint stores them (F32, F16, BF16, or a quantized checkpoint's own blocks)
  int8,  ///< weight-only int8 in blocks of 32 with a float32 scale (kernels::dtype::q8)
  // vLLM's names for a checkpoint's own quantization: held as with none, and model::load
  // refuses a checkpoint that is not of that kind (as vLLM does).
  awq,                 ///< "awq" or "awq_marlin": an AWQ checkpoint
  gptq,                ///< "gptq" or "gptq_marlin": a GPTQ checkpoint
  compressed_tensors,  ///< "compressed-tensors": an llm-compressor checkpoint
  gguf,                ///< "gguf": a GGUF file
  fp8,                 ///< "fp8": an FP8 checkpoint (quant_method fp8), or vLLM's online FP8 of an unquantized one
  mxfp4,               ///< "mxfp4": GPT-OSS's MXFP4 checkpoint (quant_method mxfp4)
};

/// "none", "int8", "awq", "gptq", "compressed-tensors", "gguf", "fp8", "mxfp4".
std::string_view quantization_name(quantization q);
/// Parses a --quantization value (vLLM's: none, int8, awq, awq_marlin, gptq, gptq_marlin,
/// compressed-tensors, gguf, fp8); unsupported names vLLM's other methods (bitsandbytes, ...),
/// invalid_request names the choices for anything else.
[[nodiscard]] result<quantization> parse_quantization(std::string_view s);

/// vLLM's --dtype: auto (nullopt: every matrix as the checkpoint stores it), float32 (or
/// float), bfloat16, float16 (or half); invalid_request names the choices.
[[nodiscard]] result<std::optional<kernels::dtype>> parse_weight_dtype(std::string_view s);
/// "auto", "float32", "bfloat16", "float16".
std::string_view weight_dtype_name(std::optional<kernels::dtype> t);

/// Tensor-parallel ranks of one replica: `ranks` of `tp` (expert_parallel as the engine's).
struct rank_set {
  int tp = 1;
  bool expert_parallel = false;
  std::vector<int> ranks;
};

struct load_options {
  /// --dtype: every weight matrix (embedding, projections, LM head, MoE router) is rewritten
  /// in this type at load (nullopt: as stored; int8 matrices of a quantized GGUF stay so).
  /// Widening is exact; narrowing rounds to nearest even, and a float16 cast refuses weights
  /// beyond its range. Activations and norms stay float32 either way. Applied before `quant`
  /// (online fp8: after it, the weights rounded to this type as they are quantized, as vLLM
  /// quantizes the --dtype copy).
  std::optional<kernels::dtype> dtype;
  /// int8: q, k, v, o, gate, up, down and the LM head are quantized at load (the embedding
  /// gather keeps the checkpoint's rows). About 1.1 bytes per weight instead of 2 (BF16): a
  /// memory-bound decode step reads half as much. fp8: an FP8 checkpoint as none; else vLLM's
  /// online FP8 (weight_rewrite.hpp: the projections, a scale per fused layer). awq, gptq,
  /// compressed_tensors, gguf: as none, refused (invalid_request) unless the checkpoint is of
  /// that kind.
  quantization quant = quantization::none;
  /// LoRA adapters served beside the model (--lora-modules), loaded at start, with ids 0, 1, ...
  /// in this order; a step sequence names one by its id (step_sequence::lora).
  std::vector<lora_source> loras;
  /// Adapters may be added while the model serves (load_lora): vLLM's --enable-lora. Implied by
  /// `loras`. The model's replicas then run on the CPU backend.
  bool enable_lora = false;
  /// Adapters loaded at most at once (vLLM's --max-cpu-loras; below `loras`' count: refused);
  /// 0: lora_set::default_capacity, or `loras`' count when it is more.
  size_t max_loras = 0;
  /// vLLM's --tokenizer DIR: the vocabulary structured outputs mask over comes from there
  /// ("": the model's own tokenizer, when it has one).
  std::string tokenizer_dir;
  /// vLLM's --lora-dtype: the type adapters' matrices are held in (float32, bfloat16, float16;
  /// narrowing rounds to nearest even). nullopt (auto): the weights' --dtype when one was given,
  /// else as each adapter's file stores them.
  std::optional<kernels::dtype> lora_dtype;
  /// vLLM's --hf-overrides: a JSON object changing config.json before it is read
  /// (apply_hf_overrides); "" changes nothing.
  std::string hf_overrides;
  /// A spread replica's node: the ranks its engine part runs (engine::create_part). The
  /// matrices load writes in memory (--quantization int8, --dtype, a packed checkpoint's 4/8-bit
  /// layers, a GGUF file's repacked blocks) are then written only where these ranks read them
  /// (make_shard_layout's slices; routed experts whole or not at all under expert parallelism;
  /// a packed or GGUF LM head whole for a classifier_from_token classifier, which takes rows
  /// of it at load; int8 and --dtype rewrite it after that),
  /// the rest staying address space without memory, and the
  /// ranks' columns of the row-parallel matrices are held as matrices of their own
  /// (column_slice), so the node holds about its share of them. Such a model runs only
  /// engines of these ranks (check_ranks). nullopt: every rank.
  std::optional<rank_set> ranks;
  /// vLLM's --max-model-len: the context the server grants (0: the model's). A longrope model
  /// takes its long factors only when this exceeds original_max_position_embeddings
  /// (choose_longrope).
  size_t max_model_len = 0;
};

/// One decoder layer. Norm weights and biases are small and converted to float32 at load.
struct layer_weights {
  std::vector<float> attn_norm, mlp_norm;
  weight_matrix q, k, v, o, gate, up, down;
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  ///< empty when the model has none
  std::vector<float> q_norm, k_norm;                  ///< [head_dim] (Qwen3's and Gemma 3's qk_norm); else empty
  /// Gemma 2/3's sandwich norms: of the attention's output and of the MLP's (mlp_norm is then
  /// pre_feedforward_layernorm). Empty otherwise. Gemma's norms hold 1 + the checkpoint's weight.
  std::vector<float> post_attn_norm, post_mlp_norm;
  /// MoE (model_config::moe): the router [n_experts, hidden] and each expert's SwiGLU MLP;
  /// gate, up and down above are then empty.
  struct expert {
    weight_matrix gate, up, down;
    std::vector<float> gate_bias, up_bias, down_bias;  ///< GPT-OSS's (model_config::moe_config::biases); else empty
  };
  weight_matrix router;
  std::vector<float> router_bias;  ///< [n_experts], GPT-OSS's; else empty
  std::vector<float> sinks;        ///< [n_heads]: GPT-OSS's attention sink logits (model_config::attn_sinks); else empty
  std::vector<expert> experts;
  /// Qwen2-MoE: the shared expert every token runs, and its gate [1, hidden] (a sigmoid scale).
  expert shared;
  weight_matrix shared_gate;
  /// The checkpoint's scales for an 8-bit float KV cache (vLLM's k_scale / v_scale, one per
  /// layer); 0 when it has none (such a cache then uses 1). Other cache types ignore them.
  float k_scale = 0.0f, v_scale = 0.0f;
};

struct model_weights {
  weight_matrix embed;  ///< [vocab, hidden]
  std::vector<layer_weights> layers;
  std::vector<float> final_norm;
  weight_matrix lm_head;  ///< the embedding when tied
  /// A sequence classifier's score head [labels, hidden] (model_config::classifier), in float32;
  /// empty otherwise. A reward model's is its last layer (score.2), after score_hidden
  /// [hidden, hidden] and its bias, then ReLU; score_bias [labels] is added to its logits.
  std::vector<float> score;
  std::vector<float> score_hidden, score_hidden_bias, score_bias;
};

/// An immutable loaded model, shared by every shard executor that runs it.
class token_vocabulary;

class model {
 public:
  /// Loads DIR/config.json and the safetensors, checking every tensor's presence and shape,
  /// then applies `opt` (quantization runs on the hardware threads, up to 64; afterwards the
  /// checkpoint's pages of the quantized tensors leave this process's resident memory).
  [[nodiscard]] static result<std::shared_ptr<const model>> load(const std::string& dir, load_options opt = {});

  const model_config& config() const { return config_; }
  const model_weights& weights() const { return weights_; }
  const std::string& dir() const { return dir_; }
  quantization quant() const { return quant_; }
  /// The type load_options::dtype rewrote the weight matrices in (nullopt: as stored).
  std::optional<kernels::dtype> cast_type() const { return cast_type_; }
  /// The block types its weight matrices are held in ("int8" for kernels::dtype::q8, after
  /// --quantization int8 or from a GGUF file's other blocks; "int4" for kernels::dtype::q4, from
  /// a 4-bit AWQ/GPTQ/compressed-tensors checkpoint or a GGUF file's Q4_0/Q4_1; "Q4_K", "Q6_K"
  /// as a GGUF file holds them), joined with "+"; empty when none. Such weights run on the CPU.
  const std::string& quantized_weights() const { return quantized_types_; }
  /// Whether any weight matrix is held in blocks of 32 (int8, fp8 or int4: kernels::dtype::q8,
  /// fp8, q4), whose rows a rank's row-parallel slice must cut on a block boundary. (A Q4_K /
  /// Q6_K slice that would cut a super-block is copied by its rank as int8: shard_executor's
  /// row slices.)
  bool holds_blocks_of_32() const {
    for (const char* t : {"int8", "int4", "fp8", "mxfp4"}) {
      if (quantized_types_.find(t) != std::string::npos) return true;
    }
    return false;
  }
  /// load_options::ranks: the ranks whose parts it holds (nullopt: every rank's).
  const std::optional<rank_set>& held_ranks() const { return held_ranks_; }
  /// invalid_request unless it holds the parts `ranks` of `tp` read (expert_parallel as
  /// theirs): a model loaded for some ranks runs no others.
  [[nodiscard]] status check_ranks(int tp, bool expert_parallel, std::span<const int> ranks) const;
  /// Held for some ranks: columns [c0, c0 + k) of a row-parallel matrix `full` (o_proj,
  /// down_proj, a routed expert's or the shared expert's down_proj) as a [rows, k] matrix of
  /// their own, the rank's copy (the full matrix's pages then left memory); nullptr when there
  /// is none (the full matrix is read in place).
  const weight_matrix* column_slice(const weight_matrix& full, size_t c0) const;
  /// Bytes of the weight matrices' pages resident in memory now (mincore; each page once):
  /// what this process holds of them, or for views into a checkpoint, the page cache.
  size_t resident_weight_bytes() const;
  /// The LoRA adapters it serves now (load_options::loras first), by id. Thread-safe; the
  /// set changes while the model serves (load_lora, lora_set::remove), the weights never do.
  lora_set& loras() const { return *loras_; }
  /// Whether the model serves LoRA adapters (load_options::enable_lora or ::loras).
  bool lora_enabled() const { return lora_enabled_; }
  /// Loads the adapter at src.path for this model and adds it under the next id.
  /// unsupported when the model was loaded without enable_lora; load_lora's and
  /// lora_set::add's errors otherwise.
  [[nodiscard]] result<int32_t> load_lora(const lora_source& src) const;
  /// The token bytes of DIR/tokenizer.json, for structured outputs (token_mask.hpp); null when
  /// the directory has no tokenizer the detokenizer reads.
  const std::shared_ptr<const token_vocabulary>& vocabulary() const { return vocabulary_; }

  /// A sequence classifier's logits for final hidden states (after the final norm), `rows`
  /// [n][hidden] → [n][labels]: score · row, summed in double; a reward model's score ·
  /// relu(score_hidden · row + its bias) + score_bias, its hidden layer one kernels::matmul
  /// over the n rows on `pool` (null: this thread), in the canonical order — a row's bits do
  /// not depend on its neighbours or the pool. REQUIRES: config().classifier.labels > 0.
  std::vector<float> classify(std::span<const float> rows, kernels::thread_pool* pool = nullptr) const;

  /// Weight bytes a decode step reads per token at batch 1: every layer matrix and the LM
  /// head (the embedding row is negligible).
  size_t decode_weight_bytes() const;
  /// Bytes of every weight matrix as held (every expert of an MoE model; embedding and LM head
  /// once when tied).
  size_t weight_bytes() const;
  /// Weights (elements) a decode step multiplies by per token: the layer matrices and the LM head.
  size_t decode_params() const;

 private:
  model(std::string dir, model_config cfg, tensor_store store)
      : dir_(std::move(dir)), config_(std::move(cfg)), store_(std::move(store)) {}
  status bind_weights();
  /// Layer `layer`'s router and experts (Qwen3-MoE's mlp.gate / mlp.experts.E.{gate,up,down}_proj,
  /// Mixtral's block_sparse_moe.gate / block_sparse_moe.experts.E.{w1,w3,w2}).
  status bind_experts(size_t layer);
  /// The classifier's score head: score.weight, or the LM head's rows of classifier_from_token's
  /// tokens (looked up in `tokenizer_dir`'s tokenizer). Before cast and quantize (classifier.cpp).
  status bind_classifier(const std::string& tokenizer_dir);
  /// `through`: online fp8 rounds each weight to it first (the --dtype it runs before).
  status quantize(quantization q, kernels::dtype through = kernels::dtype::f32);
  /// Held for some ranks: copies each rank's columns of the row-parallel matrices into
  /// column_slices_ and lets the full matrices' pages go (column_slices.cpp).
  status compact_columns();
  /// load_options::dtype.
  status cast(kernels::dtype to);

  std::string dir_;
  model_config config_;
  tensor_store store_;
  std::string root_ = "model.";  ///< the tensors' name prefix: "" in a bare transformer's checkpoint
  model_weights weights_;
  std::shared_ptr<const token_vocabulary> vocabulary_;
  quantization quant_ = quantization::none;
  std::string quantized_types_;
  std::shared_ptr<lora_set> loras_ = std::make_shared<lora_set>();
  bool lora_enabled_ = false;
  /// The quantized copy the q8 weight views point into (huge-page backed where the kernel allows).
  std::shared_ptr<uint8_t> quantized_;
  /// The --dtype copy the cast weight views point into.
  std::shared_ptr<uint8_t> cast_;
  std::optional<kernels::dtype> cast_type_;
  std::optional<kernels::dtype> lora_type_;  ///< load_options::lora_dtype, resolved
  std::optional<rank_set> held_ranks_;       ///< load_options::ranks
  struct held_columns {
    const void* full;  ///< the full matrix's data
    size_t c0;
    weight_matrix w;
  };
  /// Adds `more` (anything with full, c0 and w) to column_slices_, kept sorted.
  template <class Columns>
  void keep_column_slices(const std::vector<Columns>& more) {
    for (const auto& x : more) column_slices_.push_back({x.full, x.c0, x.w});
    sort_column_slices();
  }
  void sort_column_slices();
  std::vector<held_columns> column_slices_;  ///< sorted by (full, c0)
  std::shared_ptr<uint8_t> column_bytes_;    ///< what column_slices_ point into
};

}  // namespace llmesh::model
