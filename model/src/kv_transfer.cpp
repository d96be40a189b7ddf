// KV transfer (disaggregated prefill): whole KV blocks copied out of one engine's cache and
// into another's, in a layout that does not depend on how the heads are split over ranks:
// per block, [layer][keys, values][position][the model's KV heads][head_dim] elements of the
// cache's type. Each rank copies its own heads; where ranks replicate a KV head (more ranks
// than KV heads) they hold the same values, so whichever writes last writes the same bytes.
#include <cstring>

#include "llmesh/model/engine.hpp"
#include "llmesh/model/shard_executor.hpp"

namespace llmesh::model {
status step_executor::kv_copy_out(std::span<const int32_t>, std::span<std::byte>) const {
  return make_error(errc::unsupported, "this backend cannot copy KV blocks out");
}

status step_executor::kv_copy_in(std::span<const int32_t>, std::span<const std::byte>) {
  return make_error(errc::unsupported, "this backend cannot copy KV blocks in");
}

namespace {

/// Calls visit(layer, kind, cache offset, data offset) in bytes for every position row of
/// `blocks` (kind 0: keys, 1: values); a row is this rank's heads of one position.
template <class Visit>
void for_each_row(const model_config& c, const shard_layout& l, size_t bs, size_t es, std::span<const int32_t> blocks,
                  Visit visit) {
  const size_t hd = c.head_dim, row = l.n_kv_heads * hd * es;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const size_t block = static_cast<size_t>(blocks[i]);
    for (size_t layer = 0; layer < c.n_layers; ++layer) {
      for (int kind = 0; kind < 2; ++kind) {
        for (size_t p = 0; p < bs; ++p) {
          const size_t theirs = ((((i * c.n_layers + layer) * 2 + static_cast<size_t>(kind)) * bs + p) * c.n_kv_heads + l.kv_head0) * hd * es;
          visit(layer, kind, (block * bs + p) * row, theirs, row);
        }
      }
    }
  }
}

}  // namespace

status shard_executor::kv_copy_out(std::span<const int32_t> blocks, std::span<std::byte> data) const {
  for_each_row(model_->config(), layout_, kv_.block_size, kernels::dtype_size(kv_.type), blocks,
               [&](size_t layer, int kind, size_t mine, size_t theirs, size_t n) {
                 std::memcpy(data.data() + theirs, (kind == 0 ? keys_ : values_)[layer].data() + mine, n);
               });
  return ok_status();
}

status shard_executor::kv_copy_in(std::span<const int32_t> blocks, std::span<const std::byte> data) {
  for_each_row(model_->config(), layout_, kv_.block_size, kernels::dtype_size(kv_.type), blocks,
               [&](size_t layer, int kind, size_t mine, size_t theirs, size_t n) {
                 std::memcpy((kind == 0 ? keys_ : values_)[layer].data() + mine, data.data() + theirs, n);
               });
  return ok_status();
}

size_t engine::kv_block_bytes() const {
  const auto& c = model_->config();
  return c.n_layers * 2 * kv_.block_size * c.n_kv_heads * c.head_dim * kernels::dtype_size(kv_.type);
}

namespace {

status check_blocks(std::span<const int32_t> blocks, size_t n_blocks) {
  for (int32_t b : blocks) {
    if (b < 0 || static_cast<size_t>(b) >= n_blocks) {
      return make_error(errc::invalid_request, "KV transfer: block id " + std::to_string(b) + " out of range");
    }
  }
  return ok_status();
}

}  // namespace

result<std::vector<std::byte>> engine::export_kv(std::span<const int32_t> blocks) const {
  LLMESH_TRY(all_local("KV export"));
  LLMESH_TRY(check_blocks(blocks, kv_.n_blocks));
  std::vector<std::byte> data(blocks.size() * kv_block_bytes());
  for (const auto& shard : shards_) LLMESH_TRY(shard->kv_copy_out(blocks, data));
  return data;
}

status engine::import_kv(std::span<const int32_t> blocks, std::span<const std::byte> data) {
  LLMESH_TRY(all_local("KV import"));
  LLMESH_TRY(check_blocks(blocks, kv_.n_blocks));
  if (data.size() != blocks.size() * kv_block_bytes()) {
    return make_error(errc::invalid_request, "KV import: " + std::to_string(data.size()) + " bytes for " +
                                                 std::to_string(blocks.size()) + " blocks of " +
                                                 std::to_string(kv_block_bytes()) + " bytes");
  }
  for (auto& shard : shards_) LLMESH_TRY(shard->kv_copy_in(blocks, data));
  return ok_status();
}

}  // namespace llmesh::model
