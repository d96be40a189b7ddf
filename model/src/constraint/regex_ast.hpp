// The regex compiler's two halves (regex.cpp parses a pattern into this tree; regex_automaton.cpp
// turns a tree into rules through an NFA and a DFA), and what they share.
#pragma once

#include <string>
#include <vector>

#include "constraint_internal.hpp"

namespace llmesh::model::constraint_detail {

/// A parsed regex: a set of code points, a concatenation, an alternation or a counted repeat.
/// An empty concatenation is the empty string.
struct regex_node {
  enum class kind : uint8_t { set, concat, alt, repeat } type = kind::concat;
  code_point_set set;
  std::vector<regex_node> kids;  ///< concat, alt: the parts; repeat: the one repeated node
  int min = 0, max = -1;         ///< repeat: max < 0 is unbounded
};

inline regex_node set_node(code_point_set s) {
  regex_node n;
  n.type = regex_node::kind::set;
  n.set = std::move(s);
  return n;
}

inline regex_node repeat_node(regex_node x, int min, int max) {
  regex_node n;
  n.type = regex_node::kind::repeat;
  n.kids.push_back(std::move(x));
  n.min = min;
  n.max = max;
  return n;
}

/// Rules (in b) for the strings of top, written as mode says; returns the start rule. Errors
/// when the automaton passes its bounds (too complex) or matches nothing.
[[nodiscard]] result<rule_id> automaton_rules(grammar_builder& b, const regex_node& top, regex_mode mode,
                                              const std::string& name);

}  // namespace llmesh::model::constraint_detail
