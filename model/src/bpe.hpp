// Private: the BPE model of a byte-level tokenizer.json — vocabulary, merge ranks and the
// merge loop (HF tokenizers' Word::merge_all: a min-heap of (rank, position) pairs over a
// linked list of symbols, stale entries skipped), with a bounded, thread-safe word cache.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::model {

class bpe_model {
 public:
  /// Loads model.vocab / model.merges; refuses what this BPE does not implement.
  [[nodiscard]] status load(const nlohmann::json& model, const std::string& path);

  /// Appends the ids of one pre-token, given in byte-level characters.
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;

  /// The id of a vocabulary entry, spelled as the vocabulary spells it (byte-level characters).
  std::optional<int32_t> find(const std::string& token) const {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }

  /// UTF-8 bytes -> GPT-2 byte-level characters.
  static std::string to_byte_level(const std::string& bytes);

 private:
  struct merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }
  void merge_word(const std::string& word, std::vector<int32_t>& out) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, merge> merges_;
  int32_t unk_ = -1;
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace llmesh::model
