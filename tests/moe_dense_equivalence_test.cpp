// tests/moe_dense_equivalence_test.cpp — an MoE model made from a dense one by copying its FFN
// into every expert (random router, normalised top-k weights) computes the dense model's logits:
// a synth Qwen3 becomes a Qwen3-MoE Hugging Face directory. Also: the MoE model's logits are the
// same in one batch (experts as batched matmuls) and token by token (GEMV over selected experts).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "model/model.h"
#include "model/synth.h"
#include "test_util.h"

namespace fp {
namespace {

// Rewrites the dense HF directory `src` as Qwen3-MoE in `dst` with n_expert copies of each FFN.
void dense_to_moe(const std::string& src, const std::string& dst, int64_t n_expert, int64_t k) {
  std::ifstream in(src + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg["architectures"] = {"Qwen3MoeForCausalLM"};
  cfg["model_type"] = "qwen3_moe";
  cfg["num_experts"] = n_expert;
  cfg["num_experts_per_tok"] = k;
  cfg["moe_intermediate_size"] = cfg["intermediate_size"];
  cfg["norm_topk_prob"] = true;
  cfg["decoder_sparse_step"] = 1;
  cfg["mlp_only_layers"] = nlohmann::json::array();
  std::filesystem::create_directories(dst);
  std::ofstream(dst + "/config.json") << cfg.dump(2);
  auto set = SafetensorsSet::open_dir(src);
  SafetensorsWriter w;
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0, 1);
  const int64_t dim = cfg["hidden_size"].get<int64_t>();
  for (auto& [name, t] : set->all()) {
    std::vector<uint8_t> bytes(t->data, t->data + t->nbytes);
    const size_t at = name.find("mlp.");
    if (at == std::string::npos) {
      w.add(name, t->type, t->shape, std::move(bytes));
      continue;
    }
    const std::string layer = name.substr(0, at), proj = name.substr(at + 4);
    for (int64_t e = 0; e < n_expert; ++e) w.add(layer + "mlp.experts." + std::to_string(e) + "." + proj, t->type, t->shape, bytes);
    if (proj == "gate_proj.weight") {
      std::vector<float> router(static_cast<size_t>(n_expert * dim));
      for (auto& v : router) v = g(rng);
      std::vector<uint8_t> rb(router.size() * 4);
      std::memcpy(rb.data(), router.data(), rb.size());
      w.add(layer + "mlp.gate.weight", DType::F32, {n_expert, dim}, std::move(rb));
    }
  }
  w.write(dst + "/model.safetensors");
}

TEST(MoeDense, ExpertsCopiedFromDenseFfnReproduceDenseLogits) {
  const std::string dir = test::temp_dir("moe_dense");
  SynthOptions o;
  o.arch = "qwen3";
  o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 16},
              {"intermediate_size", 96}, {"num_hidden_layers", 3}, {"vocab_size", 512}};
  o.seed = 31;
  o.out = dir + "/dense";
  synth_model(o);
  dense_to_moe(o.out, dir + "/moe", 6, 3);
  const std::vector<int32_t> ids = {1, 17, 300, 5, 99, 42, 260, 7, 511, 3, 128, 64};
  auto dense = test::all_position_logits(o.out, ids);
  auto moe = test::all_position_logits(dir + "/moe", ids);
  ASSERT_EQ(dense.size(), moe.size());
  EXPECT_LT(test::rel_err(moe, dense), 1e-5);

  // Token by token (decode: GEMV over the selected experts) equals the batch.
  LoadOptions lo;
  lo.prefault = false;
  auto m = load_model(dir + "/moe", lo);
  ASSERT_EQ(m->config().arch, "qwen3moe");
  const int64_t V = m->config().n_vocab, n = static_cast<int64_t>(ids.size());
  auto cache = m->new_cache(n);
  std::vector<float> inc(static_cast<size_t>(n * V));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t pos = static_cast<int32_t>(i);
    m->forward(&ids[static_cast<size_t>(i)], &pos, 1, *cache, inc.data() + i * V, false);
  }
  EXPECT_LT(test::rel_err(inc, moe), 1e-5);
}

}  // namespace
}  // namespace fp
