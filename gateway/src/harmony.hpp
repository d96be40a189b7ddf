// OpenAI's harmony output format (GPT-OSS; private to reasoning.cpp): the output, decoded with
// its special tokens, is a sequence of messages, each a header and a body:
//   <|channel|>analysis<|message|>We need to...<|end|>
//   <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>
//   <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>
// (the prompt ends with "<|start|>assistant", so the first header starts at once; <|call|> and
// <|return|> end the generation and are not shown). A header names the message's channel
// (<|channel|>X), its recipient (to=X, before or after the channel) and its content type
// (<|constrain|>json, or a bare word). The bodies are routed as vLLM routes them for chat:
// - the final channel → content;
// - a recipient functions.NAME → a tool call NAME with the body as arguments (when its content
//   type is JSON or unnamed and it parses, re-encoded compactly as llmesh's other parsers do;
//   vLLM's json.dumps spaces it), whole when its message ends — with `calls` (tool_choice auto
//   with tools); otherwise its body is content;
// - anything else (analysis, commentary preambles, built-in tools' calls such as browser.* and
//   python) → reasoning, messages joined by "\n" (vLLM joins all but the last message so).
// An output cut before a call's end (max_tokens, a stop string) gives its body as content; an
// output without any <|message|> (a model not writing harmony) is content as it came (held
// until its end). The parser reads text: ordinary text spelling a tag (<|end|>...) reads as
// one (vLLM parses token ids), and text before a first header's <|channel|> is dropped (a bare
// word there even reads as the content type).
#pragma once

#include <string>

#include "llmesh/gateway/openai_api.hpp"

namespace llmesh::gateway::detail {

/// Thread affinity: its stream's. Shapes one choice's pieces as they come (the whole output
/// is one piece with its finish): each piece's text becomes its content, reasoning and the
/// calls whose messages ended in it; text that may begin a tag is held until the next piece
/// tells, a header until its <|message|>, a call's body until its end. With calls made, a
/// finish "stop" becomes "tool_calls".
class harmony_stream {
 public:
  harmony_stream(bool include_reasoning, bool calls) : include_(include_reasoning), calls_(calls) {}
  void shape(choice_delta& c);
  /// Whether any reasoning was seen.
  bool reasoned() const { return reasoned_; }

 private:
  enum class route { reasoning, content, call };
  void begin_message(std::string header);
  void body(std::string_view text, std::string& content, std::string& reasoning);
  void end_message(bool complete, std::string& content, std::vector<tool_call_delta>& calls);

  bool include_, calls_;
  bool in_body_ = false;
  std::string header_;   ///< the current header so far
  std::string pending_;  ///< a body's end that may begin a tag
  route route_ = route::content;
  std::string name_, args_;  ///< a call's function and body so far
  bool json_ = true;         ///< the call's content type is JSON (or unnamed)
  bool structured_ = false;  ///< a <|message|> was seen
  bool message_started_ = false;  ///< the current body has sent text
  bool reasoned_ = false, said_ = false;  ///< reasoning / content sent so far (a later message's joins with "\n")
  size_t calls_made_ = 0;
};

}  // namespace llmesh::gateway::detail
