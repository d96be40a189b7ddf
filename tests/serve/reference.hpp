// The reference the server tests compare with: what `llmesh generate` (the engine run
// directly, no mesh) gives for a prompt.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "../cli/subprocess.hpp"

namespace llmesh::testing {

/// Token ids of `llmesh generate` for `prompt_flags` ("--prompt-ids 1,2,3" or "--prompt 'text'"),
/// greedy unless `sampling` says otherwise.
inline std::vector<int32_t> generate_ids(const std::string& bin, const std::string& model_dir,
                                         const std::string& prompt_flags, int max_tokens,
                                         const std::string& sampling = "--temperature 0") {
  auto r = run_command(bin + " generate --device cpu --model " + model_dir + " " + prompt_flags + " --max-tokens " +
                       std::to_string(max_tokens) + " " + sampling + " --print-ids");
  std::vector<int32_t> ids;
  std::stringstream ss(r.out.substr(0, r.out.find('\n')));
  for (int32_t id; ss >> id;) ids.push_back(id);
  return ids;
}

/// "1,2,3"
inline std::string id_list(const std::vector<int32_t>& ids) {
  std::string out;
  for (auto t : ids) {
    if (!out.empty()) out += ',';
    out += std::to_string(t);
  }
  return out;
}

}  // namespace llmesh::testing
