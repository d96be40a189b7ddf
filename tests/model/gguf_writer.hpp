// Test helper: writes GGUF v3 bytes (metadata and tensors), as llama.cpp's gguf_writer.py lays
// them out, so tests can build files the parser must take or refuse.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace llmesh::model::testing {

class gguf_writer {
 public:
  void u32(const std::string& key, uint32_t v) { kv(key, 4, pod(v)); }
  void f32(const std::string& key, float v) { kv(key, 6, pod(v)); }
  void boolean(const std::string& key, bool v) { kv(key, 7, std::string(1, v ? '\1' : '\0')); }
  void str(const std::string& key, const std::string& v) { kv(key, 8, string(v)); }
  void strings(const std::string& key, const std::vector<std::string>& v) {
    std::string body = pod(uint32_t{8}) + pod(uint64_t{v.size()});
    for (const auto& s : v) body += string(s);
    kv(key, 9, body);
  }
  void i32s(const std::string& key, const std::vector<int32_t>& v) {
    std::string body = pod(uint32_t{5}) + pod(uint64_t{v.size()});
    for (int32_t x : v) body += pod(x);
    kv(key, 9, body);
  }
  void f32s(const std::string& key, const std::vector<float>& v) {
    std::string body = pod(uint32_t{6}) + pod(uint64_t{v.size()});
    for (float x : v) body += pod(x);
    kv(key, 9, body);
  }
  /// A tensor of ggml `type` with ggml dims (innermost first) and its raw bytes.
  void tensor(const std::string& name, uint32_t type, std::vector<uint64_t> dims, std::string bytes) {
    tensors_.push_back({name, type, std::move(dims), std::move(bytes)});
  }
  /// A float32 tensor.
  void tensor_f32(const std::string& name, std::vector<uint64_t> dims, const std::vector<float>& v) {
    std::string b(v.size() * 4, '\0');
    std::memcpy(b.data(), v.data(), b.size());
    tensor(name, 0, std::move(dims), std::move(b));
  }

  std::string bytes() const {
    std::string out = "GGUF" + pod(uint32_t{3}) + pod(uint64_t{tensors_.size()}) + pod(uint64_t{n_kv_});
    out += kv_;
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      out += string(t.name) + pod(static_cast<uint32_t>(t.dims.size()));
      for (auto d : t.dims) out += pod(d);
      out += pod(t.type) + pod(offset);
      offset += (t.bytes.size() + 31) / 32 * 32;
    }
    out.resize((out.size() + 31) / 32 * 32, '\0');
    for (const auto& t : tensors_) {
      out += t.bytes;
      out.resize((out.size() + 31) / 32 * 32, '\0');
    }
    return out;
  }
  void write(const std::string& path) const {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    const std::string b = bytes();
    f.write(b.data(), static_cast<std::streamsize>(b.size()));
  }

 private:
  template <class T>
  static std::string pod(T v) {
    std::string s(sizeof(T), '\0');
    std::memcpy(s.data(), &v, sizeof(T));
    return s;
  }
  static std::string string(const std::string& s) { return pod(uint64_t{s.size()}) + s; }
  void kv(const std::string& key, uint32_t type, const std::string& value) {
    kv_ += string(key) + pod(type) + value;
    ++n_kv_;
  }
  struct tensor_entry {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> dims;
    std::string bytes;
  };
  std::string kv_;
  uint64_t n_kv_ = 0;
  std::vector<tensor_entry> tensors_;
};

}  // namespace llmesh::model::testing
