// Private: whole-file reads for the small JSON files of a model directory.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "llmesh/common/error.hpp"

namespace llmesh::model {

/// The file's bytes, or not_found naming the path.
inline result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(errc::not_found, "cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace llmesh::model
