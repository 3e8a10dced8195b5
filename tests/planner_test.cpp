// tests/planner_test.cpp — the `plan` cost model against figures worked out by hand: a small dense
// case (2 layers, 2 devices) and a tiny MoE + MLA case (expected distinct experts, EP weights,
// latent KV, all-to-all and CP all-gather volumes); refusals that say what is short; config.json
// and hardware JSON errors; and a DeepSeek-V3-shaped model choosing different decode layouts on
// the shipped 8x PCIe and 8x NVLink boxes.
#include <fstream>

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/synth.h"
#include "parallel/layout_choice.h"
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

// A workload of `in` prompt and `out` generated tokens per request at the given concurrencies.
PlanWorkload workload(int64_t in, int64_t out, std::vector<int> concurrency) {
  PlanWorkload w;
  w.input_len = in;
  w.output_len = out;
  w.concurrency = std::move(concurrency);
  return w;
}

TEST(Planner, RingAllReduceByHand) {
  // 2 ranks: 2 * 1/2 * 2048 B / 10 GB/s + 2 * 1 * 10 us.
  expect_rel(ring_all_reduce_seconds(2048, 2, two_devices()), 2.048e-7 + 2e-5, "all-reduce");
  EXPECT_EQ(ring_all_reduce_seconds(2048, 1, two_devices()), 0.0);
}

// The output projection split by vocabulary rows: TP2 reads half of it per step and all-gathers
// the step's logits; a tied output stays resident whole (it is the embedding table).
TEST(Planner, VocabularyParallelOutputByHand) {
  PlanModel m = small_model();
  m.vocab = 1000;
  m.embedding_bytes = 2e8;
  m.output_bytes = 2e8;
  const PlanWorkload w = workload(1000, 200, {4});
  auto plans = plan_layouts(m, two_devices(), w);
  ASSERT_EQ(plans.size(), 3u);
  const LayoutPlan &dp2 = plans[0], &tp2 = plans[2];
  // Resident: DP2 1e9 + 8e9 + embedding 2e8 + output 2e8; TP2 1e9 + 4e9 + 2e8 + 2e8 / 2.
  expect_rel(dp2.weight_gib, 9.4e9 / (1 << 30), "DP2 weights");
  expect_rel(tp2.weight_gib, 5.3e9 / (1 << 30), "TP2 weights");
  // Decode of 4 sequences, context 1100: TP2 reads 1e9 + 4e9 + 2e8 / 2 + 4 * 1100 * 2048 B;
  // communication: 4 all-reduces of 4 * 1024 * 2 B (2 x 4096 / 10e9 + 2 x 10 us each) and one
  // all-gather of the 4 x 1000 f32 logits (16000 / 2 / 10e9 + 10 us).
  const PhaseCost& d2 = tp2.decode[0];
  expect_rel(d2.memory_s, (5.1e9 + 4 * 1100 * 2048.0) / 1e12, "TP2 decode memory");
  expect_rel(d2.comm_s, 4 * (8192 / 1e10 + 2e-5) + (8000 / 1e10 + 1e-5), "TP2 decode comm");
  // DP2: each replica reads its whole output projection; nothing to gather.
  expect_rel(dp2.decode[0].memory_s, (9.2e9 + 2 * 1100 * 4096.0) / 1e12, "DP2 decode memory");
  EXPECT_EQ(dp2.decode[0].comm_s, 0.0);
  m.tied_output = true;  // the embedding table is the output: no second copy, still read split
  auto tied = plan_layouts(m, two_devices(), w);
  expect_rel(tied[2].weight_gib, 5.2e9 / (1 << 30), "TP2 weights, tied");
  expect_rel(tied[2].decode[0].memory_s, d2.memory_s, "TP2 decode memory, tied");
}

// Calibrated efficiencies scale the two roofline terms: at half the compute peak and 80% of the
// bandwidth the small case's decode memory term is 9.0045056 ms / 0.8 and its prefill compute
// 80.04096 ms / 0.5; out-of-range fractions are refused naming the field.
TEST(Planner, EfficienciesScaleTheRooflineTerms) {
  nlohmann::json j{{"name", "two"},
                   {"devices", 2},
                   {"memory_gib", 16},
                   {"memory_bandwidth_gbps", 1000},
                   {"compute_tflops", 100},
                   {"compute_efficiency", 0.5},
                   {"bandwidth_efficiency", 0.8},
                   {"interconnect", {{"kind", "test link"}, {"bandwidth_gbps", 10}, {"latency_us", 10}}}};
  const PlanWorkload w = workload(1000, 200, {1});
  auto plans = plan_layouts(small_model(), hardware_from_json(j, "test"), w);
  expect_rel(plans[0].decode[0].memory_s, 9.0045056e-3 / 0.8, "decode memory");
  expect_rel(plans[0].decode[0].compute_s, 8.0090112e-5 / 0.5, "decode compute");
  expect_rel(plans[0].prefill.compute_s, 0.08004096 / 0.5, "prefill compute");
  for (const char* key : {"compute_efficiency", "bandwidth_efficiency"}) {
    for (double bad : {0.0, 1.5}) {
      nlohmann::json b = j;
      b[key] = bad;
      try {
        hardware_from_json(b, "hw.json");
        ADD_FAILURE() << key << " = " << bad << " accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      }
    }
  }
}

TEST(Planner, SmallCaseMatchesHandArithmetic) {
  const PlanWorkload w = workload(1000, 200, {1});
  auto plans = plan_layouts(small_model(), two_devices(), w);
  ASSERT_EQ(plans.size(), 3u);  // DP2, CP2 (prefill only), TP2
  const LayoutPlan &tp1 = plans[0], &tp2 = plans[2];
  ASSERT_TRUE(tp1.fits && tp2.fits);
  EXPECT_EQ(tp1.layout.name, "DP2");
  EXPECT_EQ(plans[1].layout.name, "CP2");
  EXPECT_EQ(tp2.layout.name, "TP2");
  EXPECT_EQ(tp1.layout.groups, 2);
  EXPECT_EQ(tp2.layout.groups, 1);

  // TP=1: 9e9 B of weights; activations 1000 tokens * 4 * 1024 * 2 B = 8192000 B (ff = 0);
  // KV per token 2 (K,V) * 2 layers * 4 heads * 128 * 2 B = 4096 B;
  // free 16 GiB - 9e9 - 8192000 B = 8171677184 B -> 1995038 tokens -> 1662 sequences of 1200.
  expect_rel(tp1.weight_gib, 9e9 / (1 << 30), "TP1 weights");
  expect_rel(tp1.activation_gib, 8192000.0 / (1 << 30), "TP1 activations");
  EXPECT_EQ(tp1.kv_bytes_per_token, 4096);
  EXPECT_EQ(tp1.kv_capacity_tokens, 1995038);
  EXPECT_EQ(tp1.max_sequences, 1662);
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

  // Overlapped as two micro-batches: max(compute, 2 x memory, comm). Prefill hides its 0.8992 ms
  // of all-reduces behind 40.02 ms of compute; decode would read the weights twice (10 ms), so
  // its overlapped figure is lower than its plain one. DP2 communicates nothing: no figure.
  expect_rel(p2.overlapped_s, 0.04002048, "TP2 prefill overlapped");
  expect_rel(p2.overlapped_tokens_per_s, 1000 / 0.04002048, "TP2 prefill overlapped tok/s");
  expect_rel(d2.overlapped_s, 2 * 5.0022528e-3, "TP2 decode overlapped");
  EXPECT_LT(d2.overlapped_tokens_per_s, d2.tokens_per_s);
  EXPECT_EQ(p1.overlapped_s, 0.0);
  // A link whose collectives run on the compute units (CPU ranks) overlaps nothing.
  PlanHardware cpu = two_devices();
  cpu.link_overlaps = false;
  EXPECT_EQ(plan_layouts(small_model(), cpu, w)[2].prefill.overlapped_tokens_per_s, 0.0);

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
  // TP2: 5e9 B = 4.657 GiB of weights + 1024 * 4 * 1024 * 2 B = 0.0078 GiB of activations.
  EXPECT_NE(plans[2].why_not.find("weights 4.66 GiB + activations 0.01 GiB per device, 4.00 GiB available (short by 0.66 GiB)"),
            std::string::npos)
      << plans[2].why_not;
}

TEST(Planner, SkipsSizesThatDoNotDivideTheHeads) {
  PlanHardware hw = two_devices();
  hw.devices = 8;  // TP=8 does not divide 4 KV heads
  auto plans = plan_layouts(small_model(), hw, PlanWorkload{});
  ASSERT_EQ(plans.size(), 7u);  // DP8, CP8, TP2xDP4, CP4xTP2, TP4xDP2, CP2xTP4, TP8
  EXPECT_EQ(plans[4].layout.name, "TP4xDP2");
  EXPECT_TRUE(plans[4].fits);
  EXPECT_EQ(plans[6].layout.name, "TP8");
  EXPECT_FALSE(plans[6].fits);
  EXPECT_NE(plans[6].why_not.find("does not divide the 8 heads / 4 KV heads"), std::string::npos) << plans[6].why_not;
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
  EXPECT_NE(out.find("TP8                    does not fit: TP=8 does not divide the 8 heads / 4 KV heads"), std::string::npos) << out;
}

TEST(Planner, CommandReadsMoeMlaModelFiles) {
  // ds3-tiny (fixtures README): 1 dense + 2 MoE layers, MLA, one shared expert.
  const std::string model = test::testdata("models/fixtures/ds3-tiny.gguf");
  FP_REQUIRE_FILE(model);
  int rc = 0;
  const std::string out = test::run_command(test::fastpath_bin() + " plan -m " + model + " --hardware " +
                                                FASTPATH_SOURCE_DIR_FOR_TESTS + "/hardware/pcie5-8x48gb.json 2>&1",
                                            &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("4 heads / 4 KV heads, MLA latent 32 + rope 16, 8 experts (top 2) on 2 layers"), std::string::npos) << out;
  EXPECT_NE(out.find("DP8-attn+EP8"), std::string::npos) << out;
  EXPECT_NE(out.find("best decode layout at concurrency 16: "), std::string::npos) << out;
}

// A model file's windows (Gemma 3: five layers of six slide theirs), read through the command.
TEST(Planner, CommandReadsWindowedModelFiles) {
  SynthOptions o;
  o.arch = "gemma3";
  o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 32},
              {"intermediate_size", 96}, {"num_hidden_layers", 12}, {"vocab_size", 512}, {"sliding_window", 512},
              {"query_pre_attn_scalar", 32}};
  o.out = test::temp_dir("plan_windows") + "/gemma3.gguf";
  synth_model(o);
  int rc = 0;
  const std::string out = test::run_command(test::fastpath_bin() + " plan -m " + o.out + " --hardware " +
                                                FASTPATH_SOURCE_DIR_FOR_TESTS + "/hardware/pcie5-8x48gb.json 2>&1",
                                            &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("sliding window 512 on 10 layers"), std::string::npos) << out;
}

// A tiny MoE + MLA model: 2 layers, both with 4 routed experts of 1e8 B (top 2) and a shared
// expert (2e8 B over both layers); dim 1000, 4 heads, latent 100 + rope 20, nope 44 (head_dim 64).
PlanModel tiny_moe() {
  PlanModel m;
  m.name = "tiny-moe";
  m.n_layers = 2;
  m.dim = 1000;
  m.n_heads = m.n_kv_heads = 4;
  m.head_dim = 64;
  m.v_head_dim = 64;
  m.kv_lora_rank = 100;
  m.rope_dim = 20;
  m.split_bytes = 4e8;
  m.replicated_bytes = 1e8;
  m.matmul_flops_per_token = 1e9;
  m.n_experts = 4;
  m.n_used = 2;
  m.n_moe_layers = 2;
  m.expert_bytes = 1e8;
  m.expert_flops = 1e8;
  m.shared_bytes = 2e8;
  m.shared_flops = 4e8;
  return m;
}

TEST(Planner, CollectivesAndExpertsByHand) {
  PlanHardware hw = two_devices();
  hw.collective_us = 5;
  // All-gather of 24000 B on 2 ranks: 5 us + 1/2 * 24000 / 10 GB/s + 1 * 10 us = 16.2 us.
  expect_rel(ring_all_gather_seconds(24000, 2, hw), 5e-6 + 1.2e-6 + 1e-5, "all-gather");
  // All-to-all with 4000 B leaving a rank of 4: 5 us + 4000 / 10 GB/s + 3 * 10 us = 35.4 us.
  expect_rel(all_to_all_seconds(4000, 4, hw), 5e-6 + 4e-7 + 3e-5, "all-to-all");
  EXPECT_EQ(all_to_all_seconds(4000, 1, hw), 0.0);
  // 3 tokens picking 2 of 4 experts: each expert missed with (1 - 2/4)^3 = 1/8 -> 4 * 7/8 = 3.5.
  expect_rel(expected_distinct_experts(4, 2, 3), 3.5, "distinct experts");
  // 256 experts, top 8, one token: exactly its 8.
  expect_rel(expected_distinct_experts(256, 8, 1), 8, "one token");
}

TEST(Planner, TinyMoeMlaMatchesHandArithmetic) {
  const PlanWorkload w = workload(100, 20, {4});
  auto plans = plan_layouts(tiny_moe(), two_devices(), w);
  std::vector<std::string> names;
  for (const LayoutPlan& p : plans) names.push_back(p.layout.name);
  ASSERT_EQ(names, (std::vector<std::string>{"DP2", "CP2", "TP2", "DP2-attn+EP2", "CP2-attn+EP2", "TP2+EP2"}));
  const LayoutPlan &dp = plans[0], &tp = plans[2], &ep = plans[3], &cp_ep = plans[4];
  ASSERT_TRUE(dp.fits && tp.fits && ep.fits && cp_ep.fits);

  // Weights per device. Routed experts: 2 layers * 4 * 1e8 = 8e8 B.
  // DP2: everything on each device, 1e8 + 4e8 + 2e8 + 8e8 = 1.5e9.
  // TP2: 1e8 replicated + (4e8 + 2e8 + 8e8) / 2 = 8e8.
  // DP2-attn+EP2: 1e8 + 4e8 (attention replicated) + 2e8 (shared replicated) + 8e8 / 2 = 1.1e9.
  expect_rel(dp.weight_gib, 1.5e9 / (1 << 30), "DP2 weights");
  expect_rel(tp.weight_gib, 8e8 / (1 << 30), "TP2 weights");
  expect_rel(ep.weight_gib, 1.1e9 / (1 << 30), "EP2 weights");
  // MLA KV: 2 layers * (100 + 20) * 2 B = 480 B per token, the same under TP2 (not split by heads).
  EXPECT_EQ(tp.kv_bytes_per_token, 480);
  EXPECT_EQ(ep.kv_bytes_per_token, 480);
  // So TP2's one group and each of DP-attention's two groups hold a whole cache each:
  // TP2 free 16 GiB - 8e8 - 100 * 4000 * 2 B activations = 16379069184 B -> 34123060 tokens.
  EXPECT_EQ(tp.kv_capacity_tokens, 34123060);

  // Decode, 4 sequences, mean context 100 + 20/2 = 110.
  // TP2: one group of 4. 2 all-reduces per layer of 4 * 1000 * 2 B on 2 ranks:
  // 4 * (1/2 * 2 * 8000 B / 10 GB/s + 2 * 10 us) = 4 * 20.8 us = 83.2 us.
  // Memory: 1e8 + 4e8/2 + 4 * 110 * 480 (KV, replicated) + (2e8 + 2 layers * 3.75 distinct * 1e8) / 2
  //   with 4 tokens touching 4 * (1 - 0.5^4) = 3.75 experts: 775211200 B -> 0.7752112 ms.
  const PhaseCost& dt = tp.decode[0];
  expect_rel(dt.comm_s, 83.2e-6, "TP2 decode comm");
  expect_rel(dt.memory_s, 775211200 / 1e12, "TP2 decode memory");
  // DP2-attn+EP2: two groups of 2 sequences; each rank sends 2 tokens * 2 experts * 1/2 leaving
  // * 1000 * 2 B = 4000 B per all-to-all: 4000 / 10 GB/s + 1 * 10 us = 10.4 us; dispatch and
  // combine on both layers: 4 * 10.4 = 41.6 us (no all-reduce: one rank per group).
  // Memory: 1e8 + 4e8 + 2 * 110 * 480 + 2e8 + 2 layers * 3.75 / 2 * 1e8 = 1075105600 B.
  // Compute: (2 * 1e9 + 2 * 110 * 2*2*4*(2*100 + 20)) + 2 * 4e8 + 4 tokens * 2 * 2 layers * 1e8 / 2
  //   = 3600774400 FLOPs / 1e14.
  const PhaseCost& de = ep.decode[0];
  expect_rel(de.comm_s, 41.6e-6, "EP2 decode comm");
  expect_rel(de.memory_s, 1075105600 / 1e12, "EP2 decode memory");
  expect_rel(de.compute_s, 3600774400 / 1e14, "EP2 decode compute");
  expect_rel(de.tokens_per_s, 4 / (1075105600 / 1e12 + 41.6e-6), "EP2 decode tok/s");
  EXPECT_EQ(de.batch, 2);
  // CP2-attn+EP2 prefill: one prompt of 100, 50 tokens per rank. Each layer all-gathers the
  // chunks' latent rows, 100 * 240 B: 1/2 * 24000 / 10 GB/s + 10 us = 11.2 us; the MoE sends
  // 50 * 2 * 1/2 * 2000 = 100000 B: 10 us + 10 us = 20 us, twice per layer.
  // 2 * 11.2 + 2 * 2 * 20 = 102.4 us.
  expect_rel(cp_ep.prefill.comm_s, 102.4e-6, "CP2 EP2 prefill comm");
  EXPECT_TRUE(cp_ep.decode.empty());
}

TEST(Planner, MoeRefusalSaysWhatIsShort) {
  PlanHardware hw = two_devices();
  hw.memory_gib = 0.5;
  auto plans = plan_layouts(tiny_moe(), hw, PlanWorkload{});
  for (const LayoutPlan& p : plans) {
    EXPECT_FALSE(p.fits) << p.layout.name;
    EXPECT_NE(p.why_not.find("short by"), std::string::npos) << p.why_not;
  }
  // TP2: 8e8 B = 0.745 GiB + 1024 * 4 * 1000 * 2 B = 0.0076 GiB, short by 0.253 GiB.
  EXPECT_NE(plans[2].why_not.find("weights 0.75 GiB + activations 0.01 GiB per device, 0.50 GiB available (short by 0.25 GiB)"),
            std::string::npos)
      << plans[2].why_not;
  // DP2-attn+EP2: 1.1e9 B = 1.024 GiB + 0.0076 GiB, short by 0.532 GiB.
  EXPECT_NE(plans[3].why_not.find("(short by 0.53 GiB)"), std::string::npos) << plans[3].why_not;
}

// DeepSeek-V3's config.json (the fields plan reads), FP8 weights at 1 byte per parameter.
nlohmann::json deepseek_v3_config() {
  return nlohmann::json::parse(R"({"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "vocab_size": 129280, "tie_word_embeddings": false})");
}

TEST(Planner, ReadsDeepSeekV3Config) {
  const PlanModel m = plan_model_from_hf_config(deepseek_v3_config(), "v3.json", 1);
  EXPECT_EQ(m.n_moe_layers, 58);  // 61 - first 3 dense
  EXPECT_EQ(m.head_dim, 192);     // nope 128 + rope 64
  // Attention split by heads, per layer: q_b 1536*128*192 + kv_b 512*128*256 + o 128*128*7168
  //   = 171966464; 61 layers = 10489954304; dense FFN 3 * 3*7168*18432 = 1189085184.
  expect_rel(m.split_bytes, 10489954304.0 + 1189085184.0, "attention + dense FFN");
  expect_rel(m.expert_bytes, 3.0 * 7168 * 2048, "one expert");
  expect_rel(m.shared_bytes, 58.0 * 3 * 7168 * 2048, "shared experts");
  // Replicated: routers 58 * 7168 * 256 and the head-less down-projections q_a 7168*1536 + kv_a
  // 7168*576 on 61 layers; the embedding and the (untied) output projection 129280 * 7168 each.
  expect_rel(m.replicated_bytes, 58.0 * 7168 * 256 + 61.0 * 7168 * (1536 + 576), "replicated");
  expect_rel(m.embedding_bytes, 129280.0 * 7168, "embedding");
  expect_rel(m.output_bytes, 129280.0 * 7168, "output");
  EXPECT_FALSE(m.tied_output);
  EXPECT_EQ(m.vocab, 129280);
  // All together: 671025397760 parameters, DeepSeek's "671B".
  const double total =
      m.split_bytes + m.shared_bytes + m.replicated_bytes + m.embedding_bytes + m.output_bytes + 58.0 * 256 * m.expert_bytes;
  expect_rel(total, 671025397760.0, "total");
}

TEST(Planner, ReadsQwenMoeSparseLayers) {
  // 4 layers, sparse every 2nd ((l + 1) % 2 == 0: layers 1, 3), layer 3 forced dense: 1 MoE layer.
  nlohmann::json j{{"hidden_size", 64}, {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                   {"head_dim", 16}, {"vocab_size", 100}, {"intermediate_size", 96}, {"num_experts", 8},
                   {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32}, {"decoder_sparse_step", 2},
                   {"mlp_only_layers", {3}}};
  const PlanModel m = plan_model_from_hf_config(j, "qwen.json", 2);
  EXPECT_EQ(m.n_moe_layers, 1);
  EXPECT_EQ(m.n_experts, 8);
  // Attention 4 layers * (64*64 + 2*64*32 + 64*64) + 3 dense FFNs * 3*64*96, 2 B each.
  expect_rel(m.split_bytes, (4.0 * (4096 + 4096 + 4096) + 3.0 * 18432) * 2, "split");
  expect_rel(m.expert_bytes, 3.0 * 64 * 32 * 2, "expert");
}

// Mixtral-8x7B's config.json: num_local_experts, experts as wide as intermediate_size, every layer
// sparse. Its 46,702,792,704 parameters less the 32 * 2 + 1 norms of 4096.
TEST(Planner, ReadsMixtralLocalExperts) {
  nlohmann::json j{{"architectures", {"MixtralForCausalLM"}}, {"hidden_size", 4096}, {"num_hidden_layers", 32},
                   {"num_attention_heads", 32}, {"num_key_value_heads", 8}, {"vocab_size", 32000},
                   {"intermediate_size", 14336}, {"num_local_experts", 8}, {"num_experts_per_tok", 2},
                   {"tie_word_embeddings", false}};
  const PlanModel m = plan_model_from_hf_config(j, "mixtral.json", 1);
  EXPECT_EQ(m.n_experts, 8);
  EXPECT_EQ(m.n_used, 2);
  EXPECT_EQ(m.n_moe_layers, 32);
  expect_rel(m.expert_bytes, 3.0 * 4096 * 14336, "expert");
  const double total = m.split_bytes + m.shared_bytes + m.replicated_bytes + m.embedding_bytes + m.output_bytes +
                       32.0 * 8 * m.expert_bytes;
  expect_rel(total, 46702792704.0 - 65.0 * 4096, "total");
}

// GraniteMoeShared's config.json: Mixtral's num_local_experts (as wide as intermediate_size) and
// one shared expert of shared_intermediate_size on every layer.
TEST(Planner, ReadsGraniteMoeSharedExpert) {
  nlohmann::json j{{"architectures", {"GraniteMoeSharedForCausalLM"}}, {"hidden_size", 1536}, {"num_hidden_layers", 32},
                   {"num_attention_heads", 24}, {"num_key_value_heads", 8}, {"vocab_size", 49160},
                   {"intermediate_size", 512}, {"num_local_experts", 40}, {"num_experts_per_tok", 8},
                   {"shared_intermediate_size", 1024}, {"tie_word_embeddings", true}};
  const PlanModel m = plan_model_from_hf_config(j, "granitemoeshared.json", 2);
  EXPECT_EQ(m.n_experts, 40);
  EXPECT_EQ(m.n_moe_layers, 32);
  expect_rel(m.expert_bytes, 3.0 * 1536 * 512 * 2, "expert");
  expect_rel(m.shared_bytes, 32.0 * 3 * 1536 * 1024 * 2, "shared expert");
}

// ERNIE-4.5-21B-A3B's config.json: its own MoE keys (moe_num_experts, moe_k, two shared experts
// of moe_intermediate_size, a dense first layer); OLMo 3 and EXAONE 4.0 slide a window on three
// layers of four without listing layer_types.
TEST(Planner, ReadsErnieMoeKeysAndOlmo3Exaone4Windows) {
  nlohmann::json j{{"architectures", {"Ernie4_5_MoeForCausalLM"}}, {"model_type", "ernie4_5_moe"}, {"hidden_size", 2560},
                   {"num_hidden_layers", 28}, {"num_attention_heads", 20}, {"num_key_value_heads", 4},
                   {"vocab_size", 103424}, {"intermediate_size", 12288}, {"moe_num_experts", 64}, {"moe_k", 6},
                   {"moe_intermediate_size", 1536}, {"moe_num_shared_experts", 2}, {"moe_layer_start_index", 1},
                   {"moe_layer_end_index", 27}, {"moe_layer_interval", 1}, {"tie_word_embeddings", true}};
  const PlanModel m = plan_model_from_hf_config(j, "ernie.json", 2);
  EXPECT_EQ(m.n_experts, 64);
  EXPECT_EQ(m.n_used, 6);
  EXPECT_EQ(m.n_moe_layers, 27);
  expect_rel(m.expert_bytes, 3.0 * 2560 * 1536 * 2, "expert");
  expect_rel(m.shared_bytes, 27.0 * 3 * 2560 * 3072 * 2, "shared experts");
  for (auto [type, pattern] : {std::pair{"olmo3", nlohmann::json(nullptr)}, std::pair{"exaone4", nlohmann::json("LLLG")}}) {
    nlohmann::json d{{"model_type", type}, {"hidden_size", 4096}, {"num_hidden_layers", 32}, {"num_attention_heads", 32},
                     {"vocab_size", 100000}, {"intermediate_size", 11008}, {"sliding_window", 4096}};
    if (!pattern.is_null()) d["sliding_window_pattern"] = pattern;
    const PlanModel w = plan_model_from_hf_config(d, type, 2);
    EXPECT_EQ(w.window, 4096) << type;
    EXPECT_EQ(w.n_window_layers, 24) << type;
  }
}

// Llama 4 from its multimodal config (text_config): Scout's 16 top-1 experts and a shared expert
// on every layer, chunks of 8192 on three layers of four (their KV trimmed as that window);
// Maverick's 128 experts on every second layer, the others dense at intermediate_size_mlp.
TEST(Planner, ReadsLlama4FromItsMultimodalConfig) {
  nlohmann::json text{{"model_type", "llama4_text"}, {"hidden_size", 5120}, {"num_hidden_layers", 48},
                      {"num_attention_heads", 40}, {"num_key_value_heads", 8}, {"head_dim", 128}, {"vocab_size", 202048},
                      {"intermediate_size", 8192}, {"intermediate_size_mlp", 16384}, {"num_local_experts", 16},
                      {"num_experts_per_tok", 1}, {"interleave_moe_layer_step", 1}, {"attention_chunk_size", 8192}};
  nlohmann::json scout = nlohmann::json::object();
  scout["architectures"] = nlohmann::json::array({"Llama4ForConditionalGeneration"});
  scout["model_type"] = "llama4";
  scout["text_config"] = text;
  scout["vision_config"] = nlohmann::json::object({{"hidden_size", 1408}});
  const PlanModel m = plan_model_from_hf_config(scout, "scout.json", 2);
  EXPECT_EQ(m.n_experts, 16);
  EXPECT_EQ(m.n_used, 1);
  EXPECT_EQ(m.n_moe_layers, 48);
  expect_rel(m.expert_bytes, 3.0 * 5120 * 8192 * 2, "expert");
  expect_rel(m.shared_bytes, 48.0 * 3 * 5120 * 8192 * 2, "shared experts");
  EXPECT_EQ(m.window, 8192);
  EXPECT_EQ(m.n_window_layers, 36);
  text["num_local_experts"] = 128;
  text["interleave_moe_layer_step"] = 2;
  const PlanModel v = plan_model_from_hf_config(text, "maverick.json", 2);
  EXPECT_EQ(v.n_moe_layers, 24);
  EXPECT_EQ(v.ff, 16384);
  text["moe_layers"] = {0, 5};
  EXPECT_EQ(plan_model_from_hf_config(text, "listed.json", 2).n_moe_layers, 2);
  text["attention_chunk_size"] = nullptr;
  EXPECT_EQ(plan_model_from_hf_config(text, "no_chunks.json", 2).window, 0);
}

// Sliding-window layers keep and read at most `window` positions. Every layer windowed at w and
// sequences much longer than w: each sequence holds w positions of every layer, so the free
// memory over w positions' KV is how many fit; decode reads less KV per step. With the window at
// least as long as the sequence, nothing changes. Half the layers windowed: the KV of a sequence
// is the mean of the two.
TEST(Planner, WindowedLayersHoldAndReadTheirWindow) {
  PlanModel plain = small_model();
  PlanModel windowed = plain;
  windowed.window = 256;
  windowed.n_window_layers = 2;
  const PlanWorkload long_w = workload(8000, 192, {4});
  const auto win = plan_layouts(windowed, two_devices(), long_w), untrimmed = plan_layouts(plain, two_devices(), long_w);
  ASSERT_EQ(win.size(), untrimmed.size());
  for (size_t i = 0; i < win.size(); ++i) {
    ASSERT_TRUE(win[i].fits) << win[i].layout.name;
    // 16 GiB less the weights and activations, over 256 positions x 2 layers x K and V x the
    // rank's KV heads x 128 x 2 bytes.
    const double free_bytes = (16.0 - win[i].weight_gib - win[i].activation_gib) * (1 << 30);
    const double per_sequence = 256.0 * 2 * 2 * (4 / win[i].layout.tp) * 128 * 2;
    EXPECT_EQ(win[i].max_sequences, static_cast<int64_t>(free_bytes / per_sequence)) << win[i].layout.name;
    EXPECT_GT(win[i].max_sequences, 20 * untrimmed[i].max_sequences) << win[i].layout.name << ": 8192 positions against 256";
    if (!win[i].decode.empty()) {
      // Decode reads the weights plus 4 sequences x 256 positions, as the short workload at context 256.
      EXPECT_LT(win[i].decode[0].memory_s, untrimmed[i].decode[0].memory_s) << win[i].layout.name;
      EXPECT_GT(win[i].decode[0].tokens_per_s, untrimmed[i].decode[0].tokens_per_s) << win[i].layout.name;
    }
  }
  // The prompt's attention: every query attends to at most 256 positions (8000 x 256 - 256^2 / 2
  // pairs against 8000^2 / 2), visible in the prefill compute time.
  EXPECT_LT(win[0].prefill.compute_s, untrimmed[0].prefill.compute_s);
  windowed.window = 1 << 20;  // longer than any sequence: the same plan as without
  const auto wide = plan_layouts(windowed, two_devices(), long_w);
  for (size_t i = 0; i < wide.size(); ++i) {
    EXPECT_EQ(wide[i].max_sequences, untrimmed[i].max_sequences);
    EXPECT_EQ(wide[i].kv_capacity_tokens, untrimmed[i].kv_capacity_tokens);
    expect_rel(wide[i].prefill.seconds, untrimmed[i].prefill.seconds, "prefill");
  }
  windowed.window = 256;
  windowed.n_window_layers = 1;  // one layer of two: (8192 + 256) / 2 positions per layer
  const auto half = plan_layouts(windowed, two_devices(), long_w);
  expect_rel(half[0].kv_bytes_per_token, untrimmed[0].kv_bytes_per_token * (8192.0 + 256) / 2 / 8192, "KV per token");
  windowed.n_window_layers = 3;
  EXPECT_THROW(plan_layouts(windowed, two_devices(), long_w), Error);
}

// Which layers slide the window, from config.json: layer_types, else the model type's pattern.
TEST(Planner, ReadsSlidingWindowLayers) {
  auto base = [](const std::string& type, int64_t layers) {
    return nlohmann::json{{"model_type", type},  {"hidden_size", 64},       {"num_hidden_layers", layers},
                          {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
                          {"vocab_size", 100},   {"intermediate_size", 96}, {"sliding_window", 1024}};
  };
  auto windowed = [&](const nlohmann::json& j) {
    const PlanModel m = plan_model_from_hf_config(j, "cfg.json", 2);
    return std::pair{m.window, m.n_window_layers};
  };
  EXPECT_EQ(windowed(base("gemma3_text", 62)), (std::pair<int64_t, int64_t>{1024, 52}));  // Gemma 3 27B: 10 global layers
  EXPECT_EQ(windowed(base("gpt_oss", 24)), (std::pair<int64_t, int64_t>{1024, 12}));
  EXPECT_EQ(windowed(base("mistral", 32)), (std::pair<int64_t, int64_t>{1024, 32}));
  EXPECT_EQ(windowed(base("qwen2", 28)), (std::pair<int64_t, int64_t>{0, 0})) << "no use_sliding_window";
  nlohmann::json j = base("qwen2", 4);
  j["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention", "full_attention"};
  j["use_sliding_window"] = true;
  EXPECT_EQ(windowed(j), (std::pair<int64_t, int64_t>{1024, 2}));
  j["layer_types"] = {"full_attention"};
  EXPECT_THROW(windowed(j), Error);
  j = base("llama", 4);
  try {
    windowed(j);
    ADD_FAILURE() << "a window on unknown layers";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_types"), std::string::npos) << e.what();
  }
  j["sliding_window"] = nullptr;
  EXPECT_EQ(windowed(j), (std::pair<int64_t, int64_t>{0, 0}));
}

TEST(Planner, ConfigErrorsNameTheField) {
  auto error_of = [](const nlohmann::json& j) -> std::string {
    try {
      plan_model_from_hf_config(j, "cfg.json", 1);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  nlohmann::json j = deepseek_v3_config();
  j.erase("moe_intermediate_size");
  EXPECT_NE(error_of(j).find("cfg.json: field 'moe_intermediate_size'"), std::string::npos) << error_of(j);
  j = deepseek_v3_config();
  j["num_experts_per_tok"] = 300;
  EXPECT_NE(error_of(j).find("field 'num_experts_per_tok' (300) exceeds the 256 routed experts"), std::string::npos)
      << error_of(j);
  j = deepseek_v3_config();
  j["qk_rope_head_dim"] = "64";
  EXPECT_NE(error_of(j).find("cfg.json: field 'qk_rope_head_dim' must be a positive integer"), std::string::npos)
      << error_of(j);
  j = deepseek_v3_config();
  j["mlp_only_layers"] = 3;
  EXPECT_NE(error_of(j).find("field 'mlp_only_layers' must be an array"), std::string::npos) << error_of(j);
}

PlanHardware shipped(const std::string& file) {
  const std::string path = std::string(FASTPATH_SOURCE_DIR_FOR_TESTS) + "/hardware/" + file;
  std::ifstream in(path);
  return hardware_from_json(nlohmann::json::parse(in), path);
}

// DeepSeek-V3 FP8 (625 GiB) on the two 8-GPU boxes it fits: PCIe Gen5 96 GB and H200 NVLink.
// At 64 concurrent requests the PCIe box is better off with DP attention + EP (TP8's 122
// all-reduces per step cost more over 40 GB/s than EP's all-to-alls); NVLink makes them cheap
// and TP8, which splits the attention weights, wins.
TEST(Planner, DeepSeekV3DecodeLayoutDiffersOnPcieAndNvlink) {
  const PlanModel m = plan_model_from_hf_config(deepseek_v3_config(), "v3.json", 1);
  PlanWorkload w;
  w.concurrency = {64};
  const auto pcie = plan_layouts(m, shipped("pcie5-8x96gb.json"), w);
  const auto nvlink = plan_layouts(m, shipped("h200-8x-nvlink.json"), w);
  const LayoutPlan *bp = best_decode(pcie, 0), *bn = best_decode(nvlink, 0);
  ASSERT_TRUE(bp && bn);
  EXPECT_EQ(bp->layout.name, "DP4xTP2-attn+EP8");
  EXPECT_EQ(bn->layout.name, "TP8");
  const std::string why = explain_best(pcie, *bp, true, 0);
  EXPECT_NE(why.find("rather than TP8"), std::string::npos) << why;
  EXPECT_NE(why.find("less communication per token"), std::string::npos) << why;
  // The reason is the step costs themselves: on PCIe the winner communicates less than TP8.
  const LayoutPlan* tp8 = nullptr;
  for (const LayoutPlan& p : pcie)
    if (p.layout.name == "TP8") tp8 = &p;
  ASSERT_TRUE(tp8 && tp8->fits);
  EXPECT_LT(bp->decode[0].comm_s, tp8->decode[0].comm_s);
  EXPECT_NE(explain_best(nvlink, *bn, true, 0).find("communication"), std::string::npos);
}

TEST(Planner, DeepSeekV3DoesNotFitEightH100s) {
  const PlanModel m = plan_model_from_hf_config(deepseek_v3_config(), "v3.json", 1);
  for (const LayoutPlan& p : plan_layouts(m, shipped("h100-8x-nvlink.json"), PlanWorkload{})) {
    EXPECT_FALSE(p.fits) << p.layout.name;
    EXPECT_NE(p.why_not.find("short by"), std::string::npos) << p.why_not;
  }
}

TEST(Planner, CommandExplainsDeepSeekV3Choices) {
  const std::string dir = test::temp_dir("planner_v3");
  const std::string cfg = dir + "/config.json";
  std::ofstream(cfg) << deepseek_v3_config().dump();
  int rc = 0;
  const std::string out = test::run_command(test::fastpath_bin() + " plan -m " + cfg + " --weight-bytes 1 --hardware " +
                                                FASTPATH_SOURCE_DIR_FOR_TESTS + "/hardware/pcie5-8x96gb.json 2>&1",
                                            &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("best decode layout at concurrency 64: DP4xTP2-attn+EP8"), std::string::npos) << out;
  EXPECT_NE(out.find("prefill and decode differ"), std::string::npos) << out;
  const std::string h100 = test::run_command(test::fastpath_bin() + " plan -m " + cfg + " --weight-bytes 1 --hardware " +
                                                 FASTPATH_SOURCE_DIR_FOR_TESTS + "/hardware/h100-8x-nvlink.json 2>&1",
                                             &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(h100.find("does not fit"), std::string::npos) << h100;
  // 80.47 GiB with the output projection whole on every rank; split 8 ways by vocabulary rows
  // it saves 7/8 of 129280 x 7168 B = 0.755 GiB per device.
  EXPECT_NE(h100.find("TP8: weights 79.71 GiB"), std::string::npos) << h100;
}

// --parallel-plan (parallel/layout_choice.h): of the costed layouts, the runnable ones; decode
// first (most output tokens/s at the concurrency), then the prefill layout with it.
const LayoutPlan& named(const std::vector<LayoutPlan>& plans, const std::string& name) {
  for (const LayoutPlan& p : plans)
    if (p.layout.name == name) return p;
  ADD_FAILURE() << "no layout " << name;
  return plans.front();
}

TEST(LayoutChoice, DenseModelTakesTensorParallelDecodeAndTheFasterPrefill) {
  const PlanModel m = small_model();
  PlanWorkload w;
  w.concurrency = {16};
  PlanHardware hw = two_devices();
  hw.link_gbps = 0.5;  // a slow link: TP2's all-reduces weigh on prefill
  const auto plans = plan_layouts(m, hw, w);
  const LayoutChoice c = choose_runtime_layout(plans, 2, false, false, 0);
  EXPECT_EQ(c.decode->layout.name, "TP2") << "the only runnable decode layout of a dense model on 2 ranks";
  EXPECT_EQ(c.tp, 2);
  EXPECT_EQ(c.ep, 1);
  EXPECT_FALSE(c.dp_attention);
  // Prefill: CP2 when the planner predicts it at least 5% faster than TP2, else TP2; the sizes
  // and flags follow.
  const bool cp_faster = named(plans, "CP2").prefill.tokens_per_s >= 1.05 * named(plans, "TP2").prefill.tokens_per_s;
  EXPECT_EQ(c.prefill->layout.name, cp_faster ? "CP2" : "TP2");
  EXPECT_EQ(c.cp, cp_faster ? 2 : 1);
  EXPECT_EQ(c.flags, cp_faster ? "--tp 2 --pcp 2" : "--tp 2");
  EXPECT_NE(c.why.find("decode candidates:\n    TP2 "), std::string::npos) << c.why;
  EXPECT_NE(c.why.find("CP2 "), std::string::npos) << c.why;
  // Over the 0.5 GB/s link TP2's all-reduces (two per layer of every token's hidden state) cost
  // far more than CP2's K/V rows: CP2 is the pick here.
  EXPECT_TRUE(cp_faster);
}

// Within 5% the decode layout serves prefill too, and the log says why CP was passed over.
TEST(LayoutChoice, ContextParallelPrefillMustBeClearlyFaster) {
  PlanHardware hw = two_devices();
  hw.link_gbps = 1e6;  // a link so fast that TP2 and CP2 prefill differ by little
  hw.link_latency_us = 0;
  PlanWorkload w;
  w.concurrency = {16};
  const auto plans = plan_layouts(small_model(), hw, w);
  const double cp = named(plans, "CP2").prefill.tokens_per_s, tp = named(plans, "TP2").prefill.tokens_per_s;
  ASSERT_GT(cp, tp) << "CP2 still ahead, by less than 5%";
  ASSERT_LT(cp, 1.05 * tp);
  const LayoutChoice c = choose_runtime_layout(plans, 2, false, false, 0);
  EXPECT_EQ(c.prefill->layout.name, "TP2");
  EXPECT_EQ(c.flags, "--tp 2");
  EXPECT_NE(c.why.find("less than 5.0% ahead: not worth a second layout"), std::string::npos) << c.why;
}

TEST(LayoutChoice, OneRankIsTheWholeModel) {
  PlanHardware one = two_devices();
  one.devices = 1;
  const auto plans = plan_layouts(small_model(), one, PlanWorkload{});  // the choice points into them
  const LayoutChoice c = choose_runtime_layout(plans, 1, false, false, 0);
  EXPECT_EQ(c.decode->layout.name, "TP1");
  EXPECT_EQ(c.flags, "");
  EXPECT_EQ(c.tp * c.ep * c.cp, 1);
}

TEST(LayoutChoice, MoeModelPicksTheFasterOfTpAndTpPlusEp) {
  PlanModel m = tiny_moe();
  m.kv_lora_rank = 0;  // GQA: TP and TP+EP both run
  m.n_kv_heads = 2;
  PlanWorkload w;
  w.concurrency = {64};
  const auto plans = plan_layouts(m, two_devices(), w);
  const LayoutChoice c = choose_runtime_layout(plans, 2, true, false, 0);
  const double tp = named(plans, "TP2").decode[0].tokens_per_s, tpep = named(plans, "TP2+EP2").decode[0].tokens_per_s;
  EXPECT_EQ(c.decode->layout.name, tpep > tp ? "TP2+EP2" : "TP2");
  EXPECT_EQ(c.ep, tpep > tp ? 2 : 1);
  EXPECT_EQ(c.tp, 2);
  EXPECT_NE(c.why.find("TP2+EP2 "), std::string::npos) << c.why;
}

// DeepSeek-V3 FP8 on the 8x PCIe Gen5 96 GB box at 64 requests: the planner's best decode layout,
// DP4xTP2-attn+EP8, is not one the runtime has (MLA runs no TP); the runtime's one, DP8-attn+EP8
// with --data-parallel-attention, is chosen and the difference said; no CP with DP attention.
TEST(LayoutChoice, DeepSeekV3TakesDataParallelAttentionAndSaysWhatItCannotRun) {
  const PlanModel m = plan_model_from_hf_config(deepseek_v3_config(), "v3.json", 1);
  PlanWorkload w;
  w.concurrency = {64};
  const auto plans = plan_layouts(m, shipped("pcie5-8x96gb.json"), w);
  const LayoutChoice c = choose_runtime_layout(plans, 8, true, true, 0);
  EXPECT_EQ(c.decode->layout.name, "DP8-attn+EP8");
  EXPECT_EQ(c.prefill->layout.name, "DP8-attn+EP8");
  EXPECT_EQ(c.flags, "--ep 8 --data-parallel-attention");
  EXPECT_TRUE(c.dp_attention);
  EXPECT_EQ(c.cp, 1);
  EXPECT_NE(c.why.find("the planner's best decode layout, DP4xTP2-attn+EP8"), std::string::npos) << c.why;
}

TEST(LayoutChoice, NothingRunnableFitsSaysWhatIsShort) {
  const PlanModel m = plan_model_from_hf_config(deepseek_v3_config(), "v3.json", 1);
  const auto plans = plan_layouts(m, shipped("h100-8x-nvlink.json"), PlanWorkload{});
  try {
    choose_runtime_layout(plans, 8, true, true, 0);
    ADD_FAILURE() << "DeepSeek-V3 does not fit 8x H100";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no layout this runtime runs on 8 ranks fits"), std::string::npos) << what;
    EXPECT_NE(what.find("DP8-attn+EP8: "), std::string::npos) << what;
    EXPECT_NE(what.find("short by"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace fp
