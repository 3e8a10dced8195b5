// tests/planner_test.cpp — the `plan` cost model against figures worked out by hand for a small
// case (2 layers, 2 devices), the refusal of a model that fits no layout, and hardware JSON errors.
#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/planner.h"
#include "test_util.h"

namespace fp {
namespace {

// 2 layers, dim 1024, 8 heads / 4 KV heads of 128; 8e9 bytes of layer matrices, 1e9 replicated,
// 8e9 matmul FLOPs per token. Two devices of 16 GiB, 1000 GB/s, 100 TFLOP/s; a 10 GB/s link
// with 10 us per ring step; 16-bit KV and activations.
PlanModel small_model() {
  PlanModel m;
  m.name = "small";
  m.n_layers = 2;
  m.dim = 1024;
  m.n_heads = 8;
  m.n_kv_heads = 4;
  m.head_dim = 128;
  m.split_bytes = 8e9;
  m.replicated_bytes = 1e9;
  m.matmul_flops_per_token = 8e9;
  return m;
}

PlanHardware two_devices() {
  return hardware_from_json(nlohmann::json{{"name", "two"},
                                           {"devices", 2},
                                           {"memory_gib", 16},
                                           {"memory_bandwidth_gbps", 1000},
                                           {"compute_tflops", 100},
                                           {"interconnect", {{"kind", "test link"}, {"bandwidth_gbps", 10}, {"latency_us", 10}}}},
                            "test");
}

void expect_rel(double got, double want, const char* what) { EXPECT_NEAR(got, want, 1e-9 * want) << what; }

TEST(Planner, RingAllReduceByHand) {
  // 2 ranks: 2 * 1/2 * 2048 B / 10 GB/s + 2 * 1 * 10 us.
  expect_rel(ring_all_reduce_seconds(2048, 2, two_devices()), 2.048e-7 + 2e-5, "all-reduce");
  EXPECT_EQ(ring_all_reduce_seconds(2048, 1, two_devices()), 0.0);
}

TEST(Planner, SmallCaseMatchesHandArithmetic) {
  PlanWorkload w;
  w.input_len = 1000;
  w.output_len = 200;
  w.concurrency = {1};
  auto plans = plan_layouts(small_model(), two_devices(), w);
  ASSERT_EQ(plans.size(), 2u);
  const LayoutPlan &tp1 = plans[0], &tp2 = plans[1];
  ASSERT_TRUE(tp1.fits && tp2.fits);
  EXPECT_EQ(tp1.dp, 2);
  EXPECT_EQ(tp2.dp, 1);

  // TP=1: 9e9 B of weights; KV per token 2 (K,V) * 2 layers * 4 heads * 128 * 2 B = 4096 B;
  // free 16 GiB - 9e9 B = 8179869184 B -> 1997038 tokens -> 1664 sequences of 1200.
  expect_rel(tp1.weight_gib, 9e9 / (1 << 30), "TP1 weights");
  EXPECT_EQ(tp1.kv_bytes_per_token, 4096);
  EXPECT_EQ(tp1.kv_capacity_tokens, 1997038);
  EXPECT_EQ(tp1.max_sequences, 1664);
  // TP=2: 1e9 + 4e9 B; 2048 B of KV per token per device.
  expect_rel(tp2.weight_gib, 5e9 / (1 << 30), "TP2 weights");
  EXPECT_EQ(tp2.kv_bytes_per_token, 2048);

  // Decode, one sequence, mean context 1000 + 200/2 = 1100. Attention FLOPs 4 * 2 layers * 1024 * 1100.
  // TP=1: memory (9e9 + 1100 * 4096) / 1e12 = 9.0045056 ms; compute (8e9 + 9011200) / 1e14.
  const PhaseCost& d1 = tp1.decode[0];
  expect_rel(d1.memory_s, 9.0045056e-3, "TP1 decode memory");
  expect_rel(d1.compute_s, 8.0090112e-5, "TP1 decode compute");
  EXPECT_EQ(d1.comm_s, 0.0);
  expect_rel(d1.tokens_per_s, 1 / 9.0045056e-3, "TP1 decode tok/s");  // one sequence: one replica busy
  EXPECT_EQ(d1.bottleneck, "memory bandwidth");
  // TP=2: memory (5e9 + 1100 * 2048) / 1e12 = 5.0022528 ms; 4 all-reduces (2 per layer) of
  // 1024 * 2 B: 4 * (2.048e-7 + 2e-5) = 80.8192 us.
  const PhaseCost& d2 = tp2.decode[0];
  expect_rel(d2.memory_s, 5.0022528e-3, "TP2 decode memory");
  expect_rel(d2.compute_s, 4.0045056e-5, "TP2 decode compute");
  expect_rel(d2.comm_s, 8.08192e-5, "TP2 decode comm");
  expect_rel(d2.tokens_per_s, 1 / (5.0022528e-3 + 8.08192e-5), "TP2 decode tok/s");

  // Prefill of 1000 tokens: FLOPs 1000 * 8e9 + 4 * 2 * 1024 * 1000^2 / 2 = 8.004096e12.
  // TP=1: 80.04096 ms compute-bound, 2 replicas: 2000 / 0.08004096 tok/s.
  const PhaseCost& p1 = tp1.prefill;
  expect_rel(p1.compute_s, 0.08004096, "TP1 prefill compute");
  expect_rel(p1.tokens_per_s, 2000 / 0.08004096, "TP1 prefill tok/s");
  EXPECT_EQ(p1.bottleneck, "compute");
  // TP=2: 40.02048 ms + 4 all-reduces of 1000 * 1024 * 2 B: 4 * (2.048e-4 + 2e-5) = 0.8992 ms.
  const PhaseCost& p2 = tp2.prefill;
  expect_rel(p2.comm_s, 8.992e-4, "TP2 prefill comm");
  expect_rel(p2.tokens_per_s, 1000 / (0.04002048 + 8.992e-4), "TP2 prefill tok/s");

  // So the phases prefer different layouts: prefill two replicas, decode split weights.
  EXPECT_GT(p1.tokens_per_s, p2.tokens_per_s);
  EXPECT_GT(d2.tokens_per_s, d1.tokens_per_s);
}

TEST(Planner, SaysWhatIsShortWhenNothingFits) {
  PlanHardware hw = two_devices();
  hw.memory_gib = 4;  // TP=2 needs 5e9 B = 4.66 GiB per device
  auto plans = plan_layouts(small_model(), hw, PlanWorkload{});
  for (const LayoutPlan& p : plans) {
    EXPECT_FALSE(p.fits);
    EXPECT_NE(p.why_not.find("short by"), std::string::npos) << p.why_not;
  }
  EXPECT_NE(plans[1].why_not.find("weights need 4.66 GiB per device, 4.00 GiB available (short by 0.66 GiB)"), std::string::npos) << plans[1].why_not;
}

TEST(Planner, SkipsSizesThatDoNotDivideTheHeads) {
  PlanHardware hw = two_devices();
  hw.devices = 8;  // TP=8 does not divide 4 KV heads
  auto plans = plan_layouts(small_model(), hw, PlanWorkload{});
  ASSERT_EQ(plans.size(), 4u);  // 1, 2, 4, 8
  EXPECT_TRUE(plans[2].fits);
  EXPECT_FALSE(plans[3].fits);
  EXPECT_NE(plans[3].why_not.find("does not divide the 8 heads / 4 KV heads"), std::string::npos) << plans[3].why_not;
}

TEST(Planner, HardwareJsonErrorsNameTheField) {
  try {
    hardware_from_json(nlohmann::json{{"devices", 2}, {"memory_gib", 16}, {"memory_bandwidth_gbps", 1}, {"compute_tflops", 1}}, "hw.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("hw.json: field 'interconnect'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(hardware_from_json(nlohmann::json{{"devices", 1}, {"memory_gib", -1}, {"memory_bandwidth_gbps", 1}, {"compute_tflops", 1}}, "h"),
               Error);
}

TEST(Planner, CommandPrintsLayoutsForTheShippedHardware) {
  const std::string model = test::testdata("models/stories260K/stories260K.gguf");
  FP_REQUIRE_FILE(model);
  int rc = 0;
  const std::string out = test::run_command(test::fastpath_bin() + " plan -m " + model + " --hardware " +
                                                FASTPATH_SOURCE_DIR_FOR_TESTS + "/hardware/h100-8x-nvlink.json 2>&1",
                                            &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("<- best prefill"), std::string::npos) << out;
  EXPECT_NE(out.find("TP8xDP1    does not fit: TP=8 does not divide the 8 heads / 4 KV heads"), std::string::npos) << out;
}

}  // namespace
}  // namespace fp
