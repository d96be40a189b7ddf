// llmesh: the one binary. Parses flags, calls a library, maps errors to a one-line message
// and a non-zero exit. Subcommands live in their own files (cmd_*.cpp).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>
#include <exception>

#include "commands.hpp"
#include "vllm_flags.hpp"
#include "llmesh/gateway/version.hpp"

int main(int argc, char** argv) {
  CLI::App app{"llmesh: an actor-based serving mesh for large language models", "llmesh"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(llmesh::gateway::version()));
  llmesh::cli::command_set commands;
  llmesh::cli::add_generate(app, commands);
  llmesh::cli::add_model(app, commands);
  llmesh::cli::add_bench(app, commands);
  llmesh::cli::add_tokenize(app, commands);
  llmesh::cli::add_chat_template(app, commands);
  llmesh::cli::add_serve(app, commands);
  llmesh::cli::add_node(app, commands);
  llmesh::cli::add_ctl(app, commands);
  if (argc > 1 && argv[1][0] != '-') {  // name an unknown command rather than "subcommand required"
    bool known = false;
    for (const auto* sub : app.get_subcommands({})) known = known || sub->get_name() == argv[1];
    if (!known) {
      std::fprintf(stderr, "llmesh: error: unknown command '%s' (see --help)\n", argv[1]);
      return 2;
    }
  }
  // vLLM's --config FILE on serve: its flags ahead of the command line's.
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args.front() == "serve") {
    auto expanded = llmesh::cli::expand_config_file(std::move(args));
    if (!expanded) {
      std::fprintf(stderr, "llmesh: error: %s\n", expanded.err().message.c_str());
      return 2;
    }
    args = std::move(*expanded);
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector last argument first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {  // bad flags: one line naming the problem (DESIGN.md §4)
    std::fprintf(stderr, "llmesh: error: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    for (auto& [sub, run] : commands) {
      if (sub->parsed()) {
        llmesh::status s = run();
        if (!s) {
          std::fprintf(stderr, "llmesh: error: %s\n", s.err().message.c_str());
          return 1;
        }
        return 0;
      }
    }
  } catch (const std::exception& e) {  // a bug: report it in one line, not a stack trace
    std::fprintf(stderr, "llmesh: internal error: %s\n", e.what());
    return 70;
  }
  return 2;
}
