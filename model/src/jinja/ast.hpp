// Private: the syntax tree of the Jinja subset used by chat templates (see chat_template.hpp).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace llmesh::model::jinja {

using json = nlohmann::ordered_json;

struct expr;
using expr_ptr = std::unique_ptr<expr>;

/// An expression node. `kind` selects which fields are meaningful.
struct expr {
  enum class kind {
    literal,    ///< value
    name,       ///< text
    list,       ///< args
    dict,       ///< args as key, value pairs
    attr,       ///< a.text
    index,      ///< a[b]
    slice,      ///< a[b:c:d] (null children = omitted)
    call,       ///< a(args, kwargs)
    filter,     ///< a | text(args, kwargs)
    test,       ///< a is [not] text(args)  (negate)
    unary,      ///< text a  ("not", "-", "+")
    binary,     ///< a text b
    ternary,    ///< b if a else c
  } type = kind::literal;
  json value;
  std::string text;
  bool negate = false;
  expr_ptr a, b, c, d;
  std::vector<expr_ptr> args;
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
};

struct node;
using node_list = std::vector<std::unique_ptr<node>>;

/// A template statement.
struct node {
  enum class kind { text, output, if_, for_, set, macro } type = kind::text;
  std::string text;                  ///< text: the literal text; macro: its name
  expr_ptr value;                    ///< output / set: the value; for: the iterable
  std::vector<std::pair<expr_ptr, node_list>> branches;  ///< if: (condition or null for else, body)
  std::vector<std::string> targets;  ///< for: loop variables; set: name (and attribute, "ns.attr"); macro: parameters
  std::vector<expr_ptr> defaults;    ///< macro: each parameter's default (null: none)
  expr_ptr filter;                   ///< for: optional "if" filter
  node_list body, else_body;         ///< for; macro: body
};

}  // namespace llmesh::model::jinja
