// tests/device_placement_test.cpp — a model placed on a device other than the host.
//
// Without a GPU, a host-memory stand-in takes the CUDA device's place (emulated_device.h): every
// op runs the CPU reference as a "cuda"-backend kernel, which exercises everything a model does
// to run on a device except the GPU kernels themselves, against the same model on the CPU.
// With a GPU, the CudaModel tests at the end run the real thing (stories260K, greedy text equal
// to the CPU's); here they report "skipped: no GPU".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <utility>

#include "core/device.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "kernels/ledger.h"
#include "kernels/ops.h"
#include "kernels/ops_moe.h"
#include "model/placement.h"
#include "model/synth.h"
#include "kernels/registry.h"
#include "backend_ops.h"
#include "cuda_ops.h"
#include "emulated_device.h"
#include "test_util.h"

namespace fp {
namespace {


using test::EmulatedDevice;

std::unique_ptr<Model> load_on(Device d) {
  LoadOptions lo;
  lo.device = d;
  return load_model(test::testdata(test::kStoriesGguf), lo);
}

std::vector<int32_t> greedy_tokens(Model& m, const std::string& prompt, int32_t n, SpeculativeConfig spec = {}) {
  GenerateRequest g;
  g.prompt = m.tokenizer()->encode(prompt, true, false);
  g.max_new_tokens = n;
  g.sampling.temperature = 0;
  g.speculative = spec;
  return generate(m, g).tokens;
}

// generate() at temperature 1 with every filter off but top-p 0.9, from a fixed seed.
std::vector<int32_t> sampled_tokens(Model& m, const std::string& prompt, int32_t n, float repetition_penalty = 1.0f) {
  GenerateRequest g;
  g.prompt = m.tokenizer()->encode(prompt, true, false);
  g.max_new_tokens = n;
  g.sampling.temperature = 1.0f;
  g.sampling.top_k = 0;
  g.sampling.top_p = 0.9f;
  g.sampling.min_p = 0;
  g.sampling.seed = 77;
  g.sampling.repetition_penalty = repetition_penalty;
  return generate(m, g).tokens;
}

const char* kPrompts[] = {"Once upon a time", "The little dog ran", "Lily wanted to", "One day, the sun"};

// Every prompt of kPrompts through one engine on m (greedy, n tokens each; with `sampled`, every
// other prompt samples at temperature 0.8 from a fixed seed, the fourth with a repetition penalty
// so that its logits come back to the host); the tokens generated.
std::vector<std::vector<int32_t>> serve_prompts(Model& m, int32_t n, bool chunked, bool sampled = false,
                                                SpeculativeConfig spec = {}) {
  EngineConfig c;
  c.speculative = spec;
  c.page_size = 16;
  c.kv_cache_bytes = 4 << 20;
  c.max_model_len = 256;
  c.scheduler.chunked_prefill = chunked;
  if (chunked) c.scheduler.max_num_batched_tokens = 8;  // prefills in chunks, mixed with decodes
  c.scheduler.max_num_seqs = 8;
  Engine e(m, c);
  EXPECT_EQ(e.pool().device(), m.device());
  std::vector<int64_t> ids;
  for (const char* p : kPrompts) {
    Request r;
    r.prompt = m.tokenizer()->encode(p, true, false);
    r.max_new_tokens = n;
    r.sampling.temperature = sampled && ids.size() % 2 == 1 ? 0.8f : 0.0f;
    r.sampling.seed = 1234 + ids.size();
    if (sampled && ids.size() == 3) r.sampling.repetition_penalty = 1.1f;
    ids.push_back(e.add_request(r));
  }
  for (int guard = 0; e.has_work() && guard < 10000; ++guard) e.step();
  EXPECT_FALSE(e.has_work());
  std::vector<std::vector<int32_t>> out;
  for (int64_t id : ids) {
    const Sequence* s = e.sequence(id);
    out.emplace_back(s->tokens.begin() + s->n_prompt, s->tokens.end());
  }
  return out;
}

TEST(DevicePlacement, StandInDeviceGivesTheCpuModelsLogitsAndText) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  FP_REQUIRE_NO_GPU();
  auto cpu = load_on(Device::CPU);
  EmulatedDevice dev;
  Ledger::global().reset();
  auto gpu = load_on(Device::CUDA);
  ASSERT_EQ(gpu->device(), Device::CUDA);

  // Logits of every position of a prompt fed as one batch.
  const auto ids = cpu->tokenizer()->encode("Once upon a time, there was a little girl", true, false);
  const int64_t n = static_cast<int64_t>(ids.size()), vocab = cpu->config().n_vocab;
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  std::vector<float> want(static_cast<size_t>(n * vocab)), got(want.size(), NAN);
  auto cpu_cache = cpu->new_cache(64), gpu_cache = gpu->new_cache(64);
  EXPECT_EQ(cpu_cache->pool->device(), Device::CPU);
  EXPECT_EQ(gpu_cache->pool->device(), Device::CUDA);
  cpu->forward(ids.data(), pos.data(), n, *cpu_cache, want.data(), true);
  gpu->forward(ids.data(), pos.data(), n, *gpu_cache, got.data(), true);
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "logit " << i << " not written";
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  EXPECT_LT(std::sqrt(err / norm), 1e-5) << "device logits differ from the CPU's";

  // A one-row step (a decode step) runs one matmul over the stacked [wq; wk; wv] and one over
  // [w_gate; w_up] per layer, then the output projection: 4 per layer + 1, where the separate
  // matrices take 7 + 1; and it still gives the CPU's logits.
  auto device_matmuls = [] {
    uint64_t calls = 0;
    for (const LedgerEntry& e : Ledger::global().snapshot()) calls += e.op == "matmul" && e.backend == "cuda" ? e.calls : 0;
    return calls;
  };
  const uint64_t before = device_matmuls();
  const int32_t next_id = ids.back(), next_pos = static_cast<int32_t>(n);
  std::vector<float> want1(static_cast<size_t>(vocab)), got1(want1.size(), NAN);
  cpu->forward(&next_id, &next_pos, 1, *cpu_cache, want1.data(), true);
  gpu->forward(&next_id, &next_pos, 1, *gpu_cache, got1.data(), true);
  EXPECT_EQ(device_matmuls() - before, static_cast<uint64_t>(4 * cpu->config().n_layers + 1));
  EXPECT_LT(test::l2_error(got1, want1), 1e-5) << "one-row step: device logits differ from the CPU's";

  for (const char* p : kPrompts) EXPECT_EQ(greedy_tokens(*gpu, p, 40), greedy_tokens(*cpu, p, 40)) << p;
  // Sampled: on the device (no penalty) from the host's draws, and on the host (a penalty).
  for (float penalty : {1.0f, 1.1f}) {
    const auto sampled = sampled_tokens(*gpu, kPrompts[0], 40, penalty);
    EXPECT_EQ(sampled, sampled_tokens(*cpu, kPrompts[0], 40, penalty)) << "repetition penalty " << penalty;
    EXPECT_NE(sampled, greedy_tokens(*cpu, kPrompts[0], 40)) << "the sampled run sampled";
  }

  // The ledger recorded the device's calls as such: backend cuda, the stand-in kernel, the real
  // CUDA kernel refused with the reason.
  int cuda_entries = 0;
  for (const LedgerEntry& e : Ledger::global().snapshot()) {
    if (e.backend != "cuda") continue;
    ++cuda_entries;
    EXPECT_EQ(e.kernel, "emulated") << e.op;
    EXPECT_EQ(e.shape_class.rfind("cuda: ", 0), 0u) << e.shape_class;
    bool refused_cuda = false;
    for (auto& [k, why] : e.refused) refused_cuda |= k != "emulated" && !why.empty();  // a real CUDA kernel
    if (!e.refused.empty()) {
      EXPECT_TRUE(refused_cuda) << e.op;
    }
  }
  EXPECT_GE(cuda_entries, 8);  // embedding, matmul, rmsnorm, rope, kv_write, attention, silu_mul, add
}

// Matrices stacked by rows on the device (DeviceWeights::stack_rows, the decode step's [wq; wk;
// wv] and [w_gate; w_up]): the stack holds the parts' bytes one after another and the parts
// become views of their rows, FP8 block scales included (a part's scale rows follow the one
// before's); parts of another dtype or width, or FP8 parts whose rows would split a scale
// block, are not stacked and stay as they were; asking for a stacked part again gives its view.
TEST(DevicePlacement, StackedRowsAreThePartsSideBySide) {
  FP_REQUIRE_NO_GPU();
  EmulatedDevice dev;
  DeviceWeights dw(Device::CUDA);
  auto bytes_of = [](const Tensor& t) {
    std::vector<uint8_t> b(static_cast<size_t>(t.nbytes()));
    copy_bytes(Device::CPU, b.data(), t.device, t.data, b.size());
    return b;
  };
  // F32 parts of 3, 2 and 4 rows of 8.
  std::vector<float> qa = test::random_floats(24, 1), ka = test::random_floats(16, 2), va = test::random_floats(32, 3);
  const Tensor q = Tensor::view(qa.data(), DType::F32, {3, 8}), k = Tensor::view(ka.data(), DType::F32, {2, 8}),
               v = Tensor::view(va.data(), DType::F32, {4, 8});
  const Tensor *pq = &q, *pk = &k, *pv = &v;
  const Tensor* whole = dw.stack_rows({&pq, &pk, &pv});
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->device, Device::CUDA);
  EXPECT_EQ(whole->rows(), 9);
  EXPECT_EQ(whole->cols(), 8);
  std::vector<uint8_t> want;
  for (const Tensor* t : {&q, &k, &v}) {
    const auto* b = static_cast<const uint8_t*>(t->data);
    want.insert(want.end(), b, b + t->nbytes());
  }
  EXPECT_EQ(bytes_of(*whole), want);
  EXPECT_EQ(pk->data, static_cast<const uint8_t*>(whole->data) + 3 * 8 * sizeof(float));
  EXPECT_EQ(pk->rows(), 2);
  EXPECT_EQ(bytes_of(*pv), std::vector<uint8_t>(reinterpret_cast<uint8_t*>(va.data()), reinterpret_cast<uint8_t*>(va.data()) + 128));
  EXPECT_EQ(dw.tensor(&k), pk) << "a stacked part asked for again is its view";
  EXPECT_EQ(dw.tensor(pk), pk) << "a device view is its own placement";

  // Another dtype or width: not stacked, the parts untouched.
  std::vector<uint16_t> h16(16, 0x3c00);
  const Tensor k16 = Tensor::view(h16.data(), DType::F16, {2, 8});
  std::vector<float> wide(30, 1.0f);
  const Tensor k10 = Tensor::view(wide.data(), DType::F32, {3, 10});
  for (const Tensor* other : {&k16, &k10}) {
    const Tensor *a = &q, *b = other;
    EXPECT_EQ(dw.stack_rows({&a, &b}), nullptr);
    EXPECT_EQ(a, &q);
    EXPECT_EQ(b, other);
  }

  // FP8 with 128x128 block scales: parts of 256 and 128 rows x 256; the second part's scales
  // start after the first's 2 x 2.
  std::vector<uint8_t> g8(256 * 256), u8(128 * 256);
  for (size_t i = 0; i < g8.size(); ++i) g8[i] = static_cast<uint8_t>(i * 7);
  for (size_t i = 0; i < u8.size(); ++i) u8[i] = static_cast<uint8_t>(i * 13 + 1);
  std::vector<float> gs = {1, 2, 3, 4}, us = {5, 6};
  Tensor g = Tensor::view(g8.data(), DType::F8_E4M3, {256, 256}), u = Tensor::view(u8.data(), DType::F8_E4M3, {128, 256});
  g.block_scale = gs.data();
  u.block_scale = us.data();
  const Tensor *pg = &g, *pu = &u;
  const Tensor* gu = dw.stack_rows({&pg, &pu});
  ASSERT_TRUE(gu);
  EXPECT_EQ(gu->rows(), 384);
  ASSERT_TRUE(gu->block_scale);
  std::vector<float> scales(6);
  copy_bytes(Device::CPU, scales.data(), Device::CUDA, gu->block_scale, scales.size() * sizeof(float));
  EXPECT_EQ(scales, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(pu->block_scale, gu->block_scale + 4);
  EXPECT_EQ(bytes_of(*pu), u8);
  // A part of 100 rows would put two parts' rows in one 128-row scale block: not stacked.
  Tensor odd = Tensor::view(u8.data(), DType::F8_E4M3, {100, 256});
  odd.block_scale = us.data();
  const Tensor *a = &g, *b = &odd;
  EXPECT_EQ(dw.stack_rows({&a, &b}), nullptr);
}

TEST(DevicePlacement, StandInDeviceServesABatchLikeTheCpu) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  FP_REQUIRE_NO_GPU();
  auto cpu = load_on(Device::CPU);
  std::vector<std::vector<int32_t>> want;
  for (const char* p : kPrompts) want.push_back(greedy_tokens(*cpu, p, 24));

  EmulatedDevice dev;
  auto gpu = load_on(Device::CUDA);
  Ledger::global().reset();
  auto got = serve_prompts(*gpu, 24, true);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << kPrompts[i];
  // Greedy rows are sampled on the device (only ids come back).
  bool device_sample = false;
  for (const LedgerEntry& e : Ledger::global().snapshot()) device_sample |= e.op == "sample" && e.backend == "cuda";
  EXPECT_TRUE(device_sample);
  // Greedy and sampled sequences in one batch: rows sampled on the device from the host's draws,
  // and a row with a penalty whose logits come back whole, give the CPU's tokens.
  const auto mixed = serve_prompts(*gpu, 24, true, true);
  EXPECT_EQ(mixed, serve_prompts(*cpu, 24, true, true));
  EXPECT_EQ(mixed[0], got[0]);  // greedy, as before
  EXPECT_TRUE(mixed[1] != got[1] || mixed[3] != got[3]) << "the sampled sequences sampled";
  // Speculative decoding: generate's drafts verified on the host (every row's logits back); the
  // engine's sampled where the logits are (ids back), or on the host under a penalty.
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(greedy_tokens(*gpu, kPrompts[i], 24, {4, 1, 3}), want[i]) << kPrompts[i];
  EXPECT_EQ(serve_prompts(*gpu, 40, true, true, {4, 1, 3}), serve_prompts(*cpu, 40, true, true));
}

// Async scheduling on a stand-in whose work waits in a stream until the host waits for it (as a
// GPU's): the engine launches each step behind the one running, its decode tokens fed on the
// device from the ids the step before sampled, and gives the CPU's tokens. A missing fence, or
// ids read before their copy ran, would give stale tokens here.
TEST(DevicePlacement, AsyncSchedulingOnADeferredStreamGivesTheCpuTokens) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  FP_REQUIRE_NO_GPU();
  auto cpu = load_on(Device::CPU);
  const auto want_greedy = serve_prompts(*cpu, 32, true), want_mixed = serve_prompts(*cpu, 32, true, true);
  EmulatedDevice dev(/*deferred=*/true);
  auto gpu = load_on(Device::CUDA);
  Ledger::global().reset();
  EXPECT_EQ(serve_prompts(*gpu, 32, true), want_greedy);
  auto engine_steps = Ledger::global().engine_steps();
  EXPECT_GT(engine_steps["launched while the step before ran"], 30u);
  EXPECT_GT(dev.stream().waits_with_work_behind, 30u) << "the host queued the next step before waiting for this one";
  bool fed_on_device = false;
  for (const LedgerEntry& e : Ledger::global().snapshot())
    fed_on_device |= e.op == "token_feed" && e.backend == "cuda" && e.calls > 0;
  EXPECT_TRUE(fed_on_device);
  EXPECT_GT(Ledger::global().steps()["replayed"], 20u) << "decode steps with fed tokens still replay their graphs";
  // Sampled rows (drawn on the device) and a row with a penalty (its logits to the host: those
  // steps wait for the one before).
  EXPECT_EQ(serve_prompts(*gpu, 32, true, true), want_mixed);
  EXPECT_GT(Ledger::global().engine_steps()["after the step before: a row is sampled on the host (penalties, log-probabilities or a grammar)"] +
                Ledger::global().engine_steps()["now: a row is sampled on the host (penalties, log-probabilities or a grammar)"],
            0u);
}

// Uploads queue behind the device's work without the host waiting, yet an image is not written
// again before the copy that reads it has run: three uploads in a row through two images, the
// stream run only at the end, land intact.
TEST(DevicePlacement, UploadRingNeverOverwritesAnImageStillToBeCopied) {
  FP_REQUIRE_NO_GPU();
  EmulatedDevice dev(/*deferred=*/true);
  UploadRing ring(Device::CUDA);
  std::vector<DeviceBuffer> dst;
  std::vector<std::vector<int32_t>> src;
  for (int i = 0; i < 5; ++i) {
    src.push_back(std::vector<int32_t>(100 + 37 * static_cast<size_t>(i), 1000 * i));
    dst.emplace_back(Device::CUDA, src.back().size() * 4);
    ring.upload(dst.back().data(), src.back().data(), src.back().size() * 4);
  }
  EXPECT_LT(dev.stream().ran, dev.stream().queued) << "uploads are queued, not run at once";
  device_memory(Device::CUDA).synchronize();
  for (int i = 0; i < 5; ++i) {
    std::vector<int32_t> got(src[static_cast<size_t>(i)].size());
    copy_bytes(Device::CPU, got.data(), Device::CUDA, dst[static_cast<size_t>(i)].data(), got.size() * 4);
    EXPECT_EQ(got, src[static_cast<size_t>(i)]) << "upload " << i;
  }
}

// Decode steps replay recorded graphs: the same tokens as running every step eagerly, and the
// ledger counts the steps that were recorded, replayed, and run eagerly (with why).
TEST(DevicePlacement, DecodeStepsReplayRecordedGraphs) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  FP_REQUIRE_NO_GPU();
  auto cpu = load_on(Device::CPU);
  std::vector<std::vector<int32_t>> want;
  for (const char* p : kPrompts) want.push_back(greedy_tokens(*cpu, p, 32));
  EmulatedDevice dev;
  for (bool graphs : {true, false}) {
    Ledger::global().reset();
    LoadOptions lo;
    lo.device = Device::CUDA;
    lo.device_graphs = graphs;
    auto gpu = load_model(test::testdata(test::kStoriesGguf), lo);
    // One sequence alone, then four decoding together through the engine.
    EXPECT_EQ(greedy_tokens(*gpu, kPrompts[0], 32), want[0]);
    auto got = serve_prompts(*gpu, 32, false);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << kPrompts[i] << (graphs ? " with graphs" : " eager");
    auto steps = Ledger::global().steps();
    if (graphs) {
      EXPECT_GT(steps["replayed"], 30u);  // most decode steps
      EXPECT_GE(steps["recorded"], 2u);   // batch 1 alone, batch 4 in the engine (and smaller as sequences finish)
      EXPECT_GE(steps["eager: prefill or mixed step"], 2u);
      EXPECT_GE(steps["eager: first step of its shape (buffers are allocated)"], 2u);
    } else {
      EXPECT_EQ(steps.count("replayed"), 0u);
      EXPECT_GT(steps["eager: graphs off (--no-cuda-graphs)"], 30u);
    }
    EXPECT_NE(Ledger::global().table().find("device steps:"), std::string::npos);
  }
}

// A small Llama written by synth with matrices of type t (BF16: prefill steps of more than 8
// rows hand the norms' and SiLU's BF16 copies to the matmuls, MatMulArgs::xb).
std::string synth_llama(DType t) {
  SynthOptions o;
  o.arch = "llama";
  o.type = t;
  o.config = {{"hidden_size", 64},  {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 96},
              {"num_hidden_layers", 3}, {"vocab_size", 512}};
  o.out = test::temp_dir("device_llama") + "/llama_" + dtype_name(t) + ".gguf";
  synth_model(o);
  return o.out;
}

// A small Qwen3-MoE (8 experts, top 2; layer 1 dense) written by synth with matrices of type t.
std::string synth_qwen3moe(DType t) {
  SynthOptions o;
  o.arch = "qwen3_moe";
  o.type = t;
  o.config = {{"hidden_size", 64},       {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"head_dim", 16},          {"intermediate_size", 96},  {"num_hidden_layers", 3},
              {"vocab_size", 512},       {"num_experts", 8},         {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 32}, {"mlp_only_layers", {1}}};
  if (dtype_info(t).block_elems == QK_K) {  // rows of whole 256-value blocks
    o.config["hidden_size"] = 256;
    o.config["head_dim"] = 64;
    o.config["intermediate_size"] = 256;
    o.config["moe_intermediate_size"] = 256;
  }
  o.out = test::temp_dir("device_qwen3moe") + "/qwen3moe_" + dtype_name(t) + ".gguf";
  synth_model(o);
  return o.out;
}

// A small GLM-4.5-style MoE written by synth with matrices of type t: q/k/v biases, half of
// each head rotated, sigmoid routing with groups and a selection bias, a shared expert, the
// first layer dense, and a multi-token-prediction layer that the forward skips.
std::string synth_glm4moe(DType t) {
  SynthOptions o;
  o.arch = "glm4_moe";
  o.type = t;
  o.config = {{"hidden_size", 64},           {"num_attention_heads", 4},   {"num_key_value_heads", 2},
              {"head_dim", 32},              {"intermediate_size", 96},    {"num_hidden_layers", 3},
              {"vocab_size", 512},           {"n_routed_experts", 8},      {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 32}, {"n_shared_experts", 1},      {"first_k_dense_replace", 1},
              {"n_group", 2},                {"topk_group", 1},            {"routed_scaling_factor", 2.5},
              {"num_nextn_predict_layers", 1}};
  o.out = test::temp_dir("device_glm4moe") + "/glm4moe_" + dtype_name(t) + ".gguf";
  synth_model(o);
  return o.out;
}

// Logits of every position of ids run as one batch on m.
std::vector<float> batch_logits(Model& m, const std::vector<int32_t>& ids) {
  const auto n = static_cast<int64_t>(ids.size());
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  std::vector<float> out(static_cast<size_t>(n * m.config().n_vocab), NAN);
  auto cache = m.new_cache(n + 16);
  m.forward(ids.data(), pos.data(), n, *cache, out.data(), true);
  return out;
}

// Each token of `gen` (greedy after `prompt`, from the device) is the CPU reference's argmax at
// its position, or within `slack` of its largest logit (a near tie that sums in another order
// may break the other way).
void expect_greedy_on_cpu(Model& cpu, const std::vector<int32_t>& prompt, const std::vector<int32_t>& gen, float slack,
                          const std::string& what) {
  std::vector<int32_t> ids = prompt;
  ids.insert(ids.end(), gen.begin(), gen.end());
  ids.pop_back();  // the last token's logits are not needed
  const auto logits = batch_logits(cpu, ids);
  const int64_t V = cpu.config().n_vocab;
  for (size_t i = 0; i < gen.size(); ++i) {
    const float* row = logits.data() + static_cast<int64_t>(prompt.size() - 1 + i) * V;
    const float best = *std::max_element(row, row + V);
    EXPECT_LE(best - row[gen[i]], slack) << what << ": token " << i << " (" << gen[i] << ") is not the CPU's greedy choice";
  }
}

// The model at `path` on the device (a stand-in or the GPU) against the CPU's reference kernels
// (the fast CPU matmuls quantize activations for 8-bit weights; the device kernels do not; the
// stand-in runs the references themselves, so its results must be exactly the same): the
// logits of every position of one batch within tol (normalised L2); greedy tokens of one sequence
// alone and of four served together with chunked prefill, each the CPU's choice (within slack);
// the MoE ops in the ledger as device calls, and decode steps replayed from recorded graphs.
void expect_device_matches_cpu(const std::string& path, double tol, float slack) {
  LoadOptions lo;
  auto cpu = load_model(path, lo);
  lo.device = Device::CUDA;
  Ledger::global().reset();
  auto gpu = load_model(path, lo);
  ASSERT_EQ(gpu->device(), Device::CUDA);
  const std::vector<int32_t> ids = {1, 17, 300, 5, 99, 42, 7, 250, 3, 64, 128};
  const auto got = batch_logits(*gpu, ids);
  const auto gen_alone = greedy_tokens(*gpu, kPrompts[0], 24);
  const auto served = serve_prompts(*gpu, 16, true);

  for (const auto& [op, kernels] : kernel_catalog())  // the CPU's reference kernels for every op that has one
    if (std::find(kernels.begin(), kernels.end(), "ref") != kernels.end()) KernelOverrides::global().force(op, "ref");
  invalidate_all_dispatch();
  const auto want = batch_logits(*cpu, ids);
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "logit " << i << " not written";
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  EXPECT_LT(std::sqrt(err / norm), tol) << path << ": device logits differ from the CPU's";
  auto encode = [&](const char* p) { return cpu->tokenizer()->encode(p, true, false); };
  expect_greedy_on_cpu(*cpu, encode(kPrompts[0]), gen_alone, slack, path + " alone");
  ASSERT_EQ(served.size(), std::size(kPrompts));
  for (size_t i = 0; i < served.size(); ++i)
    expect_greedy_on_cpu(*cpu, encode(kPrompts[i]), served[i], slack, path + " served: " + kPrompts[i]);
  KernelOverrides::global().clear();
  invalidate_all_dispatch();

  std::set<std::string> device_ops;
  for (const LedgerEntry& e : Ledger::global().snapshot())
    if (e.backend == "cuda") device_ops.insert(e.op);
  if (gpu->config().moe.n_experts > 0) {
    EXPECT_TRUE(device_ops.count("moe_route") && device_ops.count("moe_ffn")) << "the MoE ops ran on the device";
  }
  if (gpu->config().mla.kv_lora_rank > 0) {
    EXPECT_TRUE(device_ops.count("mla_attention")) << "MLA ran on the device";
  }
  EXPECT_GT(Ledger::global().steps()["replayed"], 10u) << "decode steps replayed recorded graphs";
}

// Small DeepSeek models by synth: V2 (kv_b in one tensor; one dense layer first, 2 shared
// experts) and V3 (query compression, sigmoid routing with groups and bias; llama.cpp's split
// attn_k_b / attn_v_b form).
std::string synth_deepseek(const std::string& arch, DType t, bool split_kv_b) {
  SynthOptions o;
  o.arch = arch;
  o.type = t;
  o.split_kv_b = split_kv_b;
  o.config = {{"hidden_size", 64},       {"num_attention_heads", 4}, {"intermediate_size", 96}, {"num_hidden_layers", 3},
              {"vocab_size", 512},       {"n_routed_experts", 8},    {"num_experts_per_tok", 2}, {"moe_intermediate_size", 32},
              {"n_shared_experts", 2},   {"first_k_dense_replace", 1}, {"kv_lora_rank", 32},   {"qk_rope_head_dim", 16},
              {"qk_nope_head_dim", 32},  {"v_head_dim", 32}};
  if (arch == "deepseek_v3") {
    o.config["q_lora_rank"] = 64;
    o.config["n_group"] = 4;
    o.config["topk_group"] = 2;
  }
  o.out = test::temp_dir("device_" + arch) + "/" + arch + "_" + dtype_name(t) + (split_kv_b ? "_split" : "") + ".gguf";
  synth_model(o);
  return o.out;
}

TEST(DevicePlacement, StandInDeviceRunsDeepSeekLikeTheCpu) {
  FP_REQUIRE_NO_GPU();
  EmulatedDevice dev;
  expect_device_matches_cpu(synth_deepseek("deepseek_v2", DType::F32, false), 1e-5, 0.0f);
  expect_device_matches_cpu(synth_deepseek("deepseek_v3", DType::Q8_0, true), 1e-5, 0.0f);
}

TEST(DevicePlacement, StandInDeviceRunsQwen3MoeLikeTheCpu) {
  FP_REQUIRE_NO_GPU();
  EmulatedDevice dev;
  // The stand-in runs the CPU reference kernels: the same sums, so exactly the same tokens.
  for (DType t : {DType::F32, DType::Q8_0}) expect_device_matches_cpu(synth_qwen3moe(t), 1e-5, 0.0f);
}

TEST(DevicePlacement, StandInDeviceRunsGlm4MoeLikeTheCpu) {
  FP_REQUIRE_NO_GPU();
  EmulatedDevice dev;
  for (DType t : {DType::F32, DType::Q8_0}) expect_device_matches_cpu(synth_glm4moe(t), 1e-5, 0.0f);
}

TEST(DevicePlacement, StandInDeviceRunsABf16LlamaLikeTheCpu) {
  FP_REQUIRE_NO_GPU();
  EmulatedDevice dev;
  expect_device_matches_cpu(synth_llama(DType::BF16), 1e-5, 0.0f);
}

TEST(DevicePlacement, KvPoolOnADeviceWritesReadsAndCopiesBlocks) {
  FP_REQUIRE_NO_GPU();
  EmulatedDevice dev;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    KvPool pool(KvLayout{2, 8, 4, t}, 4, 3, Device::CUDA);
    auto k = test::random_floats(2 * 8, 1), v = test::random_floats(2 * 4, 2);
    DeviceBuffer dk(Device::CUDA, k.size() * 4), dv(Device::CUDA, v.size() * 4), ds(Device::CUDA, 16);
    const int64_t slots[2] = {1, 6};
    copy_bytes(Device::CUDA, dk.data(), Device::CPU, k.data(), k.size() * 4);
    copy_bytes(Device::CUDA, dv.data(), Device::CPU, v.data(), v.size() * 4);
    copy_bytes(Device::CUDA, ds.data(), Device::CPU, slots, 16);
    {
      DeviceScope scope(Device::CUDA);
      pool.write(1, ds.as<int64_t>(), 2, dk.as<float>(), dv.as<float>());
    }
    pool.copy_block(1, 2);  // slot 6 (block 1, offset 2) -> slot 10
    const double tol = t == DType::F32 ? 0 : t == DType::F16 ? 1e-3 : 1e-2;
    for (auto [slot, row] : {std::pair<int64_t, int>{1, 0}, {6, 1}, {10, 1}}) {
      float rk[8], rv[4];
      pool.read(1, slot, rk, rv);
      for (int j = 0; j < 8; ++j) EXPECT_NEAR(rk[j], k[static_cast<size_t>(row * 8 + j)], tol * 4) << dtype_name(t) << " slot " << slot;
      for (int j = 0; j < 4; ++j) EXPECT_NEAR(rv[j], v[static_cast<size_t>(row * 4 + j)], tol * 4) << dtype_name(t) << " slot " << slot;
    }
  }
}

TEST(DevicePlacement, NoGpuIsAClearError) {
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  FP_REQUIRE_NO_GPU();
  const std::string why = device_unavailable(Device::CUDA);
  EXPECT_FALSE(why.empty());
  EXPECT_THROW(DeviceBuffer(Device::CUDA, 16), Error);
  int rc = 0;
  std::string out = test::run_command(test::fastpath_bin() + " generate -q -m " + test::testdata(test::kStoriesGguf) +
                                          " -p hi -n 2 --device cuda 2>&1",
                                      &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--device cuda: "), std::string::npos) << out;
  EXPECT_NE(out.find(why), std::string::npos) << out;
}

// ---- the real GPU (skipped here) ----
#define FP_REQUIRE_GPU()                                                             \
  do {                                                                               \
    const std::string why_ = device_unavailable(Device::CUDA);                       \
    if (!why_.empty()) GTEST_SKIP() << "skipped: no GPU (" << why_ << ")";           \
  } while (0)

TEST(CudaModel, GreedyTextEqualsTheCpusAndLogitsAgree) {
  FP_REQUIRE_GPU();
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  auto cpu = load_on(Device::CPU);
  auto gpu = load_on(Device::CUDA);
  for (const char* p : kPrompts) EXPECT_EQ(greedy_tokens(*gpu, p, 64), greedy_tokens(*cpu, p, 64)) << p;
  for (const char* p : kPrompts)
    EXPECT_EQ(greedy_tokens(*gpu, p, 64, {4, 1, 3}), greedy_tokens(*cpu, p, 64)) << p << " (speculative)";
  const auto ids = cpu->tokenizer()->encode("Once upon a time, there was a little girl", true, false);
  const int64_t n = static_cast<int64_t>(ids.size()), vocab = cpu->config().n_vocab;
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  std::vector<float> want(static_cast<size_t>(n * vocab)), got(want.size(), NAN);
  auto cc = cpu->new_cache(64), gc = gpu->new_cache(64);
  cpu->forward(ids.data(), pos.data(), n, *cc, want.data(), true);
  gpu->forward(ids.data(), pos.data(), n, *gc, got.data(), true);
  double err = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "logit " << i;
    err += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  EXPECT_LT(std::sqrt(err / norm), 1e-3);
}

// The GPU's error against the CPU's reference kernels, by weight type: f32 sums in another
// order (F32); prefill matmuls on cuBLAS with x rounded to F16 (Q8_0, Q4_K: 2^-11) or BF16
// (BF16: 2^-8) through 3 layers. Greedy choices may then differ from the CPU's best logit by
// about as much (a near tie taken the other way).
double gpu_tol(DType t) { return t == DType::F32 ? 1e-3 : t == DType::BF16 ? 2e-2 : 5e-3; }
float gpu_slack(DType t) { return t == DType::F32 ? 1e-3f : t == DType::BF16 ? 0.1f : 0.03f; }

TEST(CudaModel, LlamaMatchesTheCpu) {
  FP_REQUIRE_GPU();
  for (DType t : {DType::F32, DType::BF16}) expect_device_matches_cpu(synth_llama(t), gpu_tol(t), gpu_slack(t));
}

TEST(CudaModel, Qwen3MoeMatchesTheCpu) {
  FP_REQUIRE_GPU();
  for (DType t : {DType::F32, DType::BF16, DType::Q8_0, DType::Q4_K})
    expect_device_matches_cpu(synth_qwen3moe(t), gpu_tol(t), gpu_slack(t));
}

TEST(CudaModel, Glm4MoeMatchesTheCpu) {
  FP_REQUIRE_GPU();
  for (DType t : {DType::F32, DType::BF16, DType::Q8_0})
    expect_device_matches_cpu(synth_glm4moe(t), gpu_tol(t), gpu_slack(t));
}

TEST(CudaModel, DeepSeekMatchesTheCpu) {
  FP_REQUIRE_GPU();
  for (DType t : {DType::F32, DType::BF16, DType::Q8_0}) {
    expect_device_matches_cpu(synth_deepseek("deepseek_v2", t, false), gpu_tol(t), gpu_slack(t));
    expect_device_matches_cpu(synth_deepseek("deepseek_v3", t, true), gpu_tol(t), gpu_slack(t));
  }
}

TEST(CudaModel, AuditStrictShowsNoFallback) {
  FP_REQUIRE_GPU();
  FP_REQUIRE_FILE(test::testdata(test::kStoriesGguf));
  int rc = 0;
  std::string out = test::run_command(test::fastpath_bin() + " audit --strict --device cuda -m " + test::testdata(test::kStoriesGguf) + " 2>&1", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("cuda"), std::string::npos) << out;
}

}  // namespace
}  // namespace fp
