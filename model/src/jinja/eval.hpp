// Private: renders a parsed Jinja subset template against a JSON context.
#pragma once

#include <string>

#include "ast.hpp"
#include "llmesh/common/error.hpp"

namespace llmesh::model::jinja {

/// Renders `nodes` with the variables of `context` (an object). Errors: raise_exception's
/// message, unknown filters/tests/functions/methods (naming them), type errors.
[[nodiscard]] result<std::string> render(const node_list& nodes, const json& context);

}  // namespace llmesh::model::jinja
