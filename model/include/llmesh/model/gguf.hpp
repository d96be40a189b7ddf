// GGUF, llama.cpp's single-file model format: the header, the metadata and the tensor
// directory of a read-only mapping, every length, count and offset checked against the file
// before it is used, so a truncated or lying file is an error naming the problem, never a fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "llmesh/common/error.hpp"

namespace llmesh::model {

/// One metadata value. `type` is GGUF's code: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32,
/// 7 bool, 8 string, 9 array, 10 u64, 11 i64, 12 f64. Integers are held in `u` (unsigned) or
/// `i` (signed), floats in `f`, bools in `u`, strings in `s`, arrays in `items` (all of
/// `item_type`).
struct gguf_value {
  uint32_t type = 0;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string s;
  uint32_t item_type = 0;
  std::vector<gguf_value> items;

  bool is_string() const { return type == 8; }
  bool is_array() const { return type == 9; }
  bool is_float() const { return type == 6 || type == 12; }
  bool is_bool() const { return type == 7; }
  bool is_integer() const { return type <= 5 || type == 10 || type == 11; }
  /// The value as a non-negative integer, when it is one (an integer type, or a bool).
  bool as_uint(uint64_t& out) const;
  /// The value as a number, when it is an integer or a float.
  bool as_double(double& out) const;
};

/// ggml's tensor type codes (ggml.h) that llmesh can load.
namespace ggml {
inline constexpr uint32_t f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q2_k = 10, q3_k = 11,
                          q4_k = 12, q5_k = 13, q6_k = 14, iq4_nl = 20, iq4_xs = 23, bf16 = 30, mxfp4 = 39;
/// Elements and bytes per block of a type; {0, 0} for a type llmesh does not read.
struct block_info {
  size_t elements = 0, bytes = 0;
};
block_info block(uint32_t type);
/// ggml's name of a type code ("Q4_K"), or "type N" for one llmesh does not know.
std::string type_name(uint32_t type);
}  // namespace ggml

/// A tensor of the file: ggml's dims (dims[0] the innermost, contiguous one: a matrix of HF
/// shape [out, in] has dims {in, out}) and its bytes in the mapping.
struct gguf_tensor {
  std::string name;
  uint32_t type = 0;
  std::vector<uint64_t> dims;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  uint64_t elements() const {
    uint64_t n = 1;
    for (auto d : dims) n *= d;
    return n;
  }
};

class gguf_file {
 public:
  /// Maps and parses `path`: GGUF versions 2 and 3 (little-endian). Every tensor's type must be
  /// one block() knows, its first dimension whole blocks, its data inside the file and aligned
  /// to general.alignment (default 32).
  [[nodiscard]] static result<std::shared_ptr<const gguf_file>> open(const std::string& path);
  /// The same over bytes already in memory (`path` names them in errors); `keep` owns them.
  [[nodiscard]] static result<std::shared_ptr<const gguf_file>> parse(const std::string& path, const uint8_t* data,
                                                                       size_t size, std::shared_ptr<const void> keep);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const gguf_value* find(std::string_view key) const;
  const std::map<std::string, gguf_value, std::less<>>& metadata() const { return kv_; }
  const std::vector<gguf_tensor>& tensors() const { return tensors_; }
  const gguf_tensor* tensor(std::string_view name) const;

 private:
  gguf_file() = default;
  std::string path_;
  uint32_t version_ = 0;
  std::shared_ptr<const void> keep_;
  std::map<std::string, gguf_value, std::less<>> kv_;
  std::vector<gguf_tensor> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;
};

/// Whether `path` is a regular file that starts with GGUF's magic ("GGUF"): how a --model that
/// names a .gguf file instead of an HF directory is told apart.
bool is_gguf_file(const std::string& path);

}  // namespace llmesh::model
