// Tests of the safetensors reader (tensor_store, mapped_file) against files made by
// write_safetensors and by hand: round trips of dtype, shape and bytes, sharded directories
// through model.safetensors.index.json, and that every truncated, lying or malformed file is an
// error value naming the file — never a crash — including under a seeded header fuzz loop.
#include "llmesh/model/safetensors.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "llmesh/model/random_model.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using json = nlohmann::json;
using kernels::dtype;
using testing::temp_dir;

/// A tensor_spec whose byte i is (seed + 7 i) mod 251: every tensor distinct, no zero runs.
tensor_spec pattern_tensor(const std::string& name, dtype t, std::vector<size_t> shape, uint8_t seed) {
  return {name, t, std::move(shape), [seed](std::span<uint8_t> out) {
            for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>((seed + 7 * i) % 251);
          }};
}

std::vector<uint8_t> pattern_bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((seed + 7 * i) % 251);
  return v;
}

/// Bytes of a safetensors file with this header text (not padded) and data section.
std::vector<uint8_t> raw_file(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(len >> (8 * i));
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + static_cast<ptrdiff_t>(header.size()));
  return out;
}

void write_raw(const std::string& path, const std::string& header, const std::vector<uint8_t>& data) {
  auto bytes = raw_file(header, data);
  testing::write_bytes(path, bytes.data(), bytes.size());
}

/// A one-tensor header: "w" F32 [2, 2] at [0, 16], with `edit` applied to the entry.
template <class Edit>
std::string one_tensor_header(Edit edit) {
  json entry = {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}};
  edit(entry);
  return json({{"__metadata__", {{"format", "pt"}}}, {"w", entry}}).dump();
}

/// Opens DIR (holding model.safetensors) and expects an error whose message names `file` and
/// contains `what`.
error expect_open_error(const std::string& dir, const std::string& file, const std::string& what) {
  result<tensor_store> s = error{};
  EXPECT_NO_THROW(s = tensor_store::open(dir));
  EXPECT_FALSE(s.ok()) << "opened " << dir;
  if (s.ok()) return error{};
  EXPECT_NE(s.err().message.find(file), std::string::npos) << "no '" << file << "' in: " << s.err().message;
  EXPECT_NE(s.err().message.find(what), std::string::npos) << "no '" << what << "' in: " << s.err().message;
  return s.err();
}

void expect_tensor(const tensor_store& store, const std::string& name, dtype t, const std::vector<size_t>& shape,
                   const std::vector<uint8_t>& bytes) {
  auto v = store.get(name);
  ASSERT_TRUE(v.ok()) << v.err().message;
  EXPECT_EQ(v->type, t) << name;
  EXPECT_EQ(v->shape, shape) << name;
  ASSERT_EQ(v->bytes, bytes.size()) << name;
  EXPECT_EQ(v->elements() * kernels::dtype_size(t), bytes.size()) << name;
  if (!bytes.empty()) {
    EXPECT_EQ(std::memcmp(v->data, bytes.data(), bytes.size()), 0) << name;
  }
}

TEST(TensorStore, ReadsBackWrittenTensors) {
  temp_dir dir;
  std::vector<tensor_spec> specs = {
      pattern_tensor("a.f32", dtype::f32, {2, 3}, 1),
      pattern_tensor("b.f16", dtype::f16, {5}, 2),
      pattern_tensor("c.bf16", dtype::bf16, {2, 3, 4}, 3),
      pattern_tensor("d.scalar", dtype::f32, {}, 4),
      pattern_tensor("e.empty", dtype::f16, {0, 8}, 5),
  };
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", specs).ok());
  auto store = tensor_store::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.err().message;
  EXPECT_EQ(store->size(), 5u);
  expect_tensor(*store, "a.f32", dtype::f32, {2, 3}, pattern_bytes(24, 1));
  expect_tensor(*store, "b.f16", dtype::f16, {5}, pattern_bytes(10, 2));
  expect_tensor(*store, "c.bf16", dtype::bf16, {2, 3, 4}, pattern_bytes(48, 3));
  expect_tensor(*store, "d.scalar", dtype::f32, {}, pattern_bytes(4, 4));
  expect_tensor(*store, "e.empty", dtype::f16, {0, 8}, {});
  EXPECT_TRUE(store->contains("a.f32"));
  EXPECT_FALSE(store->contains("__metadata__"));
  EXPECT_FALSE(store->contains("a"));
}

TEST(TensorStore, WrittenFileHasPaddedHeaderAndTightData) {
  temp_dir dir;
  const std::string path = dir / "model.safetensors";
  ASSERT_TRUE(write_safetensors(path, {pattern_tensor("x", dtype::bf16, {3}, 9), pattern_tensor("y", dtype::f32, {1}, 8)}).ok());
  auto bytes = testing::read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | bytes[i];
  EXPECT_EQ((8 + len) % 8, 0u) << "data section must start 8-byte aligned";
  EXPECT_EQ(bytes.size(), 8 + len + 6 + 4);
  json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<ptrdiff_t>(len));
  EXPECT_EQ(header["x"]["dtype"], "BF16");
  EXPECT_EQ(header["x"]["data_offsets"], json({0, 6}));
  EXPECT_EQ(header["y"]["data_offsets"], json({6, 10}));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
}

TEST(TensorStore, GetMissingTensorNamesIt) {
  temp_dir dir;
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", {pattern_tensor("w", dtype::f32, {1}, 1)}).ok());
  auto store = tensor_store::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.err().message;
  auto v = store->get("model.layers.0.mlp.up_proj.weight");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.err().message.find("'model.layers.0.mlp.up_proj.weight'"), std::string::npos) << v.err().message;
}

// safetensors.hpp documents get() as returning "not_found naming it".
TEST(TensorStore, GetMissingTensorIsNotFound) {
  temp_dir dir;
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", {pattern_tensor("w", dtype::f32, {1}, 1)}).ok());
  auto store = tensor_store::open(dir.path());
  ASSERT_TRUE(store.ok());
  auto v = store->get("nope");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.err().code, errc::not_found) << errc_name(v.err().code);
}

/// Writes two shards and an index over them into `dir`.
void write_sharded(const temp_dir& dir) {
  ASSERT_TRUE(write_safetensors(dir / "model-00001-of-00002.safetensors",
                                {pattern_tensor("embed", dtype::bf16, {4, 2}, 10), pattern_tensor("norm", dtype::f32, {2}, 11)})
                  .ok());
  ASSERT_TRUE(write_safetensors(dir / "model-00002-of-00002.safetensors",
                                {pattern_tensor("layer.0", dtype::f16, {2, 2}, 12), pattern_tensor("layer.1", dtype::f16, {2, 2}, 13)})
                  .ok());
  json index = {{"metadata", {{"total_size", 16 + 8 + 8 + 8}}},
                {"weight_map",
                 {{"embed", "model-00001-of-00002.safetensors"},
                  {"norm", "model-00001-of-00002.safetensors"},
                  {"layer.0", "model-00002-of-00002.safetensors"},
                  {"layer.1", "model-00002-of-00002.safetensors"}}}};
  testing::write_text(dir / "model.safetensors.index.json", index.dump(2));
}

TEST(TensorStore, OpensShardedDirectoryThroughIndex) {
  temp_dir dir;
  write_sharded(dir);
  auto store = tensor_store::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.err().message;
  EXPECT_EQ(store->size(), 4u);
  expect_tensor(*store, "embed", dtype::bf16, {4, 2}, pattern_bytes(16, 10));
  expect_tensor(*store, "norm", dtype::f32, {2}, pattern_bytes(8, 11));
  expect_tensor(*store, "layer.0", dtype::f16, {2, 2}, pattern_bytes(8, 12));
  expect_tensor(*store, "layer.1", dtype::f16, {2, 2}, pattern_bytes(8, 13));
}

TEST(TensorStore, IndexIsPreferredOverASingleFile) {
  temp_dir dir;
  write_sharded(dir);
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", {pattern_tensor("other", dtype::f32, {1}, 1)}).ok());
  auto store = tensor_store::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.err().message;
  EXPECT_TRUE(store->contains("embed"));
  EXPECT_FALSE(store->contains("other"));
}

TEST(TensorStore, AddFileRejectsATensorThatAppearsTwice) {
  temp_dir dir;
  ASSERT_TRUE(write_safetensors(dir / "a.safetensors", {pattern_tensor("w", dtype::f32, {1}, 1)}).ok());
  ASSERT_TRUE(write_safetensors(dir / "b.safetensors", {pattern_tensor("w", dtype::f32, {1}, 2)}).ok());
  tensor_store store;
  ASSERT_TRUE(store.add_file(dir / "a.safetensors").ok());
  status s = store.add_file(dir / "b.safetensors");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.err().message.find(dir / "b.safetensors"), std::string::npos) << s.err().message;
  EXPECT_NE(s.err().message.find("'w'"), std::string::npos) << s.err().message;
  EXPECT_NE(s.err().message.find("twice"), std::string::npos) << s.err().message;
}

TEST(TensorStore, RejectsFileShorterThanEightBytes) {
  for (size_t n : {0, 1, 7}) {
    temp_dir dir;
    std::vector<uint8_t> bytes(n, 0x10);
    testing::write_bytes(dir / "model.safetensors", bytes.data(), bytes.size());
    error e = expect_open_error(dir.path(), dir / "model.safetensors", "truncated");
    EXPECT_EQ(e.code, errc::invalid_request) << n;
  }
}

TEST(TensorStore, RejectsHeaderLengthLargerThanTheFile) {
  temp_dir dir;
  std::vector<uint8_t> bytes = raw_file("{}", {});
  bytes[0] = 200;  // claims a 200-byte header; 2 bytes follow
  testing::write_bytes(dir / "model.safetensors", bytes.data(), bytes.size());
  error e = expect_open_error(dir.path(), dir / "model.safetensors", "truncated");
  EXPECT_EQ(e.code, errc::invalid_request);
}

TEST(TensorStore, RejectsAbsurdHeaderLength) {
  for (uint64_t len : {(100ull << 20) + 1, 1ull << 40, ~0ull}) {
    temp_dir dir;
    std::vector<uint8_t> bytes = raw_file("{}", {});
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(len >> (8 * i));
    testing::write_bytes(dir / "model.safetensors", bytes.data(), bytes.size());
    error e = expect_open_error(dir.path(), dir / "model.safetensors", std::to_string(len));
    EXPECT_EQ(e.code, errc::invalid_request);
  }
}

TEST(TensorStore, RejectsHeaderThatIsNotAJsonObject) {
  for (const char* header : {"{\"w\": ", "not json", "[]", "42", "{} trailing", "\"w\""}) {
    temp_dir dir;
    write_raw(dir / "model.safetensors", header, std::vector<uint8_t>(16));
    error e = expect_open_error(dir.path(), dir / "model.safetensors", "header");
    EXPECT_EQ(e.code, errc::invalid_request) << header;
  }
}

TEST(TensorStore, RejectsTensorEntryMissingAField) {
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    temp_dir dir;
    write_raw(dir / "model.safetensors", one_tensor_header([&](json& e) { e.erase(field); }), std::vector<uint8_t>(16));
    error e = expect_open_error(dir.path(), dir / "model.safetensors", "'w'");
    EXPECT_EQ(e.code, errc::invalid_request) << field;
  }
}

TEST(TensorStore, RejectsTensorEntryWithWrongFieldTypes) {
  const std::vector<std::pair<const char*, json>> cases = {
      {"dtype", 32},
      {"shape", "2,2"},
      {"shape", json::array({2, -2})},
      {"shape", json::array({2, "2"})},
      {"shape", json::array({2, 2.0})},
      {"data_offsets", json::array({0})},
      {"data_offsets", json::array({0, 16, 32})},
      {"data_offsets", json::array({"0", 16})},
      {"data_offsets", json::array({-1, 16})},
      {"data_offsets", json::object()},
  };
  for (const auto& [field, value] : cases) {
    temp_dir dir;
    write_raw(dir / "model.safetensors", one_tensor_header([&](json& e) { e[field] = value; }), std::vector<uint8_t>(16));
    error e = expect_open_error(dir.path(), dir / "model.safetensors", "'w'");
    EXPECT_EQ(e.code, errc::invalid_request) << field << " = " << value.dump();
  }
  temp_dir dir;  // the entry itself is not an object
  write_raw(dir / "model.safetensors", R"({"w": [1, 2]})", std::vector<uint8_t>(16));
  expect_open_error(dir.path(), dir / "model.safetensors", "'w'");
}

TEST(TensorStore, RejectsUnsupportedDtypeNamingIt) {
  for (const char* dt : {"I8", "F64", "U16", "F8_E8M0", "f32", ""}) {  // F8_E4M3: FP8 checkpoints (fp8_weights_test); U8: MXFP4 (gpt_oss_test)
    temp_dir dir;
    write_raw(dir / "model.safetensors", one_tensor_header([&](json& e) { e["dtype"] = dt; }), std::vector<uint8_t>(16));
    error e = expect_open_error(dir.path(), dir / "model.safetensors", "'w'");
    EXPECT_NE(e.message.find(std::string("dtype ") + dt), std::string::npos) << e.message;
  }
}

TEST(TensorStore, Int32TensorsAreKeptApartForPackedWeights) {
  // AWQ/GPTQ/compressed-tensors checkpoints hold their packed quants as I32 (and a weight_shape
  // as I64): get_i32 and integers() return them, get() refuses them by name (they are no float
  // weights).
  temp_dir dir;
  tensor_spec packed{"x.qweight", dtype::f32, {2, 3}, [](std::span<uint8_t> b) {
                       for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i);
                     }, 4};
  tensor_spec wide{"x.weight_shape", dtype::f32, {2}, [](std::span<uint8_t> b) {
                     const int64_t v[2] = {7, -3};
                     std::memcpy(b.data(), v, 16);
                   }, 8};
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", {pattern_tensor("w", dtype::f32, {4}, 1), packed, wide}).ok());
  auto st = tensor_store::open(dir.path());
  ASSERT_TRUE(st.ok()) << st.err().message;
  EXPECT_EQ(st->names(), std::vector<std::string>{"w"});
  EXPECT_EQ(st->integer_names(), (std::vector<std::string>{"x.qweight", "x.weight_shape"}));
  EXPECT_EQ(st->integers("x.weight_shape").value(), (std::vector<int64_t>{7, -3}));
  EXPECT_EQ(st->integers("x.qweight").value()[1], 0x07060504);
  EXPECT_NE(st->get_i32("x.weight_shape").err().message.find("is int64"), std::string::npos);
  auto t = st->get_i32("x.qweight");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->shape, (std::vector<size_t>{2, 3}));
  EXPECT_EQ(t->bytes, 24u);
  uint32_t second;
  std::memcpy(&second, static_cast<const uint8_t*>(t->data) + 4, 4);
  EXPECT_EQ(second, 0x07060504u);
  auto as_float = st->get("x.qweight");
  ASSERT_FALSE(as_float.ok());
  EXPECT_NE(as_float.err().message.find("'x.qweight' holds integers"), std::string::npos) << as_float.err().message;
  EXPECT_EQ(st->get_i32("w").err().code, errc::not_found);
}

TEST(TensorStore, Uint8TensorsAreKeptApartForMxfp4Blocks) {
  // GPT-OSS's MXFP4 experts: U8 blocks and exponents; get_u8 returns them, written back as "U8".
  temp_dir dir;
  tensor_spec blocks{"x_blocks", dtype::f32, {2, 3}, [](std::span<uint8_t> b) {
                       for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(250 + i);
                     }, 1};
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", {pattern_tensor("w", dtype::f32, {4}, 1), blocks}).ok());
  EXPECT_NE(testing::read_text(dir / "model.safetensors").find(R"("dtype":"U8")"), std::string::npos);
  auto st = tensor_store::open(dir.path());
  ASSERT_TRUE(st.ok()) << st.err().message;
  EXPECT_EQ(st->integer_names(), std::vector<std::string>{"x_blocks"});
  auto t = st->get_u8("x_blocks");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->bytes, 6u);
  EXPECT_EQ(static_cast<const uint8_t*>(t->data)[5], 255);
  EXPECT_EQ(st->integers("x_blocks").value(), (std::vector<int64_t>{250, 251, 252, 253, 254, 255}));
  EXPECT_NE(st->get_i32("x_blocks").err().message.find("is uint8"), std::string::npos);
  EXPECT_EQ(st->get_u8("w").err().code, errc::not_found);
  EXPECT_FALSE(st->get("x_blocks").ok());
}

TEST(TensorStore, RejectsTruncatedDataSection) {
  temp_dir dir;
  const std::string path = dir / "model.safetensors";
  ASSERT_TRUE(write_safetensors(path, {pattern_tensor("first", dtype::f32, {4}, 1), pattern_tensor("last", dtype::f32, {4}, 2)}).ok());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  ASSERT_EQ(::truncate(path.c_str(), st.st_size - 4), 0);
  error e = expect_open_error(dir.path(), path, "'last'");
  EXPECT_EQ(e.code, errc::invalid_request);
  EXPECT_NE(e.message.find("truncated"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("ends at byte 32 of a 28-byte data section"), std::string::npos) << e.message;
}

TEST(TensorStore, RejectsTruncationInsideTheHeader) {
  temp_dir dir;
  const std::string path = dir / "model.safetensors";
  ASSERT_TRUE(write_safetensors(path, {pattern_tensor("w", dtype::f32, {4}, 1)}).ok());
  ASSERT_EQ(::truncate(path.c_str(), 20), 0);
  expect_open_error(dir.path(), path, "truncated");
}

TEST(TensorStore, RejectsOffsetsInconsistentWithShapeAndDtype) {
  const std::vector<std::pair<json, std::string>> cases = {
      {json::array({0, 12}), "holds 12 bytes"},   // F32 [2, 2] needs 16
      {json::array({0, 20}), "holds 20 bytes"},
      {json::array({4, 16}), "holds 12 bytes"},
      {json::array({16, 0}), "'w'"},               // begin after end
      {json::array({0, 33}), "ends at byte 33"},  // past the 32-byte data section
  };
  for (const auto& [offsets, what] : cases) {
    temp_dir dir;
    write_raw(dir / "model.safetensors", one_tensor_header([&](json& e) { e["data_offsets"] = offsets; }),
              std::vector<uint8_t>(32));
    error e = expect_open_error(dir.path(), dir / "model.safetensors", what);
    EXPECT_EQ(e.code, errc::invalid_request) << offsets.dump();
    EXPECT_NE(e.message.find("'w'"), std::string::npos) << e.message;
  }
  temp_dir dir;  // BF16 [3] is 6 bytes, not 12
  write_raw(dir / "model.safetensors",
            one_tensor_header([](json& e) {
              e["dtype"] = "BF16";
              e["shape"] = {3};
              e["data_offsets"] = {0, 12};
            }),
            std::vector<uint8_t>(16));
  expect_open_error(dir.path(), dir / "model.safetensors", "need 6");
}

TEST(TensorStore, RejectsShapesWhoseSizeOverflows) {
  temp_dir dir;
  write_raw(dir / "model.safetensors",
            one_tensor_header([](json& e) { e["shape"] = {1ull << 32, 1ull << 32, 1ull << 32}; }),
            std::vector<uint8_t>(16));
  expect_open_error(dir.path(), dir / "model.safetensors", "too large");
}

TEST(TensorStore, MissingModelFileIsNotFound) {
  temp_dir dir;
  auto s = tensor_store::open(dir.path());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.err().code, errc::not_found);
  EXPECT_NE(s.err().message.find(dir.path()), std::string::npos) << s.err().message;
  EXPECT_NE(s.err().message.find("model.safetensors"), std::string::npos) << s.err().message;
  auto missing = tensor_store::open(dir / "no_such_dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.err().code, errc::not_found);
}

TEST(TensorStore, ModelFileThatIsADirectoryIsAnError) {
  temp_dir dir;
  ASSERT_EQ(::mkdir((dir / "model.safetensors").c_str(), 0755), 0);
  expect_open_error(dir.path(), dir / "model.safetensors", "model.safetensors");
}

TEST(TensorStore, IndexNamingAMissingShardIsNotFound) {
  temp_dir dir;
  write_sharded(dir);
  ASSERT_EQ(::unlink((dir / "model-00002-of-00002.safetensors").c_str()), 0);
  error e = expect_open_error(dir.path(), "model-00002-of-00002.safetensors", "cannot open");
  EXPECT_EQ(e.code, errc::not_found);
}

TEST(TensorStore, IndexNamingATensorTheShardLacksIsAnError) {
  temp_dir dir;
  write_sharded(dir);
  json index = json::parse(testing::read_text(dir / "model.safetensors.index.json"));
  index["weight_map"]["layer.2"] = "model-00002-of-00002.safetensors";
  testing::write_text(dir / "model.safetensors.index.json", index.dump());
  error e = expect_open_error(dir.path(), dir / "model.safetensors.index.json", "'layer.2'");
  EXPECT_EQ(e.code, errc::invalid_request);
  EXPECT_NE(e.message.find("model-00002-of-00002.safetensors"), std::string::npos) << e.message;
}

TEST(TensorStore, IndexShardNameMustBeAPlainFileName) {
  for (const char* shard : {"sub/model.safetensors", "../model-00001-of-00002.safetensors", "/etc/passwd", "..", ".",
                            ""}) {
    temp_dir dir;
    write_sharded(dir);
    json index = json::parse(testing::read_text(dir / "model.safetensors.index.json"));
    index["weight_map"]["embed"] = shard;
    testing::write_text(dir / "model.safetensors.index.json", index.dump());
    error e = expect_open_error(dir.path(), dir / "model.safetensors.index.json", std::string("'") + shard + "'");
    EXPECT_EQ(e.code, errc::invalid_request) << shard;
  }
}

TEST(TensorStore, RejectsMalformedIndex) {
  const std::vector<std::string> bad = {"not json", "[]", R"({"metadata": {}})", R"({"weight_map": []})",
                                        R"({"weight_map": {"embed": 1}})"};
  for (const auto& text : bad) {
    temp_dir dir;
    write_sharded(dir);
    testing::write_text(dir / "model.safetensors.index.json", text);
    error e = expect_open_error(dir.path(), dir / "model.safetensors.index.json", "weight_map");
    EXPECT_EQ(e.code, errc::invalid_request) << text;
  }
}

TEST(TensorStore, ErrorInAShardNamesTheShard) {
  temp_dir dir;
  write_sharded(dir);
  const std::string shard = dir / "model-00002-of-00002.safetensors";
  struct stat st {};
  ASSERT_EQ(::stat(shard.c_str(), &st), 0);
  ASSERT_EQ(::truncate(shard.c_str(), st.st_size - 1), 0);
  expect_open_error(dir.path(), shard, "'layer.1'");
}

TEST(TensorStore, FuzzedHeadersNeverCrash) {
  // A valid file; the fuzz loop mutates its length field and header and checks that open()
  // either fails cleanly or returns views that lie inside the file.
  temp_dir src;
  ASSERT_TRUE(write_safetensors(src / "model.safetensors",
                                {pattern_tensor("model.embed_tokens.weight", dtype::bf16, {6, 4}, 1),
                                 pattern_tensor("model.norm.weight", dtype::f32, {4}, 2),
                                 pattern_tensor("lm_head.weight", dtype::f16, {6, 4}, 3)})
                  .ok());
  const std::vector<uint8_t> valid = testing::read_bytes(src / "model.safetensors");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | valid[i];
  const size_t region = 8 + header_len;
  const std::string json_chars = "{}[]\":,0123456789-.eE \\u";

  temp_dir dir;
  const std::string path = dir / "model.safetensors";
  std::mt19937_64 rng(20240611);
  size_t n_ok = 0, n_err = 0;
  constexpr int iterations = 3000;
  for (int it = 0; it < iterations; ++it) {
    std::vector<uint8_t> bytes = valid;
    const int n_mut = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mut; ++m) {
      size_t pos = rng() % region;
      switch (rng() % 4) {
        case 0: bytes[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;             // flip a bit
        case 1: bytes[pos] = static_cast<uint8_t>(rng()); break;                           // random byte
        case 2: bytes[pos] = static_cast<uint8_t>(json_chars[rng() % json_chars.size()]); break;
        case 3: bytes[8 + rng() % header_len] = static_cast<uint8_t>('0' + rng() % 10); break;  // digits: offsets, shapes
      }
    }
    if (it % 10 == 0) bytes.resize(rng() % (bytes.size() + 1));  // sometimes also truncate
    testing::write_bytes(path, bytes.data(), bytes.size());

    result<tensor_store> s = error{};
    ASSERT_NO_THROW(s = tensor_store::open(dir.path())) << "iteration " << it;
    if (!s.ok()) {
      ++n_err;
      EXPECT_NE(s.err().message.find(path), std::string::npos) << "iteration " << it << ": " << s.err().message;
      continue;
    }
    ++n_ok;
    // Read every byte of every tensor the mutated header names: a view outside the mapping
    // would fault here (or be reported by ASan).
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i) len = (len << 8) | bytes[i];
    json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<ptrdiff_t>(len), nullptr, false);
    ASSERT_TRUE(header.is_object()) << "iteration " << it;
    size_t seen = 0;
    for (const auto& [name, info] : header.items()) {
      if (name == "__metadata__") continue;
      auto v = s->get(name);
      ASSERT_TRUE(v.ok()) << "iteration " << it << ": " << name;
      ++seen;
      const auto* p = static_cast<const uint8_t*>(v->data);
      ASSERT_TRUE(p != nullptr || v->bytes == 0) << "iteration " << it << ": " << name;
      uint64_t sum = 0;
      for (size_t i = 0; i < v->bytes; ++i) sum += p[i];
      (void)sum;
      EXPECT_EQ(v->bytes, v->elements() * kernels::dtype_size(v->type));
      EXPECT_LE(v->bytes, bytes.size());
    }
    EXPECT_EQ(seen, s->size()) << "iteration " << it;
  }
  // The fuzz loop must exercise both outcomes to mean anything.
  EXPECT_GT(n_err, 0u);
  EXPECT_GT(n_ok, 0u);
}

}  // namespace
}  // namespace llmesh::model
