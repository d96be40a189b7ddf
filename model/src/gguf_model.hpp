// Private: a GGUF file seen as an HF model directory. Its metadata becomes the text of the
// config.json, tokenizer.json and tokenizer_config.json that directory would hold (so the one
// parser of each reads both), and its tensors the HF-named tensors of a tensor_store.
#pragma once

#include <string>

#include "llmesh/common/error.hpp"
#include "llmesh/model/gguf.hpp"
#include "llmesh/model/safetensors.hpp"
#include "rank_parts.hpp"

namespace llmesh::model {

/// The files an HF directory would hold for a GGUF model.
struct gguf_texts {
  result<std::string> config_json = std::string();  ///< or why the file is not a model llmesh runs
  std::string tokenizer_json;         ///< empty when the file has no tokenizer
  std::string tokenizer_config_json;  ///< chat_template, bos/eos tokens, add_bos_token
};

/// Architectures: llama (Llama, Mistral; Mixtral with experts), qwen2, qwen3, qwen3moe, qwen2moe,
/// phi3, gpt-oss, gemma, gemma2, gemma3, smollm3. Tokenizers: "gpt2" (byte-level BPE: Llama 3, Qwen) with
/// the pre-tokenizers llama-bpe/llama3/llama-v3/smaug-bpe, qwen2, gpt-2 and gpt-4o;
/// "llama" (SentencePiece BPE: Llama 2, Mistral v0.1-0.3), its merges derived from the
/// scores as transformers' converter does. Anything else is refused, naming it.
[[nodiscard]] result<gguf_texts> gguf_model_texts(const gguf_file& g);

/// The tensors under their HF names (model.layers.N.self_attn.q_proj.weight, ...): F32, F16
/// and BF16 as views into the mapping (Llama's q and k rows, which llama.cpp's converter
/// interleaves for its rotary, un-permuted into a copy), Q2_K ... Q6_K and IQ4_XS matrices
/// likewise as kernels::dtype::q2_k ... iq4_xs (the kernels read those blocks in place), Q4_0
/// and Q4_1 repacked into kernels::dtype::q4 exactly (their nibbles, the float16 scale widened,
/// the offset 8·d or −min), Q8_0, Q5_0 and IQ4_NL into kernels::dtype::q8 exactly (a float16
/// scale widened, their quants minus 16, or IQ4_NL's table values, as int8), Q5_1 dequantized
/// in float32 and quantized to q8 (32-element blocks with a scale of max|w|/127). A quantized vector (no such file seen) is
/// dequantized to float32 as the other vectors are. With `part_of`, a copied or repacked
/// matrix is written only in the part it names (load_options::ranks); with `own` too, a part
/// that is one rank's columns (matrix_part::own) on whole blocks as a matrix of its own, listed
/// there (model::column_slice), its full matrix never touched.
[[nodiscard]] result<tensor_store> gguf_tensor_store(const std::string& path, const detail::part_of_tensor& part_of = {},
                                                     std::vector<detail::own_columns>* own = nullptr);

/// `name`'s text in model `dir`: DIR/name for a directory; for a GGUF file (is_gguf_file) the
/// synthesized text (cached per file), or not_found when it has none (generation_config.json).
[[nodiscard]] result<std::string> read_model_file(const std::string& dir, const std::string& name);

/// How files of `dir` are named in errors: DIR/name, or FILE.gguf (name).
std::string model_file_label(const std::string& dir, const std::string& name);

}  // namespace llmesh::model
