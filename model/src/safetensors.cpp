// safetensors: 8-byte little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the data;
// offsets are relative to the end of the header. Every offset and size is checked against the
// file before a pointer is formed, so a truncated or lying file is an error, never a fault.
#include "llmesh/model/safetensors.hpp"

#include "gguf_model.hpp"
#include "language_model_name.hpp"
#include "read_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <nlohmann/json.hpp>
#include <set>

namespace llmesh::model {
namespace {

using json = nlohmann::json;

// Why 100 MiB: real headers are a few hundred KiB even for 100k-tensor checkpoints; a larger
// length field means a corrupt or hostile file, and we refuse to parse it.
constexpr uint64_t max_header_bytes = 100ull << 20;

error file_error(const std::string& path, const std::string& msg) {
  return make_error(errc::invalid_request, path + ": " + msg);
}

result<kernels::dtype> parse_dtype(const std::string& s) {
  if (s == "F32") return kernels::dtype::f32;
  if (s == "F16") return kernels::dtype::f16;
  if (s == "BF16") return kernels::dtype::bf16;
  if (s == "F8_E4M3") return kernels::dtype::f8_e4m3;  // FP8 checkpoints' weights (fp8_weights.hpp)
  if (s == "F8_E5M2") return kernels::dtype::f8_e5m2;
  return make_error(errc::unsupported, "dtype " + s + " (supported: F32, F16, BF16, F8_E4M3 for FP8 checkpoints, I32/I64 for packed checkpoints' integers, U8 for MXFP4 blocks)");
}

}  // namespace

result<std::unique_ptr<mapped_file>> mapped_file::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    errc code = errno == ENOENT ? errc::not_found : errc::io_error;
    return make_error(code, "cannot open " + path + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return make_error(errc::io_error, "cannot stat " + path + ": " + std::strerror(e));
  }
  size_t size = static_cast<size_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return make_error(errc::io_error, "cannot mmap " + path + ": " + std::strerror(e));
    }
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return std::unique_ptr<mapped_file>(new mapped_file(path, data, size));
}

mapped_file::~mapped_file() {
  if (data_ != nullptr) munmap(const_cast<uint8_t*>(data_), size_);
}

status tensor_store::add_file(const std::string& path) {
  auto mapped = mapped_file::open(path);
  if (!mapped) return mapped.take_error();
  std::shared_ptr<mapped_file> file = std::move(mapped.value());
  if (file->size() < 8) return file_error(path, "truncated (no header length)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file->data()[i];
  if (header_len > max_header_bytes) return file_error(path, "header length " + std::to_string(header_len) + " is implausible");
  if (header_len > file->size() - 8) return file_error(path, "truncated (header runs past the end of the file)");
  const char* hbegin = reinterpret_cast<const char*>(file->data() + 8);
  json header = json::parse(hbegin, hbegin + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) return file_error(path, "header is not a JSON object");
  const uint8_t* data_start = file->data() + 8 + header_len;
  const size_t data_size = file->size() - 8 - header_len;

  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    if (!info.is_object() || !info.contains("dtype") || !info["dtype"].is_string() || !info.contains("shape") ||
        !info["shape"].is_array() || !info.contains("data_offsets") || !info["data_offsets"].is_array() ||
        info["data_offsets"].size() != 2) {
      return file_error(path, "malformed entry for tensor '" + name + "'");
    }
    const std::string dtype = info["dtype"].get<std::string>();
    const uint8_t int_bytes = dtype == "I32" ? 4 : dtype == "I64" ? 8 : dtype == "U8" ? 1 : 0;
    auto type = int_bytes ? result<kernels::dtype>(kernels::dtype::f32) : parse_dtype(dtype);
    if (!type) return make_error(errc::unsupported, path + ": tensor '" + name + "' has unsupported " + type.err().message);
    tensor_view t;
    t.type = *type;  // unused for integers
    t.int_bytes = int_bytes;
    const size_t element_bytes = int_bytes ? int_bytes : kernels::dtype_size(t.type);
    size_t elements = 1;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_unsigned()) return file_error(path, "tensor '" + name + "' has a bad shape");
      size_t dim = d.get<size_t>();
      if (dim != 0 && elements > (size_t{1} << 48) / dim) return file_error(path, "tensor '" + name + "' is too large");
      elements *= dim;
      t.shape.push_back(dim);
    }
    const auto& off = info["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return file_error(path, "tensor '" + name + "' has bad data_offsets");
    }
    size_t begin = off[0].get<size_t>(), end = off[1].get<size_t>();
    if (begin > end) return file_error(path, "tensor '" + name + "' has data_offsets with begin > end");
    if (end > data_size) {
      return file_error(path, "truncated: tensor '" + name + "' ends at byte " + std::to_string(end) +
                                  " of a " + std::to_string(data_size) + "-byte data section");
    }
    if (end - begin != elements * element_bytes) {
      return file_error(path, "tensor '" + name + "' holds " + std::to_string(end - begin) +
                                  " bytes, its shape and dtype need " + std::to_string(elements * element_bytes));
    }
    t.data = data_start + begin;
    t.bytes = end - begin;
    if (tensors_.count(name) != 0 || ints_.count(name) != 0) return file_error(path, "tensor '" + name + "' appears twice");
    (int_bytes ? ints_ : tensors_).emplace(name, std::move(t));
  }
  keep_.push_back(std::move(file));
  return ok_status();
}

status tensor_store::add(const std::string& name, tensor_view t, std::shared_ptr<const void> owner) {
  if (!tensors_.emplace(name, std::move(t)).second) return make_error(errc::invalid_request, "tensor '" + name + "' appears twice");
  if (keep_.empty() || keep_.back() != owner) keep_.push_back(std::move(owner));
  return ok_status();
}

status tensor_store::replace(const std::string& name, tensor_view t, std::shared_ptr<const void> owner) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return make_error(errc::not_found, "tensor '" + name + "' not found");
  it->second = std::move(t);
  if (keep_.empty() || keep_.back() != owner) keep_.push_back(std::move(owner));
  return ok_status();
}

std::optional<std::string> detail::language_model_name(std::string_view name) {
  static const std::pair<std::string_view, std::string_view> prefixes[] = {
      {"language_model.model.", "model."}, {"language_model.lm_head.", "lm_head."}, {"model.language_model.", "model."},
      {"lm_head.", "lm_head."}};
  for (const auto& [from, to] : prefixes) {
    if (name.starts_with(from)) return std::string(to) + std::string(name.substr(from.size()));
  }
  return std::nullopt;
}

status tensor_store::take_language_model() {
  size_t taken = 0;
  for (auto* m : {&tensors_, &ints_}) {
    std::map<std::string, tensor_view> kept;
    for (auto& [name, t] : *m) {
      auto renamed = detail::language_model_name(name);
      if (!renamed) continue;
      if (!kept.emplace(*renamed, std::move(t)).second) {
        return make_error(errc::invalid_request, "tensor '" + name + "': its language model's name '" + *renamed + "' is taken twice");
      }
      ++taken;
    }
    *m = std::move(kept);  // the vision tower's and the projector's tensors are let go
  }
  if (taken == 0) {
    return make_error(errc::invalid_request, "no language model tensors (language_model.model.*, model.language_model.*) in a multimodal checkpoint");
  }
  return ok_status();
}

result<tensor_store> tensor_store::open(const std::string& dir) {
  if (is_gguf_file(dir)) return gguf_tensor_store(dir);
  tensor_store store;
  std::string index_path = dir + "/model.safetensors.index.json";
  auto index_text = read_text_file(index_path);
  if (!index_text) {
    std::string single = dir + "/model.safetensors";
    if (access(single.c_str(), F_OK) != 0) {
      return make_error(errc::not_found, dir + ": no model.safetensors or model.safetensors.index.json");
    }
    LLMESH_TRY(store.add_file(single));
    return store;
  }
  json index = json::parse(*index_text, nullptr, false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return file_error(index_path, "missing or malformed 'weight_map'");
  }
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) return file_error(index_path, "weight_map entry for '" + name + "' is not a file name");
    std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      return file_error(index_path, "shard file name '" + f + "' must be a plain file name");
    }
    shards.insert(f);
  }
  for (const auto& f : shards) LLMESH_TRY(store.add_file(dir + "/" + f));
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!store.contains(name) && !store.contains_integers(name)) {
      return file_error(index_path, "tensor '" + name + "' is not in " + file.get<std::string>());
    }
  }
  return store;
}

result<tensor_view> tensor_store::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    if (ints_.count(name) != 0) return make_error(errc::invalid_request, "tensor '" + name + "' holds integers, not a float tensor");
    return make_error(errc::not_found, "missing tensor '" + name + "'");
  }
  return it->second;
}

result<tensor_view> tensor_store::get_i32(const std::string& name) const {
  auto it = ints_.find(name);
  if (it == ints_.end()) return make_error(errc::not_found, "missing int32 tensor '" + name + "'");
  if (it->second.int_bytes != 4) {
    return make_error(errc::invalid_request, "tensor '" + name + "' is " + (it->second.int_bytes == 8 ? "int64" : "uint8") + ", not int32");
  }
  return it->second;
}

result<tensor_view> tensor_store::get_u8(const std::string& name) const {
  auto it = ints_.find(name);
  if (it == ints_.end()) return make_error(errc::not_found, "missing uint8 tensor '" + name + "'");
  if (it->second.int_bytes != 1) return make_error(errc::invalid_request, "tensor '" + name + "' is not uint8 (U8)");
  return it->second;
}

result<std::vector<int64_t>> tensor_store::integers(const std::string& name) const {
  auto it = ints_.find(name);
  if (it == ints_.end()) return make_error(errc::not_found, "missing integer tensor '" + name + "'");
  const auto& t = it->second;
  std::vector<int64_t> out(t.bytes / t.int_bytes);
  for (size_t i = 0; i < out.size(); ++i) {
    const auto* p = static_cast<const uint8_t*>(t.data) + i * t.int_bytes;
    if (t.int_bytes == 8) {
      std::memcpy(&out[i], p, 8);
    } else if (t.int_bytes == 1) {
      out[i] = p[0];
    } else {
      int32_t v;
      std::memcpy(&v, p, 4);
      out[i] = v;
    }
  }
  return out;
}

}  // namespace llmesh::model
