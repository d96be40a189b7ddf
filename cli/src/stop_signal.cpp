// The stop signals (stop_signal.hpp).
#include "stop_signal.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

namespace llmesh::cli {
namespace {

int signal_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] auto n = write(signal_pipe[1], &b, 1);
}

}  // namespace

status stop_signal::install() {
  if (signal_pipe[0] >= 0) return make_error(errc::internal, "stop signals are already installed");
  if (pipe(signal_pipe) != 0) return make_error(errc::io_error, "cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  return ok_status();
}

void stop_signal::uninstall() {
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  for (int& fd : signal_pipe) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
}

int stop_signal::wait() {
  unsigned char b = 0;
  while (read(signal_pipe[0], &b, 1) < 0 && errno == EINTR) {
  }
  return b;
}

void stop_signal::wake() {
  const unsigned char b = 0;
  [[maybe_unused]] auto n = write(signal_pipe[1], &b, 1);
}

}  // namespace llmesh::cli
