// The build's version (CMake's project version): `llmesh --version` and GET /version.
#pragma once

#include <string_view>

namespace llmesh::gateway {

std::string_view version();

}  // namespace llmesh::gateway
