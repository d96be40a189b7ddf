// A GGUF file's tensors under their HF names. ggml's block formats (ggml-common.h) and their
// dequantization (ggml-quants.c's dequantize_row_*), each block covering consecutive elements
// of a row: Q4_0/Q4_1 and IQ4_NL (low nibbles the block's first half, high nibbles its second;
// IQ4_NL's index iq4nl_values), Q5_0/Q5_1 (plus a fifth bit from qh) and Q8_0; the
// 256-element K-quants Q2_K ... Q6_K and IQ4_XS are kernels::dtype values (dtype.hpp's
// k_quant_value is their definition).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "gguf_model.hpp"
#include "llmesh/kernels/quantize.hpp"
#include "load_threads.hpp"

namespace llmesh::model {
namespace {

namespace k = kernels;

float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return k::f16_to_f32(h);
}

/// The kernels' dtype that holds ggml `type` as stored: F32, F16, BF16 and the K-quants the
/// kernels read in place (k::k_quant_value is their definition); nullopt for the others.
std::optional<k::dtype> stored_dtype(uint32_t type) {
  switch (type) {
    case ggml::f32: return k::dtype::f32;
    case ggml::f16: return k::dtype::f16;
    case ggml::bf16: return k::dtype::bf16;
    case ggml::q2_k: return k::dtype::q2_k;
    case ggml::q3_k: return k::dtype::q3_k;
    case ggml::q4_k: return k::dtype::q4_k;
    case ggml::q5_k: return k::dtype::q5_k;
    case ggml::q6_k: return k::dtype::q6_k;
    case ggml::iq4_xs: return k::dtype::iq4_xs;
    default: return std::nullopt;
  }
}

/// One block of `type` at `b` into y (block(type).elements floats).
void dequantize_block(uint32_t type, const uint8_t* b, float* y) {
  switch (type) {
    case ggml::q8_0: {
      const float d = half(b);
      for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
      return;
    }
    case ggml::q4_0: case ggml::q4_1: {
      const bool has_min = type == ggml::q4_1;
      const float d = half(b), m = has_min ? half(b + 2) : 0.0f;
      const uint8_t* qs = b + (has_min ? 4 : 2);
      for (int j = 0; j < 16; ++j) {
        const int lo = qs[j] & 0xF, hi = qs[j] >> 4;
        y[j] = has_min ? static_cast<float>(lo) * d + m : static_cast<float>(lo - 8) * d;
        y[j + 16] = has_min ? static_cast<float>(hi) * d + m : static_cast<float>(hi - 8) * d;
      }
      return;
    }
    case ggml::q5_0: case ggml::q5_1: {
      const bool has_min = type == ggml::q5_1;
      const float d = half(b), m = has_min ? half(b + 2) : 0.0f;
      uint32_t qh;
      std::memcpy(&qh, b + (has_min ? 4 : 2), 4);
      const uint8_t* qs = b + (has_min ? 8 : 6);
      for (int j = 0; j < 16; ++j) {
        const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10), h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
        const int x0 = (qs[j] & 0xF) | h0, x1 = (qs[j] >> 4) | h1;
        y[j] = has_min ? static_cast<float>(x0) * d + m : static_cast<float>(x0 - 16) * d;
        y[j + 16] = has_min ? static_cast<float>(x1) * d + m : static_cast<float>(x1 - 16) * d;
      }
      return;
    }
    case ggml::mxfp4: {  // dequantize_row_mxfp4: kvalues_mxfp4 · 2^(e − 128)
      const float d = k::mxfp4_scale(b[0]);
      for (int j = 0; j < 16; ++j) {
        y[j] = static_cast<float>(k::mxfp4_values[b[1 + j] & 0xF]) * d;
        y[j + 16] = static_cast<float>(k::mxfp4_values[b[1 + j] >> 4]) * d;
      }
      return;
    }
    case ggml::iq4_nl: {
      const float d = half(b);
      for (int j = 0; j < 16; ++j) {
        y[j] = d * static_cast<float>(k::iq4nl_values[b[2 + j] & 0xF]);
        y[j + 16] = d * static_cast<float>(k::iq4nl_values[b[2 + j] >> 4]);
      }
      return;
    }
    default: return;  // block() refused every other type when the file was opened
  }
}

/// Row `r` of tensor `t` (dims[0] elements) in float32.
void dequantize_row(const gguf_tensor& t, size_t r, float* y) {
  const auto info = ggml::block(t.type);
  const size_t cols = t.dims[0], row_bytes = cols / info.elements * info.bytes;
  const uint8_t* row = t.data + r * row_bytes;
  if (auto stored = stored_dtype(t.type)) return k::dequantize_row(row, *stored, cols, y);
  for (size_t b = 0; b < cols / info.elements; ++b) dequantize_block(t.type, row + b * info.bytes, y + b * info.elements);
}

/// Whether a Q8_0 row of `cols` holds a −128, which q8 does not.
bool has_minus_128(const uint8_t* row, size_t cols) {
  for (size_t b = 0; b < cols / 32; ++b) {
    for (int j = 0; j < 32; ++j) {
      if (static_cast<int8_t>(row[b * 34 + 2 + j]) == -128) return true;
    }
  }
  return false;
}

/// Q8_0 row -> q8 row, exactly (a float16 scale is a float32 one); false when a value is -128,
/// which q8 does not hold (its values are within ±127), and the row must be requantized.
bool repack_q8_0(const uint8_t* row, size_t cols, uint8_t* dst) {
  for (size_t b = 0; b < cols / 32; ++b) {
    const uint8_t* src = row + b * 34;
    for (int j = 0; j < 32; ++j) {
      if (static_cast<int8_t>(src[2 + j]) == -128) return false;
    }
    const float d = half(src);
    uint8_t* out = dst + b * k::q8_block_bytes;
    std::memcpy(out, &d, 4);
    std::memcpy(out + 4, src + 2, 32);
  }
  return true;
}

/// Q4_0 / Q4_1 row -> q4 row, exactly: the nibbles as they are, factor d and offset 8·d (Q4_0:
/// (q − 8)·d) or −min (Q4_1: q·d + min, as ggml computes it, one rounding); false when a
/// float16 field is not finite.
bool repack_q4(uint32_t type, const uint8_t* row, size_t cols, uint8_t* dst) {
  const bool has_min = type == ggml::q4_1;
  const size_t bytes = has_min ? 20 : 18;
  for (size_t b = 0; b < cols / 32; ++b) {
    const uint8_t* src = row + b * bytes;
    const float d = half(src), m = has_min ? -half(src + 2) : 8.0f * d;
    if (!std::isfinite(d) || !std::isfinite(m)) return false;
    uint8_t* out = dst + b * k::q4_block_bytes;
    std::memcpy(out, &d, 4);
    std::memcpy(out + 4, &m, 4);
    std::memcpy(out + 8, src + (has_min ? 4 : 2), 16);
  }
  return true;
}

/// Q5_0 / IQ4_NL row -> q8 row, exactly: their values are (q − 16)·d and iq4nl_values[q]·d,
/// int8 quants with the block's float16 scale. False when a scale is not finite (the row is
/// requantized, which names the value).
bool repack_x_0(uint32_t type, const uint8_t* row, size_t cols, uint8_t* dst) {
  const bool nl = type == ggml::iq4_nl, five = !nl;
  const size_t bytes = five ? 22 : 18;
  for (size_t b = 0; b < cols / 32; ++b) {
    const uint8_t* src = row + b * bytes;
    const float d = half(src);
    if (!std::isfinite(d)) return false;
    uint32_t qh = 0;
    if (five) std::memcpy(&qh, src + 2, 4);
    const uint8_t* qs = src + (five ? 6 : 2);
    uint8_t* out = dst + b * k::q8_block_bytes;
    std::memcpy(out, &d, 4);
    for (int j = 0; j < 16; ++j) {
      int lo = qs[j] & 0xF, hi = qs[j] >> 4;
      if (five) {
        lo |= static_cast<int>((qh >> j) & 1) << 4;
        hi |= static_cast<int>((qh >> (j + 16)) & 1) << 4;
      }
      out[4 + j] = static_cast<uint8_t>(nl ? k::iq4nl_values[lo] : static_cast<int8_t>(lo - 16));
      out[4 + j + 16] = static_cast<uint8_t>(nl ? k::iq4nl_values[hi] : static_cast<int8_t>(hi - 16));
    }
  }
  return true;
}

struct hf_name {
  std::string name;
  bool permute = false;  ///< Llama's q/k: llama.cpp's converter interleaved each head's halves
  size_t heads = 0;
  /// A stacked expert tensor ([experts, rows, cols]): one HF matrix per expert e, named
  /// name + e + expert_suffix.
  std::string expert_suffix;
  bool as_row = false;  ///< a vector HF holds as a [1, n] matrix (Qwen2-MoE's shared_expert_gate)
  bool stacked_vectors = false;  ///< GPT-OSS's expert biases: [experts, n], a vector per expert
  /// A Gemma norm: llama.cpp's converter stored HF's weight + 1 (ggml multiplies by it as it is);
  /// the 1 is taken off here and added back at bind, as for an HF checkpoint. Exact for stored
  /// values in [0.5, 2^24) (Sterbenz; the norms are near 1).
  bool minus_one = false;
};

hf_name named(std::string name) {
  hf_name out;
  out.name = std::move(name);
  return out;
}

/// What the names depend on: Llama's permuted q/k, Phi-3's fused projections, and where an MoE
/// model keeps its experts.
struct name_facts {
  bool llama = false, mixtral = false, phi3 = false, gpt_oss = false;
  bool gemma = false, sandwich = false;  ///< Gemma 1-3; Gemma 2/3's four norms a layer
  bool permuted = false;                 ///< q/k rows interleaved by the converter: Llama's and SmolLM3's
  size_t heads = 0, kv_heads = 0;
  size_t experts = 0;  ///< expert_count: expert tensors are known only where it is positive
};

/// The HF name of a GGUF tensor, or empty for rope_freqs (read into config.json) and unknown names.
/// Experts (llama.cpp's names): ffn_gate_inp is the router; ffn_{gate,up,down}_exps stack every
/// expert's matrix; Mixtral files of llama.cpp's first MoE converter hold ffn_{gate,up,down}.E
/// per expert; Qwen2-MoE's shared expert is ffn_*_shexp, its gate ffn_gate_inp_shexp.
hf_name map_name(const std::string& g, const name_facts& f) {
  static const std::pair<const char*, const char*> top[] = {
      {"token_embd.weight", "model.embed_tokens.weight"}, {"output_norm.weight", "model.norm.weight"}, {"output.weight", "lm_head.weight"}};
  for (auto [from, to] : top) {
    if (g == from) return named(to);
  }
  if (g.rfind("blk.", 0) != 0) return {};
  const size_t dot = g.find('.', 4);
  if (dot == std::string::npos || dot == 4) return {};
  const std::string layer = g.substr(4, dot - 4), rest = g.substr(dot + 1);
  if (!std::all_of(layer.begin(), layer.end(), [](char c) { return c >= '0' && c <= '9'; })) return {};
  if (f.phi3 && rest == "attn_qkv.weight") return named("model.layers." + layer + ".self_attn.qkv_proj.weight");
  if (f.phi3 && rest == "ffn_up.weight") return named("model.layers." + layer + ".mlp.gate_up_proj.weight");  // gate, then up
  if (f.sandwich) {  // Gemma 2/3: norms after attention and around the MLP (llama.cpp's names)
    static const std::pair<const char*, const char*> norms[] = {{"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
                                                                {"post_attention_norm.weight", "post_attention_layernorm.weight"},
                                                                {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"}};
    for (auto [from, to] : norms) {
      if (rest == from) return named("model.layers." + layer + "." + to);
    }
  }
  static const std::pair<const char*, const char*> per_layer[] = {
      {"attn_norm.weight", "input_layernorm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},   {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},   {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},       {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},       {"attn_output.bias", "self_attn.o_proj.bias"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"}, {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},    {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"}};
  for (auto [from, to] : per_layer) {
    if (rest != from) continue;
    hf_name out = named("model.layers." + layer + "." + to);
    const bool q = rest.rfind("attn_q.", 0) == 0, kk = rest.rfind("attn_k.", 0) == 0;
    if (f.permuted && (q || kk)) {
      out.permute = true;
      out.heads = q ? f.heads : f.kv_heads;
    }
    return out;
  }
  if (f.gpt_oss) {  // GPT-OSS (llama.cpp's "gpt-oss"): its own names, and its experts' biases
    static const std::pair<const char*, const char*> own[] = {
        {"post_attention_norm.weight", "post_attention_layernorm.weight"}, {"attn_sinks.weight", "self_attn.sinks"},
        {"ffn_gate_inp.weight", "mlp.router.weight"}, {"ffn_gate_inp.bias", "mlp.router.bias"}};
    for (auto [from, to] : own) {
      if (rest == from) return named("model.layers." + layer + "." + to);
    }
    for (const char* x : {"gate", "up", "down"}) {
      if (rest == std::string("ffn_") + x + "_exps.bias") {
        hf_name out = named("model.layers." + layer + ".mlp.experts.");
        out.expert_suffix = std::string(".") + x + "_proj.bias";
        out.stacked_vectors = true;
        return out;
      }
    }
  }
  if (f.experts == 0) return {};
  const std::string moe = "model.layers." + layer + (f.mixtral ? ".block_sparse_moe." : ".mlp.");
  static const std::pair<const char*, const char*> qwen_experts[] = {{"gate", "gate_proj"}, {"up", "up_proj"}, {"down", "down_proj"}};
  static const std::pair<const char*, const char*> mixtral_experts[] = {{"gate", "w1"}, {"up", "w3"}, {"down", "w2"}};
  if (rest == "ffn_gate_inp.weight") return named(moe + "gate.weight");
  for (auto [from, to] : f.mixtral ? mixtral_experts : qwen_experts) {
    const std::string ffn = std::string("ffn_") + from;
    if (rest == ffn + "_exps.weight") {
      hf_name out = named(moe + "experts.");
      out.expert_suffix = std::string(".") + to + ".weight";
      return out;
    }
    if (f.mixtral && rest.rfind(ffn + ".", 0) == 0 && rest.size() > ffn.size() + 8 && rest.ends_with(".weight")) {
      const std::string e = rest.substr(ffn.size() + 1, rest.size() - ffn.size() - 8);  // ffn_gate.E.weight
      if (!e.empty() && std::all_of(e.begin(), e.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return named(moe + "experts." + e + "." + to + ".weight");
      }
    }
    if (!f.mixtral && rest == ffn + "_shexp.weight") return named(moe + "shared_expert." + to + ".weight");
  }
  if (!f.mixtral && rest == "ffn_gate_inp_shexp.weight") {
    hf_name out = named(moe + "shared_expert_gate.weight");
    out.as_row = true;
    return out;
  }
  return {};
}

/// map_name, with a Gemma norm marked minus_one.
hf_name map_tensor_name(const std::string& g, const name_facts& f) {
  hf_name out = map_name(g, f);
  out.minus_one = f.gemma && g.ends_with("norm.weight") && !out.name.empty();
  return out;
}

/// A converted tensor: the work of filling it, row by row.
struct job {
  const gguf_tensor* src = nullptr;
  hf_name name;
  k::dtype out_type = k::dtype::f32;
  size_t rows = 0, cols = 0;  ///< HF shape [rows, cols] (a vector: rows 1)
  uint8_t* buffer = nullptr;  ///< in the store's one mapping of converted tensors
  size_t bytes = 0;
  /// One rank's columns (part_cols, one span) written as a matrix of their own here, `buffer`
  /// never touched (matrix_part::own); null: rows are written in `buffer`.
  uint8_t* own = nullptr;
  size_t row0 = 0;      ///< the source's first row (an expert's matrix within a stacked tensor)
  bool matrix = false;  ///< an HF matrix (a vector source: Qwen2-MoE's shared_expert_gate)
  detail::matrix_part part;  ///< what is written (load_options::ranks; default: all)
  detail::spans part_cols;   ///< the part's columns, on the source's blocks and on 32s (empty: whole rows)
  bool owns = false;         ///< part_cols go to `own`
  size_t own_cols() const { return part_cols.front().second - part_cols.front().first; }
};

/// The source row that HF row `r` of a permuted q/k comes from: within each head of `hd` rows,
/// HF's row s*hd/2 + j is llama.cpp's row 2j + s.
size_t source_row(const job& w, size_t r) {
  if (!w.name.permute) return r;
  const size_t hd = w.rows / w.name.heads, h = r / hd, i = r % hd, half_rows = hd / 2;
  const size_t s = i / half_rows, j = i % half_rows;
  return h * hd + 2 * j + s;
}

status fill_rows(const job& w, size_t row0, size_t n, std::vector<float>& scratch) {
  const gguf_tensor& t = *w.src;
  const auto info = ggml::block(t.type);
  const size_t src_row_bytes = w.cols / info.elements * info.bytes;
  if (w.rows == 1 && t.dims.size() == 1 && w.name.permute) {  // a q/k bias: permute its elements
    scratch.resize(w.cols);
    dequantize_row(t, 0, scratch.data());
    auto* out = reinterpret_cast<float*>(w.buffer);
    job as_rows = w;
    as_rows.rows = w.cols;
    for (size_t i = 0; i < w.cols; ++i) out[i] = scratch[source_row(as_rows, i)];
    return ok_status();
  }
  const detail::spans whole{{0, w.cols}};
  for (size_t r = row0; r < row0 + n; ++r) {
    const size_t from = w.row0 + source_row(w, r);
    const uint8_t* row = t.data + from * src_row_bytes;
    // GGUF rows are whole blocks; an own matrix's row is its columns (whole blocks: q8_row_elements is the count).
    uint8_t* dst_row = w.owns ? w.own + k::dtype_bytes(w.out_type, r * w.own_cols()) : w.buffer + k::dtype_bytes(w.out_type, r * w.cols);
    const size_t dst_c0 = w.owns ? w.part_cols.front().first : 0;
    if (w.out_type == k::dtype::mxfp4) {  // ggml's block_mxfp4: the exponent byte becomes the float 2^(e − 128)
      for (const auto& [c0, c1] : w.part_cols.empty() ? whole : w.part_cols) {
        for (size_t b = c0 / 32; b < c1 / 32; ++b) {
          const uint8_t* src = row + b * info.bytes;
          if (src[0] > k::mxfp4_max_exponent) {
            return make_error(errc::invalid_request, "row " + std::to_string(r) + " holds the exponent " + std::to_string(src[0]) +
                                                         (src[0] == 255 ? " (E8M0's NaN)" : ", beyond float32's range"));
          }
          uint8_t* dst = dst_row + (b - dst_c0 / 32) * k::mxfp4_block_bytes;
          const float s = k::mxfp4_scale(src[0]);
          std::memcpy(dst, &s, 4);
          std::memcpy(dst + 4, src + 1, 16);  // the same nibble order (element j low, j + 16 high)
        }
      }
      continue;
    }
    if (w.out_type != k::dtype::q8 && w.out_type != k::dtype::q4) {  // a row as stored (a permuted F32/F16/BF16/K-quant row), or float32
      if (w.out_type == k::dtype::f32 && t.type != ggml::f32) {
        dequantize_row(t, from, reinterpret_cast<float*>(dst_row));
      } else {
        std::memcpy(dst_row, row, src_row_bytes);
      }
      if (w.name.minus_one) {
        auto* x = reinterpret_cast<float*>(dst_row);
        for (size_t c = 0; c < w.cols; ++c) x[c] -= 1.0f;
      }
      continue;
    }
    // A Q8_0 row with a −128 anywhere is requantized whole (q8 holds ±127): each span of it
    // likewise, so a part's blocks are those of the whole row.
    const bool repack_8 = t.type == ggml::q8_0 && !has_minus_128(row, w.cols);
    bool decoded = false;
    for (const auto& [c0, c1] : w.part_cols.empty() ? whole : w.part_cols) {  // on the source's blocks
      const uint8_t* src = row + c0 / info.elements * info.bytes;
      uint8_t* dst = dst_row + k::dtype_bytes(w.out_type, c0 - dst_c0);
      const size_t cols = c1 - c0;
      if (w.out_type == k::dtype::q4) {
        if (!repack_q4(t.type, src, cols, dst)) return make_error(errc::invalid_request, "row " + std::to_string(r) + " has a non-finite scale");
        continue;
      }
      if (repack_8 && repack_q8_0(src, cols, dst)) continue;
      if ((t.type == ggml::q5_0 || t.type == ggml::iq4_nl) && repack_x_0(t.type, src, cols, dst)) continue;
      if (!decoded) {
        scratch.resize(w.cols);
        dequantize_row(t, from, scratch.data());
        decoded = true;
      }
      LLMESH_TRY(k::quantize_q8(scratch.data() + c0, k::dtype::f32, 1, cols, dst, r));
    }
  }
  return ok_status();
}

/// Runs every job's rows, 256 at a time, over the hardware threads; the earliest failure is reported.
status run_jobs(std::vector<job>& jobs) {
  struct item {
    size_t job, row0, rows;
  };
  std::vector<item> items;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const size_t step = jobs[i].src->dims.size() == 1 ? jobs[i].rows : 256;
    detail::for_row_runs(jobs[i].part, jobs[i].rows, step, [&](size_t r, size_t n) { items.push_back({i, r, n}); });
  }
  return detail::for_each_item(items.size(), [&](size_t n) -> status {
    const auto& it = items[n];
    std::vector<float> scratch;
    if (auto s = fill_rows(jobs[it.job], it.row0, it.rows, scratch); !s) {
      return make_error(errc::invalid_request, jobs[it.job].src->name + ": " + s.err().message);
    }
    return ok_status();
  });
}

/// One anonymous mapping for every job's tensor (an allocation that fails is an error, not an
/// exception): those written whole or by rows of a large matrix, and own columns' matrices,
/// first, under huge pages; those held in small parts (load_options::ranks; and the full
/// matrices of own columns, never written) after, under small pages, so only what is written
/// takes memory.
result<std::shared_ptr<uint8_t>> place_jobs(std::vector<job>& jobs, const std::string& path) {
  const auto l = detail::lay_out_weights(
      jobs.size(), [&](size_t i) { return jobs[i].owns || detail::small_pages(jobs[i].part, jobs[i].bytes); },
      [&](size_t i) { return jobs[i].bytes; },
      [&](size_t i) { return jobs[i].owns ? k::dtype_bytes(jobs[i].out_type, jobs[i].rows * jobs[i].own_cols()) : 0; });
  auto owner = detail::weight_mapping(l.huge, l.total, "converted tensors");
  if (!owner) {
    error e = owner.take_error();
    e.message = path + ": " + e.message;
    return e;
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].buffer = owner->get() + l.at[i];
    if (jobs[i].owns) jobs[i].own = owner->get() + l.own_at[i];
  }
  return owner;
}

}  // namespace

result<tensor_store> gguf_tensor_store(const std::string& path, const detail::part_of_tensor& part_of,
                                       std::vector<detail::own_columns>* own) {
  auto opened = gguf_file::open(path);
  if (!opened) return opened.take_error();
  std::shared_ptr<const gguf_file> g = std::move(opened.value());
  const gguf_value* arch = g->find("general.architecture");
  name_facts facts;
  facts.llama = arch != nullptr && arch->is_string() && arch->s == "llama";
  facts.permuted = facts.llama || (arch != nullptr && arch->is_string() && arch->s == "smollm3");
  facts.phi3 = arch != nullptr && arch->is_string() && arch->s == "phi3";
  facts.gpt_oss = arch != nullptr && arch->is_string() && arch->s == "gpt-oss";
  facts.sandwich = arch != nullptr && arch->is_string() && (arch->s == "gemma2" || arch->s == "gemma3");
  facts.gemma = facts.sandwich || (arch != nullptr && arch->is_string() && arch->s == "gemma");
  if (arch != nullptr && arch->is_string()) {
    uint64_t heads = 0, kv_heads = 0, experts = 0;
    if (const gguf_value* v = g->find(arch->s + ".attention.head_count")) v->as_uint(heads);
    kv_heads = heads;
    if (const gguf_value* v = g->find(arch->s + ".attention.head_count_kv")) v->as_uint(kv_heads);
    if (const gguf_value* v = g->find(arch->s + ".expert_count")) v->as_uint(experts);
    facts.heads = heads;
    facts.kv_heads = kv_heads;
    facts.mixtral = facts.llama && experts > 0;
    facts.experts = experts;
  }
  tensor_store store;
  std::vector<job> jobs;
  for (const gguf_tensor& t : g->tensors()) {
    if (t.name == "rope_freqs.weight" || (facts.phi3 && (t.name == "rope_factors_long.weight" || t.name == "rope_factors_short.weight"))) {
      continue;  // config.json's rope_scaling (gguf_model.cpp)
    }
    if (facts.phi3 && (t.name.ends_with(".attn_q.weight") || t.name.ends_with(".attn_k.weight") ||
                       t.name.ends_with(".attn_v.weight") || t.name.ends_with(".ffn_gate.weight"))) {
      return make_error(errc::unsupported, path + ": tensor '" + t.name +
                                               "': a phi3 file with separate attn_q/attn_k/attn_v or ffn_gate tensors is not "
                                               "supported (llama.cpp's converter writes them fused, as attn_qkv and ffn_up)");
    }
    hf_name name = map_tensor_name(t.name, facts);
    if (name.name.empty()) return make_error(errc::unsupported, path + ": tensor '" + t.name + "' is not one llmesh knows");
    const bool stacked = !name.expert_suffix.empty();
    if (name.stacked_vectors) {  // GPT-OSS's [experts, n] biases: one float32 vector per expert
      if (t.dims.size() != 2 || t.dims[1] != facts.experts || t.type != ggml::f32) {
        return make_error(errc::invalid_request, path + ": tensor '" + t.name + "' must be F32 [" + std::to_string(facts.experts) +
                                                     " experts, n]");
      }
      for (size_t e = 0; e < facts.experts; ++e) {
        tensor_view v{k::dtype::f32, {t.dims[0]}, t.data + e * t.dims[0] * 4, t.dims[0] * 4};
        LLMESH_TRY(store.add(name.name + std::to_string(e) + name.expert_suffix, std::move(v), g));
      }
      continue;
    }
    if (stacked != (t.dims.size() == 3) || t.dims.size() > 3) {
      return make_error(errc::unsupported, path + ": tensor '" + t.name + "' has " + std::to_string(t.dims.size()) +
                                               " dimensions (" + (stacked ? "3: [experts, rows, columns]" : "1 or 2") + ")");
    }
    if (stacked && t.dims[2] != facts.experts) {
      return make_error(errc::invalid_request, path + ": tensor '" + t.name + "' stacks " + std::to_string(t.dims[2]) +
                                                   " experts, not expert_count's " + std::to_string(facts.experts));
    }
    const size_t rows = t.dims.size() >= 2 ? t.dims[1] : 1, cols = t.dims[0];
    const bool matrix = t.dims.size() >= 2 || name.as_row;
    std::vector<size_t> shape = matrix ? std::vector<size_t>{rows, cols} : std::vector<size_t>{cols};
    if (name.permute && (name.heads == 0 || (t.dims.size() == 2 ? rows : cols) % (2 * name.heads) != 0)) {
      return make_error(errc::invalid_request, path + ": tensor '" + t.name + "' does not split into " +
                                                   std::to_string(name.heads) + " heads of even size");
    }
    // Types the kernels read as stored: the float ones, and K-quant matrices (a K-quant
    // vector is decoded to float32 as the other quantized vectors are).
    const auto stored = stored_dtype(t.type);
    const bool plain = stored && !(t.dims.size() == 1 && k::is_quantized(*stored));
    const k::dtype plain_type = stored.value_or(k::dtype::f32);
    const size_t n_experts = stacked ? t.dims[2] : 1, expert_bytes = t.bytes / n_experts;
    for (size_t e = 0; e < n_experts; ++e) {
      const std::string hf = stacked ? name.name + std::to_string(e) + name.expert_suffix : name.name;
      if (plain && !name.permute && !name.minus_one) {  // a view into the mapping (an expert's rows are whole rows)
        tensor_view v{plain_type, shape, t.data + e * expert_bytes, expert_bytes};
        LLMESH_TRY(store.add(hf, std::move(v), g));
        continue;
      }
      const bool four = t.type == ggml::q4_0 || t.type == ggml::q4_1;
      job w;
      w.src = &t;
      w.name = name;
      w.out_type = plain ? plain_type
                         : t.dims.size() == 1 ? k::dtype::f32
                         : t.type == ggml::mxfp4 ? k::dtype::mxfp4
                         : four ? k::dtype::q4 : k::dtype::q8;
      w.rows = rows;
      w.cols = cols;
      w.name.name = hf;
      w.row0 = e * rows;
      w.matrix = matrix;
      if (t.dims.size() == 1 && !plain) w.out_type = k::dtype::f32;
      if (t.dims.size() == 1 && (name.permute || name.minus_one)) w.out_type = k::dtype::f32;  // vectors are read as float32 anyway
      w.bytes = k::dtype_bytes(w.out_type, rows * cols);
      if (part_of && matrix && t.dims.size() >= 2) {
        w.part = part_of(hf);
        if (w.out_type == k::dtype::q8 || w.out_type == k::dtype::q4 || w.out_type == k::dtype::mxfp4) {
          w.part_cols = detail::aligned_cols(w.part, std::max<size_t>(ggml::block(t.type).elements, 32), cols);
          w.owns = own != nullptr && w.part.own && !w.part_cols.empty();
        }
      }
      jobs.push_back(std::move(w));
    }
  }
  auto owner = place_jobs(jobs, path);
  if (!owner) return owner.take_error();
  LLMESH_TRY(run_jobs(jobs));
  for (auto& w : jobs) {
    std::vector<size_t> shape = w.matrix ? std::vector<size_t>{w.rows, w.cols} : std::vector<size_t>{w.cols};
    tensor_view v{w.out_type, std::move(shape), w.buffer, w.bytes};
    LLMESH_TRY(store.add(w.name.name, std::move(v), *owner));
    if (w.owns) own->push_back({w.buffer, w.part_cols.front().first, weight_matrix{w.own, w.out_type, w.rows, w.own_cols()}});
  }
  return store;
}

}  // namespace llmesh::model
