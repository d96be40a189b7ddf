// tokenizer.json loading and the encode pipeline: added tokens -> normalizer -> pre-tokenizer
// -> BPE (bpe.cpp) -> post-processor. Each component the file names is either implemented
// exactly or refused at load with an `unsupported` error naming it: never a silent
// approximation that would produce different ids than the reference.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "bpe.hpp"
#include "gguf_model.hpp"
#include "read_file.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer pattern (HF ByteLevel with use_regex).
constexpr const char* gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct regex_deleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
using regex_ptr = std::shared_ptr<pcre2_code>;

result<regex_ptr> compile(const std::string& pattern, const std::string& path) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return make_error(errc::unsupported, path + ": pre-tokenizer regex does not compile at offset " +
                                             std::to_string(offset) + ": " + reinterpret_cast<char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; the interpreter is the fallback
  return regex_ptr(code, regex_deleter{});
}

/// HF's SplitDelimiterBehavior: what a Split pre-tokenizer does with each match.
enum class split_behavior { isolated, removed, merged_with_previous, merged_with_next, contiguous };

struct pre_step {
  enum class kind { split, byte_level, metaspace } type = kind::split;
  regex_ptr re;               ///< split pattern, or GPT-2's for byte_level with use_regex
  split_behavior behavior = split_behavior::isolated;
  bool add_prefix_space = false;
  bool first_only = false;    ///< metaspace prepend_scheme "first": only the text's first section
  std::string replacement;    ///< metaspace: the space symbol
};

struct added_token {
  std::string content;
  int32_t id = 0;
  bool lstrip = false, rstrip = false, single_word = false;
};

/// One normalizer step: NFC, NFKC, Prepend(text), Replace(String pattern -> content).
struct normalization {
  enum class kind { nfc, nfkc, prepend, replace } type;
  std::string a, b;  ///< prepend: a; replace: a -> b
};

/// Pieces of text, with a flag: already mapped to byte-level characters.
struct piece {
  std::string text;
  bool mapped = false;
};

/// Splits s by the regex's (non-empty) matches, as HF's Split does with `behavior`: Isolated
/// keeps matches and the gaps between them as pieces, Removed only the gaps, MergedWithPrevious
/// appends each match to the gap before it, MergedWithNext prepends it to the gap after it,
/// Contiguous isolates runs of adjacent matches as one piece.
void split_by(const pcre2_code* re, split_behavior behavior, const std::string& s, std::vector<piece>& out) {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re, nullptr);
  std::vector<std::pair<size_t, size_t>> matches;
  size_t at = 0;
  while (at <= s.size()) {
    int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (e == b) {  // empty match: step one character forward
      if (b >= s.size()) break;
      at = b + 1;
      while (at < s.size() && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) ++at;
      continue;
    }
    if (behavior == split_behavior::contiguous && !matches.empty() && matches.back().second == b) {
      matches.back().second = e;  // adjacent to the last: one run
    } else {
      matches.emplace_back(b, e);
    }
    at = e;
  }
  pcre2_match_data_free(md);
  auto emit = [&](size_t b, size_t e) {
    if (e > b) out.push_back({s.substr(b, e - b), false});
  };
  size_t last = 0;  // the end of what has been emitted
  for (size_t i = 0; i < matches.size(); ++i) {
    const auto [b, e] = matches[i];
    switch (behavior) {
      case split_behavior::removed: emit(last, b); last = e; break;
      case split_behavior::merged_with_previous: emit(last, e); last = e; break;
      case split_behavior::merged_with_next: emit(last, b); last = b; break;  // the match opens the next piece
      default: emit(last, b); emit(b, e); last = e; break;  // isolated, contiguous
    }
  }
  emit(last, s.size());
}

/// A literal for PCRE2: every character that is not alphanumeric escaped.
std::string regex_literal(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if (!std::isalnum(ch) && ch < 0x80) out += '\\';
    out += static_cast<char>(ch);
  }
  return out;
}

bool is_word_byte(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }
bool is_space_byte(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

error bad(const std::string& path, const std::string& msg) { return make_error(errc::invalid_request, path + ": " + msg); }
error unsupported(const std::string& path, const std::string& what) {
  return make_error(errc::unsupported, path + ": " + what + " is not supported yet");
}

}  // namespace

struct tokenizer::impl {
  std::string path;
  bpe_model bpe;
  std::vector<added_token> added;
  std::array<std::vector<size_t>, 256> added_by_first;  ///< indices, longest first
  std::vector<normalization> normalizers;
  std::vector<pre_step> pre;
  std::vector<int32_t> prefix_ids, suffix_ids;
  /// The pair template: special ids, or -1 for text A's ids and -2 for B's (empty: none given).
  std::vector<int32_t> pair_items;

  status load_normalizer(const json& n);
  status load_pre_tokenizer(const json& p);
  status load_post_processor(const json& p, const json& root);
  std::string normalize(std::string s) const;
  void encode_segment(const std::string& s, bool first_section, std::vector<int32_t>& out) const;
};

status tokenizer::impl::load_normalizer(const json& n) {
  if (n.is_null()) return ok_status();
  std::string type = n.value("type", "");
  if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
    for (const auto& x : n["normalizers"]) LLMESH_TRY(load_normalizer(x));
    return ok_status();
  }
  if (type == "NFC") {
    normalizers.push_back({normalization::kind::nfc, "", ""});
  } else if (type == "NFKC") {
    normalizers.push_back({normalization::kind::nfkc, "", ""});
  } else if (type == "Prepend" && n.contains("prepend") && n["prepend"].is_string()) {
    normalizers.push_back({normalization::kind::prepend, n["prepend"].get<std::string>(), ""});
  } else if (type == "Replace" && n.contains("pattern") && n["pattern"].contains("String") && n.contains("content")) {
    normalizers.push_back({normalization::kind::replace, n["pattern"]["String"].get<std::string>(), n["content"].get<std::string>()});
  } else {
    return unsupported(path, "normalizer '" + type + "'");
  }
  return ok_status();
}

status tokenizer::impl::load_pre_tokenizer(const json& p) {
  if (p.is_null()) return ok_status();
  std::string type = p.value("type", "");
  if (type == "Sequence" && p.contains("pretokenizers") && p["pretokenizers"].is_array()) {
    for (const auto& x : p["pretokenizers"]) LLMESH_TRY(load_pre_tokenizer(x));
    return ok_status();
  }
  pre_step step;
  if (type == "Split") {
    const json& pat = p.contains("pattern") ? p["pattern"] : json();
    const std::string behavior = p.contains("behavior") && p["behavior"].is_string() ? p["behavior"].get<std::string>() : "";
    if (behavior == "Isolated") {
      step.behavior = split_behavior::isolated;
    } else if (behavior == "Removed") {
      step.behavior = split_behavior::removed;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = split_behavior::merged_with_previous;
    } else if (behavior == "MergedWithNext") {
      step.behavior = split_behavior::merged_with_next;
    } else if (behavior == "Contiguous") {
      step.behavior = split_behavior::contiguous;
    } else {
      return unsupported(path, "Split pre-tokenizer behaviour '" + behavior + "'");
    }
    if (p.value("invert", false)) return unsupported(path, "an inverted Split pre-tokenizer");
    std::string regex;
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      regex = pat["Regex"].get<std::string>();
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string() && !pat["String"].get<std::string>().empty()) {
      regex = regex_literal(pat["String"].get<std::string>());  // Gemma's: Split(" ", MergedWithPrevious)
    } else {
      return unsupported(path, "Split pre-tokenizer without a Regex or String pattern");
    }
    auto re = compile(regex, path);
    if (!re) return re.take_error();
    step.re = re.value();
  } else if (type == "ByteLevel") {
    step.type = pre_step::kind::byte_level;
    step.add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) {
      auto re = compile(gpt2_pattern, path);
      if (!re) return re.take_error();
      step.re = re.value();
    }
  } else if (type == "Metaspace") {
    // As transformers.js (the reference): spaces become the replacement, prefixed per
    // prepend_scheme; no split (SentencePiece pieces never hold the symbol mid-piece).
    step.type = pre_step::kind::metaspace;
    step.replacement = p.value("replacement", std::string("\xE2\x96\x81"));
    std::string scheme = p.value("prepend_scheme", std::string("always"));
    step.add_prefix_space = p.value("add_prefix_space", true) && scheme != "never";
    step.first_only = scheme == "first";
  } else {
    return unsupported(path, "pre-tokenizer '" + type + "'");
  }
  pre.push_back(std::move(step));
  return ok_status();
}

status tokenizer::impl::load_post_processor(const json& p, const json& root) {
  if (p.is_null()) return ok_status();
  std::string type = p.value("type", "");
  if (type == "ByteLevel") return ok_status();  // offsets only; adds no tokens
  if (type == "Sequence" && p.contains("processors") && p["processors"].is_array()) {
    for (const auto& x : p["processors"]) LLMESH_TRY(load_post_processor(x, root));
    return ok_status();
  }
  if (type != "TemplateProcessing") return unsupported(path, "post-processor '" + type + "'");
  if (!p.contains("single") || !p["single"].is_array()) return bad(path, "TemplateProcessing without 'single'");
  const json& specials = p.contains("special_tokens") ? p["special_tokens"] : json::object();
  auto special_ids = [&](const json& item, std::vector<int32_t>& out) -> status {
    if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id")) return bad(path, "malformed template item");
    std::string name = item["SpecialToken"]["id"].get<std::string>();
    if (!specials.contains(name) || !specials[name].contains("ids")) return bad(path, "template names unknown token " + name);
    for (const auto& id : specials[name]["ids"]) out.push_back(id.get<int32_t>());
    return ok_status();
  };
  if (p.contains("pair") && p["pair"].is_array()) {
    pair_items.clear();
    for (const auto& item : p["pair"]) {
      if (item.contains("Sequence")) {
        pair_items.push_back(item["Sequence"].value("id", "A") == "B" ? -2 : -1);
      } else {
        LLMESH_TRY(special_ids(item, pair_items));
      }
    }
  }
  bool after = false;
  for (const auto& item : p["single"]) {
    if (item.contains("Sequence")) {
      after = true;
      continue;
    }
    LLMESH_TRY(special_ids(item, after ? suffix_ids : prefix_ids));
  }
  return ok_status();
}

static std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, from.size(), from) == 0) {
      out += to;
      i += from.size();
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

std::string tokenizer::impl::normalize(std::string s) const {
  for (const auto& n : normalizers) {
    switch (n.type) {
      case normalization::kind::prepend:
        if (!s.empty()) s = n.a + s;  // HF's Prepend leaves an empty text empty
        break;
      case normalization::kind::replace:
        s = replace_all(s, n.a, n.b);
        break;
      default: {
        // utf8proc stops at a NUL byte: normalise the NUL-free runs and keep the NULs.
        std::string out;
        size_t at = 0;
        while (at <= s.size()) {
          size_t nul = std::min(s.find('\0', at), s.size());
          std::string run = s.substr(at, nul - at);
          auto* p = reinterpret_cast<const utf8proc_uint8_t*>(run.c_str());
          utf8proc_uint8_t* r = n.type == normalization::kind::nfc ? utf8proc_NFC(p) : utf8proc_NFKC(p);
          if (r != nullptr) {
            out += reinterpret_cast<char*>(r);
            std::free(r);
          } else {
            out += run;
          }
          if (nul < s.size()) out.push_back('\0');
          at = nul + 1;
        }
        s = std::move(out);
      }
    }
  }
  return s;
}

void tokenizer::impl::encode_segment(const std::string& text, bool first_section, std::vector<int32_t>& out) const {
  std::vector<piece> pieces{{normalize(text), false}}, next;
  for (const auto& step : pre) {
    next.clear();
    for (auto& pc : pieces) {
      if (step.type == pre_step::kind::metaspace) {
        pc.text = replace_all(pc.text, " ", step.replacement);
        if (step.add_prefix_space && (!step.first_only || first_section) &&
            pc.text.compare(0, step.replacement.size(), step.replacement) != 0) {
          pc.text = step.replacement + pc.text;
        }
        next.push_back(std::move(pc));
        continue;
      }
      if (step.type == pre_step::kind::byte_level && step.add_prefix_space && !pc.mapped &&
          (pc.text.empty() || pc.text[0] != ' ')) {
        pc.text.insert(pc.text.begin(), ' ');
      }
      if (step.re && !pc.mapped) {
        split_by(step.re.get(), step.behavior, pc.text, next);
      } else {
        next.push_back(std::move(pc));
      }
    }
    if (step.type == pre_step::kind::byte_level) {
      for (auto& pc : next) {
        if (!pc.mapped) {
          pc.text = bpe_model::to_byte_level(pc.text);
          pc.mapped = true;
        }
      }
    }
    pieces.swap(next);
  }
  for (const auto& pc : pieces) {
    if (!pc.text.empty()) bpe.encode_word(pc.text, out);
  }
}

tokenizer::~tokenizer() = default;

result<std::shared_ptr<const tokenizer>> tokenizer::load(const std::string& dir) {
  const std::string path = model_file_label(dir, "tokenizer.json");
  auto text = read_model_file(dir, "tokenizer.json");
  if (!text) return text.take_error();
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return bad(path, "not a JSON object");
  std::shared_ptr<tokenizer> t(new tokenizer());
  t->impl_ = std::make_unique<impl>();
  impl& m = *t->impl_;
  m.path = path;
  try {
    if (!j.contains("model") || !j["model"].is_object()) return bad(path, "missing 'model'");
    LLMESH_TRY(m.bpe.load(j["model"], path));
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      for (const auto& a : j["added_tokens"]) {
        added_token tok{a.at("content").get<std::string>(), a.at("id").get<int32_t>(), a.value("lstrip", false),
                        a.value("rstrip", false), a.value("single_word", false)};
        if (tok.content.empty()) continue;
        m.added.push_back(std::move(tok));
      }
    }
    for (size_t i = 0; i < m.added.size(); ++i) m.added_by_first[static_cast<unsigned char>(m.added[i].content[0])].push_back(i);
    for (auto& list : m.added_by_first) {
      std::stable_sort(list.begin(), list.end(),
                       [&](size_t a, size_t b) { return m.added[a].content.size() > m.added[b].content.size(); });
    }
    LLMESH_TRY(m.load_normalizer(j.contains("normalizer") ? j["normalizer"] : json()));
    LLMESH_TRY(m.load_pre_tokenizer(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json()));
    LLMESH_TRY(m.load_post_processor(j.contains("post_processor") ? j["post_processor"] : json(), j));
  } catch (const std::exception& e) {  // nlohmann's typed accessors on a malformed file
    return bad(path, std::string("malformed: ") + e.what());
  }
  auto d = detokenizer::from_json(j, path);  // one read and parse of the file for both halves
  if (!d) return d.take_error();
  t->decoder_ = std::make_unique<detokenizer>(std::move(d.value()));
  return std::shared_ptr<const tokenizer>(std::move(t));
}

std::vector<int32_t> tokenizer::encode(std::string_view raw, bool add_special) const {
  const impl& m = *impl_;
  const std::string text = sanitize_utf8(std::string(raw));
  std::vector<int32_t> out;
  if (add_special) out = m.prefix_ids;
  size_t seg = 0, i = 0;
  while (i < text.size()) {
    const added_token* hit = nullptr;
    for (size_t idx : m.added_by_first[static_cast<unsigned char>(text[i])]) {
      const auto& a = m.added[idx];
      if (text.compare(i, a.content.size(), a.content) != 0) continue;
      if (a.single_word && ((i > 0 && is_word_byte(text[i - 1])) ||
                            (i + a.content.size() < text.size() && is_word_byte(text[i + a.content.size()])))) {
        continue;
      }
      hit = &a;
      break;
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + hit->content.size();
    if (hit->lstrip) {
      while (begin > seg && is_space_byte(text[begin - 1])) --begin;
    }
    if (hit->rstrip) {
      while (end < text.size() && is_space_byte(text[end])) ++end;
    }
    if (begin > seg) m.encode_segment(text.substr(seg, begin - seg), seg == 0, out);
    out.push_back(hit->id);
    seg = i = end;
  }
  if (seg < text.size()) m.encode_segment(text.substr(seg), seg == 0, out);
  if (add_special) out.insert(out.end(), m.suffix_ids.begin(), m.suffix_ids.end());
  return out;
}

std::vector<int32_t> tokenizer::encode_pair(std::string_view a, std::string_view b, bool add_special) const {
  const impl& m = *impl_;
  std::vector<int32_t> first = encode(a, false), second = encode(b, false);
  if (!add_special || m.pair_items.empty()) {  // (a template without a pair form: transformers' "$A $B")
    first.insert(first.end(), second.begin(), second.end());
    return first;
  }
  std::vector<int32_t> out;
  for (int32_t item : m.pair_items) {
    if (item == -1) out.insert(out.end(), first.begin(), first.end());
    else if (item == -2) out.insert(out.end(), second.begin(), second.end());
    else out.push_back(item);
  }
  return out;
}

std::optional<int32_t> tokenizer::token_id(const std::string& token) const {
  for (const auto& a : impl_->added) {
    if (a.content == token) return a.id;
  }
  return impl_->bpe.find(token);
}

}  // namespace llmesh::model
