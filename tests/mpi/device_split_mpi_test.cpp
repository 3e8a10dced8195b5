// tests/mpi/device_split_mpi_test.cpp — models placed on a device and split across the ranks
// (GPU ranks: tensor, expert and context parallel, data-parallel attention) give the logits and
// greedy tokens of the same model on the device on one rank.
//
// Without GPUs the device is the host-memory stand-in (tests/emulated_device.h): its kernels are
// the CPU references and its collectives run MPI on the (host-memory) device buffers, where GPU
// ranks run NCCL. So this checks what the models do across device ranks — each rank's slices
// uploaded (its experts only under expert parallel), the sums on device buffers inside the
// recorded decode graphs, logits copied back, the sampled token shared — everything but the GPU
// kernels and NCCL themselves. Every rank builds both models and compares locally.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>

#include "core/error.h"
#include "emulated_device.h"
#include "engine/generator.h"
#include "kernels/ledger.h"
#include "model/model.h"
#include "model/synth.h"
#include "mpi_test_util.h"
#include "test_util.h"

namespace fp {
namespace {

using test::greedy;
using test::rel_diff;

std::unique_ptr<Model> load_on_device(const std::string& path, std::shared_ptr<Communicator> comm, ParallelSizes ps = {},
                                      int64_t overlap = 0) {
  LoadOptions lo;
  lo.device = Device::CUDA;
  lo.prefault = false;
  lo.parallel = ps;
  lo.micro_batch_overlap = overlap;
  return load_model(path, lo, std::move(comm));
}

struct DeviceSplitCase {
  std::string name, arch;
  DType type;
  ParallelSizes ps;  // tp and ep: 0 for the number of ranks
  bool deferred = false;  // the stand-in's work waits in a stream until the host waits, as on a GPU
  bool data_parallel_attention = false;  // dp = ep = the number of ranks
  bool tied = false;  // the output projection is the embedding table (rank 0's output rows start where it does)
  bool context_parallel = false;  // cp = the number of ranks: the prompt prefilled context parallel
  int64_t overlap = 0;  // --micro-batch-overlap: steps of this many tokens as two micro-batches
  DType kv = DType::F32;  // the KV cache's dtype (context parallel exchanges its rows as stored)
};

void PrintTo(const DeviceSplitCase& c, std::ostream* os) { *os << c.name; }

class DeviceSplit : public ::testing::TestWithParam<DeviceSplitCase> {};

TEST_P(DeviceSplit, MatchesOneRankOnTheDevice) {
  FP_REQUIRE_RANKS(2);
  FP_REQUIRE_NO_GPU();
  const DeviceSplitCase& c = GetParam();
  const int ranks = test::world_comm()->size(), rank = test::world_comm()->rank();
  const ParallelSizes ps{c.ps.tp == 0 ? ranks : c.ps.tp, c.ps.ep == 0 ? ranks : c.ps.ep, c.context_parallel ? ranks : 1,
                         c.data_parallel_attention ? ranks : 1};
  SynthOptions o;
  o.arch = c.arch;
  o.type = c.type;
  o.seed = 23;
  o.out = test::temp_dir("device_split_" + c.name) + "/model.gguf";
  if (c.arch == "llama" || c.arch == "qwen3") {  // 12 query heads over 6 KV heads: splits over 2 and 3 ranks
    o.config = {{"hidden_size", 64},        {"num_attention_heads", 12}, {"num_key_value_heads", 6}, {"head_dim", 16},
                {"intermediate_size", 96}, {"num_hidden_layers", 2},    {"vocab_size", 256}};
  } else {
    o.config = test::moe_config(c.arch);
  }
  if (c.tied) o.config["tie_word_embeddings"] = true;
  if (c.type == DType::F8_E4M3) {  // DeepSeek-V3's own format: widths of 3 scale tiles
    o.config["hidden_size"] = 128;
    o.config["vocab_size"] = 384;
    o.config["intermediate_size"] = 384;
    o.config["moe_intermediate_size"] = 384;
    o.out = test::temp_dir("device_split_" + c.name) + "/model";
  }
  synth_model(o);
  test::EmulatedDevice dev(c.deferred);
  Ledger::global().reset();
  auto whole = load_on_device(o.out, nullptr);
  auto split = load_on_device(o.out, test::world_comm(), ps, c.overlap);
  ASSERT_EQ(split->device(), Device::CUDA);
  ASSERT_EQ(split->tp_size(), ranks);
  const std::vector<int32_t> prompt = {1, 9, 200, 33, 71, 4, 150, 88, 3, 12}, decode = {5, 17, 42, 7, 99};
  const auto a = test::run_logits(*split, prompt, decode, c.kv);
  const auto split_tokens = greedy(*split, prompt, 16);
  // The split model's own steps: its decode steps recorded once per shape and replayed after.
  auto steps = Ledger::global().steps();
  EXPECT_GE(steps["recorded"], 1u);
  EXPECT_GT(steps["replayed"], 10u) << "decode steps replay their recorded graphs, collectives included";
  for (const auto& [how, count] : steps)
    EXPECT_TRUE(how.find("recording") == std::string::npos && how.find("while recording") == std::string::npos)
        << how << " x" << count;
  // The ledger: the sums ran on the device's collectives, and under expert parallel this rank's
  // moe_ffn calls name its range of the 6 experts, on the device.
  const std::string table = Ledger::global().table();
  const auto b = test::run_logits(*whole, prompt, decode, c.kv);
  EXPECT_LT(rel_diff(a, b), 1e-4) << c.name;
  double mx = 0;
  for (float v : b) mx = std::max(mx, static_cast<double>(std::fabs(v)));
  EXPECT_GT(mx, 0.1) << "logits should not be degenerate";
  EXPECT_EQ(split_tokens, greedy(*whole, prompt, 16)) << c.name;

  if (ps.tp > 1 || ps.ep > 1) {
    EXPECT_NE(table.find("cuda: f32 sum comm=mpi ranks=" + std::to_string(ranks)), std::string::npos) << table;
  }
  if (ps.cp > 1) {
    EXPECT_GT(Ledger::global().steps()["eager: context-parallel prefill"], 0u);
  }
  auto device_line = [&](const std::string& what) {  // a ledger line of a device call naming `what`
    std::istringstream lines(table);
    for (std::string line; std::getline(lines, line);)
      if (line.find("cuda: ") != std::string::npos && line.find(what) != std::string::npos) return true;
    return false;
  };
  // Overlapped steps start their sums (data parallel: their gathers and reduce-scatters).
  EXPECT_EQ(device_line(c.data_parallel_attention ? "reduce_scatter_start" : "all_reduce_start"), c.overlap > 0) << table;
  if (ps.ep > 1) {
    const int64_t b0 = 6 * rank / ranks, e0 = 6 * (rank + 1) / ranks;
    const std::string range = "experts " + std::to_string(b0) + ".." + std::to_string(e0 - 1) + " of 6";
    EXPECT_TRUE(device_line(range)) << range << "\n" << table;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DeviceSplit,
    ::testing::Values(DeviceSplitCase{"llama_tp", "llama", DType::Q8_0, {0, 1}},
                      DeviceSplitCase{"llama_tp_deferred", "llama", DType::F16, {0, 1}, true},
                      DeviceSplitCase{"qwen3_tp_tied", "qwen3", DType::BF16, {0, 1}, false, false, true},
                      DeviceSplitCase{"qwen3moe_tp", "qwen3_moe", DType::Q8_0, {0, 1}},
                      DeviceSplitCase{"qwen3moe_ep", "qwen3_moe", DType::Q8_0, {1, 0}},
                      DeviceSplitCase{"qwen3moe_tp_ep_deferred", "qwen3_moe", DType::F16, {0, 0}, true},
                      DeviceSplitCase{"deepseek_v3_ep", "deepseek_v3", DType::Q8_0, {1, 0}},
                      DeviceSplitCase{"deepseek_v3_fp8_ep", "deepseek_v3", DType::F8_E4M3, {1, 0}},
                      DeviceSplitCase{"deepseek_v2_ep_deferred", "deepseek_v2", DType::F32, {1, 0}, true},
                      DeviceSplitCase{"deepseek_v3_dp_attention_ep", "deepseek_v3", DType::Q8_0, {1, 0}, false, true},
                      DeviceSplitCase{"deepseek_v3_fp8_dp_attention_ep_deferred", "deepseek_v3", DType::F8_E4M3, {1, 0},
                                      true, true},
                      // Context-parallel prefill, then decode whole, tensor parallel (over the
                      // cache of every head the prefill wrote) or expert parallel; caches of F32,
                      // F16 and BF16 (the rows travel packed as the cache stores them).
                      DeviceSplitCase{"llama_pcp", "llama", DType::Q8_0, {1, 1}, false, false, false, true},
                      DeviceSplitCase{"llama_pcp_tp_deferred_f16_cache", "llama", DType::F16, {0, 1}, true, false, false, true,
                                      0, DType::F16},
                      DeviceSplitCase{"qwen3moe_pcp_tp_bf16_cache", "qwen3_moe", DType::Q8_0, {0, 1}, false, false, false, true,
                                      0, DType::BF16},
                      DeviceSplitCase{"qwen3moe_pcp_tp_ep_deferred", "qwen3_moe", DType::F16, {0, 0}, true, false, false,
                                      true},
                      DeviceSplitCase{"deepseek_v3_pcp_ep_f16_cache", "deepseek_v3", DType::Q8_0, {1, 0}, false, false, false,
                                      true, 0, DType::F16},
                      DeviceSplitCase{"deepseek_v3_fp8_pcp", "deepseek_v3", DType::F8_E4M3, {1, 1}, true, false, false,
                                      true},
                      // Micro-batch overlap: the prompt as two micro-batches whose sums are in
                      // flight while the other computes (started collectives).
                      DeviceSplitCase{"llama_tp_overlap", "llama", DType::Q8_0, {0, 1}, false, false, false, false, 2},
                      DeviceSplitCase{"llama_tp_overlap_deferred", "llama", DType::F16, {0, 1}, true, false, true, false,
                                      2},
                      DeviceSplitCase{"qwen3moe_tp_ep_overlap", "qwen3_moe", DType::Q8_0, {0, 0}, false, false, false,
                                      false, 2},
                      DeviceSplitCase{"qwen3moe_ep_overlap_deferred", "qwen3_moe", DType::F16, {1, 0}, true, false, false,
                                      false, 2},
                      DeviceSplitCase{"deepseek_v3_ep_overlap_deferred", "deepseek_v3", DType::Q8_0, {1, 0}, true, false,
                                      false, false, 2},
                      DeviceSplitCase{"deepseek_v3_dp_attention_ep_overlap_deferred", "deepseek_v3", DType::Q8_0, {1, 0},
                                      true, true, false, false, 2}),
    [](const auto& p) { return p.param.name; });

}  // namespace
}  // namespace fp
