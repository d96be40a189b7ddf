// Byte-level BPE decoding: each vocabulary string is a sequence of code points from GPT-2's
// byte-to-unicode table; mapping them back gives the token's bytes. Added tokens decode to
// their content. Invalid UTF-8 becomes U+FFFD per maximal invalid subpart (Rust's
// from_utf8_lossy, which HF tokenizers use).
#include "llmesh/model/detokenizer.hpp"
#include "gguf_model.hpp"
#include "read_file.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <nlohmann/json.hpp>

namespace llmesh::model {
namespace {

using json = nlohmann::json;

/// Code point -> byte for GPT-2's table (-1: not in the table).
const std::array<int, 512>& unicode_to_byte() {
  static const std::array<int, 512> table = [] {
    std::array<int, 512> t{};
    t.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[printable ? b : 256 + extra++] = b;
    }
    return t;
  }();
  return table;
}

/// Decodes one UTF-8 code point at s[i]; returns -1 on malformed input. Advances i.
int32_t next_code_point(const std::string& s, size_t& i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return -1;
  }
  int32_t cp = len == 1 ? c : c & (0x7f >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  i += len;
  return cp;
}

std::string byte_level_bytes(const std::string& token) {
  std::string out;
  const auto& table = unicode_to_byte();
  for (size_t i = 0; i < token.size();) {
    size_t start = i;
    int32_t cp = next_code_point(token, i);
    if (cp >= 0 && cp < 512 && table[cp] >= 0) {
      out.push_back(static_cast<char>(table[cp]));
    } else {
      out.append(token, start, i - start);  // not a byte-level character: keep it as is
    }
  }
  return out;
}

error bad(const std::string& path, const std::string& msg) { return make_error(errc::invalid_request, path + ": " + msg); }

/// SentencePiece-style token text: "▁" is a space, and with a ByteFallback decoder "<0xNN>"
/// is the byte NN (without one it stays literal text, as the reference decodes it).
std::string metaspace_bytes(const std::string& token, bool byte_fallback) {
  if (byte_fallback && token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>' && std::isxdigit(static_cast<unsigned char>(token[3])) &&
      std::isxdigit(static_cast<unsigned char>(token[4]))) {
    return std::string(1, static_cast<char>(std::stoi(token.substr(3, 2), nullptr, 16)));
  }
  std::string out;
  const std::string space = "\xE2\x96\x81";  // U+2581
  for (size_t i = 0; i < token.size();) {
    if (token.compare(i, space.size(), space) == 0) {
      out.push_back(' ');
      i += space.size();
    } else {
      out.push_back(token[i++]);
    }
  }
  return out;
}

struct decoder_kind {
  bool byte_level = true;
  size_t strip_leading = 0;  ///< leading spaces removed from the start of a decode
  bool byte_fallback = false;  ///< <0xNN> tokens decode to their byte
};

/// The decoders we reproduce exactly: ByteLevel; SentencePiece's Metaspace; and the Sequence
/// [Replace("▁" -> " "), ByteFallback, Fuse, Strip(" ", n, 0)] of Llama 2 / Mistral files.
result<decoder_kind> classify_decoder(const json& d) {
  std::string type = d.is_object() && d.contains("type") && d["type"].is_string() ? d["type"].get<std::string>() : "none";
  if (type == "ByteLevel") return decoder_kind{true, 0, false};
  if (type == "Metaspace") {
    bool prefix = d.value("add_prefix_space", true) && d.value("prepend_scheme", std::string("always")) != "never";
    return decoder_kind{false, prefix ? size_t{1} : size_t{0}, false};
  }
  if (type == "Sequence" && d.contains("decoders") && d["decoders"].is_array()) {
    decoder_kind k{false, 0, false};
    bool replace = false;
    for (const auto& step : d["decoders"]) {
      std::string t = step.value("type", "");
      if (t == "Replace" && step.contains("pattern") && step["pattern"].contains("String") &&
          step["pattern"]["String"] == "\u2581" && step.value("content", "") == " ") {
        replace = true;
      } else if (t == "ByteFallback") {
        k.byte_fallback = true;
      } else if (t == "Fuse") {
      } else if (t == "Strip" && step.value("content", "") == " " && step.value("stop", 0) == 0) {
        k.strip_leading = step.value("start", 0);
      } else {
        return make_error(errc::unsupported, "decoder step '" + t + "' is not supported yet");
      }
    }
    if (replace) return k;
  }
  return make_error(errc::unsupported, "decoder '" + type + "' is not supported yet");
}

}  // namespace

std::string sanitize_utf8(const std::string& s, size_t* complete_prefix) {
  std::string out;
  out.reserve(s.size());
  const std::string replacement = "\xEF\xBF\xBD";
  size_t i = 0, complete = s.size();
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    }
    if (len == 0) {
      out += replacement;
      ++i;
      continue;
    }
    size_t j = 1;
    for (; j < static_cast<size_t>(len) && i + j < s.size(); ++j) {
      unsigned char b = static_cast<unsigned char>(s[i + j]);
      unsigned char min = j == 1 ? lo : 0x80, max = j == 1 ? hi : 0xBF;
      if (b < min || b > max) break;
    }
    if (j == static_cast<size_t>(len)) {
      out.append(s, i, len);
    } else {
      if (i + j == s.size() && complete == s.size()) complete = i;  // valid so far, cut by the end
      out += replacement;
    }
    i += j;
  }
  if (complete_prefix != nullptr) *complete_prefix = complete;
  return out;
}

result<detokenizer> detokenizer::load(const std::string& dir) {
  const std::string path = model_file_label(dir, "tokenizer.json");
  auto text = read_model_file(dir, "tokenizer.json");
  if (!text) return text.take_error();
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad(path, "not a JSON object");
  return from_json(j, path);
}

result<detokenizer> detokenizer::from_json(const nlohmann::json& j, const std::string& path) {
  const json decoder = j.contains("decoder") ? j["decoder"] : json();
  auto decoder_kind = classify_decoder(decoder);
  if (!decoder_kind) return make_error(errc::unsupported, path + ": " + decoder_kind.err().message);
  if (!j.contains("model") || !j["model"].is_object() || !j["model"].contains("vocab") || !j["model"]["vocab"].is_object()) {
    return bad(path, "missing model.vocab");
  }
  detokenizer d;
  d.strip_leading_ = decoder_kind->strip_leading;
  const bool byte_level = decoder_kind->byte_level, byte_fallback = decoder_kind->byte_fallback;
  auto place = [&d](int64_t id) -> bool {
    if (id < 0 || id > (1 << 24)) return false;
    if (static_cast<size_t>(id) >= d.bytes_.size()) {
      d.bytes_.resize(id + 1);
      d.special_.resize(id + 1, false);
    }
    return true;
  };
  for (const auto& [token, id] : j["model"]["vocab"].items()) {
    if (!id.is_number_integer() || !place(id.get<int64_t>())) return bad(path, "bad id for vocab entry '" + token + "'");
    d.bytes_[id.get<size_t>()] = byte_level ? byte_level_bytes(token) : metaspace_bytes(token, byte_fallback);
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& t : j["added_tokens"]) {
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
          !t["content"].is_string() || !place(t["id"].get<int64_t>())) {
        return bad(path, "malformed added_tokens entry");
      }
      size_t id = t["id"].get<size_t>();
      d.bytes_[id] = t["content"].get<std::string>();
      d.special_[id] = t.value("special", false);
    }
  }
  return d;
}

const std::string& detokenizer::token_bytes(int32_t id) const {
  static const std::string empty;
  return id >= 0 && static_cast<size_t>(id) < bytes_.size() ? bytes_[id] : empty;
}

bool detokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[id];
}

std::string detokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string raw;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    raw += token_bytes(id);
  }
  size_t strip = 0;
  while (strip < strip_leading_ && strip < raw.size() && raw[strip] == ' ') ++strip;
  return sanitize_utf8(raw.substr(strip));
}

std::string stream_decoder::push(int32_t id) {
  if (skip_special_ && d_.is_special(id) && std::find(keep_.begin(), keep_.end(), id) == keep_.end()) return {};
  std::string bytes = d_.token_bytes(id);
  while (stripped_ < d_.strip_leading() && !bytes.empty()) {  // the decoder's Strip: leading spaces only
    if (bytes[0] != ' ') {
      stripped_ = d_.strip_leading();
      break;
    }
    bytes.erase(0, 1);
    ++stripped_;
  }
  pending_ += bytes;
  size_t complete = 0;
  sanitize_utf8(pending_, &complete);
  std::string out = sanitize_utf8(pending_.substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string stream_decoder::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace llmesh::model
