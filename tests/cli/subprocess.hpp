// Test helper: runs a shell command, capturing stdout and stderr separately.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace llmesh::testing {

struct command_result {
  int exit_code = -1;
  std::string out, err;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Runs `cmd` through /bin/sh; stderr goes to a temporary file that is read back.
inline command_result run_command(const std::string& cmd) {
  char tmpl[] = "/tmp/llmesh_stderr_XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd >= 0) close(fd);
  command_result r;
  FILE* p = popen((cmd + " 2>" + tmpl).c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.err = read_file(tmpl);
  std::filesystem::remove(tmpl);
  return r;
}

/// A directory under /tmp removed with everything in it at scope exit.
class temp_dir {
 public:
  temp_dir() {
    char tmpl[] = "/tmp/llmesh_cli_test_XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~temp_dir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace llmesh::testing
