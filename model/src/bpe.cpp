#include "bpe.hpp"

#include <array>
#include <cstdio>
#include <queue>

namespace llmesh::model {
namespace {

using json = nlohmann::json;

// Why 200k: distinct words of a large English corpus stay well below it; past it the cache is
// dropped, so memory stays bounded whatever the input.
constexpr size_t max_cache_words = 200000;

const std::array<std::string, 256>& byte_chars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      int cp = printable ? b : 256 + extra++;
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      t[b] = s;
    }
    return t;
  }();
  return table;
}

size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1; }

}  // namespace

std::string bpe_model::to_byte_level(const std::string& bytes) {
  const auto& t = byte_chars();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += t[c];
  return out;
}

status bpe_model::load(const json& m, const std::string& path) {
  std::string type = m.value("type", "BPE");
  if (type != "BPE") return make_error(errc::unsupported, path + ": model type '" + type + "' is not supported yet");
  byte_fallback_ = m.value("byte_fallback", false);
  fuse_unk_ = m.value("fuse_unk", false);
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(k) && !m[k].is_null() && !m[k].get<std::string>().empty()) {
      return make_error(errc::unsupported, path + ": BPE " + k + " is not supported yet");
    }
  }
  if (!m.contains("vocab") || !m["vocab"].is_object()) return make_error(errc::invalid_request, path + ": missing model.vocab");
  for (const auto& [tok, id] : m["vocab"].items()) vocab_[tok] = id.get<int32_t>();
  ignore_merges_ = m.value("ignore_merges", false);
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = vocab_.find(m["unk_token"].get<std::string>());
    if (it != vocab_.end()) unk_ = it->second;
  }
  if (!m.contains("merges") || !m["merges"].is_array()) return make_error(errc::invalid_request, path + ": missing model.merges");
  int32_t rank = 0;
  for (const auto& entry : m["merges"]) {
    std::string a, b;
    if (entry.is_string()) {
      const std::string s = entry.get<std::string>();
      size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) return make_error(errc::invalid_request, path + ": malformed merge '" + s + "'");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (entry.is_array() && entry.size() == 2) {
      a = entry[0].get<std::string>();
      b = entry[1].get<std::string>();
    } else {
      return make_error(errc::invalid_request, path + ": malformed merge entry");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), im = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end()) {
      return make_error(errc::invalid_request, path + ": merge '" + a + " " + b + "' uses tokens missing from the vocabulary");
    }
    merges_.emplace(key(ia->second, ib->second), merge{rank++, im->second});
  }
  return ok_status();
}

void bpe_model::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (word.size() > 256) return;  // whole-text "words" (no pre-tokenizer) are not worth caching
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() >= max_cache_words) cache_.clear();
  cache_.emplace(word, std::move(ids));
}

void bpe_model::merge_word(const std::string& word, std::vector<int32_t>& out) const {
  struct symbol {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<symbol> sym;
  for (size_t i = 0; i < word.size();) {
    size_t n = std::min(utf8_len(static_cast<unsigned char>(word[i])), word.size() - i);
    auto it = vocab_.find(word.substr(i, n));
    i += n;
    auto add = [&](int32_t id) { sym.push_back({id, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1, true}); };
    if (it != vocab_.end()) {
      add(it->second);
      continue;
    }
    // Unknown character: its UTF-8 bytes as <0xNN> tokens when the vocabulary has them all
    // (byte_fallback), else the unknown token (fused with a preceding one when fuse_unk).
    std::vector<int32_t> bytes;
    if (byte_fallback_) {
      for (size_t b = i - n; b < i; ++b) {
        char name[7];
        std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned char>(word[b]));
        auto bt = vocab_.find(name);
        if (bt == vocab_.end()) {
          bytes.clear();
          break;
        }
        bytes.push_back(bt->second);
      }
    }
    if (!bytes.empty()) {
      for (int32_t id : bytes) add(id);
    } else if (unk_ >= 0 && !(fuse_unk_ && !sym.empty() && sym.back().id == unk_)) {
      add(unk_);
    }
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  struct entry {
    int32_t rank;
    int pos;
    int32_t merged;
    bool operator>(const entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<entry, std::vector<entry>, std::greater<entry>> heap;
  auto push_pair = [&](int pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    auto it = merges_.find(key(sym[pos].id, sym[sym[pos].next].id));
    if (it != merges_.end()) heap.push({it->second.rank, pos, it->second.merged});
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) push_pair(i);
  while (!heap.empty()) {
    entry top = heap.top();
    heap.pop();
    symbol& s = sym[top.pos];
    if (!s.alive || s.next < 0) continue;
    auto it = merges_.find(key(s.id, sym[s.next].id));
    if (it == merges_.end() || it->second.merged != top.merged) continue;  // stale entry
    symbol& right = sym[s.next];
    right.alive = false;
    s.id = top.merged;
    s.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    push_pair(s.prev);
    push_pair(top.pos);
  }
  for (const auto& s : sym) {
    if (s.alive) out.push_back(s.id);
  }
}

}  // namespace llmesh::model
