// Stop strings over a token stream: text arrives piece by piece (whole UTF-8 characters, from
// model::stream_decoder) and a stop string may straddle pieces. The matcher releases only text
// that can no longer be the start of a stop string, holds back the rest, and on a match
// reports the text before it (the stop string itself is not returned, as in OpenAI's API).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace llmesh::gateway {

/// Thread affinity: one request's stream.
class stop_matcher {
 public:
  /// `include`: vLLM's include_stop_str_in_output: the text released at a stop ends with the
  /// stop string instead of just before it.
  explicit stop_matcher(std::vector<std::string> stops, bool include = false);

  struct output {
    std::string text;      ///< text safe to send now
    bool stopped = false;  ///< a stop string was found: `text` ends just before it (or with it)
  };

  /// Appends a piece of generated text. With `match` false (vLLM's min_tokens, before the
  /// request's minimum), no stop string is looked for: a later push finds only stop strings
  /// that end in its own piece (one may begin in earlier text), as vLLM's detokenizer searches
  /// only the new text and the stop strings' length before it.
  output push(std::string_view piece, bool match = true);
  /// The stream ended without a stop string: everything held back.
  std::string flush();
  /// The stop string that ended the text (empty: none has).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  bool include_ = false;
  std::string held_;
  std::string matched_;
  /// held_'s first bytes that were searched already (or, before min_tokens, must not be): a
  /// match must end after them.
  size_t searched_ = 0;
  bool stopped_ = false;
};

}  // namespace llmesh::gateway
