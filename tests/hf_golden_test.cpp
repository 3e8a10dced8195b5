// tests/hf_golden_test.cpp — the Llama/Qwen2/Qwen3/Qwen3-MoE/DeepSeek-V2/V3/GLM-4.5-MoE forward against Hugging Face transformers:
// tests/golden/*.logits.f32 were computed by transformers (scripts/make_hf_golden.py) on models
// `synth` writes deterministically; here the same models are written again, loaded from the
// safetensors directory and from GGUF, and their logits compared with transformers'.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/synth.h"
#include "test_util.h"

namespace fp {
namespace {

const std::string kGolden = std::string(FASTPATH_SOURCE_DIR_FOR_TESTS) + "/tests/golden/";


TEST(HfGolden, LlamaQwen2Qwen3MatchTransformers) {
  std::ifstream in(kGolden + "hf_cases.json");
  ASSERT_TRUE(in) << kGolden;
  auto cases = nlohmann::json::parse(in);
  std::vector<int32_t> ids = cases["tokens"].get<std::vector<int32_t>>();
  std::string dir = test::temp_dir("hf_golden");
  for (auto& c : cases["cases"]) {
    std::string name = c["name"];
    auto ref = test::read_f32_file(kGolden + name + ".logits.f32");
    ASSERT_EQ(ref.size(), ids.size() * 512) << name;
    double mx = 0;
    for (float r : ref) mx = std::max(mx, static_cast<double>(std::fabs(r)));
    for (const std::string& ext : {std::string("_hf"), std::string(".gguf")}) {
      SynthOptions o;
      o.arch = c["arch"];
      o.config = c["config"];
      o.seed = c["seed"].get<uint64_t>();
      o.out = dir + "/" + name + ext;
      synth_model(o);
      auto got = test::all_position_logits(o.out, ids);
      ASSERT_EQ(got.size(), ref.size());
      double err = 0;
      for (size_t i = 0; i < ref.size(); ++i) err = std::max(err, static_cast<double>(std::fabs(got[i] - ref[i])));
      EXPECT_LT(err / mx, 1e-4) << name << ext << ": max |ours - transformers| = " << err << " (max |logit| " << mx << ")";
    }
  }
}

}  // namespace
}  // namespace fp
