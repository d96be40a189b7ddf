// Test helpers for the server: child processes with their stderr collected; `llmesh serve`
// on 127.0.0.1 with a port chosen at run time (it prints the port it got), stopped with SIGTERM
// (SIGKILL if it does not exit); free ports; and a
// blocking HTTP/1.1 client on raw sockets — raw, so tests can also send malformed requests,
// oversized headers and half-written bodies, and hang up mid-stream.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "../free_port.hpp"

namespace llmesh::testing {

/// A child process (argv[0] is the binary) whose stderr is collected; SIGTERM (then SIGKILL)
/// when destroyed. It never outlives the test (SIGKILL when the test process dies).
class child_process {
 public:
  explicit child_process(std::vector<std::string> argv) {
    int err_pipe[2];
    if (pipe(err_pipe) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(err_pipe[1], 2);
      close(err_pipe[0]);
      close(err_pipe[1]);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(argv[0].c_str(), args.data());
      _exit(127);
    }
    close(err_pipe[1]);
    err_fd_ = err_pipe[0];
  }
  ~child_process() { stop(std::chrono::seconds(20)); }
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  pid_t pid() const { return pid_; }
  /// stderr so far.
  const std::string& log() {
    while (read_some(0)) {
    }
    return log_;
  }
  /// Waits (up to `patience`) until stderr contains `text`; false if it never did (or the
  /// process closed stderr first).
  bool wait_for(const std::string& text, std::chrono::seconds patience = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (log_.find(text) == std::string::npos) {
      if (std::chrono::steady_clock::now() > deadline || !read_some(200)) return log_.find(text) != std::string::npos;
    }
    return true;
  }
  void pause() { kill(pid_, SIGSTOP); }
  void resume() { kill(pid_, SIGCONT); }
  /// SIGKILL: the process dies as in a crash (no goodbye to anyone).
  void crash() {
    if (pid_ > 0) kill(pid_, SIGKILL);
  }
  /// SIGTERM, then wait (SIGKILL after `patience`); the exit status, or 128 + the signal.
  int stop(std::chrono::seconds patience = std::chrono::seconds(20)) {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + patience;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      read_some(10);
    }
    log();
    pid_ = -1;
    if (err_fd_ >= 0) close(err_fd_);
    err_fd_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  /// Reads what stderr has within timeout_ms; false at EOF or when nothing came.
  bool read_some(int timeout_ms) {
    if (err_fd_ < 0) return false;
    pollfd p{err_fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return timeout_ms > 0;  // nothing yet: keep waiting
    char buf[4096];
    const ssize_t n = read(err_fd_, buf, sizeof buf);
    if (n <= 0) return false;
    log_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int err_fd_ = -1;
  std::string log_;
};

/// A running `llmesh serve`; stopped (SIGTERM, then SIGKILL after 20 s) when destroyed.
class server_process : public child_process {
 public:
  /// Starts `binary serve <args> --http 127.0.0.1:0 --rpc 127.0.0.1:0` and waits (up to 60 s) for its
  /// "serving ... on http://127.0.0.1:PORT" line (https:// with --ssl-certfile) and the line after
  /// it. port() is 0 when it failed; log() says why.
  server_process(const std::string& binary, const std::vector<std::string>& args) : child_process(argv(binary, args)) {
    if (wait_for("llmesh: try: curl ")) {
      for (const char* on : {"on http://127.0.0.1:", "on https://127.0.0.1:"}) {
        if (const auto at = log().find(on); at != std::string::npos) port_ = std::atoi(log().c_str() + at + std::strlen(on));
      }
    }
  }
  int port() const { return port_; }

 private:
  static std::vector<std::string> argv(const std::string& binary, const std::vector<std::string>& args) {
    std::vector<std::string> all{binary, "serve"};
    all.insert(all.end(), args.begin(), args.end());
    all.push_back("--http");
    all.push_back("127.0.0.1:0");
    if (std::find(args.begin(), args.end(), "--rpc") == args.end()) {
      all.push_back("--rpc");  // any free port: tests run side by side
      all.push_back("127.0.0.1:0");
    }
    return all;
  }
  int port_ = 0;
};


struct http_response {
  int status = 0;  ///< 0: no response (connection failed or closed early)
  std::map<std::string, std::string> headers;  ///< names lower-cased
  std::string body;  ///< de-chunked
};

/// A connected TCP socket to 127.0.0.1:port (-1 on failure).
inline int connect_local(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

/// Reads until the peer closes (or timeout_s passes without data).
inline std::string read_all(int fd, int timeout_s = 60) {
  std::string out;
  char buf[8192];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, timeout_s * 1000) <= 0) break;
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

/// Parses one whole HTTP response (status line, headers, body by Content-Length or chunked).
inline http_response parse_response(const std::string& raw) {
  http_response r;
  const auto end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || end == std::string::npos) return r;
  r.status = std::atoi(raw.c_str() + 9);
  size_t line = raw.find("\r\n") + 2;
  while (line < end) {
    const size_t next = raw.find("\r\n", line);
    const std::string h = raw.substr(line, next - line);
    const auto colon = h.find(':');
    std::string name = h.substr(0, colon);
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string value = colon == std::string::npos ? "" : h.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    r.headers[name] = value;
    line = next + 2;
  }
  std::string body = raw.substr(end + 4);
  if (r.headers["transfer-encoding"] == "chunked") {
    size_t pos = 0;
    while (pos < body.size()) {
      const size_t eol = body.find("\r\n", pos);
      if (eol == std::string::npos) break;
      const size_t n = std::stoul(body.substr(pos, eol - pos), nullptr, 16);
      if (n == 0) break;
      r.body += body.substr(eol + 2, n);
      pos = eol + 2 + n + 2;
    }
  } else {
    r.body = body;
  }
  return r;
}

/// One request on its own connection ("Connection: close"); extra_headers are "Name: value\r\n" lines.
inline http_response http_request(int port, const std::string& method, const std::string& path,
                                  const std::string& body = "", const std::string& extra_headers = "") {
  int fd = connect_local(port);
  if (fd < 0) return {};
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
  if (!body.empty() || method == "POST") {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n" + body;
  http_response r;
  if (send_all(fd, req)) r = parse_response(read_all(fd));
  close(fd);
  return r;
}

/// The JSON payloads of an SSE body ("data: X\n\n" events), in order.
inline std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end == std::string::npos ? body.size() : end + 2;
  }
  return out;
}

}  // namespace llmesh::testing
