// tests/cli_audit_bench_test.cpp — `audit` prints the ledger and --strict fails on a fallback
// (provoked by masking the CPU's AVX2); `bench --json` has the contract's keys; the KV cache
// dtype `auto` picks from the weights.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/cpu_features.h"
#include "model/synth.h"
#include "test_util.h"

namespace fp {
namespace {

TEST(CliAudit, PrintsTheLedgerAndStrictPassesWithoutFallbacks) {
  FP_REQUIRE_FILE(test::stories_path());
  int rc = -1;
  std::string out = test::run_command(test::fastpath_bin() + " audit -q --strict -m " + test::stories_path(), &rc);
  EXPECT_EQ(rc, 0) << out;
  for (const char* op : {"matmul", "attention", "rmsnorm", "rope", "silu_mul", "embedding", "add"})
    EXPECT_NE(out.find(op), std::string::npos) << op << "\n" << out;
  EXPECT_NE(out.find("0 fallbacks"), std::string::npos) << out;
}

TEST(CliAudit, StrictFailsWhenAFastKernelIsRefused) {
  FP_REQUIRE_FILE(test::stories_path());
  if (!cpu_features().missing({"avx2"}).empty()) GTEST_SKIP() << "no AVX2 kernels to refuse on this CPU";
  int rc = -1;
  std::string out = test::run_command("FASTPATH_CPU_DISABLE=avx2 " + test::fastpath_bin() + " audit --strict -m " + test::stories_path() + " 2>&1", &rc);
  EXPECT_EQ(rc, 3) << out;
  EXPECT_NE(out.find("FALLBACK"), std::string::npos) << out;
  EXPECT_NE(out.find("needs avx2"), std::string::npos) << out;
  // The JSON ledger says the same.
  out = test::run_command("FASTPATH_CPU_DISABLE=avx2 " + test::fastpath_bin() + " audit -q --json -m " + test::stories_path(), &rc);
  EXPECT_EQ(rc, 0);
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_FALSE(j["fallbacks"].empty());
}

TEST(CliAudit, ForcedKernelThatCannotRunIsAnError) {
  FP_REQUIRE_FILE(test::stories_path());
  if (!cpu_features().missing({"avx2"}).empty()) GTEST_SKIP() << "needs AVX2";
  int rc = -1;
  std::string out = test::run_command("FASTPATH_CPU_DISABLE=avx2 " + test::fastpath_bin() + " audit --kernel matmul=avx2 -m " + test::stories_path() + " 2>&1", &rc);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("was forced but cannot run"), std::string::npos) << out;
}

TEST(CliBench, JsonHasTheContractKeys) {
  FP_REQUIRE_FILE(test::stories_path());
  int rc = -1;
  std::string out = test::run_command(test::fastpath_bin() + " bench -q --json -p 32 -n 8 -r 2 --warmup 0 -m " + test::stories_path(), &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  for (const char* k : {"prefill_tps", "decode_tps", "prefill_ceiling_fraction", "decode_ceiling_fraction",
                        "decode_read_gbps_beside", "decode_beside_fraction", "decode_beside_ceiling_tps"}) {
    ASSERT_TRUE(j.contains(k)) << k;
    EXPECT_GT(j[k].get<double>(), 0.0) << k;
  }
  // The ceiling is the largest read figure seen, so it is never below the probes' median beside
  // the runs, and the two fractions order the other way.
  EXPECT_GE(j["ceiling"]["read_gbps"].get<double>(), j["decode_read_gbps_beside"].get<double>());
  EXPECT_GE(j["decode_beside_fraction"].get<double>(), j["decode_ceiling_fraction"].get<double>() * (1 - 1e-9));
  EXPECT_NEAR(j["decode_beside_fraction"].get<double>(), j["decode_tps"].get<double>() / j["decode_beside_ceiling_tps"].get<double>(),
              1e-9 * j["decode_beside_fraction"].get<double>());
  // Batched decode: one entry per batch size above 1.
  out = test::run_command(test::fastpath_bin() + " bench -q --json -p 0 -n 8 -r 1 --warmup 0 -b 1,4 -m " + test::stories_path(), &rc);
  ASSERT_EQ(rc, 0) << out;
  j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_TRUE(j.contains("decode_batches")) << out;
  ASSERT_EQ(j["decode_batches"].size(), 1u);
  EXPECT_EQ(j["decode_batches"][0]["batch"], 4);
  EXPECT_GT(j["decode_batches"][0]["decode_tps"].get<double>(), 0.0);
}

// An MoE token reads only its top-k routed experts: two models that differ only in experts per
// token differ in decode bytes per token by exactly the unread experts' share.
TEST(CliBench, MoeDecodeCeilingCountsOnlyTheSelectedExperts) {
  const std::string dir = test::temp_dir("bench_moe_cost");
  const int64_t hidden = 64, layers = 2, experts = 4, moe_ff = 32;
  double bytes[2] = {0, 0};
  const int used[2] = {2, 4};
  for (int i = 0; i < 2; ++i) {
    SynthOptions o;
    o.arch = "qwen3_moe";
    o.config = {{"hidden_size", hidden}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
                {"intermediate_size", 64}, {"num_hidden_layers", layers}, {"vocab_size", 512}, {"num_experts", experts},
                {"num_experts_per_tok", used[i]}, {"moe_intermediate_size", moe_ff}};
    o.type = DType::F16;
    o.out = dir + "/moe" + std::to_string(used[i]) + ".gguf";
    synth_model(o);
    int rc = -1;
    std::string out = test::run_command(test::fastpath_bin() + " bench -q --json -p 0 -n 2 -r 1 --warmup 0 -m " + o.out, &rc);
    ASSERT_EQ(rc, 0) << out;
    auto j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out;
    bytes[i] = j["decode_weight_bytes_per_token"].get<double>();
  }
  // gate, up and down of each expert: 3 x hidden x moe_ff F16 values; k = 2 leaves half unread.
  const double unread = static_cast<double>(layers * experts * 3 * hidden * moe_ff * 2) * (1.0 - 2.0 / 4.0);
  EXPECT_DOUBLE_EQ(bytes[1] - bytes[0], unread);
}

// --kv-cache-dtype auto follows the weights: F32 models keep an F32 cache, BF16 ones BF16, F16
// and quantized ones F16; an explicit dtype wins.
TEST(CliKvDtype, AutoFollowsTheWeights) {
  const std::string dir = test::temp_dir("kv_auto");
  struct Case {
    DType weights;
    const char* flag;
    const char* expect;
  };
  for (const Case& c : {Case{DType::F32, "", "KV cache F32"}, Case{DType::BF16, "", "KV cache BF16"},
                        Case{DType::F16, "", "KV cache F16"}, Case{DType::Q8_0, "", "KV cache F16"},
                        Case{DType::Q8_0, " --kv-cache-dtype auto", "KV cache F16"},
                        Case{DType::Q8_0, " --kv-cache-dtype f32", "KV cache F32"},
                        Case{DType::F32, " --kv-cache-dtype BF16", "KV cache BF16"}}) {
    SynthOptions o;
    o.arch = "llama";
    o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
                {"intermediate_size", 128}, {"num_hidden_layers", 2}, {"vocab_size", 256}};
    o.type = c.weights;
    o.out = dir + "/" + dtype_name(c.weights) + ".gguf";
    synth_model(o);
    int rc = -1;
    const std::string out = test::run_command(test::fastpath_bin() + " audit -q -p 4 -n 2 -t 1 -m " + o.out + c.flag, &rc);
    ASSERT_EQ(rc, 0) << out;
    EXPECT_NE(out.find(c.expect), std::string::npos) << dtype_name(c.weights) << c.flag << "\n" << out;
  }
}

TEST(CliBench, ServingRunReportsThroughputAndPrefixHits) {
  FP_REQUIRE_FILE(test::stories_path());
  int rc = -1;
  std::string out = test::run_command(test::fastpath_bin() +
                                          " bench -q --json --requests 12 --input-len 40 --output-len 8 --concurrency 1,4 "
                                          "--shared-prefix-len 32 --kv-cache-memory 64MiB -m " + test::stories_path(), &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_EQ(j["runs"].size(), 2u);
  for (auto& r : j["runs"]) {
    EXPECT_GT(r["output_tps"].get<double>(), 0.0);
    EXPECT_GT(r["input_tps"].get<double>(), 0.0);
  }
  // 32 shared tokens = 2 blocks of 16. One at a time, every request after the first reuses
  // them; with 4 in flight the other 3 wait for the first one's blocks (scheduler.h).
  EXPECT_NEAR(j["runs"][0]["prefix_hit_rate"].get<double>(), 11.0 * 32 / (12 * 40), 1e-9);
  EXPECT_NEAR(j["runs"][1]["prefix_hit_rate"].get<double>(), 11.0 * 32 / (12 * 40), 1e-9);
  // Without the wait the first 4 start together, before any block is cached.
  out = test::run_command(test::fastpath_bin() +
                              " bench -q --json --requests 12 --input-len 40 --output-len 8 --concurrency 4 --no-shared-prefix-wait "
                              "--shared-prefix-len 32 --kv-cache-memory 64MiB -m " + test::stories_path(), &rc);
  ASSERT_EQ(rc, 0) << out;
  j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_NEAR(j["runs"][0]["prefix_hit_rate"].get<double>(), 8.0 * 32 / (12 * 40), 1e-9);
}

// --high-priority-every: every K-th request is priority 0; the JSON counts each class and, under
// the priority policy with all requests queued at once, the high ones are served first.
TEST(CliBench, HighPriorityEveryReportsEachClass) {
  FP_REQUIRE_FILE(test::stories_path());
  int rc = -1;
  const std::string out = test::run_command(test::fastpath_bin() +
                                                " bench -q --json --requests 9 --input-len 40 --output-len 4 --concurrency 9 "
                                                "--max-num-seqs 1 --high-priority-every 3 --scheduling-policy priority "
                                                "--kv-cache-memory 64MiB -m " + test::stories_path(), &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["scheduling_policy"], "priority");
  const auto& p = j["runs"][0]["priority"];
  EXPECT_EQ(p["high_requests"], 3);
  EXPECT_EQ(p["low_requests"], 6);
  // One sequence at a time: the 3 high ones run before any of the 6 low ones.
  EXPECT_LT(p["ttft_high_p95_ms"].get<double>(), p["ttft_low_median_ms"].get<double>());
  EXPECT_EQ(j["runs"][0]["prompt_tokens"], 9 * 40);

  // Short urgent requests among long ones: the high-priority prompts have their own length.
  const std::string mixed = test::run_command(test::fastpath_bin() +
                                                  " bench -q --json --requests 9 --input-len 40 --output-len 4 --concurrency 9 "
                                                  "--high-priority-every 3 --high-priority-input-len 8 --scheduling-policy priority "
                                                  "--kv-cache-memory 64MiB -m " + test::stories_path(), &rc);
  ASSERT_EQ(rc, 0) << mixed;
  j = nlohmann::json::parse(mixed, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << mixed;
  EXPECT_EQ(j["high_priority_input_len"], 8);
  EXPECT_EQ(j["runs"][0]["prompt_tokens"], 3 * 8 + 6 * 40);
  const std::string refused = test::run_command(test::fastpath_bin() + " bench -q --requests 2 --input-len 8 --output-len 2 "
                                                                        "--high-priority-input-len 4 -m " + test::stories_path() + " 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(refused.find("--high-priority-input-len needs --high-priority-every"), std::string::npos) << refused;
}

TEST(CliGenerate, BatchFileGivesEachPromptsOwnTextInOrder) {
  FP_REQUIRE_FILE(test::stories_path());
  std::string dir = test::temp_dir("batch_file");
  const std::vector<std::string> prompts = {"Once upon a time", "Lily had a dog", "The sun was", "Tom"};
  {
    std::ofstream f(dir + "/in.jsonl");
    for (size_t i = 0; i < prompts.size(); ++i)
      f << nlohmann::json{{"prompt", prompts[i]}, {"max_tokens", 12 + static_cast<int>(i)}, {"temperature", 0}}.dump() << "\n";
  }
  int rc = -1;
  std::string out = test::run_command(test::fastpath_bin() + " generate -q --batch-file " + dir + "/in.jsonl -m " + test::stories_path(), &rc);
  ASSERT_EQ(rc, 0) << out;
  std::istringstream lines(out);
  std::string line;
  size_t i = 0;
  for (; std::getline(lines, line); ++i) {
    ASSERT_LT(i, prompts.size());
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["index"], i);
    std::string alone = test::run_command(test::fastpath_bin() + " generate -q --temp 0 -n " + std::to_string(12 + i) + " -p '" +
                                              prompts[i] + "' -m " + test::stories_path(), &rc);
    ASSERT_EQ(rc, 0);
    EXPECT_EQ(j["text"].get<std::string>() + "\n", alone) << "prompt " << i;
  }
  EXPECT_EQ(i, prompts.size());
  // A bad line is refused before anything runs, naming the file and line.
  {
    std::ofstream f(dir + "/bad.jsonl");
    f << "{\"prompt\": \"ok\"}\n{\"prompt\": \"x\", \"temperature\": \"hot\"}\n";
  }
  out = test::run_command(test::fastpath_bin() + " generate -q --batch-file " + dir + "/bad.jsonl -m " + test::stories_path() + " 2>&1", &rc);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("bad.jsonl:2: field 'temperature'"), std::string::npos) << out;
}

// bench-comm on one rank: every op and size reported (nothing crosses a link: bus bandwidth 0),
// sizes parsed with their units, a bad size named.
TEST(CliBenchComm, OneRankReportsEveryOpAndSize) {
  int rc = -1;
  std::string out = test::run_command(test::fastpath_bin() + " bench-comm -q --json --sizes 4,1K,64KiB --iters 3", &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["ranks"], 1);
  EXPECT_EQ(j["backend"], "single");
  ASSERT_EQ(j["results"].size(), 6u) << out;
  const int64_t want[] = {4, 1024, 65536};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(j["results"][i]["op"], i < 3 ? "all_reduce" : "all_gather");
    EXPECT_EQ(j["results"][i]["bytes"].get<int64_t>(), want[i % 3]);
    EXPECT_GT(j["results"][i]["seconds"].get<double>(), 0.0);
    EXPECT_EQ(j["results"][i]["busbw_gbps"].get<double>(), 0.0) << "one rank moves nothing over a link";
  }
  out = test::run_command(test::fastpath_bin() + " bench-comm --sizes 12Q 2>&1", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--sizes: '12Q' is not a size"), std::string::npos) << out;
}

}  // namespace
}  // namespace fp
