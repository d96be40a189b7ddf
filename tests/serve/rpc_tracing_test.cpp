// The native API's generate calls under --otlp-traces-endpoint: each call is one llm_request
// span — a child of its request's traceparent field, else a root, none when that says "not
// sampled" — naming the call (rpc.system capnp, rpc.method generate) with the call's token
// counts; a call its client drops is recorded too, marked cancelled; the spans still queued
// when the server stops are sent before it exits.
#include "../otlp_collector.hpp"
#include "rpc_client.hpp"

namespace llmesh::testing {
namespace {

constexpr const char* kTrace = "0af7651916cd43dd8448eb211c80319c";
constexpr const char* kParentSpan = "b7ad6b7169203331";

TEST(RpcTracing, GenerateCallsBecomeSpansInTheirCallersTraces) {
  otlp_collector c;
  scoped_otel_env env{{"OTEL_BSP_SCHEDULE_DELAY", "60000"}};  // sent at the stop, all at once
  server_process s(bin, {"--model", model_dir, "--otlp-traces-endpoint", c.url()});
  ASSERT_GT(s.port(), 0) << s.log();
  const int port = rpc_port(s);
  ASSERT_GT(port, 0) << s.log();
  size_t prompt_tokens = 0;
  std::vector<size_t> generated;
  {
    capnp::EzRpcClient client("127.0.0.1", static_cast<uint>(port));
    auto call = [&](const std::string& traceparent, uint32_t n) {
      return generate(client, [&](auto r) {
        r.setModel("kjv-tiny");
        r.getPrompt().setText("In the beginning God created");
        r.setMaxTokens(4);
        r.setIgnoreEos(true);
        r.setN(n);
        r.setTemperature(0.5f);
        r.setHasSeed(true);
        r.setSeed(7);
        if (!traceparent.empty()) {
          r.setTraceparent(traceparent);
          r.setTracestate("k=v");
        }
      });
    };
    auto traced = call(std::string("00-") + kTrace + "-" + kParentSpan + "-01", 2);
    ASSERT_TRUE(traced.ok) << traced.message;
    prompt_tokens = traced.prompt_tokens;
    auto root = call("", 1);
    ASSERT_TRUE(root.ok) << root.message;
    auto unsampled = call("00-11111111111111111111111111111111-2222222222222222-00", 1);
    ASSERT_TRUE(unsampled.ok) << unsampled.message;
    // A call its client drops mid-stream: its span says so, with the tokens it got.
    std::vector<int32_t> ids;
    std::string text;
    auto paf = kj::newPromiseAndFulfiller<void>();
    auto req = client.getMain<rpc::Llmesh>().generateRequest();
    auto r = req.initRequest();
    r.setModel("kjv-tiny");
    r.getPrompt().setText("And God said");
    r.setMaxTokens(200);
    r.setIgnoreEos(true);
    r.setTraceparent("00-33333333333333333333333333333333-4444444444444444-01");
    req.setSink(kj::heap<sink>(ids, text, 3, kj::mv(paf.fulfiller)));
    auto running = req.send();
    paf.promise.wait(client.getWaitScope());  // streaming
    { auto dropped = kj::mv(running); }
    // Once the server has let it go, a next call runs (the loop handled the cancel first).
    auto after = call("", 1);
    ASSERT_TRUE(after.ok) << after.message;
  }
  EXPECT_EQ(s.stop(), 0) << s.log();
  const auto spans = spans_of(c);
  ASSERT_EQ(spans.size(), 4u) << "the unsampled call leaves no span";
  const read_span* child = nullptr;
  const read_span* root = nullptr;
  const read_span* dropped = nullptr;
  for (const auto& sp : spans) {
    if (sp.trace_id == kTrace) child = &sp;
    if (sp.trace_id == "33333333333333333333333333333333") dropped = &sp;
    if (sp.parent_span_id.empty() && root == nullptr) root = &sp;
  }
  ASSERT_NE(dropped, nullptr);
  EXPECT_TRUE(std::get<bool>(dropped->attributes.at("llmesh.cancelled")));
  EXPECT_EQ(dropped->status_code, 0u);  // the client's choice, not an error
  const int64_t got = std::get<int64_t>(dropped->attributes.at("gen_ai.usage.completion_tokens"));
  EXPECT_GE(got, 3);
  EXPECT_LT(got, 200);
  ASSERT_NE(child, nullptr);
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(child->trace_id, kTrace);
  EXPECT_EQ(child->parent_span_id, kParentSpan);
  EXPECT_EQ(child->trace_state, "k=v");
  EXPECT_EQ(child->name, "llm_request");
  EXPECT_EQ(std::get<std::string>(child->attributes.at("rpc.system")), "capnp");
  EXPECT_EQ(std::get<std::string>(child->attributes.at("rpc.method")), "generate");
  EXPECT_EQ(child->attributes.count("http.request.method"), 0u);
  EXPECT_EQ(std::get<std::string>(child->attributes.at("gen_ai.response.model")), "kjv-tiny");
  EXPECT_EQ(std::get<int64_t>(child->attributes.at("gen_ai.request.n")), 2);
  EXPECT_EQ(std::get<int64_t>(child->attributes.at("gen_ai.usage.prompt_tokens")), static_cast<int64_t>(prompt_tokens));
  EXPECT_EQ(std::get<int64_t>(child->attributes.at("gen_ai.usage.completion_tokens")), 8);  // 2 choices × 4
  EXPECT_NEAR(std::get<double>(child->attributes.at("gen_ai.request.temperature")), 0.5, 1e-6);
  const double ttft = std::get<double>(child->attributes.at("gen_ai.latency.time_to_first_token"));
  const double e2e = std::get<double>(child->attributes.at("gen_ai.latency.e2e"));
  EXPECT_GT(ttft, 0.0);
  EXPECT_LE(ttft, e2e);
  EXPECT_LE(std::get<double>(child->attributes.at("gen_ai.latency.time_in_model_inference")), e2e);
  EXPECT_NE(root->trace_id, kTrace);
  EXPECT_EQ(std::get<int64_t>(root->attributes.at("gen_ai.usage.completion_tokens")), 4);
  EXPECT_EQ(child->attributes.count("llmesh.cancelled"), 0u);
}

}  // namespace
}  // namespace llmesh::testing
