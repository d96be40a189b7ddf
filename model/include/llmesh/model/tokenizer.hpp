// Text -> token ids from an HF tokenizer.json, for BPE tokenizers: byte-level (GPT-2, Llama 3,
// Qwen2 and models trained like them) and SentencePiece-style (Llama 2, Mistral). Added/special
// tokens matched first (lstrip / rstrip / single_word honoured); NFC, NFKC, Prepend and
// Replace (String pattern) normalizers; Split-regex (Isolated), ByteLevel and Metaspace
// pre-tokenizers (PCRE2 with Unicode properties); BPE merges by rank (O(n log n) per word,
// cached), with byte_fallback, unk_token, fuse_unk and ignore_merges; the TemplateProcessing /
// ByteLevel post-processors. Decoding is `detokenizer`'s.
//
// load() refuses, with an `unsupported` error naming the component: models other than BPE
// (Unigram, WordPiece, ...), BPE continuing_subword_prefix / end_of_word_suffix, any other
// normalizer (Replace with a Regex pattern too), pre-tokenizer, post-processor or decoder, and
// Split without a Regex pattern or with a behaviour other than Isolated.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/model/detokenizer.hpp"

namespace llmesh::model {

/// Immutable after load; encode() is thread-safe (its word cache is per thread).
class tokenizer {
 public:
  /// Reads DIR/tokenizer.json. Errors name the file and the component.
  [[nodiscard]] static result<std::shared_ptr<const tokenizer>> load(const std::string& model_dir);
  ~tokenizer();

  /// Token ids of text. add_special: apply the post-processor template (e.g. BOS). Invalid
  /// UTF-8 in text is first replaced by U+FFFD (one per maximal invalid subpart).
  std::vector<int32_t> encode(std::string_view text, bool add_special = true) const;

  /// Token ids of a pair of texts, as transformers' tokenizer(text, text_pair): the
  /// post-processor's pair template (e.g. BOS A EOS B EOS) when add_special, else (or without a
  /// pair template) A's ids then B's.
  std::vector<int32_t> encode_pair(std::string_view a, std::string_view b, bool add_special = true) const;

  /// The id of one token as the vocabulary or the added tokens spell it (transformers'
  /// convert_tokens_to_ids), or nothing.
  std::optional<int32_t> token_id(const std::string& token) const;

  const detokenizer& decoder() const { return *decoder_; }

  struct impl;

 private:
  tokenizer() = default;
  std::unique_ptr<impl> impl_;
  std::unique_ptr<detokenizer> decoder_;
};

}  // namespace llmesh::model
