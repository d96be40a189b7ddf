// Read-only, zero-copy access to the tensors of an HF model directory: one model.safetensors
// or several shards listed by model.safetensors.index.json, each memory-mapped once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "llmesh/common/error.hpp"
#include "llmesh/kernels/dtype.hpp"

namespace llmesh::model {

/// A read-only memory mapping of a whole file. Movable, unmaps on destruction.
class mapped_file {
 public:
  static result<std::unique_ptr<mapped_file>> open(const std::string& path);
  ~mapped_file();
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  mapped_file(std::string path, const uint8_t* data, size_t size) : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

/// A tensor inside a mapped file: dtype, shape and a pointer into the mapping (not aligned).
struct tensor_view {
  kernels::dtype type = kernels::dtype::f32;
  std::vector<size_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;
  uint8_t int_bytes = 0;  ///< an integer tensor's element size (1: U8, 4: I32, 8: I64; `type` unused); 0: a float tensor
  size_t elements() const {
    size_t n = 1;
    for (size_t d : shape) n *= d;
    return n;
  }
};

/// A shape as error messages spell it: "[4096, 11008]".
inline std::string shape_string(const std::vector<size_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// All tensors of a model directory by name. Keeps its files mapped while it lives.
class tensor_store {
 public:
  /// Opens DIR/model.safetensors, or the shards named by DIR/model.safetensors.index.json, or,
  /// when `model_dir` is a GGUF file, its tensors under their HF names (gguf_model.hpp).
  /// Errors name the file and the problem (missing, truncated, bad header, unknown dtype).
  static result<tensor_store> open(const std::string& model_dir);

  /// Parses one safetensors file's header and adds its tensors.
  status add_file(const std::string& path);

  /// Adds a tensor whose bytes `owner` keeps alive (a GGUF file's mapping, or a converted
  /// copy); a name already present is invalid_request.
  status add(const std::string& name, tensor_view t, std::shared_ptr<const void> owner);

  /// Puts `t` (whose bytes `owner` keeps alive) in place of the tensor `name` (an FP8
  /// checkpoint's weight in the kernels' fp8 blocks); not_found when there is none.
  status replace(const std::string& name, tensor_view t, std::shared_ptr<const void> owner);

  /// A multimodal checkpoint's language model under a causal LM's names:
  /// language_model.model.X and model.language_model.X as model.X, language_model.lm_head.X
  /// as lm_head.X (lm_head.X as it is); every other tensor (the vision tower, the projector) is
  /// dropped. invalid_request when there is none, or two take one name.
  status take_language_model();

  /// The tensor, or not_found naming it.
  result<tensor_view> get(const std::string& name) const;
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }

  /// An int32 tensor ("I32": AWQ's, GPTQ's and compressed-tensors' packed quants and zeros,
  /// g_idx; integer tensors are kept apart from the float ones get() returns), or not_found
  /// naming it; invalid_request for an I64 one.
  result<tensor_view> get_i32(const std::string& name) const;
  /// A uint8 tensor ("U8": an MXFP4 checkpoint's blocks and exponents), or not_found naming it.
  result<tensor_view> get_u8(const std::string& name) const;
  /// An integer tensor's (I32 or I64) elements, or not_found naming it (small tensors:
  /// compressed-tensors' weight_shape).
  result<std::vector<int64_t>> integers(const std::string& name) const;
  bool contains_integers(const std::string& name) const { return ints_.count(name) != 0; }
  /// Every integer tensor's name, in order.
  std::vector<std::string> integer_names() const {
    std::vector<std::string> out;
    for (const auto& [n, t] : ints_) out.push_back(n);
    return out;
  }
  /// Every tensor's name, in order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& [n, t] : tensors_) out.push_back(n);
    return out;
  }
  size_t size() const { return tensors_.size(); }

 private:
  std::vector<std::shared_ptr<const void>> keep_;  ///< the mappings and copies the views point into
  std::map<std::string, tensor_view> tensors_;
  std::map<std::string, tensor_view> ints_;  ///< I32 and I64 tensors
};

}  // namespace llmesh::model
