// Chat templates against the reference Jinja implementations (@huggingface/jinja; fixtures from
// tools/reference/tokenizer/make_chat_fixtures.mjs, and Python jinja2's from the .py scripts
// there): real templates (Llama 2, Llama 3/3.1, Qwen3, Mistral, Zephyr, ChatML, Gemma 2 and 3) on
// several conversations render identically, and the ones that raise_exception raise the same
// message.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "llmesh/model/chat_template.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::ordered_json;
const std::string data_dir = std::string(LLMESH_TEST_DATA);

/// Renders every case of a fixture file (cases.jsonl's format); returns how many ran.
int render_fixture_cases(const std::string& file) {
  std::ifstream in(data_dir + "/chat_templates/" + file);
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    json c = json::parse(line);
    SCOPED_TRACE(c["template"].get<std::string>() + " / " + c["conversation"].get<std::string>() +
                 (c["add_generation_prompt"].get<bool>() ? " / +gen" : ""));
    ++cases;
    auto t = chat_template::parse(c["source"].get<std::string>());
    if (!t.ok()) {
      ADD_FAILURE() << t.err().message;
      continue;
    }
    t->bos_token = "<s>";
    t->eos_token = "</s>";
    auto r = t->render(c["messages"], c["add_generation_prompt"].get<bool>());
    if (c["error"].is_string()) {
      EXPECT_FALSE(r.ok()) << "rendered instead of raising: " << (r.ok() ? r.value() : "");
      if (!r.ok()) {
        EXPECT_NE(r.err().message.find(c["error"].get<std::string>()), std::string::npos) << r.err().message;
      }
    } else {
      EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
      if (r.ok()) {
        EXPECT_EQ(r.value(), c["rendered"].get<std::string>());
      }
    }
  }
  return cases;
}

TEST(ChatTemplate, MatchesTheReferenceOnRealTemplates) { EXPECT_GE(render_fixture_cases("cases.jsonl"), 90); }

// Gemma 2's and Gemma 3's templates (Python jinja2 fixtures: make_gemma_cases.py): `trim` binding
// tighter than `+`, the system turn refused (2) or folded into the first user turn (3), content
// parts, and the alternation check.
TEST(ChatTemplate, GemmaRendersAsJinja2Does) { EXPECT_EQ(render_fixture_cases("gemma_cases.jsonl"), 26); }

// Qwen3's template on the paths that need more than messages: tools (tojson), tool calls with
// object and string arguments, grouped tool results, reasoning_content, <think> blocks after the
// last query, enable_thinking (Python jinja2 fixtures: make_qwen3_context_cases.py).
TEST(ChatTemplate, Qwen3RendersToolsReasoningAndThinkingAsJinja2Does) {
  auto t = chat_template::load(data_dir + "/tokenizers/qwen3");
  ASSERT_TRUE(t.ok()) << t.err().message;
  t->bos_token = "<s>";
  t->eos_token = "</s>";
  std::ifstream in(data_dir + "/chat_templates/qwen3_context_cases.jsonl");
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    json c = json::parse(line);
    const bool gen = c["add_generation_prompt"].get<bool>();
    SCOPED_TRACE(c["conversation"].get<std::string>() + (gen ? " / +gen" : ""));
    json extra = json::object();
    for (const char* key : {"tools", "enable_thinking"}) {
      if (c["context"].contains(key)) extra[key] = c["context"][key];
    }
    auto r = t->render(c["context"]["messages"], gen, extra);
    ASSERT_TRUE(r.ok()) << r.err().message;
    EXPECT_EQ(r.value(), c["rendered"].get<std::string>());
    ++cases;
  }
  EXPECT_EQ(cases, 14);
}

/// llmesh's strftime_now reads the clock, the Python fixtures pin it: replaces the date after the
/// first "Current date: " (checked to be YYYY-MM-DD) by `date`; false when there is none.
bool pin_current_date(std::string& text, const std::string& date) {
  const std::string label = "Current date: ";
  const size_t at = text.find(label);
  if (at == std::string::npos || at + label.size() + 10 > text.size()) return false;
  const size_t d = at + label.size();
  for (size_t i = 0; i < 10; ++i) {
    const char ch = text[d + i];
    if ((i == 4 || i == 7) ? ch != '-' : std::isdigit(static_cast<unsigned char>(ch)) == 0) return false;
  }
  text.replace(d, 10, date);
  return true;
}

// OpenAI's GPT-OSS (harmony) template, gpt_oss.jinja (Python jinja2 fixtures:
// make_gpt_oss_cases.py): macros with default arguments, recursion (render_typescript_type) and
// namespace() state, tool schemas (nested objects, arrays, enums, type unions, oneOf, defaults,
// with the template's own stray whitespace), tool calls with object and string arguments and
// their results through tojson, thinking kept or dropped, reasoning_effort, model_identity,
// builtin_tools, `|length` counting characters (not UTF-8 bytes), and its four raise_exception
// refusals. The date of the system message's "Current date: " line is pinned to the fixture's
// before comparing.
TEST(ChatTemplate, GptOssRendersAsJinja2Does) {
  std::ifstream src(data_dir + "/chat_templates/gpt_oss.jinja");
  ASSERT_TRUE(src.good());
  std::stringstream source;
  source << src.rdbuf();
  auto t = chat_template::parse(source.str());
  ASSERT_TRUE(t.ok()) << t.err().message;
  std::ifstream in(data_dir + "/chat_templates/gpt_oss_cases.jsonl");
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    json c = json::parse(line);
    const bool gen = c["add_generation_prompt"].get<bool>();
    SCOPED_TRACE(c["conversation"].get<std::string>() + (gen ? " / +gen" : ""));
    ++cases;
    json extra = json::object();  // tools, reasoning_effort, model_identity, builtin_tools, bos/eos
    for (const auto& [key, value] : c["context"].items()) {
      if (key != "messages" && key != "add_generation_prompt") extra[key] = value;
    }
    auto r = t->render(c["context"]["messages"], gen, extra);
    if (c.contains("error")) {
      EXPECT_FALSE(r.ok()) << "rendered instead of raising: " << (r.ok() ? r.value() : "");
      if (!r.ok()) {
        EXPECT_NE(r.err().message.find(c["error"].get<std::string>()), std::string::npos) << r.err().message;
      }
      continue;
    }
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.err().message);
    if (!r.ok()) continue;
    std::string rendered = r.value();
    EXPECT_TRUE(pin_current_date(rendered, c["date"].get<std::string>())) << rendered;
    EXPECT_EQ(rendered, c["rendered"].get<std::string>());
  }
  EXPECT_EQ(cases, 44);
}

TEST(ChatTemplate, UnsupportedConstructsAreNamed) {
  for (const char* src : {"{% call m() %}x{% endcall %}", "{% include 'x' %}", "{{ x | wordwrap }}",
                          "{{ foo() }}", "{% for x in y recursive %}{% endfor %}"}) {
    auto t = chat_template::parse(src);
    if (t.ok()) {
      auto r = t->render(json::array(), false, json{{"y", json::array({1})}, {"x", "a"}});
      ASSERT_FALSE(r.ok()) << src;
      EXPECT_EQ(r.err().code, errc::unsupported) << src << ": " << r.err().message;
    } else {
      EXPECT_EQ(t.err().code, errc::unsupported) << src << ": " << t.err().message;
    }
  }
  for (const char* bad : {"{% if x %}", "{{ 'unterminated }}", "{% for %}", "{{ }}", "{% endfor %}"}) {
    auto t = chat_template::parse(bad);
    EXPECT_FALSE(t.ok()) << bad;
  }
}

TEST(ChatTemplate, ExpressionsBehaveLikePython) {
  auto render = [](const std::string& src, json ctx = json::object()) {
    auto t = chat_template::parse(src);
    EXPECT_TRUE(t.ok()) << src;
    auto r = t->render(json::array(), false, ctx);
    return r.ok() ? r.value() : "ERROR: " + r.err().message;
  };
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 1 / 2 }} {{ 2 ** 10 }}"), "3 -4 1 0.5 1024");
  EXPECT_EQ(render("{{ none }} {{ true }} {{ [1, 'a'] }} {{ {'k': 1} }}"), "None True [1, 'a'] {'k': 1}");
  EXPECT_EQ(render("{{ 'abc'[::-1] }} {{ [1,2,3][1:] }} {{ 'a,b'.split(',') | join('|') }}"), "cba [2, 3] a|b");
  EXPECT_EQ(render("{{ x is defined }} {{ y is none }} {{ 'a' in 'cat' }} {{ 3 not in [1] }}", {{"y", nullptr}}),
            "False True True True");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"), "6");
  EXPECT_EQ(render("{% for i in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{{ {'b': [1, 'x']} | tojson }}"), "{\"b\": [1, \"x\"]}");
  EXPECT_EQ(render("{{ 'yes' if 0 else 'no' }} {{ '  pad ' | trim | upper }}"), "no PAD");
}

// Macros as Jinja2 runs them (checked with Python jinja2 3.1): positional and keyword
// arguments, defaults evaluated at the call, a missing argument undefined, recursion, a body
// that sees the top level but not its caller's loop variables, its own `set` staying inside,
// a namespace() it changes; and the errors.
TEST(ChatTemplate, MacrosBehaveAsJinja2s) {
  auto render = [](const std::string& src, json ctx = json::object()) {
    auto t = chat_template::parse(src);
    if (!t.ok()) return "PARSE: " + t.err().message;
    auto r = t->render(json::array(), false, ctx);
    return r.ok() ? r.value() : "ERROR: " + r.err().message;
  };
  EXPECT_EQ(render("{% macro m(a, b=2, c='x') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ m(1, c='y') }}"),
            "12x 13x 12y");
  EXPECT_EQ(render("{% macro m(a, b) %}[{{ a }}|{{ b is defined }}]{% endmacro %}{{ m('p') }}"), "[p|False]");
  EXPECT_EQ(render("{% set top = 't' %}{% macro m() %}{{ top }}{{ i is defined }}{% endmacro %}{% for i in [1] %}{{ m() }}{% endfor %}"),
            "tFalse");
  EXPECT_EQ(render("{% macro m() %}{% set x = 5 %}{{ x }}{% endmacro %}{% set x = 1 %}{{ m() }}{{ x }}"), "51");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% macro bump() %}{% set ns.n = ns.n + 1 %}{% endmacro %}{{ bump() }}{{ bump() }}{{ ns.n }}"),
            "2");
  EXPECT_EQ(render("{% macro t(x) %}{% if x is mapping %}{ {% for k, v in x.items() %}{{ k }}: {{ t(v) }} {% endfor %}}"
                   "{% else %}{{ x }}{% endif %}{% endmacro %}{{ t(s) }}",
                   {{"s", {{"a", {{"b", 1}}}}}}),
            "{ a: { b: 1 } }");
  EXPECT_EQ(render("{% macro m(n=k * 2) %}{{ n }}{% endmacro %}{% set k = 4 %}{{ m() }}"), "8");  // the default at the call
  EXPECT_EQ(render("{% macro m(s) %}{{ s | length }}{% endmacro %}{{ m('h\u00e9llo') }}"), "5");  // characters, not bytes
  EXPECT_NE(render("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").find("takes 1 arguments, 2 given"), std::string::npos);
  EXPECT_NE(render("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}").find("no parameter 'b'"), std::string::npos);
  EXPECT_NE(render("{% macro m(a) %}{% endmacro %}{{ m(1, a=2) }}").find("parameter 'a' twice"), std::string::npos);
  EXPECT_NE(render("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}").find("recursion deeper than 64"), std::string::npos);
  EXPECT_NE(render("{% macro m(a %}{% endmacro %}").find("PARSE"), std::string::npos);
  EXPECT_NE(render("{% macro m() %}x").find("endmacro"), std::string::npos);
}

TEST(ChatTemplate, ContinuingTheFinalMessageCutsAfterItsContentAsTransformersDoes) {
  // A template that keeps the content's spacing, and one that trims it.
  const std::string keep = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
                           "{% if add_generation_prompt %}<|assistant|>{% endif %}";
  const std::string trim = "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}<|end|>{% endfor %}";
  auto k = chat_template::parse(keep);
  auto t = chat_template::parse(trim);
  ASSERT_TRUE(k.ok() && t.ok());
  auto msgs = nlohmann::ordered_json::parse(R"([{"role":"user","content":"Hi"},{"role":"assistant","content":"The answer is "}])");
  auto a = k->render_continuing(msgs);
  ASSERT_TRUE(a.ok()) << a.err().message;
  EXPECT_EQ(*a, "<|user|>Hi<|end|><|assistant|>The answer is ");  // no end, no new turn; its space kept
  auto b = t->render_continuing(msgs);
  ASSERT_TRUE(b.ok()) << b.err().message;
  EXPECT_EQ(*b, "<|user|>Hi<|end|><|assistant|>The answer is");  // the template trimmed it
  // Nothing to continue: no string content, or a rendering without it.
  auto none = nlohmann::ordered_json::parse(R"([{"role":"user","content":null}])");
  EXPECT_FALSE(k->render_continuing(none).ok());
  auto hidden = chat_template::parse("{% for m in messages %}[{{ m.role }}]{% endfor %}");
  ASSERT_TRUE(hidden.ok());
  EXPECT_FALSE(hidden->render_continuing(msgs).ok());
}

TEST(ChatTemplate, LoadsFromTokenizerConfig) {
  auto t = chat_template::load(data_dir + "/tokenizers/llama3_1");
  ASSERT_TRUE(t.ok()) << t.err().message;
  EXPECT_EQ(t->bos_token, "<|begin_of_text|>");
  auto r = t->render(json::array({{{"role", "user"}, {"content", "Hi"}}}), true);
  ASSERT_TRUE(r.ok()) << r.err().message;
  EXPECT_EQ(r.value(),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  testing::temp_dir dir;
  testing::write_text(dir / "tokenizer_config.json", "{}");
  auto missing = chat_template::load(dir.path());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.err().message.find("no chat_template"), std::string::npos);
}

// transformers 4.51 on saves chat_template.jinja, which clobbers tokenizer_config.json's
// template (bos/eos still come from there); a processor's chat_template.json comes last.
TEST(ChatTemplate, ChatTemplateJinjaWinsAndAProcessorsJsonIsTheLastResort) {
  const auto msgs = json::array({{{"role", "user"}, {"content", "Hi"}}});
  testing::temp_dir dir;
  testing::write_text(dir / "tokenizer_config.json",
                      R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": "config:{{ messages[0].content }}"})");
  testing::write_text(dir / "chat_template.json", R"({"chat_template": "processor:{{ messages[0].content }}"})");
  auto from_config = chat_template::load(dir.path());
  ASSERT_TRUE(from_config.ok()) << from_config.err().message;
  EXPECT_EQ(from_config->render(msgs, false).value(), "config:Hi");
  testing::write_text(dir / "chat_template.jinja", "{{ bos_token }}jinja:{{ messages[0].content }}{{ eos_token }}");
  auto from_jinja = chat_template::load(dir.path());
  ASSERT_TRUE(from_jinja.ok()) << from_jinja.err().message;
  EXPECT_EQ(from_jinja->render(msgs, false).value(), "<s>jinja:Hi</s>");
  std::filesystem::remove(dir / "chat_template.jinja");
  testing::write_text(dir / "tokenizer_config.json", R"({"bos_token": "<s>"})");
  auto from_processor = chat_template::load(dir.path());
  ASSERT_TRUE(from_processor.ok()) << from_processor.err().message;
  EXPECT_EQ(from_processor->render(msgs, false).value(), "processor:Hi");
  testing::write_text(dir / "chat_template.json", R"({"template": 1})");
  auto bad = chat_template::load(dir.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("chat_template.json: no chat_template string"), std::string::npos) << bad.err().message;
  // Without tokenizer_config.json, a chat_template.jinja alone serves (no bos/eos tokens).
  std::filesystem::remove(dir / "tokenizer_config.json");
  testing::write_text(dir / "chat_template.jinja", "[{{ bos_token }}]{{ messages[0].content }}");
  auto alone = chat_template::load(dir.path());
  ASSERT_TRUE(alone.ok()) << alone.err().message;
  EXPECT_EQ(alone->render(msgs, false).value(), "[]Hi");
  testing::write_text(dir / "chat_template.jinja", "{% if %}");
  auto broken = chat_template::load(dir.path());
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.err().message.find("chat_template.jinja: "), std::string::npos) << broken.err().message;
}

// vLLM's --chat-template: a file or the template inline replaces the model's, keeping its
// bos/eos tokens; a path that is not a file and holds no template is refused, and so is a
// template outside the subset, naming the flag.
TEST(ChatTemplate, AnOverrideFromAFileOrInlineReplacesTheModelsOwn) {
  const std::string model_dir = data_dir + "/tokenizers/llama3_1";
  const auto messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  const std::string inline_source = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";
  auto t = chat_template::load_override(model_dir, inline_source);
  ASSERT_TRUE(t.ok()) << t.err().message;
  EXPECT_EQ(*t->render(messages, true), "<|begin_of_text|>[user] Hi\n");
  testing::temp_dir dir;
  testing::write_text(dir / "t.jinja", "{% for m in messages %}<{{ m.content }}>{% endfor %}{{ eos_token }}");
  auto f = chat_template::load_override(model_dir, (dir / "t.jinja"));
  ASSERT_TRUE(f.ok()) << f.err().message;
  EXPECT_EQ(*f->render(messages, true), "<Hi><|eot_id|>");
  auto missing = chat_template::load_override(model_dir, (dir / "none.jinja"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.err().message.find("--chat-template " + (dir / "none.jinja") + ": no such file"), std::string::npos)
      << missing.err().message;
  testing::write_text(dir / "bad.jinja", "{% filter upper %}{% endfilter %}");
  auto bad = chat_template::load_override(model_dir, (dir / "bad.jinja"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.err().message.find("--chat-template " + (dir / "bad.jinja") + ": "), std::string::npos)
      << bad.err().message;
  // A directory without tokenizer_config.json: the template alone, no bos/eos.
  auto bare = chat_template::load_override(dir.path(), inline_source);
  ASSERT_TRUE(bare.ok()) << bare.err().message;
  EXPECT_EQ(*bare->render(messages, true), "[user] Hi\n");
}

}  // namespace
}  // namespace llmesh::model

namespace llmesh::model {
namespace {

TEST(ChatTemplate, WhitespaceControlFollowsHfSettings) {
  auto render = [](const std::string& src) {
    auto t = chat_template::parse(src);
    EXPECT_TRUE(t.ok()) << src;
    auto r = t->render(nlohmann::ordered_json::array(), false, {{"x", true}});
    return r.ok() ? r.value() : "ERROR";
  };
  EXPECT_EQ(render("a\n  {% if x %}\nb\n  {% endif %}\nc"), "a\nb\nc");  // lstrip_blocks + trim_blocks
  EXPECT_EQ(render("a {% if x %}  {% endif %}b"), "a   b");             // mid-line: nothing stripped
  EXPECT_EQ(render("a  {%- if x -%}  b  {%- endif %}"), "ab");
  EXPECT_EQ(render("{{ 'a' }}\n{{ 'b' }}"), "a\nb");                      // trim_blocks: blocks only
}

}  // namespace
}  // namespace llmesh::model
