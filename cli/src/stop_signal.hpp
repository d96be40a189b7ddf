// SIGINT/SIGTERM for long-running commands (serve, node): the handler writes the signal number
// into a pipe that one thread reads (a signal mask cannot cover threads that libraries start
// before main, e.g. OpenBLAS's). One instance per process at a time.
#pragma once

#include <string>

#include "llmesh/common/error.hpp"

namespace llmesh::cli {

class stop_signal {
 public:
  /// Installs the handlers. Error when the pipe cannot be made or another instance is live.
  [[nodiscard]] static status install();
  /// Restores the default handlers and closes the pipe.
  static void uninstall();

  /// Blocks until a signal (returns its number) or wake() (returns 0).
  static int wait();
  /// Makes wait() return 0; safe from any thread.
  static void wake();
};

}  // namespace llmesh::cli
