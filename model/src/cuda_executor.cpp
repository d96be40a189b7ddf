// The CUDA executor (cuda_executor.hpp). A step: host metadata (token ids, positions, cache
// slots, query tiles, logit rows, block tables) goes to the device in one copy; then the layer
// loop of shard_executor.cpp runs as kernels on one stream; then token ids (argmax, or the
// device sampler, which draws the CPU's tokens) or logits come back. Pure decode steps pad the
// batch to a power-of-two bucket (padding rows have slot -1 and touch nothing) and replay a
// CUDA graph captured once per (bucket, partitions).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "cuda_weights.hpp"
#include "llmesh/kernels/cuda_ops.hpp"
#include "llmesh/kernels/device.hpp"
#include "llmesh/model/cuda_executor.hpp"

namespace llmesh::model {
namespace {

namespace cuda = kernels::cuda;
using kernels::dtype;

size_t pow2_at_least(size_t n) {
  size_t p = 1;
  while (p < n) p *= 2;
  return p;
}

/// What one step runs: counts include batch padding.
struct step_plan {
  size_t tokens = 0, tiles = 0, rows = 0, real_rows = 0, partitions = 1;
  bool decode_graph = false;
};

class cuda_executor final : public step_executor {
 public:
  cuda_executor(model_config cfg, device_weights w, shard_layout l, kv_cache_config kv, cuda_options opt,
                kernels::device_communicator* comm)
      : cfg_(std::move(cfg)), w_(std::move(w)), layout_(l), kv_(kv), opt_(opt), comm_(comm) {}

  status init() {
    auto s = cuda::stream::create();
    if (!s) return s.take_error();
    stream_ = std::move(*s);
    auto b = cuda::blas::create();
    if (!b) return b.take_error();
    blas_ = std::move(*b);
    const size_t hd = cfg_.head_dim, slots = kv_.n_blocks * kv_.block_size;
    const size_t kv_floats = slots * layout_.n_kv_heads * hd;
    for (size_t i = 0; i < cfg_.n_layers; ++i) {
      LLMESH_TRY(alloc(k_cache_.emplace_back(), kv_floats * sizeof(float)));
      LLMESH_TRY(alloc(v_cache_.emplace_back(), kv_floats * sizeof(float)));
    }
    // Rotary tables for every position the cache can hold, computed as the CPU computes them.
    const size_t half = cfg_.rope.head_dim / 2, positions = std::min(slots, cfg_.max_positions);
    std::vector<float> cs(positions * half), sn(positions * half);
    auto inv_freq = kernels::rope_inv_freq(cfg_.rope);
    const double scale = kernels::rope_scale(cfg_.rope);
    for (size_t p = 0; p < positions; ++p) kernels::rope_angles(inv_freq, p, &cs[p * half], &sn[p * half], scale);
    LLMESH_TRY(alloc(cos_, cs.size() * sizeof(float)));
    LLMESH_TRY(alloc(sin_, sn.size() * sizeof(float)));
    LLMESH_TRY(cuda::copy_to_device(cos_.get(), cs.data(), cs.size() * sizeof(float), stream_.get()));
    LLMESH_TRY(cuda::copy_to_device(sin_.get(), sn.data(), sn.size() * sizeof(float), stream_.get()));
    if (const auto& qt = cfg_.query_temperature; qt.beta != 0.0) {  // Ministral 3: the queries' scale per position
      std::vector<float> qs(positions);
      for (size_t p = 0; p < positions; ++p) qs[p] = kernels::llama4_query_scale(p, qt.beta, qt.original);
      LLMESH_TRY(alloc(q_temp_, qs.size() * sizeof(float)));
      LLMESH_TRY(cuda::copy_to_device(q_temp_.get(), qs.data(), qs.size() * sizeof(float), stream_.get()));
    }
    nv_max_ = layout_.n_vocab;
    for (int r = 0; r < layout_.tp; ++r) {
      auto peer = make_shard_layout(cfg_, r, layout_.tp, layout_.expert_parallel);
      if (!peer) return peer.take_error();
      nv_max_ = std::max(nv_max_, peer->n_vocab);
      peers_.push_back(*peer);
    }
    return stream_.synchronize();
  }

  // KV transfer (disaggregated prefill; model/src/kv_transfer.cpp has the layout): this rank's
  // heads of a block's positions are one run of block_size rows in each layer's cache, and
  // strided rows (every KV head of the model per position) in `data`: one 2-D copy each.
  status kv_copy_out(std::span<const int32_t> blocks, std::span<std::byte> data) const override {
    LLMESH_TRY(cuda::use_device(opt_.device));  // called from any thread
    LLMESH_TRY(stream_.synchronize());           // the steps that wrote them
    return kv_rows(blocks, [&](std::byte* theirs, std::byte* mine, size_t full, size_t row) {
      return cuda::copy_to_host_2d(theirs, full, mine, row, row, kv_.block_size);  // done when it returns
    }, data.data());
  }

  status kv_copy_in(std::span<const int32_t> blocks, std::span<const std::byte> data) override {
    LLMESH_TRY(cuda::use_device(opt_.device));
    // On the executor's stream (after the steps before, before the next), then waited for: a
    // copy from pageable memory may return before its data is on the device.
    LLMESH_TRY(kv_rows(blocks, [&](std::byte* theirs, std::byte* mine, size_t full, size_t row) {
      return cuda::copy_to_device_2d_async(mine, row, theirs, full, row, kv_.block_size, stream_.get());
    }, const_cast<std::byte*>(data.data())));
    return stream_.synchronize();
  }

  status forward(std::span<const step_sequence> batch, std::vector<float>& logits) override {
    step_plan p;
    LLMESH_TRY(run(batch, p));
    logits.resize(p.real_rows * cfg_.vocab);
    LLMESH_TRY(cuda::copy_to_host(logits.data(), logits_full(), logits.size() * sizeof(float), stream_.get()));
    return finish();
  }

  using step_executor::forward_sample;
  status forward_sample(std::span<const step_sequence> batch, std::span<const kernels::sample_row> rows,
                        std::vector<int32_t>& tokens, step_logprobs* logprobs) override {
    LLMESH_TRY(check_sample_rows(batch, rows.size()));
    step_plan p;
    LLMESH_TRY(run(batch, p));
    tokens.clear();
    if (logprobs) logprobs->clear();
    if (layout_.rank != 0) return finish();
    if (p.real_rows == 0) {
      LLMESH_TRY(finish());
      if (!logprobs) return ok_status();
      LLMESH_TRY(hidden_out(batch, logprobs->hidden));
      return score(batch, p, logprobs->prompt);
    }
    // Rows that ask for logprobs bring their logits back too (computed on the host, exactly as
    // the CPU executor does); the others only their ids.
    const bool want_logprobs = logprobs && kernels::any_logprobs(rows);
    std::vector<float> lp_logits;
    if (want_logprobs) {
      lp_logits.assign(rows.size() * cfg_.vocab, 0.0f);
      for (size_t r = 0; r < rows.size(); ++r) {
        if (rows[r].params.logprobs < 0) continue;
        LLMESH_TRY(cuda::copy_to_host(lp_logits.data() + r * cfg_.vocab, logits_full() + r * cfg_.vocab,
                                      cfg_.vocab * sizeof(float), stream_.get()));
      }
    }
    // Penalties and bans change the logits in place, after the logprobs' copies (stream order).
    LLMESH_TRY(adjust(rows));
    if (kernels::all_greedy(rows)) {
      LLMESH_TRY(timed("argmax", [&] { return cuda::argmax(logits_full(), p.real_rows, cfg_.vocab, ids_.as<int32_t>(), stream_.get()); }));
    } else {
      auto* args = sample_args_host_.as<cuda::device_sample_row>();
      for (size_t r = 0; r < rows.size(); ++r) {
        const auto& q = rows[r].params;
        args[r] = {q.temperature, q.top_k, q.top_p, q.min_p, q.seed, rows[r].position};
      }
      LLMESH_TRY(cuda::copy_to_device(sample_args_.get(), args, rows.size() * sizeof(cuda::device_sample_row), stream_.get()));
      LLMESH_TRY(timed("sample", [&] {
        return cuda::sample(logits_full(), p.real_rows, cfg_.vocab, sample_args_.as<cuda::device_sample_row>(), ids_.as<int32_t>(),
                            stream_.get());
      }));
    }
    LLMESH_TRY(cuda::copy_to_host(ids_host_.get(), ids_.get(), p.real_rows * sizeof(int32_t), stream_.get()));
    LLMESH_TRY(finish());
    tokens.assign(ids_host_.as<int32_t>(), ids_host_.as<int32_t>() + p.real_rows);
    if (want_logprobs) logprobs->rows = kernels::logprobs_rows(lp_logits, cfg_.vocab, rows, tokens);
    if (!logprobs) return ok_status();
    LLMESH_TRY(hidden_out(batch, logprobs->hidden));
    return score(batch, p, logprobs->prompt);
  }

  /// The hidden rows the batch wants (step_sequence::hidden): the final norm's rows in xn_,
  /// [tokens][hidden] (a step with such a sequence is never a padded decode graph's).
  /// REQUIRES: the step finished.
  status hidden_out(std::span<const step_sequence> batch, std::vector<float>& out) {
    size_t n = 0;
    for (const auto& s : batch) n += hidden_row_count(s);
    out.resize(n * cfg_.hidden);
    if (n == 0) return ok_status();
    size_t t = 0, row = 0;
    for (const auto& s : batch) {
      const size_t k = hidden_row_count(s);
      if (k > 0) {
        const float* from = xn_.as<float>() + (t + hidden_row_first(s)) * cfg_.hidden;
        LLMESH_TRY(cuda::copy_to_host(out.data() + row * cfg_.hidden, from, k * cfg_.hidden * sizeof(float), stream_.get()));
      }
      row += k;
      t += s.tokens.size();
    }
    return stream_.synchronize();
  }

  /// The scored positions' log-probabilities (step_sequence::prompt_logprobs): their logits
  /// rows follow the drawn rows (run() put them there); they come back in blocks and are
  /// computed on the host, as the CPU executor computes them. REQUIRES: the step finished.
  status score(std::span<const step_sequence> batch, const step_plan& p, std::vector<kernels::token_logprobs>& out) {
    out.clear();
    std::vector<std::pair<int32_t, int>> rows_to_score;  // (target, alternatives) per scored row
    for (const auto& s : batch) {
      const size_t k = scored_positions(s);
      for (size_t i = 0; i < k; ++i) rows_to_score.emplace_back(scored_target(s, i), s.prompt_logprobs);
    }
    // Most steps score nothing (decode rows are padded, so the row counts cannot tell).
    if (rows_to_score.empty()) return ok_status();
    constexpr size_t block = 32;
    std::vector<float> host(block * cfg_.vocab);
    for (size_t b = 0; b < rows_to_score.size(); b += block) {
      const size_t n = std::min(block, rows_to_score.size() - b);
      LLMESH_TRY(cuda::copy_to_host(host.data(), logits_full() + (p.real_rows + b) * cfg_.vocab, n * cfg_.vocab * sizeof(float),
                                    stream_.get()));
      LLMESH_TRY(stream_.synchronize());
      for (size_t r = 0; r < n; ++r) {
        out.push_back(kernels::compute_logprobs(std::span<const float>(host).subspan(r * cfg_.vocab, cfg_.vocab),
                                                rows_to_score[b + r].first, rows_to_score[b + r].second));
      }
    }
    return ok_status();
  }

  const shard_layout& layout() const override { return layout_; }

  /// kernels::apply_adjust for every row that needs it, on the device: its biases, its seen
  /// tokens' penalties, then its bans, one launch each (an id may be in several), then the
  /// grammar masks as bitmasks (one word per 32 ids a masked row).
  status adjust(std::span<const kernels::sample_row> rows) {
    std::vector<cuda::device_adjust> biases, penalties, bans;
    std::vector<uint32_t> masks, mask_rows;  // [masked row][words], and each one's logits row
    const size_t words = cuda::mask_words(cfg_.vocab);
    for (size_t r = 0; r < rows.size(); ++r) {
      if (!kernels::row_adjusts(rows[r])) continue;
      const auto& p = rows[r].params;
      const auto row = static_cast<uint32_t>(r);
      if (kernels::has_penalties(p)) {
        for (const auto& s : rows[r].adjust->seen) {
          penalties.push_back({row, s.id, s.count, 0, p.presence_penalty, p.frequency_penalty, p.repetition_penalty, 0});
        }
      }
      for (int32_t id : rows[r].adjust->banned) bans.push_back({row, id, 0, 1, 0.0f, 0.0f, 1.0f, 0});
      // A grammar's mask, as apply_adjust reads it: words past its end allow nothing.
      if (const auto allowed = rows[r].adjust->allowed; !allowed.empty()) {
        const size_t at = masks.size();
        masks.resize(at + words, 0u);
        std::copy_n(allowed.begin(), std::min(words, allowed.size()), masks.begin() + static_cast<std::ptrdiff_t>(at));
        mask_rows.push_back(row);
      }
      for (const auto& b : rows[r].adjust->bias) biases.push_back({row, b.id, 0, 2, b.bias, 0.0f, 1.0f, 0});
    }
    const size_t n_bias = biases.size(), n_pen = penalties.size(), n = n_bias + n_pen + bans.size();
    if (n == 0 && mask_rows.empty()) return ok_status();
    biases.insert(biases.end(), penalties.begin(), penalties.end());
    biases.insert(biases.end(), bans.begin(), bans.end());
    // One upload: the entries, then the masks, then their rows (all 4-byte aligned).
    const size_t entry_bytes = n * sizeof(cuda::device_adjust), mask_bytes = masks.size() * sizeof(uint32_t);
    const size_t bytes = entry_bytes + mask_bytes + mask_rows.size() * sizeof(uint32_t);
    if (adjust_bytes_ < bytes) {
      auto b = cuda::buffer::device(bytes);
      if (!b) return b.take_error();
      adjust_ = std::move(*b);
      adjust_bytes_ = bytes;
    }
    auto* entries = adjust_.as<cuda::device_adjust>();
    auto* dev_masks = reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(adjust_.get()) + entry_bytes);
    auto* dev_rows = dev_masks + masks.size();
    if (n > 0) LLMESH_TRY(cuda::copy_to_device(entries, biases.data(), entry_bytes, stream_.get()));
    if (!mask_rows.empty()) {
      LLMESH_TRY(cuda::copy_to_device(dev_masks, masks.data(), mask_bytes, stream_.get()));
      LLMESH_TRY(cuda::copy_to_device(dev_rows, mask_rows.data(), mask_rows.size() * sizeof(uint32_t), stream_.get()));
    }
    LLMESH_TRY(cuda::adjust_logits(logits_full(), cfg_.vocab, entries, n_bias, stream_.get()));
    LLMESH_TRY(timed("adjust", [&] { return cuda::adjust_logits(logits_full(), cfg_.vocab, entries + n_bias, n_pen, stream_.get()); }));
    LLMESH_TRY(cuda::adjust_logits(logits_full(), cfg_.vocab, entries + n_bias + n_pen, bans.size(), stream_.get()));
    return cuda::mask_logits(logits_full(), cfg_.vocab, dev_masks, dev_rows, mask_rows.size(), stream_.get());
  }

  std::string profile_report() const override {
    std::string out;
    double total = 0;
    for (const auto& [name, t] : profile_) total += t.first;
    char line[160];
    for (const auto& [name, t] : profile_) {
      std::snprintf(line, sizeof line, "  %-22s %6zu calls %9.3f ms %8.1f us/call %5.1f%%\n", name.c_str(), t.second,
                    t.first, 1e3 * t.first / static_cast<double>(t.second), 100.0 * t.first / total);
      out += line;
    }
    std::snprintf(line, sizeof line, "  %-22s %22.3f ms\n", "total (device)", total);
    return out + line;
  }

  void profile_reset() override { profile_.clear(); }

 private:
  /// Runs one op; with opt_.profile (and outside graph capture) times it with events.
  template <class F>
  status timed(const std::string& name, F&& f) {
    if (!opt_.profile) return f();
    auto t = cuda::event_timer::create();
    if (!t) return t.take_error();
    LLMESH_TRY(t->start(stream_.get()));
    LLMESH_TRY(f());
    LLMESH_TRY(t->stop(stream_.get()));
    pending_.push_back({name, std::move(*t)});
    return ok_status();
  }

  static status alloc(cuda::buffer& b, size_t bytes) {
    auto r = cuda::buffer::device(bytes);
    if (!r) return r.take_error();
    b = std::move(*r);
    return ok_status();
  }

  float* logits_full() const { return layout_.tp > 1 ? gathered_.as<float>() : logits_.as<float>(); }

  status finish() {
    if (comm_ && layout_.tp > 1) LLMESH_TRY(comm_->wait(stream_.get()));
    else LLMESH_TRY(stream_.synchronize());
    for (auto& [name, t] : pending_) {
      auto ms = t.elapsed_ms();
      if (!ms) return ms.take_error();
      auto& acc = profile_[name];
      acc.first += *ms;
      acc.second += 1;
    }
    pending_.clear();
    return ok_status();
  }

  // Metadata offsets (int32 elements) for a token capacity; block tables come last.
  size_t off_tokens() const { return 0; }
  size_t off_pos() const { return cap_; }
  size_t off_slot() const { return 2 * cap_; }
  size_t off_bt() const { return 3 * cap_; }
  size_t off_tile0() const { return 4 * cap_; }
  size_t off_tile_rows() const { return 5 * cap_; }
  size_t off_tile_partial() const { return 6 * cap_; }
  size_t off_rows() const { return 7 * cap_; }
  size_t off_tables() const { return 8 * cap_; }

  /// Grows step buffers to hold `tokens` rows, `table_ints` block-table entries and
  /// attention partials for `singles` one-row tiles over `partitions` partitions. Growing
  /// invalidates captured graphs.
  status reserve(size_t tokens, size_t table_ints, size_t partitions, size_t singles) {
    const bool grow_tokens = tokens > cap_, grow_tables = table_ints > cap_tables_;
    const bool grow_parts = partitions > cap_parts_ || singles > cap_singles_;
    if (!grow_tokens && !grow_tables && !grow_parts) return ok_status();
    LLMESH_TRY(stream_.synchronize());
    graphs_.clear();
    if (grow_tokens) cap_ = std::max<size_t>({tokens, cap_ * 2, 64});
    if (grow_tables) cap_tables_ = std::max(table_ints, cap_tables_ * 2);
    if (grow_parts) {
      cap_parts_ = std::max(cap_parts_, pow2_at_least(partitions));
      cap_singles_ = std::max(cap_singles_, pow2_at_least(singles));
    }
    const size_t hd = cfg_.head_dim, nq = layout_.n_heads * hd, nkv = layout_.n_kv_heads * hd;
    const size_t ni = layout_.n_inter, H = cfg_.hidden, f = sizeof(float);
    if (grow_tokens || grow_tables) {
      const size_t ints = off_tables() + cap_tables_;
      LLMESH_TRY(alloc(meta_, ints * sizeof(int32_t)));
      auto pinned = cuda::buffer::pinned(ints * sizeof(int32_t));
      if (!pinned) return pinned.take_error();
      meta_host_ = std::move(*pinned);
    }
    if (grow_tokens) {
      for (auto* b : {&h_, &xn_, &proj_, &xl_}) LLMESH_TRY(alloc(*b, cap_ * H * f));
      LLMESH_TRY(alloc(q_, cap_ * nq * f));
      LLMESH_TRY(alloc(attn_, cap_ * nq * f));
      LLMESH_TRY(alloc(k_, cap_ * nkv * f));
      LLMESH_TRY(alloc(v_, cap_ * nkv * f));
      LLMESH_TRY(alloc(gate_, cap_ * std::max<size_t>(ni, 1) * f));
      LLMESH_TRY(alloc(up_, cap_ * std::max<size_t>(ni, 1) * f));
      LLMESH_TRY(alloc(scratch16_, cap_ * std::max({H, nq, ni}) * 2));
      LLMESH_TRY(alloc(logits_, cap_ * std::max<size_t>(nv_max_, 1) * f));
      if (layout_.tp > 1) {
        LLMESH_TRY(alloc(gathered_raw_, cap_ * nv_max_ * layout_.tp * f));
        LLMESH_TRY(alloc(gathered_, cap_ * cfg_.vocab * f));
      }
      LLMESH_TRY(alloc(ids_, cap_ * sizeof(int32_t)));
      auto pinned = cuda::buffer::pinned(cap_ * sizeof(int32_t));
      if (!pinned) return pinned.take_error();
      ids_host_ = std::move(*pinned);
      LLMESH_TRY(alloc(sample_args_, cap_ * sizeof(cuda::device_sample_row)));
      auto pinned_args = cuda::buffer::pinned(cap_ * sizeof(cuda::device_sample_row));
      if (!pinned_args) return pinned_args.take_error();
      sample_args_host_ = std::move(*pinned_args);
      // Padding rows read these buffers: start from zeros, never from stale NaN patterns.
      for (auto* b : {&h_, &xn_, &proj_, &xl_, &q_, &attn_, &k_, &v_, &gate_, &up_}) {
        LLMESH_TRY(cuda::fill_bytes(b->get(), 0, b->size(), stream_.get()));
      }
    }
    if (grow_parts) {
      const size_t n = kernels::cuda::attention_partials_floats(cap_singles_, layout_.n_heads, hd, cap_parts_);
      if (n > 0) LLMESH_TRY(alloc(partials_, n * f));
    }
    return ok_status();
  }

  /// Builds the step's metadata on the host, copies it to the device and runs the step.
  status run(std::span<const step_sequence> batch, step_plan& p) {
    LLMESH_TRY(cuda::use_device(opt_.device));  // ranks may be driven from any thread
    size_t n_tokens = 0, table_ints = 0, max_pos = 0, scored = 0;
    bool decode = opt_.graphs && !opt_.profile;  // profiling times each op: no graphs
    for (const auto& s : batch) {
      n_tokens += s.tokens.size();
      table_ints += s.block_table.size();
      max_pos = std::max(max_pos, s.pos0 + s.tokens.size() - 1);
      decode = decode && s.tokens.size() == 1 && s.want_logits && scored_positions(s) == 0 && s.hidden == hidden_rows::none;
      p.real_rows += drawn_rows(s);
      scored += scored_positions(s);
    }
    if (n_tokens == 0) return make_error(errc::invalid_request, "forward: empty batch");
    if (max_pos >= std::min(kv_.n_blocks * kv_.block_size, cfg_.max_positions)) {
      return make_error(errc::invalid_request, "forward: position beyond the KV cache");
    }
    // One-row tiles (decode rows, and a prompt chunk's last tile of one token) run one block
    // per 128-position partition; the partials of those spanning several are merged after.
    size_t singles = 0, single_pos = 0;
    for (const auto& s : batch) {
      if (s.tokens.size() % cuda::attention_tile_rows == 1) {
        ++singles;
        single_pos = std::max(single_pos, s.pos0 + s.tokens.size() - 1);
      }
    }
    p.partitions = single_pos / cuda::attention_partition + 1;
    p.decode_graph = decode;
    if (decode) {
      p.tokens = p.tiles = p.rows = singles = pow2_at_least(n_tokens);
      p.partitions = pow2_at_least(p.partitions);
    } else {
      p.tokens = n_tokens;
      p.rows = p.real_rows + scored;  // the scored positions' rows follow the drawn rows
      for (const auto& s : batch) p.tiles += (s.tokens.size() + cuda::attention_tile_rows - 1) / cuda::attention_tile_rows;
    }
    LLMESH_TRY(reserve(p.tokens, table_ints, p.partitions, singles));

    int32_t* m = meta_host_.as<int32_t>();
    std::fill(m, m + off_tables(), 0);
    size_t t = 0, tile = 0, row = 0, table = 0, single = 0;
    for (const auto& s : batch) {
      std::copy(s.block_table.begin(), s.block_table.end(), m + off_tables() + table);
      for (size_t i = 0; i < s.tokens.size(); ++i, ++t) {
        const size_t pos = s.pos0 + i;
        m[off_tokens() + t] = s.tokens[i];
        m[off_pos() + t] = static_cast<int32_t>(pos);
        m[off_slot() + t] = s.block_table[pos / kv_.block_size] * static_cast<int32_t>(kv_.block_size) +
                            static_cast<int32_t>(pos % kv_.block_size);
        m[off_bt() + t] = static_cast<int32_t>(table);
        if (i % cuda::attention_tile_rows == 0) {
          const size_t rows = std::min(cuda::attention_tile_rows, s.tokens.size() - i);
          m[off_tile0() + tile] = static_cast<int32_t>(t);
          m[off_tile_rows() + tile] = static_cast<int32_t>(rows);
          m[off_tile_partial() + tile] = rows == 1 ? static_cast<int32_t>(single++) : -1;
          ++tile;
        }
      }
      for (size_t r = drawn_rows(s); r > 0; --r) m[off_rows() + row++] = static_cast<int32_t>(t - r);  // the last drawn_rows
      table += s.block_table.size();
    }
    t = 0;
    for (const auto& s : batch) {  // after every drawn row
      const size_t k = scored_positions(s);
      for (size_t i = 0; i < k; ++i) m[off_rows() + row++] = static_cast<int32_t>(t + i);
      t += s.tokens.size();
    }
    t = n_tokens;
    for (; t < p.tokens; ++t) {  // decode padding: no cache slot, no tile
      m[off_pos() + t] = -1;
      m[off_slot() + t] = -1;
    }
    LLMESH_TRY(cuda::copy_to_device(meta_.get(), m, (off_tables() + table) * sizeof(int32_t), stream_.get()));

    if (!p.decode_graph) return enqueue(p);
    const auto key = std::make_pair(p.tokens, p.partitions);
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      LLMESH_TRY(cuda::graph::begin_capture(stream_.get()));
      status st = enqueue(p);
      auto g = cuda::graph::end_capture(stream_.get());
      if (!st) return st;
      if (!g) return g.take_error();
      it = graphs_.emplace(key, std::move(*g)).first;
    }
    return it->second.launch(stream_.get());
  }

  status project(const char* name, std::span<const kernels::cuda::dense_job> jobs, size_t m) {
    // Fast mode hands m > 2 to cuBLASLt: at m = 8 its tensor-core GEMV beats the CUDA-core
    // kernel, whose x loads grow with m (H200: gate/up 97 µs dense vs ~30 µs cuBLAS).
    if (opt_.deterministic || m <= 2 || w_.type == dtype::f32) {
      return timed(std::string("dense ") + name, [&] { return cuda::dense(jobs, m, stream_.get()); });
    }
    return timed(std::string("cublas ") + name, [&]() -> status {
      // The jobs of one call share their input: round it to 16 bits once.
      LLMESH_TRY(cuda::to_16bit(jobs[0].x, jobs[0].ldx, m, jobs[0].k, w_.type, scratch16_.get(), stream_.get()));
      for (const auto& j : jobs) LLMESH_TRY(blas_->gemm_16bit(j, m, scratch16_.get(), stream_.get()));
      return ok_status();
    });
  }

  cuda::dense_job job(const float* x, size_t ldx, const device_matrix& w, const float* bias, float* y, size_t ldy) const {
    cuda::dense_job j;
    j.x = x;
    j.ldx = ldx;
    j.w = w.data;
    j.ldw = w.ld;
    j.w_type = w_.type;
    j.bias = bias;
    j.y = y;
    j.ldy = ldy;
    j.n = w.rows;
    j.k = w.cols;
    return j;
  }

  status all_reduce(float* data, size_t n) {
    if (layout_.tp == 1) return ok_status();
    return comm_->all_reduce_sum(data, n, stream_.get());
  }

  /// The whole forward pass as stream work (capturable: fixed pointers and sizes only).
  status enqueue(const step_plan& p) {
    const size_t T = p.tokens, H = cfg_.hidden, hd = cfg_.head_dim;
    const size_t nq = layout_.n_heads * hd, nkv = layout_.n_kv_heads * hd, ni = layout_.n_inter;
    const float eps = cfg_.rms_norm_eps;
    auto s = stream_.get();
    const int32_t* meta = meta_.as<int32_t>();
    float *h = h_.as<float>(), *xn = xn_.as<float>(), *proj = proj_.as<float>();
    float *q = q_.as<float>(), *k = k_.as<float>(), *v = v_.as<float>(), *attn = attn_.as<float>();
    float *gate = gate_.as<float>(), *up = up_.as<float>();
    LLMESH_TRY(timed("embed", [&] { return cuda::embed(w_.embed.data, w_.type, H, meta + off_tokens(), T, h, s); }));
    for (size_t L = 0; L < cfg_.n_layers; ++L) {
      const auto& lw = w_.layers[L];
      LLMESH_TRY(timed("rmsnorm", [&] {
        return L == 0 ? cuda::rmsnorm(h, lw.attn_norm, xn, T, H, eps, s)
                      : cuda::add_rmsnorm(h, proj, lw.attn_norm, xn, T, H, eps, s);
      }));
      const cuda::dense_job qkv[3] = {job(xn, H, lw.q, lw.q_bias, q, nq), job(xn, H, lw.k, lw.k_bias, k, nkv),
                                      job(xn, H, lw.v, lw.v_bias, v, nkv)};
      LLMESH_TRY(project("qkv", qkv, T));
      if (lw.q_norm != nullptr) {  // Qwen3: each head of q and k normalised on its own (rows of head_dim)
        LLMESH_TRY(timed("qk_norm", [&]() -> status {
          LLMESH_TRY(cuda::rmsnorm(q, lw.q_norm, q, T * layout_.n_heads, hd, eps, s));
          return cuda::rmsnorm(k, lw.k_norm, k, T * layout_.n_kv_heads, hd, eps, s);
        }));
      }
      cuda::rope_kv_args r;
      r.q = q;
      r.k = k;
      r.v = v;
      r.n_tokens = T;
      r.n_heads = layout_.n_heads;
      r.n_kv_heads = layout_.n_kv_heads;
      r.head_dim = hd;
      r.rotary_dim = cfg_.rope.head_dim;
      r.rotate = !layer_nope(cfg_, L);
      r.q_scale = cfg_.query_temperature.beta != 0.0 ? q_temp_.as<float>() : nullptr;
      r.pos = meta + off_pos();
      r.slot = meta + off_slot();
      r.cos = cos_.as<float>();
      r.sin = sin_.as<float>();
      r.k_cache = k_cache_[L].as<float>();
      r.v_cache = v_cache_[L].as<float>();
      LLMESH_TRY(timed("rope_kv", [&] { return cuda::rope_kv(r, s); }));
      cuda::attention_args a;
      a.q = q;
      a.out = attn;
      a.k_cache = r.k_cache;
      a.v_cache = r.v_cache;
      a.pos = r.pos;
      a.bt_offset = meta + off_bt();
      a.block_tables = meta + off_tables();
      a.tile_token0 = meta + off_tile0();
      a.tile_rows = meta + off_tile_rows();
      a.tile_partial = meta + off_tile_partial();
      a.n_tiles = p.tiles;
      a.n_tokens = T;
      a.n_heads = layout_.n_heads;
      a.n_kv_heads = layout_.n_kv_heads;
      a.head_dim = hd;
      a.block_size = kv_.block_size;
      a.sliding_window = layer_window(cfg_, L);  // SmolLM3's sliding layers only (the families with others are CPU-only)
      a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
      a.max_partitions = p.partitions;
      a.partials = partials_.as<float>();
      LLMESH_TRY(timed("attention", [&] { return cuda::attention(a, s); }));
      const cuda::dense_job o[1] = {job(attn, nq, lw.o, lw.o_bias, proj, H)};
      LLMESH_TRY(project("o", o, T));
      LLMESH_TRY(all_reduce(proj, T * H));
      LLMESH_TRY(timed("rmsnorm", [&] { return cuda::add_rmsnorm(h, proj, lw.mlp_norm, xn, T, H, eps, s); }));
      if (ni > 0) {
        const cuda::dense_job gu[2] = {job(xn, H, lw.gate, nullptr, gate, ni), job(xn, H, lw.up, nullptr, up, ni)};
        LLMESH_TRY(project("gate_up", gu, T));
        LLMESH_TRY(timed("swiglu", [&] { return cuda::swiglu(gate, up, gate, T * ni, s); }));
        const cuda::dense_job down[1] = {job(gate, ni, lw.down, nullptr, proj, H)};
        LLMESH_TRY(project("down", down, T));
      } else {
        LLMESH_TRY(cuda::fill_bytes(proj, 0, T * H * sizeof(float), s));
      }
      LLMESH_TRY(all_reduce(proj, T * H));
    }
    LLMESH_TRY(timed("rmsnorm", [&] { return cuda::add_rmsnorm(h, proj, w_.final_norm, xn, T, H, eps, s); }));
    const size_t W = p.rows;
    if (W == 0) return ok_status();
    LLMESH_TRY(timed("gather", [&] { return cuda::gather_rows(xn, H, meta + off_rows(), W, H, xl_.as<float>(), s); }));
    float* local = logits_.as<float>();
    const size_t ld_local = layout_.tp > 1 ? nv_max_ : cfg_.vocab;
    if (layout_.n_vocab > 0) {
      const cuda::dense_job head[1] = {job(xl_.as<float>(), H, w_.lm_head, nullptr, local, ld_local)};
      LLMESH_TRY(project("lm_head", head, W));
    }
    if (layout_.tp == 1) return ok_status();
    // Vocabulary-parallel head: gather [rank][W][nv_max], then place each rank's columns.
    float* raw = gathered_raw_.as<float>();
    LLMESH_TRY(comm_->all_gather(local, W * nv_max_, raw, s));
    for (int rk = 0; rk < layout_.tp; ++rk) {
      const auto& peer = peers_[rk];
      for (size_t row = 0; row < W; ++row) {
        LLMESH_TRY(cuda::copy_on_device(gathered_.as<float>() + row * cfg_.vocab + peer.vocab0,
                                        raw + (rk * W + row) * nv_max_, peer.n_vocab * sizeof(float), s));
      }
    }
    return ok_status();
  }

  /// Calls copy(data's rows, the cache's rows, data's row pitch, this rank's row bytes) for each
  /// block, layer, and keys then values (float32 caches only).
  template <class Copy>
  status kv_rows(std::span<const int32_t> blocks, Copy copy, std::byte* data) const {
    const size_t es = sizeof(float), hd = cfg_.head_dim, bs = kv_.block_size;
    const size_t row = layout_.n_kv_heads * hd * es, full = cfg_.n_kv_heads * hd * es;
    for (size_t i = 0; i < blocks.size(); ++i) {
      const size_t block = static_cast<size_t>(blocks[i]);
      for (size_t layer = 0; layer < cfg_.n_layers; ++layer) {
        for (size_t kind = 0; kind < 2; ++kind) {
          auto* mine = (kind == 0 ? k_cache_ : v_cache_)[layer].as<std::byte>() + block * bs * row;
          auto* theirs = data + (((i * cfg_.n_layers + layer) * 2 + kind) * bs * cfg_.n_kv_heads + layout_.kv_head0) * hd * es;
          LLMESH_TRY(copy(theirs, mine, full, row));
        }
      }
    }
    return ok_status();
  }

  model_config cfg_;
  device_weights w_;
  shard_layout layout_;
  kv_cache_config kv_;
  cuda_options opt_;
  kernels::device_communicator* comm_;
  std::vector<shard_layout> peers_;
  size_t nv_max_ = 0;
  cuda::stream stream_;
  std::unique_ptr<cuda::blas> blas_;
  std::vector<cuda::buffer> k_cache_, v_cache_;
  cuda::buffer cos_, sin_;
  cuda::buffer q_temp_;  ///< [positions]: Ministral 3's query temperature (kernels::llama4_query_scale); empty otherwise
  size_t cap_ = 0, cap_tables_ = 0, cap_parts_ = 1, cap_singles_ = 0;
  cuda::buffer meta_, meta_host_, ids_, ids_host_, sample_args_, sample_args_host_;
  cuda::buffer adjust_;  ///< the step's logits adjustments (penalties, bans)
  size_t adjust_bytes_ = 0;
  cuda::buffer h_, xn_, proj_, xl_, q_, attn_, k_, v_, gate_, up_, scratch16_, logits_, gathered_raw_, gathered_,
      partials_;
  std::map<std::pair<size_t, size_t>, cuda::graph> graphs_;
  struct pending_timing {
    std::string name;
    cuda::event_timer timer;
  };
  std::vector<pending_timing> pending_;
  std::map<std::string, std::pair<double, size_t>> profile_;  ///< name → (ms, calls)
};

result<std::unique_ptr<step_executor>> finish_create(std::unique_ptr<cuda_executor> e) {
  LLMESH_TRY(e->init());
  return std::unique_ptr<step_executor>(std::move(e));
}

}  // namespace

bool cuda_available() { return kernels::cuda_device_count() > 0; }

result<std::unique_ptr<step_executor>> make_cuda_executor(std::shared_ptr<const model> m, shard_layout layout,
                                                          kv_cache_config kv, cuda_options opt,
                                                          kernels::device_communicator* comm) {
  if (!cuda_available()) return make_error(errc::invalid_request, "no CUDA device");
  if (layout.tp > 1 && comm == nullptr) return make_error(errc::internal, "cuda executor: tp > 1 needs a communicator");
  LLMESH_TRY(cuda::use_device(opt.device));
  auto w = upload_weights(*m, layout);
  if (!w) return w.take_error();
  return finish_create(std::make_unique<cuda_executor>(m->config(), std::move(*w), layout, kv, opt, comm));
}

result<std::unique_ptr<step_executor>> make_cuda_executor_random(const model_config& cfg, kernels::dtype type,
                                                                 uint64_t seed, kv_cache_config kv, cuda_options opt) {
  if (!cuda_available()) return make_error(errc::invalid_request, "no CUDA device");
  if (const char* family = cpu_only_family(cfg)) {
    return make_error(errc::unsupported, std::string(family) + " run on the CPU backend only (use --device cpu)");
  }
  LLMESH_TRY(cuda::use_device(opt.device));
  auto layout = make_shard_layout(cfg, 0, 1);
  if (!layout) return layout.take_error();
  auto w = random_weights(cfg, type, seed);
  if (!w) return w.take_error();
  return finish_create(std::make_unique<cuda_executor>(cfg, std::move(*w), *layout, kv, opt, nullptr));
}

}  // namespace llmesh::model
