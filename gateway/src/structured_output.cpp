// Structured outputs and tools in a request body (structured_output.hpp).
#include "llmesh/gateway/structured_output.hpp"

#include <optional>
#include <vector>

#include "llmesh/model/constraint_cache.hpp"

namespace llmesh::gateway {
namespace {

using json = nlohmann::ordered_json;

error bad(const std::string& msg) { return make_error(errc::invalid_request, msg); }

std::string field_name(const std::string& field) { return "'" + field + "'"; }


/// Absent or null: not sent.
const json* sent(const json& j, const char* name) {
  auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

/// One constraint a body asks for, and the field that asked (named in errors).
struct asked {
  std::string field;
  model::constraint_spec spec;
};

/// A schema given as an object, or as a string holding one (guided_json's two forms).
status schema_spec(const json& v, const std::string& field, bool string_allowed, asked& out) {
  json schema = v;
  if (v.is_string() && string_allowed) {
    auto parsed = parse_embedded_json(v.get_ref<const std::string&>());
    if (!parsed) return bad(field_name(field) + " is not valid JSON (a JSON schema as a string)");
    schema = std::move(*parsed);
  }
  if (!schema.is_object()) {
    return bad(field_name(field) + (string_allowed ? " must be a JSON schema: an object, or a string holding one"
                                               : " must be a JSON schema object"));
  }
  out = {field, {model::constraint_spec::kind::json_schema, schema.dump()}};
  return ok_status();
}

status text_spec(const json& v, const std::string& field, model::constraint_spec::kind k, const char* what,
                 asked& out) {
  if (!v.is_string() || v.get_ref<const std::string&>().empty()) return bad(field_name(field) + " must be a non-empty string (" + what + ")");
  out = {field, {k, v.get<std::string>()}};
  return ok_status();
}

status choice_spec(const json& v, const std::string& field, asked& out) {
  const std::string shape = field_name(field) + " must be a non-empty array of strings";
  if (!v.is_array() || v.empty()) return bad(shape);
  for (const auto& c : v) {
    if (!c.is_string()) return bad(shape);
  }
  out = {field, {model::constraint_spec::kind::choice, v.dump()}};
  return ok_status();
}

/// OpenAI's response_format; nullopt for "text".
status response_format(const json& v, std::optional<asked>& out) {
  const char* types = "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"";
  if (!v.is_object()) return bad("'response_format' must be an object with a 'type'");
  auto type = v.find("type");
  if (type == v.end() || !type->is_string()) return bad(types);
  const std::string& t = type->get_ref<const std::string&>();
  if (t == "text") return ok_status();
  if (t == "json_object") {
    out = asked{"response_format", {model::constraint_spec::kind::json_object, ""}};
    return ok_status();
  }
  if (t == "structural_tag") {
    return bad("'response_format' of type \"structural_tag\" is not supported by this server");
  }
  if (t != "json_schema") return bad(types);
  const json* js = sent(v, "json_schema");
  if (!js || !js->is_object()) return bad("'response_format.json_schema' must be an object with a 'schema'");
  // OpenAI requires a name; vLLM does not: a missing one is accepted, a wrong type is not.
  if (const json* name = sent(*js, "name"); name && !name->is_string()) {
    return bad("'response_format.json_schema.name' must be a string");
  }
  if (const json* strict = sent(*js, "strict"); strict && !strict->is_boolean()) {
    return bad("'response_format.json_schema.strict' must be true or false");
  }
  const json* schema = sent(*js, "schema");
  if (!schema) return bad("'response_format.json_schema.schema' is required (a JSON schema object)");
  return schema_spec(*schema, "response_format.json_schema.schema", false, out.emplace());
}

/// vLLM's structured_outputs object: json, regex, choice, grammar, json_object (true).
status structured_outputs(const json& v, std::vector<asked>& out) {
  if (!v.is_object()) return bad("'structured_outputs' must be an object");
  if (const json* j = sent(v, "json")) LLMESH_TRY(schema_spec(*j, "structured_outputs.json", true, out.emplace_back()));
  if (const json* r = sent(v, "regex")) {
    LLMESH_TRY(text_spec(*r, "structured_outputs.regex", model::constraint_spec::kind::regex, "a regular expression",
                         out.emplace_back()));
  }
  if (const json* c = sent(v, "choice")) LLMESH_TRY(choice_spec(*c, "structured_outputs.choice", out.emplace_back()));
  if (const json* g = sent(v, "grammar")) {
    LLMESH_TRY(text_spec(*g, "structured_outputs.grammar", model::constraint_spec::kind::grammar, "a GBNF grammar",
                         out.emplace_back()));
  }
  if (const json* o = sent(v, "json_object")) {
    if (!o->is_boolean()) return bad("'structured_outputs.json_object' must be true or false");
    if (o->get<bool>()) out.push_back({"structured_outputs.json_object", {model::constraint_spec::kind::json_object, ""}});
  }
  if (sent(v, "structural_tag")) return bad("'structured_outputs.structural_tag' is not supported by this server");
  return ok_status();  // other keys (backend options, whitespace_pattern, ...) tune vLLM's backends: ignored
}

/// The tool's parameters schema, or an empty object's when it has none (vLLM's rule).
json parameters_of(const json& tool) {
  const json& f = tool.at("function");
  auto p = f.find("parameters");
  if (p == f.end() || p->is_null()) return json{{"type", "object"}, {"properties", json::object()}};
  return *p;
}

/// tool_choice's constraint, when it forces a call.
std::optional<asked> tool_constraint(const tool_request& t) {
  if (t.mode == tool_choice_mode::named) {
    for (size_t i = 0; i < t.tools.size(); ++i) {
      if (t.tools[i].at("function").at("name") == t.name) {
        return asked{"tools[" + std::to_string(i) + "].function.parameters",
                     {model::constraint_spec::kind::json_schema, parameters_of(t.tools[i]).dump()}};
      }
    }
  }
  if (t.mode == tool_choice_mode::required) {
    return asked{"tools", {model::constraint_spec::kind::json_schema, required_tools_schema(t).dump()}};
  }
  return std::nullopt;
}

/// tool_choice as sent; the tools are already checked.
status parse_tool_choice(const json& body, tool_request& out) {
  const bool have = !out.tools.empty();
  out.mode = have ? tool_choice_mode::automatic : tool_choice_mode::none;
  const json* c = sent(body, "tool_choice");
  if (!c) return ok_status();
  const char* forms =
      "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";
  if (c->is_string()) {
    const std::string& s = c->get_ref<const std::string&>();
    if (s == "none") {
      out.mode = tool_choice_mode::none;
    } else if (s == "auto") {
      // Without tools "auto" has nothing to choose from: accepted as none (clients send it always).
    } else if (s == "required") {
      if (!have) return bad("'tool_choice' \"required\" needs 'tools'");
      out.mode = tool_choice_mode::required;
    } else {
      return bad(forms);
    }
    return ok_status();
  }
  if (!c->is_object()) return bad(forms);
  const json* type = sent(*c, "type");
  const json* f = sent(*c, "function");
  if (!type || *type != "function" || !f || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string()) {
    return bad(forms);
  }
  const std::string name = (*f)["name"].get<std::string>();
  for (const auto& tool : out.tools) {
    if (tool["function"]["name"] == name) {
      out.mode = tool_choice_mode::named;
      out.name = name;
      return ok_status();
    }
  }
  if (!have) return bad("'tool_choice' names the function '" + name.substr(0, 256) + "' but the request has no 'tools'");
  return bad("'tool_choice' names the function '" + name.substr(0, 256) + "', which is not in 'tools'");
}

/// Longest tool name: OpenAI allows 64 characters; this server is lenient up to 256 bytes
/// (names only need to be told apart and rendered).
constexpr size_t max_tool_name_bytes = 256;

}  // namespace

std::optional<json> parse_embedded_json(std::string_view text) {
  bool too_deep = false;
  json::parser_callback_t guard = [&too_deep](int depth, json::parse_event_t, json&) {
    if (depth > max_embedded_json_depth) too_deep = true;
    return !too_deep;
  };
  json j = json::parse(text, guard, /*allow_exceptions=*/false);
  if (too_deep || j.is_discarded()) return std::nullopt;
  return j;
}

status parse_tools(const json& body, tool_request& out) {
  out = tool_request{};
  if (const json* p = sent(body, "parallel_tool_calls")) {
    if (!p->is_boolean()) return bad("'parallel_tool_calls' must be true or false");
    out.parallel_tool_calls = p->get<bool>();
  }
  if (const json* tools = sent(body, "tools")) {
    if (!tools->is_array()) return bad("'tools' must be an array of {\"type\": \"function\", \"function\": {...}}");
    if (tools->size() > max_tools) return bad("'tools' holds at most " + std::to_string(max_tools) + " tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) return bad(field_name(at) + " must be an object {\"type\": \"function\", \"function\": {...}}");
      if (const json* type = sent(t, "type"); type && *type != "function") {
        return bad(field_name(at + ".type") + " must be \"function\" (the only kind of tool this server knows)");
      }
      const json* f = sent(t, "function");
      if (!f || !f->is_object()) return bad(field_name(at + ".function") + " must be an object with a 'name'");
      const json* name = sent(*f, "name");
      if (!name || !name->is_string() || name->get_ref<const std::string&>().empty() ||
          name->get_ref<const std::string&>().size() > max_tool_name_bytes) {
        return bad(field_name(at + ".function.name") + " must be a non-empty string of at most " +
                   std::to_string(max_tool_name_bytes) + " bytes");
      }
      if (const json* d = sent(*f, "description"); d && !d->is_string()) {
        return bad(field_name(at + ".function.description") + " must be a string");
      }
      if (const json* p = sent(*f, "parameters"); p && !p->is_object()) {
        return bad(field_name(at + ".function.parameters") + " must be a JSON schema object");
      }
      if (const json* s = sent(*f, "strict"); s && !s->is_boolean()) {
        return bad(field_name(at + ".function.strict") + " must be true or false");
      }
      for (size_t k = 0; k < i; ++k) {
        if ((*tools)[k]["function"]["name"] == *name) {
          return bad("'tools' holds two functions named '" + name->get<std::string>() + "' (tools[" +
                     std::to_string(k) + "] and " + at + ")");
        }
      }
    }
    out.tools = *tools;
  }
  return parse_tool_choice(body, out);
}

json required_tools_schema(const tool_request& t) {
  json any = json::array();
  for (const auto& tool : t.tools) {
    any.push_back({{"type", "object"},
                   {"properties",
                    {{"name", {{"type", "string"}, {"enum", json::array({tool["function"]["name"]})}}},
                     {"parameters", parameters_of(tool)}}},
                   {"required", json::array({"name", "parameters"})},
                   {"additionalProperties", false}});
  }
  json schema = {{"type", "array"}, {"minItems", 1}};
  if (!t.parallel_tool_calls) schema["maxItems"] = 1;
  schema["items"] = {{"anyOf", std::move(any)}};  // each branch says "object" (no "type" beside anyOf)
  return schema;
}

status parse_output_constraint(const json& body, const tool_request* tools, model::constraint_spec& out) {
  out = model::constraint_spec{};
  // Every field's shape first, so each is named for its own mistake; then the count; then the
  // one compile.
  std::vector<asked> all;
  if (const json* rf = sent(body, "response_format")) {
    std::optional<asked> a;
    LLMESH_TRY(response_format(*rf, a));
    if (a) all.push_back(std::move(*a));
  }
  if (const json* v = sent(body, "guided_json")) LLMESH_TRY(schema_spec(*v, "guided_json", true, all.emplace_back()));
  if (const json* v = sent(body, "guided_regex")) {
    LLMESH_TRY(text_spec(*v, "guided_regex", model::constraint_spec::kind::regex, "a regular expression", all.emplace_back()));
  }
  if (const json* v = sent(body, "guided_choice")) LLMESH_TRY(choice_spec(*v, "guided_choice", all.emplace_back()));
  if (const json* v = sent(body, "guided_grammar")) {
    LLMESH_TRY(text_spec(*v, "guided_grammar", model::constraint_spec::kind::grammar, "a GBNF grammar", all.emplace_back()));
  }
  if (const json* v = sent(body, "structured_outputs")) LLMESH_TRY(structured_outputs(*v, all));
  if (tools) {
    if (auto t = tool_constraint(*tools)) all.push_back(std::move(*t));
  }
  if (all.empty()) return ok_status();
  if (all.size() > 1) {
    std::string names;
    for (size_t i = 0; i < all.size(); ++i) {
      const std::string name = all[i].field == "tools" || all[i].field.starts_with("tools[") ? "tool_choice" : all[i].field;
      names += (i == 0 ? "" : i + 1 == all.size() ? " and " : ", ") + field_name(name);
    }
    return bad("a request takes one output constraint; this one sends " + names);
  }
  asked& a = all.front();
  if (a.spec.text.size() > model::max_constraint_bytes) {
    return bad(field_name(a.field) + " is too long (" + std::to_string(a.spec.text.size()) + " bytes; at most " +
               std::to_string(model::max_constraint_bytes) + ")");
  }
  auto compiled = model::constraint_cache::shared().get(a.spec);  // the replica in this process finds it there
  if (!compiled) return bad(field_name(a.field) + ": " + compiled.err().message);
  out = std::move(a.spec);
  return ok_status();
}

status normalize_tool_calls(json& message, size_t index) {
  auto role = message.find("role");
  if (role == message.end() || *role != "assistant") return ok_status();
  auto calls = message.find("tool_calls");
  if (calls == message.end() || calls->is_null()) return ok_status();
  const std::string at = "messages[" + std::to_string(index) + "].tool_calls";
  if (!calls->is_array()) return bad(field_name(at) + " must be an array of tool calls");
  for (size_t i = 0; i < calls->size(); ++i) {
    json& call = (*calls)[i];
    const std::string c = at + "[" + std::to_string(i) + "]";
    if (!call.is_object()) return bad(field_name(c) + " must be an object with a 'function'");
    auto f = call.find("function");
    if (f == call.end() || !f->is_object()) return bad(field_name(c + ".function") + " must be an object with 'name' and 'arguments'");
    auto name = f->find("name");
    if (name == f->end() || !name->is_string()) return bad(field_name(c + ".function.name") + " must be a string");
    auto args = f->find("arguments");
    if (args == f->end() || !(args->is_string() || args->is_object())) {
      return bad(field_name(c + ".function.arguments") + " must be a string (JSON) or an object");
    }
    if (args->is_string()) {
      // vLLM hands templates the arguments as a mapping; text that is not a JSON object stays as sent.
      auto parsed = parse_embedded_json(args->get_ref<const std::string&>());
      if (parsed && parsed->is_object()) *args = std::move(*parsed);
    }
  }
  auto content = message.find("content");
  if (content == message.end() || content->is_null()) message["content"] = "";
  return ok_status();
}

}  // namespace llmesh::gateway
