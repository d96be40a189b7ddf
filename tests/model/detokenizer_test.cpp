// Byte-level decoding: token bytes, special tokens, UTF-8 repair like from_utf8_lossy, and
// streaming that never splits a character and concatenates to the full decode.
#include <gtest/gtest.h>

#include <random>

#include "llmesh/model/detokenizer.hpp"
#include "llmesh/model/random_model.hpp"
#include "temp_dir.hpp"

namespace llmesh::model {
namespace {

using testing::temp_dir;

const std::string fffd = "\xEF\xBF\xBD";

class Detokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    random_model_spec s;
    s.vocab = 300;
    ASSERT_TRUE(write_random_model(s, dir_.path()).ok());
    auto d = detokenizer::load(dir_.path());
    ASSERT_TRUE(d.ok()) << d.err().message;
    d_ = std::move(d.value());
  }
  temp_dir dir_;
  std::optional<detokenizer> d_;
};

TEST_F(Detokenizer, ByteTokensDecodeToTheirBytes) {
  std::vector<int32_t> hello{72, 101, 108, 108, 111, 32, 0xC3, 0xA9, 10};
  EXPECT_EQ(d_->decode(hello), "Hello \xC3\xA9\n");
  for (int b = 0; b < 256; ++b) EXPECT_EQ(d_->token_bytes(b), std::string(1, static_cast<char>(b))) << b;
  EXPECT_EQ(d_->vocab_size(), 300u);
}

TEST_F(Detokenizer, SpecialTokensAreSkippedUnlessAsked) {
  std::vector<int32_t> ids{256, 72, 105, 257};
  EXPECT_TRUE(d_->is_special(256));
  EXPECT_FALSE(d_->is_special(72));
  EXPECT_EQ(d_->decode(ids), "Hi");
  EXPECT_EQ(d_->decode(ids, false), "<|begin_of_text|>Hi<|end_of_text|>");
  EXPECT_EQ(d_->decode(std::vector<int32_t>{299}), "<|reserved_299|>");
  EXPECT_EQ(d_->decode(std::vector<int32_t>{-1, 5000}), "");
}

TEST_F(Detokenizer, AStreamKeepsTheSpecialTokensItIsAskedTo) {
  // A tool-call parser's marker (Mistral's [TOOL_CALLS]) is special: kept only where asked.
  stream_decoder plain(*d_), keeping(*d_);
  keeping.keep_special({257});
  std::string a, b;
  for (int32_t id : {72, 257, 105, 256}) {
    a += plain.push(id);
    b += keeping.push(id);
  }
  EXPECT_EQ(a, "Hi");
  EXPECT_EQ(b, "H<|end_of_text|>i") << "256 is special and not kept";
}

TEST_F(Detokenizer, StreamingHoldsPartialCharacters) {
  stream_decoder s(*d_);
  EXPECT_EQ(s.push(0xE2), "");
  EXPECT_EQ(s.push(0x82), "");
  EXPECT_EQ(s.push(0xAC), "\xE2\x82\xAC");  // €
  EXPECT_EQ(s.push(0xF0), "");
  EXPECT_EQ(s.flush(), fffd);
}

TEST_F(Detokenizer, StreamConcatenatesToFullDecode) {
  std::mt19937 rng(7);
  for (int round = 0; round < 500; ++round) {
    std::vector<int32_t> ids(1 + rng() % 20);
    for (auto& id : ids) id = rng() % 3 == 0 ? static_cast<int32_t>(0x80 + rng() % 0x80) : static_cast<int32_t>(rng() % 258);
    stream_decoder s(*d_);
    std::string streamed;
    for (int32_t id : ids) {
      std::string piece = s.push(id);
      EXPECT_EQ(sanitize_utf8(piece), piece) << "a streamed piece is not valid UTF-8";
      streamed += piece;
    }
    streamed += s.flush();
    ASSERT_EQ(streamed, d_->decode(ids)) << "round " << round;
  }
}

TEST(SanitizeUtf8, ReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(sanitize_utf8("abc"), "abc");
  EXPECT_EQ(sanitize_utf8("\xC3\xA9"), "\xC3\xA9");
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(sanitize_utf8("\xC0\x80"), fffd + fffd);             // overlong lead
  EXPECT_EQ(sanitize_utf8("\xE0\x80\x80"), fffd + fffd + fffd);  // overlong 3-byte
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), fffd + fffd + fffd);  // surrogate
  EXPECT_EQ(sanitize_utf8("\xF4\x90\x80\x80"), fffd + fffd + fffd + fffd);  // > U+10FFFF
  EXPECT_EQ(sanitize_utf8("\xE2\x82x"), fffd + "x");              // cut short, then ASCII
  EXPECT_EQ(sanitize_utf8("\xFF"), fffd);
  size_t complete = 0;
  EXPECT_EQ(sanitize_utf8("ab\xE2\x82", &complete), "ab" + fffd);
  EXPECT_EQ(complete, 2u);
  sanitize_utf8("ab\xE2x", &complete);
  EXPECT_EQ(complete, 4u);
}

TEST(DetokenizerLoad, ErrorsNameTheProblem) {
  temp_dir dir;
  auto missing = detokenizer::load(dir.path());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.err().code, errc::not_found);
  testing::write_text(dir / "tokenizer.json", R"({"model":{"type":"BPE","vocab":{"a":0}},"decoder":{"type":"WordPiece"}})");
  auto meta = detokenizer::load(dir.path());
  ASSERT_FALSE(meta.ok());
  EXPECT_EQ(meta.err().code, errc::unsupported);
  EXPECT_NE(meta.err().message.find("WordPiece"), std::string::npos);
  testing::write_text(dir / "tokenizer.json", "{not json");
  EXPECT_FALSE(detokenizer::load(dir.path()).ok());
  testing::write_text(dir / "tokenizer.json", R"({"model":{"vocab":{"a":-4}},"decoder":{"type":"ByteLevel"}})");
  EXPECT_FALSE(detokenizer::load(dir.path()).ok());
}

}  // namespace
}  // namespace llmesh::model
