// Private: template source -> syntax tree, for the Jinja subset of chat templates.
#pragma once

#include <string>

#include "ast.hpp"
#include "llmesh/common/error.hpp"

namespace llmesh::model::jinja {

/// Parses with HF's environment settings (trim_blocks, lstrip_blocks). Constructs outside the
/// subset (include, extends, block, call, filter blocks, ...) are errors naming them.
[[nodiscard]] result<node_list> parse(const std::string& source);

}  // namespace llmesh::model::jinja
