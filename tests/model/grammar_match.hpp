// Helpers for the constraint tests: compile a spec, and follow a string through a grammar.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <string_view>

#include "llmesh/model/constraint.hpp"
#include "llmesh/model/grammar.hpp"

namespace llmesh::model::testing {

/// Whether the whole of s is a sentence of g.
inline bool matches(const std::shared_ptr<const grammar>& g, std::string_view s) {
  grammar_matcher m(g);
  return m.accept(s) && m.accepting();
}

/// Whether s is a prefix of some sentence of g.
inline bool viable(const std::shared_ptr<const grammar>& g, std::string_view s) {
  grammar_matcher m(g);
  return m.accept(s);
}

/// The grammar of a spec; fails the test (and returns nullptr) on an error.
inline std::shared_ptr<const grammar> compile_ok(constraint_spec::kind k, const std::string& text) {
  auto g = compile_constraint({k, text});
  EXPECT_TRUE(g.ok()) << text << "\n  -> " << (g.ok() ? "" : g.err().message);
  return g.ok() ? g.value() : nullptr;
}

/// The message of a spec's error; fails the test when it compiles or the code is not invalid_request.
inline std::string compile_error(constraint_spec::kind k, const std::string& text) {
  auto g = compile_constraint({k, text});
  EXPECT_FALSE(g.ok()) << text << " compiled";
  if (g.ok()) return "";
  EXPECT_EQ(g.err().code, errc::invalid_request) << g.err().message;
  return g.err().message;
}

}  // namespace llmesh::model::testing
