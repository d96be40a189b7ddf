// The subcommands of `llmesh`. Each add_* declares its flags on `app` and registers the
// function that runs it.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <utility>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::cli {

using command_set = std::vector<std::pair<CLI::App*, std::function<status()>>>;

void add_generate(CLI::App& app, command_set& commands);
void add_model(CLI::App& app, command_set& commands);
void add_bench(CLI::App& app, command_set& commands);
void add_tokenize(CLI::App& app, command_set& commands);
void add_chat_template(CLI::App& app, command_set& commands);
void add_serve(CLI::App& app, command_set& commands);
void add_node(CLI::App& app, command_set& commands);
void add_ctl(CLI::App& app, command_set& commands);

/// Parses "1,2,3" (spaces allowed) into ids; errors name the bad element.
[[nodiscard]] result<std::vector<int32_t>> parse_id_list(const std::string& text);

}  // namespace llmesh::cli
