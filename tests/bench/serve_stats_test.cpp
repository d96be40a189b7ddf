// The serving benchmark's statistics against numbers worked out by hand (numpy's percentile
// and vLLM's metric definitions), and the SSE recorder on bodies cut at awkward places.
#include "llmesh/bench/serve_stats.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace llmesh::bench {
namespace {

request_record record(double ttft, double e2e, std::vector<double> itl, size_t in, size_t out) {
  request_record r;
  r.ok = true;
  r.ttft = ttft;
  r.e2e = e2e;
  r.itl = std::move(itl);
  r.n_tokens_prompt = in;
  r.n_tokens_output = out;
  return r;
}

TEST(Percentile, InterpolatesLinearlyLikeNumpy) {
  const std::vector<double> v = {4, 1, 3, 2};  // unsorted on purpose
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);    // rank 1.5
  EXPECT_DOUBLE_EQ(percentile(v, 99), 3.97);   // rank 2.97
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(percentile({5}, 99), 5);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
}

TEST(SummarizeSeconds, GivesMilliseconds) {
  const auto s = summarize_seconds({0.1, 0.3, 0.2});
  EXPECT_NEAR(s.mean_ms, 200, 1e-9);
  EXPECT_NEAR(s.median_ms, 200, 1e-9);
  EXPECT_NEAR(s.p99_ms, 298, 1e-9);                    // 0.2 + 0.98 * 0.1
  EXPECT_NEAR(s.std_ms, std::sqrt(0.02 / 3) * 1e3, 1e-9);  // population std
  const auto empty = summarize_seconds({});
  EXPECT_EQ(empty.mean_ms, 0);
  EXPECT_EQ(empty.p99_ms, 0);
}

TEST(ComputeServeMetrics, FollowsVllmDefinitions) {
  std::vector<request_record> rs = {
      record(0.1, 0.5, {0.1, 0.1, 0.2}, 10, 4),  // TPOT (0.5 - 0.1) / 3
      record(0.3, 0.5, {0.2}, 10, 2),            // TPOT 0.2
      record(0.2, 0.2, {}, 10, 1),               // one token: no TPOT
  };
  request_record failed;
  failed.n_tokens_prompt = 10;
  failed.error = "HTTP 500";
  rs.push_back(failed);

  const auto m = compute_serve_metrics(rs, 2.0);
  EXPECT_EQ(m.completed, 3u);
  EXPECT_EQ(m.failed, 1u);
  EXPECT_EQ(m.total_input_tokens, 30u);  // failed requests count for nothing
  EXPECT_EQ(m.total_output_tokens, 7u);
  EXPECT_DOUBLE_EQ(m.duration_s, 2.0);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.5);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 18.5);

  EXPECT_NEAR(m.ttft.mean_ms, 200, 1e-9);
  EXPECT_NEAR(m.ttft.median_ms, 200, 1e-9);
  EXPECT_NEAR(m.ttft.p99_ms, 298, 1e-9);

  EXPECT_NEAR(m.tpot.mean_ms, (400.0 / 3 + 200) / 2, 1e-9);
  EXPECT_NEAR(m.tpot.median_ms, (400.0 / 3 + 200) / 2, 1e-9);
  EXPECT_NEAR(m.tpot.p99_ms, 400.0 / 3 + 0.99 * (200 - 400.0 / 3), 1e-9);

  // ITL pools every gap: {0.1, 0.1, 0.2, 0.2}.
  EXPECT_NEAR(m.itl.mean_ms, 150, 1e-9);
  EXPECT_NEAR(m.itl.median_ms, 150, 1e-9);
  EXPECT_NEAR(m.itl.p99_ms, 200, 1e-9);

  EXPECT_NEAR(m.e2el.mean_ms, 400, 1e-9);
  EXPECT_NEAR(m.e2el.median_ms, 500, 1e-9);
  EXPECT_NEAR(m.e2el.p99_ms, 500, 1e-9);
}

TEST(ComputeServeMetrics, AllFailedGivesZeros) {
  request_record failed;
  failed.error = "connect: refused";
  const auto m = compute_serve_metrics({failed, failed}, 1.0);
  EXPECT_EQ(m.completed, 0u);
  EXPECT_EQ(m.failed, 2u);
  EXPECT_EQ(m.output_throughput, 0);
  EXPECT_EQ(m.ttft.mean_ms, 0);
}

TEST(SseRecorder, StampsEventsWhenTheyComplete) {
  sse_recorder rec;
  rec.feed("data: {\"choices\":[{\"text\":\"a\"}]}\n\nda", 0.1);
  rec.feed("ta: {\"choices\":[{\"text\":\"b\"}]}\n", 0.25);  // completes only with the next piece
  rec.feed("\n", 0.3);
  rec.feed("data: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n"
           "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}\n\n"
           "data: [DONE]\n\n",
           0.4);
  EXPECT_TRUE(rec.done());
  const auto r = rec.finish(5);
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_DOUBLE_EQ(r.ttft, 0.1);
  ASSERT_EQ(r.itl.size(), 2u);
  EXPECT_DOUBLE_EQ(r.itl[0], 0.2);
  EXPECT_DOUBLE_EQ(r.itl[1], 0.1);
  EXPECT_DOUBLE_EQ(r.e2e, 0.4);  // the last choices chunk, not [DONE]
  EXPECT_EQ(r.n_tokens_output, 7u);  // usage wins over the chunk count
  EXPECT_EQ(r.n_tokens_prompt, 5u);
}

TEST(SseRecorder, AcceptsCrlfCommentsAndNoSpaceAfterColon) {
  sse_recorder rec;
  rec.feed(": ping\r\n\r\ndata:{\"choices\":[{\"text\":\"x\"}]}\r\n\r\ndata: [DONE]\r\n\r\n", 0.5);
  const auto r = rec.finish(1);
  EXPECT_TRUE(r.ok) << r.error;
  EXPECT_DOUBLE_EQ(r.ttft, 0.5);
  EXPECT_EQ(r.n_tokens_output, 1u);  // no usage: one per choices chunk
}

TEST(SseRecorder, FailsOnErrorEventsAndCutStreams) {
  sse_recorder err;
  err.feed("data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: {\"error\":{\"message\":\"shard died\"}}\n\ndata: [DONE]\n\n", 1);
  const auto r1 = err.finish(1);
  EXPECT_FALSE(r1.ok);
  EXPECT_NE(r1.error.find("shard died"), std::string::npos) << r1.error;

  sse_recorder cut;
  cut.feed("data: {\"choices\":[{\"text\":\"x\"}]}\n\n", 1);
  const auto r2 = cut.finish(1);
  EXPECT_FALSE(r2.ok);
  EXPECT_NE(r2.error.find("[DONE]"), std::string::npos) << r2.error;

  sse_recorder empty;
  empty.feed("data: [DONE]\n\n", 1);
  EXPECT_FALSE(empty.finish(1).ok);

  sse_recorder junk;
  junk.feed("data: {not json\n\ndata: [DONE]\n\n", 1);
  EXPECT_FALSE(junk.finish(1).ok);
}

TEST(FormatServeJson, IsOneLineWithVllmKeys) {
  const auto m = compute_serve_metrics({record(0.1, 0.5, {0.2, 0.2}, 3, 3)}, 1.0);
  serve_run_info info{"m", 1, 3, 3, std::numeric_limits<double>::infinity(), 4};
  const std::string line = format_serve_json(m, info);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const auto j = nlohmann::json::parse(line);
  EXPECT_TRUE(j["request_rate"].is_null());
  EXPECT_EQ(j["max_concurrency"], 4);
  EXPECT_EQ(j["completed"], 1);
  EXPECT_EQ(j["total_output_tokens"], 3);
  EXPECT_NEAR(j["mean_ttft_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(j["mean_tpot_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(j["p99_itl_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(j["median_e2el_ms"].get<double>(), 500, 1e-9);

  const std::string table = format_serve_table(m, info);
  EXPECT_NE(table.find("Serving Benchmark Result"), std::string::npos);
  EXPECT_NE(table.find("Mean TTFT (ms):"), std::string::npos);
}

}  // namespace
}  // namespace llmesh::bench
