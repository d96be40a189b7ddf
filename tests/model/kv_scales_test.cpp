// FP8 KV-cache scales in checkpoints (model/src/kv_scales.hpp): each layer's k_scale / v_scale
// read under every name vLLM accepts (a key scale alone serving both), broken ones and a lone
// value scale refused naming the tensor, compressed-tensors' kv_cache_scheme read or refused by name; an fp8_e4m3 cache uses
// them (its logits change, its contracts hold: chunks, neighbours, tp 2), float32 and bfloat16
// caches ignore them, fp8_e5m2 refuses them. The numbers against the PyTorch reference:
// tests/cli/golden_test.cpp (*_kv_scales*).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "llmesh/model/engine.hpp"
#include "llmesh/model/random_model.hpp"
#include "llmesh/model/safetensors.hpp"
#include "checkpoint_edit.hpp"
#include "engine_runs.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using kernels::dtype;
using json = nlohmann::json;

random_model_spec scaled_spec(const std::string& packed) {
  random_model_spec s;
  s.hidden = 128;
  s.intermediate = 256;  // tp 2 shares stay whole blocks of 32
  s.n_layers = 2;
  s.n_heads = 8;
  s.n_kv_heads = 2;
  s.vocab = 300;
  s.dtype = dtype::bf16;
  s.seed = 31;
  s.packed = packed;
  s.kv_scales = true;
  return s;
}

std::shared_ptr<const model> load_ok(const std::string& dir) {
  auto m = model::load(dir);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.err().message);
  return m.ok() ? *m : nullptr;
}

/// Layer i's scale tensor `which` ("k_scale", "v_scale") as the random model wrote it.
float stored(const testing::temp_dir& dir, size_t layer, const std::string& which) {
  auto st = tensor_store::open(dir.path());
  EXPECT_TRUE(st.ok());
  auto t = st->get("model.layers." + std::to_string(layer) + ".self_attn." + which);
  EXPECT_TRUE(t.ok());
  return t.ok() ? kernels::load_as_f32(t->data, t->type, 0) : 0.0f;
}

/// Renames a tensor ending in `from` to end in `to` ("" drops it).
std::function<bool(tensor_spec&)> rename(const std::string& from, const std::string& to) {
  return [from, to](tensor_spec& s) {
    if (!s.name.ends_with(from)) return true;
    if (to.empty()) return false;
    s.name = s.name.substr(0, s.name.size() - from.size()) + to;
    return true;
  };
}

TEST(KvScales, ReadUnderEveryNameVllmAccepts) {
  for (const char* packed : {"fp8", "fp8-block", "ct-fp8", "ct-w4a16"}) {
    SCOPED_TRACE(packed);
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(scaled_spec(packed), dir.path()).ok());
    const float k0 = stored(dir, 0, "k_scale"), v0 = stored(dir, 0, "v_scale"), k1 = stored(dir, 1, "k_scale");
    EXPECT_GT(k0, 0.009f);
    EXPECT_LT(k0, 0.031f);
    EXPECT_NE(k0, v0);
    EXPECT_NE(k0, k1);
    auto m = load_ok(dir.path());
    ASSERT_TRUE(m);
    EXPECT_EQ(m->weights().layers[0].k_scale, k0);
    EXPECT_EQ(m->weights().layers[0].v_scale, v0);
    EXPECT_EQ(m->weights().layers[1].k_scale, k1);
  }
  struct variant {
    const char* what;
    std::vector<std::function<bool(tensor_spec&)>> edits;
    bool k_for_both, none;
  };
  const variant variants[] = {
      {"ModelOpt's names", {rename(".self_attn.k_scale", ".self_attn.k_proj.k_scale"), rename(".self_attn.v_scale", ".self_attn.v_proj.v_scale")}, false, false},
      {"early compressed-tensors' output scales",
       {rename(".self_attn.k_scale", ".self_attn.k_proj.output_scale"), rename(".self_attn.v_scale", ".self_attn.v_proj.output_scale")}, false, false},
      {"the deprecated kv_scale", {rename(".self_attn.k_scale", ".self_attn.kv_scale"), rename(".self_attn.v_scale", "")}, true, false},
      {"a k_scale alone", {rename(".self_attn.v_scale", "")}, true, false},
      {"none", {rename(".self_attn.k_scale", ""), rename(".self_attn.v_scale", "")}, false, true},
  };
  for (const auto& v : variants) {
    SCOPED_TRACE(v.what);
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(scaled_spec("ct-fp8"), dir.path()).ok());
    const float k = stored(dir, 1, "k_scale"), vs = stored(dir, 1, "v_scale");
    for (const auto& edit : v.edits) testing::rewrite(dir, edit);
    auto m = load_ok(dir.path());
    ASSERT_TRUE(m);
    const auto& l = m->weights().layers[1];
    const float want_k = v.none ? 0.0f : k, want_v = v.none ? 0.0f : v.k_for_both ? k : vs;
    EXPECT_EQ(l.k_scale, want_k);
    EXPECT_EQ(l.v_scale, want_v);
  }
}

TEST(KvScales, BrokenScalesAreRefusedNamingThem) {
  struct broken {
    const char* why;
    std::function<void(tensor_spec&)> change;
  };
  auto value = [](float x) {
    return [x](tensor_spec& s) {
      s.type = dtype::f32;
      s.shape = {1};
      s.fill = [x](std::span<uint8_t> out) { std::memcpy(out.data(), &x, sizeof x); };
    };
  };
  const broken cases[] = {
      {"must be finite and positive", value(0.0f)},
      {"must be finite and positive", value(-0.02f)},
      {"must be finite and positive", value(std::nanf(""))},
      {"must be finite and positive", value(INFINITY)},
      {"a KV-cache scale is one number", [](tensor_spec& s) {
         s.type = dtype::f32;
         s.shape = {2};
         s.fill = [](std::span<uint8_t> out) { std::memset(out.data(), 0, out.size()); };
       }},
      {"F8_E4M3", [](tensor_spec& s) {  // refused by the FP8 reader, which meets it first
         s.type = dtype::f8_e4m3;
         s.shape = {1};
         s.fill = [](std::span<uint8_t> out) { out[0] = 0x38; };
       }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.why);
    testing::temp_dir dir;
    ASSERT_TRUE(write_random_model(scaled_spec("ct-fp8"), dir.path()).ok());
    testing::rewrite(dir, [&](tensor_spec& s) {
      if (s.name == "model.layers.1.self_attn.v_scale") c.change(s);
      return true;
    });
    auto m = model::load(dir.path());
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.err().code, errc::invalid_request);
    EXPECT_NE(m.err().message.find("'model.layers.1.self_attn.v_scale'"), std::string::npos) << m.err().message;
    EXPECT_NE(m.err().message.find(c.why), std::string::npos) << m.err().message;
  }
  // A value scale without a key scale: vLLM asserts one; refused naming the layer.
  testing::temp_dir dir;
  ASSERT_TRUE(write_random_model(scaled_spec("fp8"), dir.path()).ok());
  testing::rewrite(dir, rename("layers.0.self_attn.k_scale", ""));
  auto m = model::load(dir.path());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.err().code, errc::invalid_request);
  EXPECT_NE(m.err().message.find("'model.layers.0.self_attn.v_scale' (or its like) has no key scale"), std::string::npos)
      << m.err().message;
}

TEST(KvScales, KvCacheSchemeReadOrRefusedByName) {
  auto with_scheme = [](const testing::temp_dir& dir, const std::string& packed, const json& scheme) {
    EXPECT_TRUE(write_random_model(scaled_spec(packed), dir.path()).ok());
    json cfg = json::parse(testing::read_text(dir / "config.json"));
    EXPECT_TRUE(cfg["quantization_config"].contains("kv_cache_scheme"));
    cfg["quantization_config"]["kv_cache_scheme"] = scheme;
    testing::write_text(dir / "config.json", cfg.dump());
    return model::load(dir.path());
  };
  const json good = {{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"strategy", "tensor"}, {"dynamic", false}};
  for (const char* packed : {"ct-fp8", "ct-fp8-block", "ct-w4a16", "ct-w8a16"}) {
    SCOPED_TRACE(packed);
    testing::temp_dir a, b;
    auto m = with_scheme(a, packed, good);
    ASSERT_TRUE(m.ok()) << m.err().message;
    EXPECT_GT((*m)->weights().layers[0].k_scale, 0.0f);
    auto n = with_scheme(b, packed, nullptr);  // a null scheme: the scales are read all the same
    ASSERT_TRUE(n.ok()) << n.err().message;
  }
  auto changed = [&](const char* key, const json& v) {
    json s = good;
    s[key] = v;
    return s;
  };
  const std::pair<json, std::string> refused[] = {
      {changed("type", "int"), "type 'int' (not float)"},
      {changed("num_bits", 4), "num_bits other than 8"},
      {changed("strategy", "attn_head"), "strategy 'attn_head' (not tensor)"},
      {changed("strategy", "channel"), "strategy 'channel' (not tensor)"},
      {changed("symmetric", false), "asymmetric scales"},
      {changed("symmetric", nullptr), "asymmetric scales"},
      {changed("strategy", nullptr), "strategy '' (not tensor)"},
      {changed("dynamic", true), "dynamic scales"},
  };
  for (const auto& [scheme, why] : refused) {
    SCOPED_TRACE(scheme.dump());
    testing::temp_dir dir;
    auto m = with_scheme(dir, "ct-fp8", scheme);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.err().code, errc::unsupported);
    EXPECT_NE(m.err().message.find("kv_cache_scheme: " + why), std::string::npos) << m.err().message;
  }
  testing::temp_dir dir;
  auto m = with_scheme(dir, "ct-fp8", json::array());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.err().code, errc::invalid_request);
}


TEST(KvScales, AnFp8CacheUsesThemAndKeepsItsContracts) {
  testing::temp_dir scaled_dir, plain_dir;
  ASSERT_TRUE(write_random_model(scaled_spec("ct-fp8"), scaled_dir.path()).ok());
  ASSERT_TRUE(write_random_model(scaled_spec("ct-fp8"), plain_dir.path()).ok());
  testing::rewrite(plain_dir, [](tensor_spec& s) { return !s.name.ends_with("_scale") || s.name.ends_with("weight_scale"); });
  auto scaled = load_ok(scaled_dir.path()), plain = load_ok(plain_dir.path());
  ASSERT_TRUE(scaled && plain);
  ASSERT_EQ(plain->weights().layers[0].k_scale, 0.0f);
  const auto prompt = testing::prompt_of(29, 3);
  // Float32 and bfloat16 caches ignore the scales: the same bits with them and without.
  for (dtype kv : {dtype::f32, dtype::bf16}) {
    auto a = testing::engine_with(scaled, kv), b = testing::engine_with(plain, kv);
    ASSERT_TRUE(a && b);
    const auto with = testing::run(*a, prompt, prompt.size()), without = testing::run(*b, prompt, prompt.size());
    for (size_t s = 0; s < with.size(); ++s) EXPECT_TRUE(testing::same_bits(with[s], without[s])) << "step " << s;
  }
  // An fp8_e4m3 cache stores x / scale: other values than a scale-1 cache's, near float32's.
  auto f32 = testing::engine_with(scaled, dtype::f32), fp8 = testing::engine_with(scaled, dtype::f8_e4m3), fp8_plain = testing::engine_with(plain, dtype::f8_e4m3);
  ASSERT_TRUE(f32 && fp8 && fp8_plain);
  const auto exact = testing::run(*f32, prompt, prompt.size());
  const auto whole = testing::run(*fp8, prompt, prompt.size());
  const auto unscaled = testing::run(*fp8_plain, prompt, prompt.size());
  EXPECT_FALSE(testing::same_bits(whole[0], unscaled[0]));
  EXPECT_GT(testing::relative_gap(whole[0], unscaled[0]), 1e-4f);
  EXPECT_LT(testing::relative_gap(whole[0], exact[0]), 0.06f);
  // Its contracts: chunks, token by token, neighbours give the same bits; tp 2 within 1e-4.
  const auto chunks = testing::run(*fp8, prompt, 5), batched = testing::run(*fp8, prompt, prompt.size(), 3);
  for (size_t s = 0; s < whole.size(); ++s) {
    EXPECT_TRUE(testing::same_bits(whole[s], chunks[s])) << "chunks of 5, step " << s;
    EXPECT_TRUE(testing::same_bits(whole[s], batched[s])) << "beside 3 neighbours, step " << s;
  }
  auto tp2 = testing::engine_with(scaled, dtype::f8_e4m3, 2);
  ASSERT_TRUE(tp2);
  const auto split = testing::run(*tp2, prompt, prompt.size());
  EXPECT_LT(testing::relative_gap(split[0], whole[0]), 1e-4f);
  // fp8_e5m2 with e4m3 calibration: refused as vLLM refuses it; without scales it runs.
  engine_options o;
  o.kv_type = dtype::f8_e5m2;
  o.device = backend::cpu;
  auto e5 = engine::create(scaled, o);
  ASSERT_FALSE(e5.ok());
  EXPECT_EQ(e5.err().code, errc::unsupported);
  EXPECT_NE(e5.err().message.find("--kv-cache-dtype fp8_e5m2 with a checkpoint's FP8 KV-cache scales"), std::string::npos)
      << e5.err().message;
  EXPECT_TRUE(engine::create(plain, o).ok());
}

}  // namespace
}  // namespace llmesh::model
