// Token ids -> text for byte-level BPE vocabularies (GPT-2 / Llama 3 / Qwen2 style
// tokenizer.json with a ByteLevel decoder) and SentencePiece-style ones (Llama 2 / Mistral:
// "▁" as space, <0xNN> byte fallback, leading-space strip), including streaming: a token that
// ends inside a UTF-8 character emits nothing until the character is complete.
//
// This is the decoding half of the model's tokenizer; encoding (pre-tokenizer, merges,
// normalizers, chat templates) is the tokenizer issue's.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llmesh/common/error.hpp"

namespace llmesh::model {

/// Immutable after load; thread-safe to share.
class detokenizer {
 public:
  /// Reads DIR/tokenizer.json. Errors name the file and the problem; decoders other than those
  /// above are `unsupported`.
  [[nodiscard]] static result<detokenizer> load(const std::string& model_dir);

  /// The same from an already parsed tokenizer.json (`path` names it in errors).
  [[nodiscard]] static result<detokenizer> from_json(const nlohmann::json& tokenizer_json, const std::string& path);

  /// Bytes of one token (its UTF-8 text for added tokens); empty for ids outside the vocabulary.
  const std::string& token_bytes(int32_t id) const;

  /// Whether id is an added token marked special (BOS, EOS, ...).
  bool is_special(int32_t id) const;

  /// The text of ids; special tokens are skipped when skip_special. Invalid UTF-8 sequences
  /// in the result (possible mid-stream) become U+FFFD, as HF's decode does.
  std::string decode(std::span<const int32_t> ids, bool skip_special = true) const;

  size_t vocab_size() const { return bytes_.size(); }

  /// Leading spaces the decoder strips from the start of a decode (SentencePiece's prefix space).
  size_t strip_leading() const { return strip_leading_; }

 private:
  size_t strip_leading_ = 0;
  std::vector<std::string> bytes_;
  std::vector<bool> special_;
};

/// Streaming decode of one sequence: feed tokens one at a time; each call returns the new,
/// complete UTF-8 text (possibly empty). The concatenation of all returns equals the decode of
/// all ids once flush() has been called.
class stream_decoder {
 public:
  explicit stream_decoder(const detokenizer& d, bool skip_special = true) : d_(d), skip_special_(skip_special) {}
  /// Special tokens whose text is kept while the others are skipped (a tool-call parser's
  /// markers, e.g. Mistral's [TOOL_CALLS]).
  void keep_special(std::vector<int32_t> ids) { keep_ = std::move(ids); }
  std::string push(int32_t id);
  /// Emits what is left (an incomplete trailing character becomes U+FFFD).
  std::string flush();

 private:
  const detokenizer& d_;
  bool skip_special_;
  std::vector<int32_t> keep_;
  std::string pending_;  ///< bytes of an unfinished UTF-8 character
  size_t stripped_ = 0;  ///< leading spaces already stripped (or strip_leading() once text began)
};

/// Replaces invalid UTF-8 sequences in bytes with U+FFFD; `complete_prefix` (optional)
/// receives the length of the longest prefix that does not end inside a valid-but-unfinished
/// character.
std::string sanitize_utf8(const std::string& bytes, size_t* complete_prefix = nullptr);

}  // namespace llmesh::model
