// A free TCP port on 127.0.0.1, for tests that start servers on ports chosen at run time.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>

namespace llmesh::testing {

/// A free TCP port on 127.0.0.1 (bound, then released). Picked below Linux's ephemeral range
/// (32768-60999): a port the kernel chose would be free again for the kernel to give out, and
/// UCX's own listeners and every outgoing connection take ephemeral ports, so a node's port
/// was sometimes taken before the node bound it (seen in CI: "listen on ...: Device is busy").
inline int free_local_port() {
  static std::atomic<unsigned> calls{0};
  std::minstd_rand pick(static_cast<unsigned>(getpid()) * 7919u + calls++ * 104729u +
                        static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = 20000 + static_cast<int>(pick() % 12000);  // 20000-31999
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    close(fd);
    if (free) return port;
  }
  // Everything tried was busy: let the kernel choose.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

}  // namespace llmesh::testing
