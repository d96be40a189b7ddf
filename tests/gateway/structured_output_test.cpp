// Structured outputs and tools in requests: response_format, vLLM's guided_* and
// structured_outputs become one constraint_spec (compiled at parse time: a bad schema, pattern
// or grammar is a 400 naming its field; two constraints are a 400 naming both); tools,
// tool_choice and parallel_tool_calls are checked, a forced call becomes the constraint;
// assistant tool calls in the conversation reach the template with their arguments as
// objects; api_service puts the constraint on every generation of a job and the tools into
// the chat template.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "llmesh/gateway/api_service.hpp"
#include "llmesh/gateway/structured_output.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;
using kind = model::constraint_spec::kind;

const std::string completion_head = R"({"model":"m","prompt":"x",)";
const std::string chat_head = R"({"model":"m","messages":[{"role":"user","content":"x"}],)";

/// The body's constraint on either endpoint (fields is the rest of the object, without braces).
result<model::constraint_spec> constraint_of(bool chat, const std::string& fields) {
  request_limits lim;
  if (chat) {
    auto r = parse_chat_request(chat_head + fields + "}", lim);
    if (!r) return r.take_error();
    return r->gen.constraint;
  }
  auto r = parse_completion_request(completion_head + fields + "}", lim);
  if (!r) return r.take_error();
  return r->gen.constraint;
}

result<chat_request> chat(const std::string& fields) { return parse_chat_request(chat_head + fields + "}", request_limits{}); }

/// A schema's text as the gateway hands it on: the object's compact dump, keys in the order sent.
std::string dumped(const std::string& schema) { return json::parse(schema).dump(); }

const std::string schema = R"({"type":"object","properties":{"answer":{"type":"string","enum":["yes","no"]},)"
                           R"("ok":{"type":"boolean"}},"required":["answer","ok"],"additionalProperties":false})";

TEST(StructuredOutput, ResponseFormatBecomesTheConstraintOnBothEndpoints) {
  for (bool c : {false, true}) {
    auto none = constraint_of(c, R"("response_format":{"type":"text"})");
    ASSERT_TRUE(none.ok()) << none.err().message;
    EXPECT_EQ(none->type, kind::none);
    auto null = constraint_of(c, R"("response_format":null)");
    ASSERT_TRUE(null.ok()) << null.err().message;
    EXPECT_EQ(null->type, kind::none);
    auto obj = constraint_of(c, R"("response_format":{"type":"json_object"})");
    ASSERT_TRUE(obj.ok()) << obj.err().message;
    EXPECT_EQ(obj->type, kind::json_object);
    auto js = constraint_of(c, R"("response_format":{"type":"json_schema","json_schema":{"name":"a","strict":true,"schema":)" + schema + "}}");
    ASSERT_TRUE(js.ok()) << js.err().message;
    EXPECT_EQ(js->type, kind::json_schema);
    EXPECT_EQ(js->text, dumped(schema));
    // OpenAI requires a name; vLLM (and this server) take a schema without one.
    auto nameless = constraint_of(c, R"("response_format":{"type":"json_schema","json_schema":{"schema":)" + schema + "}}");
    ASSERT_TRUE(nameless.ok()) << nameless.err().message;
    EXPECT_EQ(nameless->text, dumped(schema));
  }
  auto plain = constraint_of(true, R"("max_tokens":4)");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(*plain, model::constraint_spec{});
}

TEST(StructuredOutput, VllmsGuidedFieldsAndStructuredOutputsBecomeTheConstraint) {
  struct field_case {
    std::string fields;
    kind k;
    std::string text;
  };
  const std::string as_string = json(schema).dump();  // guided_json as a string holding the schema
  const field_case cases[] = {
      {R"("guided_json":)" + schema, kind::json_schema, dumped(schema)},
      {R"("guided_json":)" + as_string, kind::json_schema, dumped(schema)},
      {R"("guided_regex":"[0-9]{3}")", kind::regex, "[0-9]{3}"},
      {R"("guided_choice":["yes","no"])", kind::choice, R"(["yes","no"])"},
      {R"("guided_grammar":"root ::= \"a\" | \"b\"")", kind::grammar, R"(root ::= "a" | "b")"},
      {R"("structured_outputs":{"json":)" + schema + "}", kind::json_schema, dumped(schema)},
      {R"("structured_outputs":{"json":)" + as_string + "}", kind::json_schema, dumped(schema)},
      {R"("structured_outputs":{"regex":"a+b"})", kind::regex, "a+b"},
      {R"("structured_outputs":{"choice":["x","y z"]})", kind::choice, R"(["x","y z"])"},
      {R"("structured_outputs":{"grammar":"root ::= \"a\""})", kind::grammar, R"(root ::= "a")"},
      {R"("structured_outputs":{"json_object":true})", kind::json_object, ""},
      // Neutral values ask for nothing.
      {R"("structured_outputs":{"json_object":false,"regex":null})", kind::none, ""},
      {R"("structured_outputs":{})", kind::none, ""},
      {R"("guided_json":null,"guided_regex":null,"guided_choice":null,"guided_grammar":null,"structured_outputs":null)",
       kind::none, ""},
  };
  for (bool c : {false, true}) {
    for (const auto& f : cases) {
      auto s = constraint_of(c, f.fields);
      ASSERT_TRUE(s.ok()) << f.fields << " -> " << s.err().message;
      EXPECT_EQ(s->type, f.k) << f.fields;
      EXPECT_EQ(s->text, f.text) << f.fields;
    }
  }
}

TEST(StructuredOutput, TwoConstraintsAreRefusedNamingBoth) {
  const std::pair<std::string, std::string> cases[] = {
      {R"("response_format":{"type":"json_object"},"guided_regex":"a")", "'response_format' and 'guided_regex'"},
      {R"("guided_json":{},"guided_choice":["a"],"guided_grammar":"root ::= \"a\"")",
       "'guided_json', 'guided_choice' and 'guided_grammar'"},
      {R"("structured_outputs":{"regex":"a","choice":["a"]})", "'structured_outputs.regex' and 'structured_outputs.choice'"},
      {R"("guided_regex":"a","structured_outputs":{"json_object":true})", "'guided_regex' and 'structured_outputs.json_object'"},
  };
  for (bool c : {false, true}) {
    for (const auto& [fields, names] : cases) {
      auto s = constraint_of(c, fields);
      ASSERT_FALSE(s.ok()) << fields;
      EXPECT_EQ(s.err().code, errc::invalid_request);
      EXPECT_EQ(s.err().message, "a request takes one output constraint; this one sends " + names) << fields;
    }
  }
  // A forced tool call is a constraint too.
  auto t = chat(R"("tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required",)"
                R"("response_format":{"type":"json_object"})");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.err().message, "a request takes one output constraint; this one sends 'response_format' and 'tool_choice'");
  // response_format text with a guided field is one constraint.
  auto one = constraint_of(true, R"("response_format":{"type":"text"},"guided_regex":"a")");
  ASSERT_TRUE(one.ok()) << one.err().message;
  EXPECT_EQ(one->type, kind::regex);
}

TEST(StructuredOutput, MisshapenFieldsAreNamed) {
  const std::pair<std::string, std::string> cases[] = {
      {R"("response_format":"json")", "'response_format' must be an object with a 'type'"},
      {R"("response_format":{"type":"yaml"})", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\""},
      {R"("response_format":{})", "'response_format.type' must be"},
      {R"("response_format":{"type":"json_schema"})", "'response_format.json_schema' must be an object with a 'schema'"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"a"}})",
       "'response_format.json_schema.schema' is required"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"a","schema":"{}"}})",
       "'response_format.json_schema.schema' must be a JSON schema object"},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":5,"schema":{}}})",
       "'response_format.json_schema.name' must be a string"},
      {R"("response_format":{"type":"json_schema","json_schema":{"strict":"yes","schema":{}}})",
       "'response_format.json_schema.strict' must be true or false"},
      {R"("response_format":{"type":"structural_tag"})", "\"structural_tag\" is not supported"},
      {R"("guided_json":5)", "'guided_json' must be a JSON schema: an object, or a string holding one"},
      {R"("guided_json":"{not json")", "'guided_json' is not valid JSON"},
      {R"("guided_json":"[1]")", "'guided_json' must be a JSON schema"},
      {R"("guided_regex":"")", "'guided_regex' must be a non-empty string"},
      {R"("guided_regex":["a"])", "'guided_regex' must be a non-empty string"},
      {R"("guided_choice":[])", "'guided_choice' must be a non-empty array of strings"},
      {R"("guided_choice":"a")", "'guided_choice' must be a non-empty array of strings"},
      {R"("guided_choice":["a",1])", "'guided_choice' must be a non-empty array of strings"},
      {R"("guided_grammar":7)", "'guided_grammar' must be a non-empty string"},
      {R"("structured_outputs":[])", "'structured_outputs' must be an object"},
      {R"("structured_outputs":{"json":1})", "'structured_outputs.json' must be a JSON schema"},
      {R"("structured_outputs":{"regex":1})", "'structured_outputs.regex' must be a non-empty string"},
      {R"("structured_outputs":{"choice":[1]})", "'structured_outputs.choice' must be a non-empty array of strings"},
      {R"("structured_outputs":{"grammar":""})", "'structured_outputs.grammar' must be a non-empty string"},
      {R"("structured_outputs":{"json_object":1})", "'structured_outputs.json_object' must be true or false"},
      {R"("structured_outputs":{"structural_tag":"x"})", "'structured_outputs.structural_tag' is not supported"},
  };
  for (bool c : {false, true}) {
    for (const auto& [fields, needle] : cases) {
      auto s = constraint_of(c, fields);
      ASSERT_FALSE(s.ok()) << fields;
      EXPECT_EQ(s.err().code, errc::invalid_request);
      EXPECT_NE(s.err().message.find(needle), std::string::npos) << fields << " -> " << s.err().message;
    }
  }
  // Schema text within the bound the replicas compile.
  const std::string huge = R"("guided_regex":")" + std::string(model::max_constraint_bytes + 1, 'a') + "\"";
  auto s = constraint_of(false, huge);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find("'guided_regex' is too long"), std::string::npos) << s.err().message;
}

// What the compiler refuses comes back as a 400 naming the field, its message after it.
TEST(StructuredOutput, CompileErrorsAre400sNamingTheField) {
  const std::pair<std::string, std::string> cases[] = {
      {R"("guided_regex":"(ab")", "'guided_regex': "},
      {R"("structured_outputs":{"regex":"[z-a]"})", "'structured_outputs.regex': "},
      {R"("guided_json":{"type":"frobnicate"})", "'guided_json': "},
      {R"("response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"frobnicate"}}})",
       "'response_format.json_schema.schema': "},
      {R"("guided_grammar":"root ::= undefined_rule")", "'guided_grammar': "},
      {R"("guided_choice":[""])", "'guided_choice': "},
  };
  for (bool c : {false, true}) {
    for (const auto& [fields, prefix] : cases) {
      auto s = constraint_of(c, fields);
      ASSERT_FALSE(s.ok()) << fields;
      EXPECT_EQ(s.err().code, errc::invalid_request);
      EXPECT_EQ(s.err().message.rfind(prefix, 0), 0u) << fields << " -> " << s.err().message;
      EXPECT_GT(s.err().message.size(), prefix.size() + 5) << "the compiler's reason follows: " << s.err().message;
    }
  }
  // A named tool's parameters are compiled: a bad one names the tool's place.
  auto t = chat(R"("tools":[{"type":"function","function":{"name":"a"}},{"type":"function","function":{"name":"b",)"
                R"("parameters":{"type":"frobnicate"}}}],"tool_choice":{"type":"function","function":{"name":"b"}})");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.err().message.rfind("'tools[1].function.parameters': ", 0), 0u) << t.err().message;
  // With "auto" the parameters are only rendered, never compiled: any object passes.
  auto a = chat(R"("tools":[{"type":"function","function":{"name":"b","parameters":{"type":"frobnicate"}}}])");
  ASSERT_TRUE(a.ok()) << a.err().message;
}

const std::string two_tools =
    R"("tools":[{"type":"function","function":{"name":"get_weather","description":"Weather in a city",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},)"
    R"({"type":"function","function":{"name":"now"}}])";

TEST(StructuredOutput, ToolsAndToolChoiceAreParsed) {
  auto none = chat(R"("max_tokens":3)");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->tools.tools.empty());
  EXPECT_EQ(none->tools.mode, tool_choice_mode::none);
  EXPECT_TRUE(none->tools.parallel_tool_calls);
  for (const char* neutral : {R"("tools":null)", R"("tools":[])", R"("tools":[],"tool_choice":"auto")",
                              R"("tools":null,"tool_choice":"none")", R"("tool_choice":null,"parallel_tool_calls":null)"}) {
    auto r = chat(neutral);
    ASSERT_TRUE(r.ok()) << neutral << " -> " << r.err().message;
    EXPECT_EQ(r->tools.mode, tool_choice_mode::none) << neutral;
    EXPECT_EQ(r->gen.constraint.type, kind::none) << neutral;
  }
  auto deflt = chat(two_tools);
  ASSERT_TRUE(deflt.ok()) << deflt.err().message;
  EXPECT_EQ(deflt->tools.mode, tool_choice_mode::automatic);  // the default with tools
  EXPECT_EQ(deflt->tools.tools, json::parse("{" + two_tools + "}")["tools"]) << "the tools as sent";
  EXPECT_EQ(deflt->gen.constraint.type, kind::none);  // auto: free text
  auto off = chat(two_tools + R"(,"tool_choice":"none","parallel_tool_calls":false)");
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->tools.mode, tool_choice_mode::none);
  EXPECT_FALSE(off->tools.parallel_tool_calls);
  EXPECT_EQ(off->tools.tools.size(), 2u);  // still rendered

  // Named: the tool's parameters are the constraint; without parameters, an empty object's schema.
  auto named = chat(two_tools + R"(,"tool_choice":{"type":"function","function":{"name":"get_weather"}})");
  ASSERT_TRUE(named.ok()) << named.err().message;
  EXPECT_EQ(named->tools.mode, tool_choice_mode::named);
  EXPECT_EQ(named->tools.name, "get_weather");
  EXPECT_EQ(named->gen.constraint.type, kind::json_schema);
  EXPECT_EQ(named->gen.constraint.text, R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})");
  auto bare = chat(two_tools + R"(,"tool_choice":{"type":"function","function":{"name":"now"}})");
  ASSERT_TRUE(bare.ok()) << bare.err().message;
  EXPECT_EQ(bare->gen.constraint.text, R"({"type":"object","properties":{}})");

  // Required: vLLM's array-of-calls schema (maxItems 1 without parallel calls).
  const std::string item_of_weather =
      R"({"type":"object","properties":{"name":{"type":"string","enum":["get_weather"]},"parameters":)"
      R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},)"
      R"("required":["name","parameters"],"additionalProperties":false})";
  const std::string item_of_now =
      R"({"type":"object","properties":{"name":{"type":"string","enum":["now"]},"parameters":)"
      R"({"type":"object","properties":{}}},"required":["name","parameters"],"additionalProperties":false})";
  auto req = chat(two_tools + R"(,"tool_choice":"required")");
  ASSERT_TRUE(req.ok()) << req.err().message;
  EXPECT_EQ(req->tools.mode, tool_choice_mode::required);
  EXPECT_EQ(req->gen.constraint.type, kind::json_schema);
  EXPECT_EQ(req->gen.constraint.text, R"({"type":"array","minItems":1,"items":{"anyOf":[)" +
                                          item_of_weather + "," + item_of_now + "]}}");
  auto one = chat(two_tools + R"(,"tool_choice":"required","parallel_tool_calls":false)");
  ASSERT_TRUE(one.ok()) << one.err().message;
  EXPECT_EQ(one->gen.constraint.text, R"({"type":"array","minItems":1,"maxItems":1,"items":{"anyOf":[)" +
                                          item_of_weather + "," + item_of_now + "]}}");
  // A tool without "type" is a function (vLLM's default).
  auto untyped = chat(R"("tools":[{"function":{"name":"f","description":null,"parameters":null,"strict":false}}])");
  ASSERT_TRUE(untyped.ok()) << untyped.err().message;
}

TEST(StructuredOutput, BadToolsAndToolChoicesAreNamed) {
  std::string many = R"("tools":[)";
  for (size_t i = 0; i <= max_tools; ++i) many += (i ? "," : "") + std::string(R"({"type":"function","function":{"name":"f)") + std::to_string(i) + "\"}}";
  many += "]";
  const std::pair<std::string, std::string> cases[] = {
      {R"("tools":{"type":"function"})", "'tools' must be an array"},
      {R"("tools":[5])", "'tools[0]' must be an object"},
      {R"("tools":[{"type":"retrieval","function":{"name":"f"}}])", "'tools[0].type' must be \"function\""},
      {R"("tools":[{"type":"function"}])", "'tools[0].function' must be an object with a 'name'"},
      {R"("tools":[{"type":"function","function":{"description":"d"}}])", "'tools[0].function.name' must be a non-empty string"},
      {R"("tools":[{"type":"function","function":{"name":""}}])", "'tools[0].function.name' must be a non-empty string"},
      {R"("tools":[{"type":"function","function":{"name":7}}])", "'tools[0].function.name' must be a non-empty string"},
      {R"("tools":[{"type":"function","function":{"name":")" + std::string(257, 'n') + R"("}}])",
       "'tools[0].function.name' must be a non-empty string of at most 256 bytes"},
      {R"("tools":[{"type":"function","function":{"name":"f","description":1}}])", "'tools[0].function.description' must be a string"},
      {R"("tools":[{"type":"function","function":{"name":"f","parameters":"{}"}}])",
       "'tools[0].function.parameters' must be a JSON schema object"},
      {R"("tools":[{"type":"function","function":{"name":"f","strict":"no"}}])", "'tools[0].function.strict' must be true or false"},
      {R"("tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}])",
       "'tools' holds two functions named 'f' (tools[0] and tools[1])"},
      {many, "'tools' holds at most 128 tools"},
      {two_tools + R"(,"tool_choice":"sometimes")", "'tool_choice' must be \"none\", \"auto\", \"required\" or"},
      {two_tools + R"(,"tool_choice":5)", "'tool_choice' must be"},
      {two_tools + R"(,"tool_choice":{"type":"function"})", "'tool_choice' must be"},
      {two_tools + R"(,"tool_choice":{"type":"function","function":{"name":"get_time"}})",
       "'tool_choice' names the function 'get_time', which is not in 'tools'"},
      {R"("tool_choice":{"type":"function","function":{"name":"f"}})", "'tool_choice' names the function 'f' but the request has no 'tools'"},
      {R"("tool_choice":"required")", "'tool_choice' \"required\" needs 'tools'"},
      {R"("tools":[],"tool_choice":"required")", "'tool_choice' \"required\" needs 'tools'"},
      {two_tools + R"(,"parallel_tool_calls":"yes")", "'parallel_tool_calls' must be true or false"},
  };
  for (const auto& [fields, needle] : cases) {
    auto r = chat(fields);
    ASSERT_FALSE(r.ok()) << fields.substr(0, 200);
    EXPECT_EQ(r.err().code, errc::invalid_request);
    EXPECT_NE(r.err().message.find(needle), std::string::npos) << fields.substr(0, 200) << " -> " << r.err().message;
  }
  // Tools are a chat field: the legacy endpoint refuses them (their neutral values pass).
  auto c = parse_completion_request(completion_head + two_tools + "}", request_limits{});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.err().message.find("'tools' is not supported on /v1/completions"), std::string::npos) << c.err().message;
  EXPECT_TRUE(parse_completion_request(completion_head + R"("tools":[]})", request_limits{}).ok());
}

TEST(StructuredOutput, AssistantToolCallsReachTheTemplateWithArgumentsAsObjects) {
  auto r = chat(R"("messages":[{"role":"user","content":"Weather?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"20 C"},
      {"role":"assistant","tool_calls":[{"id":"call_2","type":"function",
        "function":{"name":"now","arguments":"not json"}},{"function":{"name":"x","arguments":{"a":1}}}]}],
      "max_tokens":3)");
  ASSERT_TRUE(r.ok()) << r.err().message;
  json m = r->messages;
  EXPECT_EQ(m[1]["content"], "");  // null or left out beside tool calls: "" as vLLM gives templates
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], json({{"city", "Paris"}}));
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "call_1");  // the rest as sent
  EXPECT_EQ(m[2], json({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "20 C"}}));
  EXPECT_EQ(m[3]["content"], "");
  EXPECT_EQ(m[3]["tool_calls"][0]["function"]["arguments"], "not json");  // not JSON: left as sent
  EXPECT_EQ(m[3]["tool_calls"][1]["function"]["arguments"], json({{"a", 1}}));
  // A message without tool calls still needs its content.
  EXPECT_FALSE(chat(R"("messages":[{"role":"assistant"}])").ok());
  const std::pair<std::string, std::string> bad[] = {
      {R"([{"role":"assistant","tool_calls":{"id":"x"}}])", "'messages[0].tool_calls' must be an array"},
      {R"([{"role":"user","content":"a"},{"role":"assistant","tool_calls":[5]}])", "'messages[1].tool_calls[0]' must be an object"},
      {R"([{"role":"assistant","tool_calls":[{"id":"x"}]}])", "'messages[0].tool_calls[0].function' must be an object"},
      {R"([{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}])",
       "'messages[0].tool_calls[0].function.name' must be a string"},
      {R"([{"role":"assistant","tool_calls":[{"function":{"name":"f"}}]}])",
       "'messages[0].tool_calls[0].function.arguments' must be a string (JSON) or an object"},
      {R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":[1]}}]}])",
       "'messages[0].tool_calls[0].function.arguments' must be"},
  };
  for (const auto& [messages, needle] : bad) {
    auto b = parse_chat_request(R"({"model":"m","messages":)" + messages + "}", request_limits{});
    ASSERT_FALSE(b.ok()) << messages;
    EXPECT_NE(b.err().message.find(needle), std::string::npos) << messages << " -> " << b.err().message;
  }
}

// ---- api_service: the constraint on every generation, the tools in the template ----

struct fake_mesh : actors::mesh_client {
  void submit(actors::replica_request, actors::token_sink) override {}
  void cancel(uint64_t) override {}
  size_t ready_replicas() const override { return 1; }
  size_t ready_replicas(std::string_view) const override { return 1; }
};

/// A template that shows the tools and the assistant's calls, as tool-use templates read them.
const char* tool_template =
    "{% if tools %}TOOLS={{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<call {{ c.function.name }} city={{ c.function.arguments.city }}>"
    "{% endfor %}{% endif %}\n{% endfor %}assistant:";

class StructuredService : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = LLMESH_SOURCE_DIR "/models/kjv-tiny";
    auto t = model::tokenizer::load(dir);
    auto c = model::load_config(dir);
    auto tmpl = model::chat_template::parse(tool_template);
    ASSERT_TRUE(t.ok() && c.ok());
    ASSERT_TRUE(tmpl.ok()) << tmpl.err().message;
    tok_ = *t;
    tmpl_ = *tmpl;
    api_options o;
    o.model_name = "kjv";
    api_ = std::make_unique<api_service>(o, tok_, tmpl_, *c, mesh_, metrics_);
  }
  api_outcome post(const std::string& path, const std::string& body) { return api_->handle("POST", path, "", body); }

  fake_mesh mesh_;
  actors::metrics_registry metrics_;
  std::shared_ptr<const model::tokenizer> tok_;
  std::optional<model::chat_template> tmpl_;
  std::unique_ptr<api_service> api_;
};

TEST_F(StructuredService, EveryGenerationOfAJobCarriesTheConstraint) {
  const model::constraint_spec choice{kind::choice, R"(["yes","no"])"};
  // Completions: a batch of 2 prompts × n 2, and best_of's candidates.
  auto batch = post("/v1/completions", R"({"model":"kjv","prompt":["a","b"],"n":2,"guided_choice":["yes","no"]})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(batch)) << std::get<http_reply>(batch).body;
  ASSERT_EQ(std::get<generation_job>(batch).requests.size(), 4u);
  for (const auto& r : std::get<generation_job>(batch).requests) EXPECT_EQ(r.constraint, choice);
  auto best = post("/v1/completions", R"({"model":"kjv","prompt":"a","n":2,"best_of":3,"guided_choice":["yes","no"]})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(best));
  ASSERT_EQ(std::get<generation_job>(best).requests.size(), 3u);
  for (const auto& r : std::get<generation_job>(best).requests) EXPECT_EQ(r.constraint, choice);
  // Chat, n 3.
  auto c = post("/v1/chat/completions", R"({"model":"kjv","messages":[{"role":"user","content":"x"}],"n":3,)"
                                        R"("response_format":{"type":"json_object"}})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(c)) << std::get<http_reply>(c).body;
  ASSERT_EQ(std::get<generation_job>(c).requests.size(), 3u);
  for (const auto& r : std::get<generation_job>(c).requests) EXPECT_EQ(r.constraint.type, kind::json_object);
  // Without one: none.
  auto plain = post("/v1/completions", R"({"model":"kjv","prompt":"a"})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(plain));
  EXPECT_EQ(std::get<generation_job>(plain).requests.at(0).constraint, model::constraint_spec{});
  // A bad one never reaches the mesh: a 400 naming the field.
  auto bad = post("/v1/completions", R"({"model":"kjv","prompt":"a","guided_regex":"(ab"})");
  ASSERT_TRUE(std::holds_alternative<http_reply>(bad));
  EXPECT_EQ(std::get<http_reply>(bad).status, 400);
  auto err = json::parse(std::get<http_reply>(bad).body);
  EXPECT_EQ(err["error"]["type"], "invalid_request_error");
  EXPECT_EQ(err["error"]["message"].get<std::string>().rfind("'guided_regex': ", 0), 0u) << err.dump();
}

TEST_F(StructuredService, ToolsAndToolCallsAreRenderedByTheTemplate) {
  json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather",)"
                                 R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  json body = {{"model", "kjv"},
               {"messages", json::parse(R"([{"role":"user","content":"Weather?"},
                  {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
                   "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
                  {"role":"tool","tool_call_id":"c1","content":"20 C"}])")},
               {"tools", tools},
               {"max_tokens", 4}};
  auto o = post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << std::get<http_reply>(o).body;
  nlohmann::ordered_json extra = {{"tools", tools}};
  auto want = tmpl_->render(json::parse(R"([{"role":"user","content":"Weather?"},
      {"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function",
       "function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},
      {"role":"tool","tool_call_id":"c1","content":"20 C"}])"), true, extra);
  ASSERT_TRUE(want.ok()) << want.err().message;
  EXPECT_NE(want->find("TOOLS=[{\"type\": \"function\""), std::string::npos) << *want;
  EXPECT_NE(want->find("<call get_weather city=Paris>"), std::string::npos) << *want;  // arguments as an object
  EXPECT_EQ(std::get<generation_job>(o).requests.at(0).prompt, tok_->encode(*want, false));
  EXPECT_EQ(std::get<generation_job>(o).requests.at(0).constraint.type, kind::none);  // auto: unconstrained
  // Without tools the template sees none.
  body.erase("tools");
  auto p = post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(std::holds_alternative<generation_job>(p)) << std::get<http_reply>(p).body;
  auto plain = tok_->decoder().decode(std::get<generation_job>(p).requests.at(0).prompt);
  EXPECT_EQ(plain.find("TOOLS="), std::string::npos) << plain;
}

// A named tool_choice's choice comes back as that tool's call, through the job's own output.
TEST_F(StructuredService, ANamedToolChoiceAnswersWithTheCall) {
  auto o = post("/v1/chat/completions", R"({"model":"kjv","messages":[{"role":"user","content":"x"}],)"
                                        R"("tools":[{"type":"function","function":{"name":"get_weather"}}],)"
                                        R"("tool_choice":{"type":"function","function":{"name":"get_weather"}}})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << std::get<http_reply>(o).body;
  auto& job = std::get<generation_job>(o);
  EXPECT_EQ(job.requests.at(0).constraint.text, R"({"type":"object","properties":{}})");
  const auto ids = tok_->encode("{\"city\": \"Zion\"}", false);
  for (size_t i = 0; i < ids.size(); ++i) {
    job.output->on_message({job.requests[0].id, ids[i], i + 1 == ids.size() ? actors::finish_reason::eos : actors::finish_reason::none,
                            false, {}, {}, {}});
  }
  ASSERT_TRUE(job.output->done());
  auto reply = json::parse(job.output->reply().body);
  const auto& msg = reply["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "");
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], tok_->decoder().decode(ids));
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Zion"}}));
  EXPECT_EQ(reply["choices"][0]["finish_reason"], "stop");
}

// With tool_choice "auto" (the default with tools) nothing is constrained, and Hermes-style
// calls the model writes come back as tool_calls.
TEST_F(StructuredService, AutoTurnsHermesCallsIntoToolCalls) {
  auto o = post("/v1/chat/completions", R"({"model":"kjv","messages":[{"role":"user","content":"x"}],)"
                                        R"("tools":[{"type":"function","function":{"name":"now"}}]})");
  ASSERT_TRUE(std::holds_alternative<generation_job>(o)) << std::get<http_reply>(o).body;
  auto& job = std::get<generation_job>(o);
  EXPECT_EQ(job.requests.at(0).constraint, model::constraint_spec{});
  const auto ids = tok_->encode("Behold.<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>", false);
  for (size_t i = 0; i < ids.size(); ++i) {
    job.output->on_message({job.requests[0].id, ids[i], i + 1 == ids.size() ? actors::finish_reason::eos : actors::finish_reason::none,
                            false, {}, {}, {}});
  }
  ASSERT_TRUE(job.output->done());
  auto reply = json::parse(job.output->reply().body);
  EXPECT_EQ(reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "now") << reply.dump();
  EXPECT_EQ(reply["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(reply["choices"][0]["message"]["content"].get<std::string>().find("<tool_call>"), std::string::npos);
}

}  // namespace
}  // namespace llmesh::gateway
