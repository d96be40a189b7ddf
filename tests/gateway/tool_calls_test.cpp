// A chat choice's output shaped as OpenAI's tool_calls: call ids, a "required" output parsed
// into calls, whole messages (named: the text is the arguments, finish "stop"; required:
// finish "tool_calls"; cut short: left as content; auto: Hermes-style <tool_call> blocks
// taken out of the content) and streamed deltas (named: the call's start, then argument
// pieces; required: held, then every call in one delta; auto: content until a tag, no piece
// of a tag leaking, then the calls at the end; llama3_json: an output of JSON calls held
// whole, anything else content), both directly and through a
// completion_group fed with a tokenizer's tokens.
#include <gtest/gtest.h>

#include <random>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/completion_group.hpp"
#include "llmesh/gateway/tool_calls.hpp"
#include "llmesh/model/tokenizer.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::json;
using actors::finish_reason;
using actors::token_msg;

const tool_output named{tool_choice_mode::named, "get_weather"};
const tool_output required{tool_choice_mode::required, ""};

bool is_call_id(const std::string& id) { return std::regex_match(id, std::regex("chatcmpl-tool-[0-9a-f]{32}")); }

TEST(ToolCalls, IdsAreVllmsFormAndDistinct) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = new_tool_call_id();
    EXPECT_TRUE(is_call_id(id)) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 1000u);
}

TEST(ToolCalls, RequiredOutputsParseIntoCallsWithCompactArguments) {
  auto calls = parse_required_calls(R"([{"name": "get_weather", "parameters": {"city": "Paris", "days": [1, 2]}},
                                        {"name":"now","parameters":{}}])");
  ASSERT_TRUE(calls.ok()) << calls.err().message;
  ASSERT_EQ(calls->size(), 2u);
  EXPECT_EQ((*calls)[0].index, 0u);
  EXPECT_EQ((*calls)[0].name, "get_weather");
  EXPECT_EQ((*calls)[0].arguments, R"({"city":"Paris","days":[1,2]})");  // key order kept, compact
  EXPECT_TRUE(is_call_id((*calls)[0].id));
  EXPECT_EQ((*calls)[1].index, 1u);
  EXPECT_EQ((*calls)[1].arguments, "{}");
  EXPECT_NE((*calls)[0].id, (*calls)[1].id);
  for (const char* bad : {"", "[", "{}", "[]", R"([{"name":"f"}])", R"([{"parameters":{}}])", R"([{"name":1,"parameters":{}}])",
                          R"([{"name":"f","parameters":{}}, 5])", R"([{"name":"f","parameters":{"a":)"}) {
    EXPECT_FALSE(parse_required_calls(bad).ok()) << bad;
  }
}

TEST(ToolCalls, WholeMessagesCarryTheCalls) {
  choice_delta c;
  c.text = R"({"city": "Paris"})";
  c.finish = "stop";
  shape_tool_calls(named, c);
  EXPECT_EQ(c.text, "");
  ASSERT_EQ(c.tool_calls.size(), 1u);
  EXPECT_EQ(c.tool_calls[0].name, "get_weather");
  EXPECT_EQ(c.tool_calls[0].arguments, R"({"city": "Paris"})");  // the generated text as it is
  EXPECT_EQ(*c.finish, "stop");                                  // vLLM's for a named call
  auto r = json::parse(response_json("chat.completion", "chatcmpl-1", 1, "m", {c}, {3, 4}));
  json msg = r["choices"][0]["message"];
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"], "");
  EXPECT_EQ(msg["tool_calls"], json::parse(R"([{"id":")" + c.tool_calls[0].id +
                                           R"(","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}])"));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");

  choice_delta q;
  q.text = R"([{"name":"a","parameters":{"x":1}},{"name":"b","parameters":{}}])";
  q.finish = "stop";
  shape_tool_calls(required, q);
  ASSERT_EQ(q.tool_calls.size(), 2u);
  EXPECT_EQ(q.text, "");
  EXPECT_EQ(*q.finish, "tool_calls");
  auto rq = json::parse(response_json("chat.completion", "chatcmpl-1", 1, "m", {q}, {3, 4}));
  EXPECT_EQ(rq["choices"][0]["message"]["tool_calls"][1]["function"], json({{"name", "b"}, {"arguments", "{}"}}));
  EXPECT_EQ(rq["choices"][0]["finish_reason"], "tool_calls");

  // Cut short by max_tokens: no calls to give; the text and its finish reason stay.
  choice_delta cut;
  cut.text = R"([{"name":"a","para)";
  cut.finish = "length";
  shape_tool_calls(required, cut);
  EXPECT_TRUE(cut.tool_calls.empty());
  EXPECT_EQ(cut.text, R"([{"name":"a","para)");
  EXPECT_EQ(*cut.finish, "length");
  // auto and none shape nothing; nor does a message without calls render a tool_calls key.
  for (auto mode : {tool_choice_mode::none, tool_choice_mode::automatic}) {
    choice_delta p;
    p.text = R"([{"name":"a","parameters":{}}])";
    p.finish = "stop";
    shape_tool_calls({mode, "a"}, p);
    EXPECT_TRUE(p.tool_calls.empty());
    EXPECT_EQ(*p.finish, "stop");
    auto rp = json::parse(response_json("chat.completion", "chatcmpl-1", 1, "m", {p}, {3, 4}));
    EXPECT_FALSE(rp["choices"][0]["message"].contains("tool_calls"));
  }
}

/// The JSON of a streamed delta.
json delta_json(const choice_delta& d) { return json::parse(chunk_json("chat.completion.chunk", "chatcmpl-1", 1, "m", d)); }

TEST(ToolCalls, ANamedCallStreamsItsStartThenArgumentPieces) {
  tool_call_stream s(named);
  choice_delta first;
  first.role = true;
  first.text = "{\"ci";
  auto a = s.shape(first);
  ASSERT_EQ(a.size(), 2u);  // the call's start, then the first piece
  json head = delta_json(a[0]);
  EXPECT_EQ(head["choices"][0]["delta"]["role"], "assistant");
  EXPECT_FALSE(head["choices"][0]["delta"].contains("content"));
  json call = head["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(call["index"], 0);
  EXPECT_TRUE(is_call_id(call["id"]));
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"], json({{"name", "get_weather"}, {"arguments", ""}}));
  json piece = delta_json(a[1]);
  EXPECT_FALSE(piece["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(piece["choices"][0]["delta"]["tool_calls"], json::parse(R"([{"index":0,"function":{"arguments":"{\"ci"}}])"));
  choice_delta mid;
  mid.text = "ty\": 1}";
  auto b = s.shape(mid);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(delta_json(b[0])["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"], "ty\": 1}");
  choice_delta last;
  last.finish = "stop";
  auto c = s.shape(last);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(delta_json(c[0])["choices"][0]["delta"], json::object());
  EXPECT_EQ(delta_json(c[0])["choices"][0]["finish_reason"], "stop");
  // A first delta without text is the call's start alone.
  tool_call_stream t(named);
  choice_delta empty_first;
  empty_first.role = true;
  auto d = t.shape(empty_first);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].tool_calls.size(), 1u);
  EXPECT_EQ(d[0].tool_calls[0].arguments, "");
}

TEST(ToolCalls, ARequiredOutputIsHeldAndSentAsCallsAtTheEnd) {
  tool_call_stream s(required);
  choice_delta first;
  first.role = true;
  first.text = "[{\"name\":";
  auto a = s.shape(first);
  ASSERT_EQ(a.size(), 1u);  // the role goes out at once, the text is held
  EXPECT_EQ(delta_json(a[0])["choices"][0]["delta"], json({{"role", "assistant"}}));
  choice_delta mid;
  mid.text = "\"f\",\"parameters\":{\"a\": [1]}}]";
  EXPECT_TRUE(s.shape(mid).empty());
  choice_delta last;
  last.finish = "stop";
  auto c = s.shape(last);
  ASSERT_EQ(c.size(), 1u);
  json e = delta_json(c[0]);
  EXPECT_EQ(e["choices"][0]["finish_reason"], "tool_calls");
  json call = e["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(call["index"], 0);
  EXPECT_TRUE(is_call_id(call["id"]));
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"], json({{"name", "f"}, {"arguments", "{\"a\":[1]}"}}));
  // Cut short: the held text goes out as content with the engine's finish reason.
  tool_call_stream t(required);
  first.text = "[{\"na";
  t.shape(first);
  choice_delta cut;
  cut.text = "me\"";
  cut.finish = "length";
  auto d = t.shape(cut);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(delta_json(d[0])["choices"][0]["delta"], json({{"content", "[{\"name\""}}));
  EXPECT_EQ(delta_json(d[0])["choices"][0]["finish_reason"], "length");
  // A held piece that carries logprobs still goes out (without its text).
  tool_call_stream u(required);
  u.shape(first);
  choice_delta scored;
  scored.text = "x";
  scored.logprobs = std::vector<logprob_entry>{{{"x", "x", -0.5f}, {}, 0}};
  auto f = u.shape(scored);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_FALSE(delta_json(f[0])["choices"][0]["delta"].contains("content"));
  EXPECT_EQ(delta_json(f[0])["choices"][0]["logprobs"]["content"].size(), 1u);
}

const tool_output automatic{tool_choice_mode::automatic, ""};

TEST(ToolCalls, HermesBlocksParseIntoCalls) {
  auto calls = parse_hermes_calls("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                                  "<tool_call>{\"name\": \"now\"}</tool_call> trailing");
  ASSERT_TRUE(calls.ok()) << calls.err().message;
  ASSERT_EQ(calls->size(), 2u);
  EXPECT_EQ((*calls)[0].name, "get_weather");
  EXPECT_EQ((*calls)[0].arguments, R"({"city":"Paris"})");
  EXPECT_TRUE(is_call_id((*calls)[0].id));
  EXPECT_EQ((*calls)[1].index, 1u);
  EXPECT_EQ((*calls)[1].arguments, "{}");  // no arguments: an empty object
  // The last block may be unclosed (vLLM's rule: a generation that ended on the JSON).
  auto open = parse_hermes_calls(R"(<tool_call>{"name": "f", "arguments": {"a": [1]}})");
  ASSERT_TRUE(open.ok()) << open.err().message;
  EXPECT_EQ((*open)[0].arguments, R"({"a":[1]})");
  for (const char* bad : {"", "no tags", "<tool_call></tool_call>", "<tool_call>{\"name\": 1}</tool_call>",
                          "<tool_call>[1]</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
                          "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\", </tool_call>",
                          "<tool_call>{\"name\": \"f\", \"argu"}) {
    EXPECT_FALSE(parse_hermes_calls(bad).ok()) << bad;
  }
}

TEST(ToolCalls, ParserNames) {
  EXPECT_EQ(parse_tool_call_parser("hermes").value(), tool_call_parser::hermes);
  EXPECT_EQ(parse_tool_call_parser("llama3_json").value(), tool_call_parser::llama3_json);
  for (auto p : {tool_call_parser::hermes, tool_call_parser::llama3_json, tool_call_parser::mistral, tool_call_parser::pythonic}) {
    EXPECT_EQ(parse_tool_call_parser(tool_call_parser_name(p)).value(), p);
  }
  EXPECT_EQ(parse_tool_call_parser("mistral").value(), tool_call_parser::mistral);
  EXPECT_EQ(parse_tool_call_parser("pythonic").value(), tool_call_parser::pythonic);
  auto bad = parse_tool_call_parser("xlam");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("'xlam' (hermes, llama3_json, mistral, pythonic, qwen3_coder, granite, phi4_mini_json, openai)"), std::string::npos) << bad.err().message;
}

TEST(ToolCalls, Llama3JsonCallsParseIntoCalls) {
  auto calls = parse_llama3_json_calls(
      R"({"name": "get_weather", "parameters": {"city": "Paris", "note": "a } in \"text\""}}; {"name": "now", "arguments": {}} )");
  ASSERT_TRUE(calls.ok()) << calls.err().message;
  ASSERT_EQ(calls->size(), 2u);
  EXPECT_EQ((*calls)[0].name, "get_weather");
  EXPECT_EQ((*calls)[0].arguments, R"({"city":"Paris","note":"a } in \"text\""})");
  EXPECT_TRUE(is_call_id((*calls)[0].id));
  EXPECT_EQ((*calls)[1].index, 1u);
  EXPECT_EQ((*calls)[1].arguments, "{}");
  auto tagged = parse_llama3_json_calls(R"(<|python_tag|>{"name": "f", "parameters": {"a": [1, {"b": 2}]}})");
  ASSERT_TRUE(tagged.ok()) << tagged.err().message;
  EXPECT_EQ((*tagged)[0].arguments, R"({"a":[1,{"b":2}]})");
  for (const char* sep : {", ", "\n\n", ";"}) {  // other separators models write
    auto two = parse_llama3_json_calls(std::string(R"({"name": "f", "parameters": {}})") + sep + R"({"name": "g", "parameters": {}})");
    ASSERT_TRUE(two.ok()) << sep;
    EXPECT_EQ(two->size(), 2u) << sep;
  }
  for (const char* bad : {"", "Hello", R"({"name": "f"})", R"({"parameters": {}})", R"({"name": 1, "parameters": {}})",
                          R"({"name": "f", "parameters": {}} and more)", R"({"name": "f", "parameters": {})",
                          R"([{"name": "f", "parameters": {}}])", R"({"name": "f", "parameters": {}};; {"name": "g"})",
                          R"({"name": "f", "parameters": {}} x)"}) {
    EXPECT_FALSE(parse_llama3_json_calls(bad).ok()) << bad;
  }
}

TEST(ToolCalls, Llama3JsonParsesRandomCallsAndTheirCorruptionsClearly) {
  // Random call lists (names, nested arguments with brackets, escapes and separators inside
  // strings) parse into exactly their calls; the same texts with a byte dropped, doubled or
  // replaced give a clear answer (calls or an error), never a crash or a read past the end.
  const std::vector<std::string> args = {"{}", R"({"a": 1})", R"({"s": "x}; {\"y"})", R"({"l": [1, {"m": [2]}], "n": null})",
                                         R"({"q": "a\\"})", R"({"u": "é;{"})"};
  std::mt19937 rng(3);
  for (int round = 0; round < 5000; ++round) {
    const size_t n = 1 + rng() % 3;
    std::string text = rng() % 4 == 0 ? "<|python_tag|>" : "";
    std::vector<std::string> want;
    for (size_t i = 0; i < n; ++i) {
      const std::string a = args[rng() % args.size()];
      want.push_back(json::parse(a).dump());
      text += std::string(R"({"name": "f)") + std::to_string(i) + R"(", ")" + (rng() % 2 ? "parameters" : "arguments") +
              "\": " + a + "}" + (i + 1 < n ? (rng() % 2 ? "; " : ", ") : "");
    }
    auto calls = parse_llama3_json_calls(text);
    ASSERT_TRUE(calls.ok()) << text;
    ASSERT_EQ(calls->size(), n) << text;
    for (size_t i = 0; i < n; ++i) EXPECT_EQ((*calls)[i].arguments, want[i]) << text;
    std::string bad = text;
    const size_t at = rng() % bad.size();
    switch (rng() % 3) {
      case 0: bad.erase(at, 1); break;
      case 1: bad.insert(at, 1, bad[at]); break;
      default: bad[at] = "{}[]\";,: x"[rng() % 10]; break;
    }
    auto maybe = parse_llama3_json_calls(bad);
    if (maybe) {
      for (const auto& c : *maybe) EXPECT_TRUE(json::accept(c.arguments)) << bad;
    }
  }
}

TEST(ToolCalls, Llama3JsonTakesCallsOnlyFromAnOutputThatIsCalls) {
  const tool_output llama{tool_choice_mode::automatic, "", tool_call_parser::llama3_json};
  choice_delta c;
  c.text = R"({"name": "get_weather", "parameters": {"city": "Zion"}})";
  c.finish = "stop";
  shape_tool_calls(llama, c);
  EXPECT_EQ(c.text, "");
  ASSERT_EQ(c.tool_calls.size(), 1u);
  EXPECT_EQ(c.tool_calls[0].arguments, R"({"city":"Zion"})");
  EXPECT_EQ(*c.finish, "tool_calls");
  // Prose, Hermes blocks (another parser's format) and broken JSON stay content.
  for (const char* text : {"The weather is fair.", "<tool_call>{\"name\": \"f\"}</tool_call>", "{\"name\": \"f\", \"par"}) {
    choice_delta p;
    p.text = text;
    p.finish = "length";
    shape_tool_calls(llama, p);
    EXPECT_EQ(p.text, text);
    EXPECT_TRUE(p.tool_calls.empty()) << text;
    EXPECT_EQ(*p.finish, "length");
  }
  // Streamed: calls are held whole to the end; prose streams at once; a piece of the python tag waits.
  auto run = [&](const std::vector<std::string>& pieces) {
    tool_call_stream s(llama);
    std::vector<json> out;
    for (size_t i = 0; i < pieces.size(); ++i) {
      choice_delta d;
      d.role = i == 0;
      d.text = pieces[i];
      if (i + 1 == pieces.size()) d.finish = "stop";
      for (const auto& x : s.shape(d)) out.push_back(delta_json(x)["choices"][0]);
    }
    return out;
  };
  auto ev = run({"", "{\"name\": \"now\", ", "\"parameters\": {}}", ""});
  ASSERT_EQ(ev.size(), 2u);  // the role; then the call with the finish
  EXPECT_EQ(ev[0]["delta"], json({{"role", "assistant"}}));
  EXPECT_EQ(ev[1]["delta"]["tool_calls"][0]["function"], json({{"name", "now"}, {"arguments", "{}"}}));
  EXPECT_EQ(ev[1]["finish_reason"], "tool_calls");
  auto prose = run({"It is", " fair {\"x\": 1}", "."});
  ASSERT_EQ(prose.size(), 3u);
  EXPECT_EQ(prose[0]["delta"]["content"], "It is");
  EXPECT_EQ(prose[1]["delta"]["content"], " fair {\"x\": 1}");
  EXPECT_EQ(prose[2]["finish_reason"], "stop");
  auto tag = run({"<|py", "thon_tag|>{\"name\": \"f\", \"parameters\": {\"n\": 1}}"});
  ASSERT_EQ(tag.size(), 2u);
  EXPECT_EQ(tag[1]["delta"]["tool_calls"][0]["function"], json({{"name", "f"}, {"arguments", R"({"n":1})"}}));
  auto lt = run({"<", "3 you"});  // looked like the tag's start, was not
  std::string text;
  for (const auto& e : lt) text += e["delta"].value("content", "");
  EXPECT_EQ(text, "<3 you");
  auto broken = run({"{\"name\": ", "5}"});
  text.clear();
  for (const auto& e : broken) text += e["delta"].value("content", "");
  EXPECT_EQ(text, "{\"name\": 5}");
  EXPECT_EQ(broken.back()["finish_reason"], "stop");
}

TEST(ToolCalls, MistralCallsParseInBothFormats) {
  auto is_mistral_id = [](const std::string& id) { return std::regex_match(id, std::regex("[A-Za-z0-9]{9}")); };
  auto v3 = parse_mistral_calls(R"([{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "arguments": {}}])");
  ASSERT_TRUE(v3.ok()) << v3.err().message;
  ASSERT_EQ(v3->size(), 2u);
  EXPECT_EQ((*v3)[0].name, "get_weather");
  EXPECT_EQ((*v3)[0].arguments, R"({"city":"Paris"})");
  EXPECT_TRUE(is_mistral_id((*v3)[0].id)) << (*v3)[0].id;
  EXPECT_EQ((*v3)[1].index, 1u);
  auto v11 = parse_mistral_calls(R"(get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]now[ARGS]{})");
  ASSERT_TRUE(v11.ok()) << v11.err().message;
  ASSERT_EQ(v11->size(), 2u);
  EXPECT_EQ((*v11)[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ((*v11)[1].name, "now");
  EXPECT_TRUE(is_mistral_id((*v11)[1].id));
  // With the model's own ids ([CALL_ID], later tokenizers): kept when alphanumeric.
  auto with_ids = parse_mistral_calls(R"(get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}[TOOL_CALLS]now[CALL_ID]no-good![ARGS]{})");
  ASSERT_TRUE(with_ids.ok()) << with_ids.err().message;
  ASSERT_EQ(with_ids->size(), 2u);
  EXPECT_EQ((*with_ids)[0].name, "get_weather");
  EXPECT_EQ((*with_ids)[0].id, "a1B2c3D4e");
  EXPECT_EQ((*with_ids)[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ((*with_ids)[1].name, "now");
  EXPECT_TRUE(is_mistral_id((*with_ids)[1].id)) << (*with_ids)[1].id;  // not alphanumeric: a fresh one
  auto short_id = parse_mistral_calls(R"(f[CALL_ID]abc[ARGS]{}[TOOL_CALLS]g[CALL_ID][ARGS]{})");  // not 9 / none: new ones
  ASSERT_TRUE(short_id.ok()) << short_id.err().message;
  EXPECT_TRUE(is_mistral_id((*short_id)[0].id)) << (*short_id)[0].id;
  EXPECT_TRUE(is_mistral_id((*short_id)[1].id)) << (*short_id)[1].id;
  for (const char* bad : {"", "[", R"([{"arguments": {}}])", "f[ARGS]nope", "[ARGS]{}", R"([1])", "Paris", "[CALL_ID]x[ARGS]{}"}) {
    EXPECT_FALSE(parse_mistral_calls(bad).ok()) << bad;
  }
  std::set<std::string> ids;
  for (int i = 0; i < 100; ++i) ids.insert(new_mistral_tool_call_id());
  EXPECT_EQ(ids.size(), 100u);
}

TEST(ToolCalls, MistralTakesTheCallsAfterItsMarkerWholeOrStreamed) {
  const tool_output mistral{tool_choice_mode::automatic, "", tool_call_parser::mistral};
  choice_delta c;
  c.text = R"(Let me check.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Zion"}}])";
  c.finish = "stop";
  shape_tool_calls(mistral, c);
  EXPECT_EQ(c.text, "Let me check.");
  ASSERT_EQ(c.tool_calls.size(), 1u);
  EXPECT_EQ(c.tool_calls[0].arguments, R"({"city":"Zion"})");
  EXPECT_EQ(*c.finish, "tool_calls");
  choice_delta cut;  // cut short by max_tokens: content, without the marker (as vLLM)
  cut.text = R"(Let me check.[TOOL_CALLS][{"name": "get_wea)";
  cut.finish = "length";
  shape_tool_calls(mistral, cut);
  EXPECT_EQ(cut.text, R"(Let me check.[{"name": "get_wea)");
  EXPECT_TRUE(cut.tool_calls.empty());
  EXPECT_EQ(*cut.finish, "length");
  auto v3_with_args = parse_mistral_calls(R"([{"name": "f", "arguments": {"s": "[ARGS]"}}])");  // v3 by its "["
  ASSERT_TRUE(v3_with_args.ok());
  EXPECT_EQ((*v3_with_args)[0].arguments, R"({"s":"[ARGS]"})");
  {
    tool_call_stream cs(mistral);
    std::string text;
    for (const std::string piece : {"ok", "[TOOL_CALLS]", "[{\"na"}) {
      choice_delta d;
      d.text = piece;
      if (piece == "[{\"na") d.finish = "length";
      for (const auto& x : cs.shape(d)) text += x.text;
    }
    EXPECT_EQ(text, "ok[{\"na") << "streamed, the marker does not leak either";
  }
  choice_delta hermes_text;  // another parser's format stays content
  hermes_text.text = R"(<tool_call>{"name": "f"}</tool_call>)";
  shape_tool_calls(mistral, hermes_text);
  EXPECT_TRUE(hermes_text.tool_calls.empty());
  tool_call_stream s(mistral);
  std::string content;
  json calls = json::array();
  std::optional<std::string> finish;
  const std::vector<std::string> pieces = {"Let me", " check.", "[TOOL_CALLS]", R"([{"name": "now", )", R"("arguments": {}}])"};
  for (size_t i = 0; i < pieces.size(); ++i) {
    choice_delta d;
    d.role = i == 0;
    d.text = pieces[i];
    if (i + 1 == pieces.size()) d.finish = "stop";
    for (const auto& x : s.shape(d)) {
      const json ch = delta_json(x)["choices"][0];
      content += ch["delta"].value("content", "");
      for (const auto& t : ch["delta"].value("tool_calls", json::array())) calls.push_back(t);
      if (ch["finish_reason"].is_string()) finish = ch["finish_reason"].get<std::string>();
    }
  }
  EXPECT_EQ(content, "Let me check.");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"], json({{"name", "now"}, {"arguments", "{}"}}));
  EXPECT_EQ(finish, "tool_calls");
}

TEST(ToolCalls, AutoTakesHermesCallsOutOfAWholeMessage) {
  choice_delta c;
  c.text = "I shall ask.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zion\"}}\n</tool_call>";
  c.finish = "stop";
  shape_tool_calls(automatic, c);
  EXPECT_EQ(c.text, "I shall ask.\n");  // what came before the first call
  ASSERT_EQ(c.tool_calls.size(), 1u);
  EXPECT_EQ(c.tool_calls[0].name, "get_weather");
  EXPECT_EQ(c.tool_calls[0].arguments, R"({"city":"Zion"})");
  EXPECT_EQ(*c.finish, "tool_calls");
  // Text without calls, or with a block that does not parse, stays content.
  for (const char* text : {"And God said, Let there be light.", "<tool_call>{not json}</tool_call>", "a <tool_call"}) {
    choice_delta p;
    p.text = text;
    p.finish = "stop";
    shape_tool_calls(automatic, p);
    EXPECT_EQ(p.text, text);
    EXPECT_TRUE(p.tool_calls.empty()) << text;
    EXPECT_EQ(*p.finish, "stop");
  }
}

TEST(ToolCalls, AutoStreamsContentAndHoldsTheCallsFromTheirTag) {
  /// The deltas of pieces (the first with the role, the last with `finish`), flattened.
  auto run = [](const std::vector<std::string>& pieces, const std::string& finish) {
    tool_call_stream s(automatic);
    std::vector<json> out;
    for (size_t i = 0; i < pieces.size(); ++i) {
      choice_delta c;
      c.role = i == 0;
      c.text = pieces[i];
      if (i + 1 == pieces.size()) c.finish = finish;
      for (const auto& d : s.shape(c)) out.push_back(delta_json(d)["choices"][0]);
    }
    return out;
  };
  auto ev = run({"Let me", " see.<to", "ol_call>\n{\"name\": \"now\", ", "\"arguments\": {}}\n</tool_call>", ""}, "stop");
  ASSERT_EQ(ev.size(), 3u);  // "Let me" with the role; " see." once "<to" proved a tag; the calls
  EXPECT_EQ(ev[0]["delta"], json({{"role", "assistant"}, {"content", "Let me"}}));
  EXPECT_EQ(ev[1]["delta"], json({{"content", " see."}}));
  EXPECT_EQ(ev[2]["finish_reason"], "tool_calls");
  EXPECT_FALSE(ev[2]["delta"].contains("content"));
  ASSERT_EQ(ev[2]["delta"]["tool_calls"].size(), 1u);
  EXPECT_EQ(ev[2]["delta"]["tool_calls"][0]["index"], 0);
  EXPECT_EQ(ev[2]["delta"]["tool_calls"][0]["function"], json({{"name", "now"}, {"arguments", "{}"}}));
  // What only looked like a tag's start goes out with the next piece; a held start at the end
  // goes out with the finish; content without calls is all content.
  auto plain = run({"a <to", "p> b <tool"}, "length");
  std::string text;
  for (const auto& e : plain) text += e["delta"].value("content", "");
  EXPECT_EQ(text, "a <top> b <tool");
  EXPECT_EQ(plain.back()["finish_reason"], "length");
  EXPECT_EQ(plain[0]["delta"]["content"], "a ");
  // A block that does not parse: the held text goes out as content at the end.
  auto broken = run({"x<tool_call>{\"name\"", ": 5}</tool_call>"}, "stop");
  text.clear();
  for (const auto& e : broken) text += e["delta"].value("content", "");
  EXPECT_EQ(text, "x<tool_call>{\"name\": 5}</tool_call>");
  EXPECT_EQ(broken.back()["finish_reason"], "stop");
  EXPECT_FALSE(broken.back()["delta"].contains("tool_calls"));
}

// Through the group, as api_service builds a chat choice: tokens of a real tokenizer in, the
// client's chunks (or message) out.
class ToolCallChoice : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto t = model::tokenizer::load(LLMESH_SOURCE_DIR "/models/kjv-tiny");
    ASSERT_TRUE(t.ok()) << t.err().message;
    tok_ = *t;
  }
  /// Feeds `text`'s tokens (the last with eos) to a one-choice group; returns the SSE bytes or
  /// the reply's body.
  static std::string run(const tool_output& tools, bool streaming, const std::string& text,
                         finish_reason last = finish_reason::eos) {
    completion_group g(group_setup{true, streaming, false, "chatcmpl-1", 1, "m", 1}, tok_->decoder(), nullptr);
    stream_setup s;
    s.prompt_ids = {1, 2};
    s.tools = tools;
    g.add_choice(7, s);
    std::string out;
    const auto ids = tok_->encode(text, false);
    for (size_t i = 0; i < ids.size(); ++i) {
      out += g.on_message(token_msg{7, ids[i], i + 1 == ids.size() ? last : finish_reason::none, false, {}, {}, {}});
    }
    EXPECT_TRUE(g.done());
    return streaming ? out : g.reply().body;
  }
  static std::vector<json> events(const std::string& sse) {
    std::vector<json> out;
    for (size_t pos = 0; (pos = sse.find("data: ", pos)) != std::string::npos;) {
      const size_t end = sse.find("\n\n", pos);
      const std::string payload = sse.substr(pos + 6, end - pos - 6);
      if (payload != "[DONE]") out.push_back(json::parse(payload));
      pos = end + 2;
    }
    return out;
  }
  static inline std::shared_ptr<const model::tokenizer> tok_;
};

TEST_F(ToolCallChoice, ANamedCallStreamsAsArgumentPiecesThatJoinToTheText) {
  const std::string args = tok_->decoder().decode(tok_->encode(R"({"city": "Jerusalem", "days": 3})", false));
  auto ev = events(run(named, true, args));
  ASSERT_GE(ev.size(), 3u);
  json head = ev[0]["choices"][0]["delta"];
  EXPECT_EQ(head["role"], "assistant");
  EXPECT_EQ(head["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(head["tool_calls"][0]["function"]["arguments"], "");
  std::string joined;
  for (size_t i = 0; i < ev.size(); ++i) {
    json d = ev[i]["choices"][0]["delta"];
    EXPECT_FALSE(d.contains("content")) << ev[i].dump();
    if (i > 0) {
      EXPECT_FALSE(d.contains("role"));
    }
    if (!d.contains("tool_calls")) continue;
    EXPECT_EQ(d["tool_calls"][0]["index"], 0);
    if (i > 0) {
      EXPECT_FALSE(d["tool_calls"][0].contains("id")) << "only the start carries the id";
    }
    joined += d["tool_calls"][0]["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(joined, args);
  EXPECT_EQ(ev.back()["choices"][0]["finish_reason"], "stop");
  // Whole: one call, the text its arguments.
  auto r = json::parse(run(named, false, args));
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], args);
  EXPECT_EQ(r["choices"][0]["message"]["content"], "");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
}

TEST_F(ToolCallChoice, ARequiredOutputBecomesCallsOnceTheChoiceEnds) {
  const std::string out = tok_->decoder().decode(
      tok_->encode(R"([{"name": "get_weather", "parameters": {"city": "Zion"}}, {"name": "now", "parameters": {}}])", false));
  auto ev = events(run(required, true, out));
  ASSERT_EQ(ev.size(), 2u);  // the role at once; the calls with the finish
  EXPECT_EQ(ev[0]["choices"][0]["delta"], json({{"role", "assistant"}}));
  json last = ev[1]["choices"][0];
  EXPECT_EQ(last["finish_reason"], "tool_calls");
  ASSERT_EQ(last["delta"]["tool_calls"].size(), 2u);
  EXPECT_EQ(last["delta"]["tool_calls"][0]["function"], json({{"name", "get_weather"}, {"arguments", R"({"city":"Zion"})"}}));
  EXPECT_EQ(last["delta"]["tool_calls"][1]["index"], 1);
  EXPECT_EQ(last["delta"]["tool_calls"][1]["function"], json({{"name", "now"}, {"arguments", "{}"}}));
  auto r = json::parse(run(required, false, out));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["message"]["content"], "");
  // Cut by max_tokens: the text as content, finish "length".
  auto cut = json::parse(run(required, false, R"([{"name": "now", "par)", finish_reason::length));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "length");
  EXPECT_FALSE(cut["choices"][0]["message"].contains("tool_calls"));
  EXPECT_NE(cut["choices"][0]["message"]["content"].get<std::string>().find("now"), std::string::npos);
  // Without a forced call (none, or auto: no <tool_call> in it) the same text is plain content.
  auto plain = json::parse(run({}, false, out));
  EXPECT_EQ(plain["choices"][0]["message"]["content"], out);
  plain = json::parse(run(automatic, false, out));
  EXPECT_EQ(plain["choices"][0]["message"]["content"], out);
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "stop");
}

TEST_F(ToolCallChoice, AutoFindsHermesCallsInTheTokensStreamedOrWhole) {
  const std::string out = tok_->decoder().decode(tok_->encode(
      "The LORD is my shepherd.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zion\"}}\n</tool_call>",
      false));
  const size_t at = out.find("<tool_call>");
  ASSERT_NE(at, std::string::npos) << out;
  auto ev = events(run(automatic, true, out));
  std::string content;
  json calls = json::array();
  for (const auto& e : ev) {
    const json d = e["choices"][0]["delta"];
    content += d.value("content", "");
    for (const auto& c : d.value("tool_calls", json::array())) calls.push_back(c);
  }
  EXPECT_EQ(content, out.substr(0, at));  // no piece of the tag leaked into the content
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"], json({{"name", "get_weather"}, {"arguments", R"({"city":"Zion"})"}}));
  EXPECT_EQ(ev.back()["choices"][0]["finish_reason"], "tool_calls");
  auto r = json::parse(run(automatic, false, out));
  EXPECT_EQ(r["choices"][0]["message"]["content"], out.substr(0, at));
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
}

}  // namespace
}  // namespace llmesh::gateway
