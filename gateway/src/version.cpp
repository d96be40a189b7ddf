#include "llmesh/gateway/version.hpp"

namespace llmesh::gateway {

std::string_view version() { return LLMESH_VERSION; }  // set for this file alone (gateway/CMakeLists.txt)

}  // namespace llmesh::gateway
