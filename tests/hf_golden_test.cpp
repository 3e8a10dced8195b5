// tests/hf_golden_test.cpp — the Llama/Qwen2/Qwen3/Phi-3/Gemma 2/Gemma 3/Qwen2-MoE/Qwen3-MoE/Mixtral/DeepSeek-V2/V3/GLM-4.5-MoE/gpt-oss
// forward against Hugging Face transformers:
// tests/golden/*.logits.f32 were computed by transformers (scripts/make_hf_golden.py) on models
// `synth` writes deterministically; here the same models are written again, loaded from the
// safetensors directory and from GGUF, and their logits compared with transformers'. Also the
// multi-token-prediction layer's logits against a reference built around transformers' layers.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/embedder.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "model/synth.h"
#include "test_util.h"

namespace fp {
namespace {

const std::string kGolden = std::string(FASTPATH_SOURCE_DIR_FOR_TESTS) + "/tests/golden/";

using test::write_synth_case;

double max_abs(const std::vector<float>& v) {
  double mx = 0;
  for (float x : v) mx = std::max(mx, static_cast<double>(std::fabs(x)));
  return mx;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
  return err;
}


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
    const double mx = max_abs(ref);
    // MXFP4 weights meet activations rounded to 8 bits in the CPU kernels (as llama.cpp's): "tol".
    const double tol = c.value("tol", 1e-4);
    const auto formats = c.value("formats", std::vector<std::string>{"_hf", ".gguf"});
    for (const std::string& ext : formats) {
      auto got = test::all_position_logits(write_synth_case(c, dir + "/" + name + ext), ids);
      ASSERT_EQ(got.size(), ref.size());
      const double err = max_abs_diff(got, ref);
      EXPECT_LT(err / mx, tol) << name << ext << ": max |ours - transformers| = " << err << " (max |logit| " << mx << ")";
    }
  }
}

// The multi-token-prediction layer (DeepSeek-V3, GLM-4.5) against the reference the script wires
// around transformers' own decoder layer (scripts/make_hf_golden.py, mtp_logits): row i continues
// the model's final hidden state at position i with token i+1 and predicts token i+2.
TEST(HfGolden, MultiTokenPredictionLayerMatchesReference) {
  std::ifstream in(kGolden + "hf_cases.json");
  ASSERT_TRUE(in) << kGolden;
  auto cases = nlohmann::json::parse(in);
  std::vector<int32_t> ids = cases["tokens"].get<std::vector<int32_t>>();
  const auto T = static_cast<int64_t>(ids.size());
  std::string dir = test::temp_dir("hf_golden_mtp");
  int checked = 0;
  for (auto& c : cases["cases"]) {
    if (!c.value("mtp", false)) continue;
    std::string name = c["name"];
    auto ref = test::read_f32_file(kGolden + name + ".mtp_logits.f32");
    ASSERT_EQ(ref.size(), static_cast<size_t>((T - 1) * 512)) << name;
    const double mx = max_abs(ref);
    for (const std::string& ext : {std::string("_hf"), std::string(".gguf")}) {
      LoadOptions lo;
      lo.prefault = false;
      lo.mtp = true;
      auto m = load_model(write_synth_case(c, dir + "/" + name + ext), lo);
      ASSERT_TRUE(m->has_mtp());
      const int64_t V = m->config().n_vocab, d = m->config().dim;
      auto cache = m->new_cache(T);
      EXPECT_EQ(cache->pool->layout().n_layers, m->config().n_layers + 1) << "the draft layer's KV is one more layer";
      std::vector<int32_t> pos(ids.size());
      for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
      std::vector<float> logits(static_cast<size_t>(T * V));
      m->forward(ids.data(), pos.data(), T, *cache, logits.data(), true);
      std::vector<float> hidden(m->final_hidden(), m->final_hidden() + (T - 1) * d);
      ForwardBatch b;
      b.add_sequence(ids.data() + 1, T - 1, 0, cache->pages.data(), static_cast<int64_t>(cache->pages.size()), true, true);
      std::vector<float> got(static_cast<size_t>((T - 1) * V)), out_hidden(static_cast<size_t>((T - 1) * d));
      m->mtp_forward(b, *cache->pool, hidden.data(), got.data(), out_hidden.data());
      const double err = max_abs_diff(got, ref);
      EXPECT_LT(err / mx, 1e-4) << name << ext << ": max |ours - reference| = " << err << " (max |logit| " << mx << ")";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4) << "two MTP cases, each from safetensors and GGUF";
}

// Gemma 3's 4B/12B/27B checkpoints are Gemma3ForConditionalGeneration: the text model's config
// under text_config (most fields left to Gemma3TextConfig's defaults), its tensors under
// "language_model.model." (or "model.language_model." as newer transformers save them), and a
// vision tower beside them. The text model loads from that layout and gives transformers' logits.
// The case `name` of hf_cases.json, and its reference logits.
nlohmann::json golden_case(const std::string& name) {
  std::ifstream in(kGolden + "hf_cases.json");
  auto cases = nlohmann::json::parse(in);
  for (auto& c : cases["cases"])
    if (c["name"] == name) return c;
  ADD_FAILURE() << "no case " << name;
  return {};
}

// A text model's safetensors (model.* names) rewritten as a multimodal checkpoint stores it:
// under `prefix` ("language_model.model." or "model.language_model."), with vision tensors
// beside it, and `config` as its config.json.
void write_multimodal_layout(const std::string& plain, const std::string& out, const std::string& prefix,
                             const nlohmann::json& config) {
  auto src = SafetensorsSet::open_dir(plain);
  std::filesystem::create_directories(out);
  SafetensorsWriter st;
  for (auto& [name, t] : src->all()) {
    ASSERT_TRUE(name.rfind("model.", 0) == 0 || name == "lm_head.weight") << name;
    std::vector<uint8_t> bytes(static_cast<const uint8_t*>(t->data), static_cast<const uint8_t*>(t->data) + t->nbytes);
    const std::string moved = name == "lm_head.weight" ? (prefix == "language_model.model." ? "language_model.lm_head.weight" : name)
                                                       : prefix + name.substr(6);
    st.add(moved, t->type, t->shape, std::move(bytes));
  }
  st.add("vision_tower.vision_model.embeddings.patch_embedding.weight", DType::F32, {4, 3}, std::vector<uint8_t>(48, 0));
  st.add("multi_modal_projector.mm_input_projection_weight", DType::F32, {3, 4}, std::vector<uint8_t>(48, 0));
  st.write(out + "/model.safetensors");
  std::ofstream(out + "/config.json") << config.dump(2);
}

TEST(HfGolden, Gemma3MultimodalCheckpointLoadsItsTextModel) {
  std::ifstream in(kGolden + "hf_cases.json");
  ASSERT_TRUE(in) << kGolden;
  auto cases = nlohmann::json::parse(in);
  std::vector<int32_t> ids = cases["tokens"].get<std::vector<int32_t>>();
  const nlohmann::json gemma = golden_case("hf_gemma3");
  ASSERT_FALSE(gemma.is_null());
  const auto ref = test::read_f32_file(kGolden + "hf_gemma3.logits.f32");
  const double mx = max_abs(ref);
  const std::string dir = test::temp_dir("hf_golden_gemma3_mm");
  const std::string plain = write_synth_case(gemma, dir + "/plain");
  for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
    const std::string out = dir + "/" + prefix.substr(0, prefix.size() - 1);
    // What differs from Gemma3TextConfig's defaults, as the Hub's configs write it (rms_norm_eps,
    // hidden_activation, rope_local_base_freq and the layer pattern left to the defaults).
    nlohmann::json text = gemma["config"];
    for (const char* k : {"rms_norm_eps", "rope_local_base_freq"}) text.erase(k);
    text["model_type"] = "gemma3_text";
    write_multimodal_layout(plain, out, prefix,
                            {{"architectures", {"Gemma3ForConditionalGeneration"}}, {"model_type", "gemma3"},
                             {"text_config", text}, {"vision_config", {{"model_type", "siglip_vision_model"}}},
                             {"mm_tokens_per_image", 256}});
    auto got = test::all_position_logits(out, ids);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_LT(max_abs_diff(got, ref) / mx, 1e-4) << prefix;
  }
}

// Mistral Small 3.1 / 3.2 (Mistral3ForConditionalGeneration): a Mistral under text_config (its
// window kept), its tensors under either prefix and an untied lm_head, the vision tower ignored.
TEST(HfGolden, Mistral3MultimodalCheckpointLoadsItsTextModel) {
  std::ifstream in(kGolden + "hf_cases.json");
  auto cases = nlohmann::json::parse(in);
  std::vector<int32_t> ids = cases["tokens"].get<std::vector<int32_t>>();
  const nlohmann::json mistral = golden_case("hf_mistral_window");
  ASSERT_FALSE(mistral.is_null());
  const auto ref = test::read_f32_file(kGolden + "hf_mistral_window.logits.f32");
  const std::string dir = test::temp_dir("hf_golden_mistral3_mm");
  const std::string plain = write_synth_case(mistral, dir + "/plain");
  nlohmann::json text = nlohmann::json::parse(std::ifstream(plain + "/config.json"));
  text.erase("architectures");
  for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
    const std::string out = dir + "/" + prefix.substr(0, prefix.size() - 1);
    write_multimodal_layout(plain, out, prefix,
                            {{"architectures", {"Mistral3ForConditionalGeneration"}}, {"model_type", "mistral3"},
                             {"text_config", text}, {"vision_config", {{"model_type", "pixtral"}}}, {"image_token_index", 10}});
    auto got = test::all_position_logits(out, ids);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_LT(max_abs_diff(got, ref) / max_abs(ref), 1e-4) << prefix;
    EXPECT_EQ(load_model_file(out)->config.sliding_window, 6) << prefix;
  }
}

// Gemma 2's config.json files may leave out the caps and the layer types: Gemma2Config's defaults
// (scores capped at 50, logits at 30, the even layers windowed) fill them, a cap written as null
// turns it off, and Gemma 3 refuses a cap. The GGUF's keys give the same config as the directory.
TEST(HfGolden, Gemma2ConfigDefaultsAndCaps) {
  std::ifstream in(kGolden + "hf_cases.json");
  ASSERT_TRUE(in) << kGolden;
  auto cases = nlohmann::json::parse(in);
  nlohmann::json gemma;
  for (auto& c : cases["cases"])
    if (c["name"] == "hf_gemma2") gemma = c;
  ASSERT_FALSE(gemma.is_null());
  const std::string dir = test::temp_dir("hf_golden_gemma2_defaults");
  const ModelConfig from_gguf = load_model_file(write_synth_case(gemma, dir + "/m.gguf"))->config;
  const ModelConfig from_hf = load_model_file(write_synth_case(gemma, dir + "/hf"))->config;
  for (const ModelConfig* c : {&from_gguf, &from_hf}) {
    EXPECT_EQ(c->attn_softcap, 2.0f) << c->source;
    EXPECT_EQ(c->final_softcap, 20.0f) << c->source;
    EXPECT_EQ(c->swa_layers, (std::vector<bool>{true, false, true, false})) << c->source;
    EXPECT_EQ(c->sliding_window, 5) << c->source;
    EXPECT_FALSE(c->qk_norm) << c->source;
    EXPECT_TRUE(c->post_norms && c->gelu_ffn) << c->source;
    EXPECT_NE(c->describe().find("scores soft-capped at 2, logits soft-capped at 20"), std::string::npos) << c->describe();
  }
  auto rewrite = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/hf/config.json"));
    edit(cfg);
    std::ofstream(dir + "/hf/config.json") << cfg.dump(2);
  };
  rewrite([](nlohmann::json& cfg) {
    for (const char* k : {"attn_logit_softcapping", "final_logit_softcapping", "layer_types", "sliding_window"}) cfg.erase(k);
  });
  ModelConfig d = load_model_file(dir + "/hf")->config;
  EXPECT_EQ(d.attn_softcap, 50.0f);
  EXPECT_EQ(d.final_softcap, 30.0f);
  EXPECT_EQ(d.sliding_window, 4096);
  EXPECT_EQ(d.swa_layers, (std::vector<bool>{true, false, true, false}));
  rewrite([](nlohmann::json& cfg) { cfg["final_logit_softcapping"] = nullptr; });
  d = load_model_file(dir + "/hf")->config;
  EXPECT_EQ(d.attn_softcap, 50.0f);
  EXPECT_EQ(d.final_softcap, 0.0f);
  rewrite([](nlohmann::json& cfg) { cfg["attn_logit_softcapping"] = -1.0; });
  EXPECT_THROW(
      {
        try {
          load_model_file(dir + "/hf");
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("must be positive or null"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  rewrite([](nlohmann::json& cfg) {
    cfg["architectures"] = {"Gemma3ForCausalLM"};
    cfg["attn_logit_softcapping"] = 50.0;
  });
  try {
    load_model_file(dir + "/hf");
    ADD_FAILURE() << "Gemma 3 with a cap loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attn_logit_softcapping = 50.0: Gemma 3 has no logit soft-capping"), std::string::npos)
        << e.what();
  }
}

// LongRoPE (Phi-3.5, Phi-4-mini): the GGUF (factor tensors and keys, as llama.cpp's converter
// writes them) and the directory give the same config; the factor set follows the longest
// sequence served (LoadOptions::max_model_len), and the frequencies are the base ones divided by
// that set's factors. Malformed factors are refused by name.
TEST(HfGolden, LongRopeFactorsFollowTheLongestSequence) {
  std::ifstream in(kGolden + "hf_cases.json");
  auto cases = nlohmann::json::parse(in);
  nlohmann::json phi;
  for (auto& c : cases["cases"])
    if (c["name"] == "hf_phi35_longrope_long") phi = c;
  ASSERT_FALSE(phi.is_null());
  const std::string dir = test::temp_dir("hf_golden_longrope");
  const std::string gguf = write_synth_case(phi, dir + "/m.gguf"), hf = write_synth_case(phi, dir + "/hf");
  const std::vector<float> s = phi["config"]["rope_scaling"]["short_factor"], l = phi["config"]["rope_scaling"]["long_factor"];
  for (const std::string& path : {gguf, hf}) {
    for (int64_t longest : {0, 8, 9, 100}) {
      LoadOptions lo;
      lo.max_model_len = longest;
      const ModelConfig c = load_model_file(path, lo)->config;
      const RopeScaling& r = c.rope_scaling;
      EXPECT_EQ(r.type, "longrope") << path;
      EXPECT_EQ(r.short_factor, s) << path;
      EXPECT_EQ(r.long_factor, l) << path;
      EXPECT_EQ(r.original_context, 8) << path;
      EXPECT_NEAR(r.attn_factor, std::sqrt(2.0), 1e-6) << path;  // sqrt(1 + ln(64 / 8) / ln(8))
      EXPECT_EQ(r.use_long, longest != 8) << path << " longest " << longest;  // 0 and 100: the context, 64
      const std::vector<float>& f = r.use_long ? l : s;
      const std::vector<float> inv = c.rope_inv_freq();
      ASSERT_EQ(inv.size(), f.size());
      for (size_t i = 0; i < inv.size(); ++i)
        EXPECT_NEAR(inv[i], 1.0 / (f[i] * std::pow(10000.0, 2.0 * static_cast<double>(i) / 12.0)), 1e-7) << path << " " << i;
    }
  }
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& want) {
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(hf + "/config.json"));
    const nlohmann::json keep = cfg;
    edit(cfg["rope_scaling"]);
    std::ofstream(hf + "/config.json") << cfg.dump(2);
    try {
      load_model_file(hf);
      ADD_FAILURE() << "loaded; wanted: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    std::ofstream(hf + "/config.json") << keep.dump(2);
  };
  refused([](nlohmann::json& r) { r["short_factor"].push_back(1.0); }, "LongRoPE short_factor length = 7 (must be half the rotated dimensions, 6)");
  refused([](nlohmann::json& r) { r.erase("long_factor"); }, "rope_scaling (longrope) needs the array 'long_factor'");
  refused([](nlohmann::json& r) { r["long_factor"][2] = -1.0; }, "LongRoPE factor -1 must be positive");
  refused([](nlohmann::json& r) { r["short_factor"][0] = "x"; }, "rope_scaling short_factor holds \"x\", not a number");
}

// A model loaded without its draft layer, or one that has none, says so.
TEST(HfGolden, MultiTokenPredictionNeedsTheLayer) {
  std::string dir = test::temp_dir("hf_golden_mtp_none");
  SynthOptions o;
  o.arch = "qwen3_moe";
  o.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 96},
              {"num_hidden_layers", 2}, {"vocab_size", 512}, {"num_experts", 4}, {"num_experts_per_tok", 2},
              {"moe_intermediate_size", 32}};
  o.out = dir + "/m.gguf";
  synth_model(o);
  LoadOptions lo;
  lo.prefault = false;
  lo.mtp = true;
  try {
    load_model(o.out, lo);
    ADD_FAILURE() << "loaded a draft layer an architecture without one cannot have";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("this one is qwen3moe"), std::string::npos) << e.what();
  }
  SynthOptions glm;  // an architecture with the layer, in a file without it
  glm.arch = "glm4_moe";
  glm.config = {{"hidden_size", 64}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 96},
                {"num_hidden_layers", 2}, {"vocab_size", 512}, {"n_routed_experts", 4}, {"num_experts_per_tok", 2},
                {"moe_intermediate_size", 32}};
  glm.out = dir + "/glm.gguf";
  synth_model(glm);
  try {
    load_model(glm.out, lo);
    ADD_FAILURE() << "loaded a draft layer the file does not have";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("num_nextn_predict_layers = 0"), std::string::npos) << e.what();
  }
  lo.mtp = false;
  auto m = load_model(o.out, lo);
  EXPECT_FALSE(m->has_mtp());
  ForwardBatch b;
  auto cache = m->new_cache(4);
  const int32_t t = 5;
  b.add_sequence(&t, 1, 0, cache->pages.data(), static_cast<int64_t>(cache->pages.size()), true);
  std::vector<float> lg(512);
  EXPECT_THROW(m->mtp_forward(b, *cache->pool, lg.data(), lg.data(), nullptr), std::exception);
}

// The first Mixtral GGUFs hold one tensor per expert (blk.N.ffn_gate.E.weight, as llama.cpp
// wrote them before stacking); such a file loads and gives the logits of the stacked one, which
// HfGolden.LlamaQwen2Qwen3MatchTransformers checks against transformers.
TEST(HfGolden, MixtralPerExpertGgufGivesTheStackedLogits) {
  const nlohmann::json c = golden_case("hf_mixtral");
  const std::string dir = test::temp_dir("hf_golden_mixtral_legacy");
  const std::string stacked = write_synth_case(c, dir + "/stacked.gguf");
  auto g = GgufFile::open(stacked);
  ASSERT_EQ(g->get_string("general.architecture"), "llama") << "llama.cpp writes Mixtral as a llama with experts";
  GgufWriter w;
  for (auto& [key, v] : g->metadata()) {
    if (key == "general.alignment") continue;
    if (v.type == GgufType::STRING) w.set_string(key, v.s);
    else if (v.type == GgufType::U32) w.set_u32(key, static_cast<uint32_t>(v.u));
    else if (v.type == GgufType::F32) w.set_f32(key, static_cast<float>(v.f));
    else if (v.type == GgufType::BOOL) w.set_bool(key, v.b);
    else if (v.type == GgufType::ARRAY && v.elem_type == GgufType::STRING) w.set_string_array(key, v.arr_str);
    else if (v.type == GgufType::ARRAY && v.elem_type == GgufType::F32) w.set_f32_array(key, std::vector<float>(v.arr_num.begin(), v.arr_num.end()));
    else if (v.type == GgufType::ARRAY && v.elem_type == GgufType::I32) {
      std::vector<int32_t> ints;
      for (double x : v.arr_num) ints.push_back(static_cast<int32_t>(x));
      w.set_i32_array(key, ints);
    } else {
      ADD_FAILURE() << key << ": a metadata type this copy does not handle (" << gguf_type_name(v.type) << ")";
    }
  }
  int split = 0;
  for (const GgufTensorInfo& t : g->tensors()) {
    const size_t at = t.name.find("_exps.weight");
    if (at == std::string::npos) {
      w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
      continue;
    }
    ASSERT_EQ(t.ne.size(), 3u) << t.name;
    const uint64_t per = t.nbytes / static_cast<uint64_t>(t.ne[2]);
    for (int64_t e = 0; e < t.ne[2]; ++e, ++split)
      w.add_tensor(t.name.substr(0, at) + "." + std::to_string(e) + ".weight", t.type, {t.ne[0], t.ne[1]},
                   std::vector<uint8_t>(t.data + e * static_cast<int64_t>(per), t.data + (e + 1) * static_cast<int64_t>(per)));
  }
  EXPECT_EQ(split, 2 * 3 * 4) << "two layers, three projections, four experts";
  const std::string legacy = dir + "/per_expert.gguf";
  w.write(legacy);
  const std::vector<int32_t> ids = {1, 17, 300, 5, 99, 42, 260, 7};
  const auto want = test::all_position_logits(stacked, ids), got = test::all_position_logits(legacy, ids);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(max_abs_diff(got, want) / max_abs(want), 1e-5);
}

// Granite's multipliers divide and fold (config.h): one that is not positive is refused by name,
// as are biases the Llama class does not read.
TEST(HfGolden, GraniteRefusesMultipliersItCannotFold) {
  const std::string dir = write_synth_case(golden_case("hf_granite_untied"), test::temp_dir("hf_golden_granite_bad") + "/m");
  nlohmann::json good;
  std::ifstream(dir + "/config.json") >> good;
  for (auto [key, value, expect] :
       {std::tuple{"residual_multiplier", nlohmann::json(0.0), "residual multiplier 0 must be positive"},
        std::tuple{"logits_scaling", nlohmann::json(-2.0), "logits scaling -2 must be positive"},
        std::tuple{"attention_bias", nlohmann::json(true), "attention_bias (biases on Granite's projections) is not supported"}}) {
    nlohmann::json bad = good;
    bad[key] = value;
    std::ofstream(dir + "/config.json") << bad.dump();
    try {
      load_model(dir);
      ADD_FAILURE() << key << " = " << value << " loaded";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  }
}

// Loading `dir` fails with an error that says `expect`.
void expect_refused(const std::string& dir, const std::string& expect) {
  try {
    load_model_file(dir);
    ADD_FAILURE() << dir << " loaded; expected: " << expect;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
  }
}

// Llama 4 reads its keys (NoPE and chunked layers, the temperature tuning, sparse layers by
// step or by list) and refuses by name what it does not run; the multimodal checkpoint
// (Llama4ForConditionalGeneration: text_config, language_model.* names, a vision tower beside)
// gives the text model's logits exactly.
TEST(HfGolden, Llama4ReadsItsKeysAndTheMultimodalWrapper) {
  const std::string root = test::temp_dir("hf_golden_llama4");
  const std::string text = write_synth_case(golden_case("hf_llama4"), root + "/text");
  nlohmann::json good;
  std::ifstream(text + "/config.json") >> good;
  auto with = [&](const nlohmann::json& patch, const std::vector<std::string>& drop = {}) {
    const std::string dir = root + "/patched";
    if (!std::filesystem::exists(dir)) write_synth_case(golden_case("hf_llama4"), dir);
    nlohmann::json cfg = good;
    for (auto& [k, v] : patch.items()) cfg[k] = v;  // (not merge_patch: a null value here means null)
    for (const std::string& k : drop) cfg.erase(k);
    std::ofstream(dir + "/config.json") << cfg.dump();
    return dir;
  };
  {
    const ModelConfig c = load_model_file(text)->config;
    EXPECT_EQ(c.arch, "llama4");
    EXPECT_EQ(c.nope_layers, (std::vector<bool>{false, false, false, true}));
    EXPECT_EQ(c.chunked_layers, (std::vector<bool>{true, true, true, false}));
    EXPECT_EQ(c.attention_chunk, 5);
    EXPECT_TRUE(c.qk_l2_norm);
    EXPECT_EQ(c.nope_temp_floor, 4.0f);
    EXPECT_FLOAT_EQ(c.nope_query_scale(2), 1.0f);  // floor(3 / 4) = 0
    EXPECT_FLOAT_EQ(c.nope_query_scale(11), 1.0f + 0.5f * std::log(4.0f));
    EXPECT_EQ(c.hidden_dim, 96);
    EXPECT_EQ(c.moe.ff, 32);
    EXPECT_TRUE(c.moe.scale_input);
    EXPECT_FALSE(c.moe.is_moe_layer(0));
    EXPECT_TRUE(c.moe.is_moe_layer(1));
    EXPECT_TRUE(c.moe.is_moe_layer(3));
  }
  {  // Llama4TextConfig's defaults where the keys are left out: a NoPE layer every fourth, chunks of 8192
    const ModelConfig c = load_model_file(with(nlohmann::json::object(), {"no_rope_layers", "layer_types", "attention_chunk_size", "floor_scale",
                                                    "attn_scale", "attn_temperature_tuning"}))->config;
    EXPECT_EQ(c.nope_layers, (std::vector<bool>{false, false, false, true}));
    EXPECT_EQ(c.attention_chunk, 8192);
    EXPECT_EQ(c.chunked_layers, (std::vector<bool>{true, true, true, false}));
    EXPECT_EQ(c.nope_temp_floor, 8192.0f);
    EXPECT_FLOAT_EQ(c.nope_temp_scale, 0.1f);
    // No chunks (null), the temperature off (older configs write a number), every layer rotating
    const ModelConfig d = load_model_file(with({{"attention_chunk_size", nullptr}, {"attn_temperature_tuning", 0},
                                                {"no_rope_layers", {1, 1, 1, 1}}},
                                               {"layer_types"}))->config;
    EXPECT_EQ(d.attention_chunk, 0);
    EXPECT_TRUE(d.chunked_layers.empty());
    EXPECT_EQ(d.nope_temp_floor, 0.0f);
    EXPECT_EQ(d.nope_layers, (std::vector<bool>{false, false, false, false}));
  }
  expect_refused(with({{"num_experts_per_tok", 2}}), "read here for top-1 routing only");
  expect_refused(with({{"hidden_act", "gelu"}}), "hidden_act 'gelu' is not supported for Llama 4");
  expect_refused(with({{"moe_layers", {0, 1, 3}}}), "missing tensor 'model.layers.0.feed_forward.experts.");
  expect_refused(with({{"moe_layers", {1, 4}}}), "moe_layers holds 4, not a layer index below num_hidden_layers (4)");
  expect_refused(with({{"layer_types", {"chunked_attention", "sliding_attention", "full_attention", "full_attention"}}}),
          "layer_types holds \"sliding_attention\"");

  // The multimodal wrapper: the same tensors under language_model., a vision tensor beside them.
  const std::string mm = root + "/multimodal";
  std::filesystem::create_directories(mm);
  {
    auto set = SafetensorsSet::open_dir(text);
    SafetensorsWriter w;
    for (auto& [name, t] : set->all()) {
      w.add("language_model." + name, t->type, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes));
    }
    w.add("vision_model.patch_embedding.linear.weight", DType::F32, {2, 2}, std::vector<uint8_t>(16, 0));
    w.write(mm + "/model.safetensors");
    nlohmann::json text_config = good;
    text_config.erase("architectures");
    nlohmann::json wrapped = nlohmann::json::object();
    wrapped["architectures"] = nlohmann::json::array({"Llama4ForConditionalGeneration"});
    wrapped["model_type"] = "llama4";
    wrapped["text_config"] = text_config;
    wrapped["vision_config"] = nlohmann::json::object({{"hidden_size", 4}});
    std::ofstream(mm + "/config.json") << wrapped.dump();
  }
  const std::vector<int32_t> ids = {1, 17, 300, 5, 99, 42, 260, 7, 3, 11, 12};
  const auto want = test::all_position_logits(text, ids), got = test::all_position_logits(mm, ids);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(max_abs_diff(got, want), 0.0f);

  // The experts one tensor each (feed_forward.experts.E.{gate,up,down}_proj.weight, [out, in]) read
  // as the stacks do: the same logits.
  const std::string per_expert = root + "/per_expert";
  std::filesystem::create_directories(per_expert);
  {
    auto set = SafetensorsSet::open_dir(text);
    SafetensorsWriter w;
    const int64_t dim = good["hidden_size"], ff = good["intermediate_size"], E = good["num_local_experts"];
    auto f32 = [](const SafetensorsTensor* t) { return reinterpret_cast<const float*>(t->data); };
    auto add = [&](const std::string& name, int64_t rows, int64_t cols, const std::function<float(int64_t, int64_t)>& at) {
      std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols * 4));
      auto* out = reinterpret_cast<float*>(bytes.data());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < cols; ++k) out[r * cols + k] = at(r, k);
      w.add(name, DType::F32, {rows, cols}, std::move(bytes));
    };
    int split = 0;
    for (auto& [name, t] : set->all()) {
      ASSERT_EQ(t->type, DType::F32) << name;
      const size_t at = name.find("feed_forward.experts.");
      if (at == std::string::npos) {
        w.add(name, t->type, t->shape, std::vector<uint8_t>(t->data, t->data + t->nbytes));
        continue;
      }
      const std::string base = name.substr(0, at) + "feed_forward.experts.";
      const float* x = f32(t);
      for (int64_t e = 0; e < E; ++e) {
        const std::string ex = base + std::to_string(e) + ".";
        if (name.ends_with("gate_up_proj")) {  // [E, dim, 2ff]: gate the first ff columns
          add(ex + "gate_proj.weight", ff, dim, [&](int64_t j, int64_t i) { return x[(e * dim + i) * 2 * ff + j]; });
          add(ex + "up_proj.weight", ff, dim, [&](int64_t j, int64_t i) { return x[(e * dim + i) * 2 * ff + ff + j]; });
        } else {  // down_proj [E, ff, dim]
          add(ex + "down_proj.weight", dim, ff, [&](int64_t i, int64_t j) { return x[(e * ff + j) * dim + i]; });
        }
      }
      ++split;
    }
    EXPECT_EQ(split, 4) << "two sparse layers, two stacks each";
    w.write(per_expert + "/model.safetensors");
    std::filesystem::copy_file(text + "/config.json", per_expert + "/config.json");
  }
  EXPECT_EQ(max_abs_diff(test::all_position_logits(per_expert, ids), want), 0.0f);
}

// The forty-third session's architectures read their own config keys (EXAONE 4.0's string
// sliding_window_pattern, ERNIE 4.5 MoE's last sparse layer, OLMo 3's RoPE per layer type) and
// refuse by name what they do not run: MiniMax's lightning-attention layers and per-head q/k
// norms, Seed-OSS's output bias, ERNIE's biases, a GraniteMoeShared config whose shared expert
// the file lacks, OLMo 3's sliding layers with a scaling of their own, Hunyuan's dynamic NTK
// scaling without a fixed alpha or per-layer expert counts that differ.
TEST(HfGolden, NewArchitecturesReadTheirKeysAndRefuseTheRest) {
  const std::string root = test::temp_dir("hf_golden_new_archs");
  auto with = [&](const std::string& name, const nlohmann::json& patch, const std::vector<std::string>& drop = {}) {
    const std::string dir = root + "/" + name;
    if (!std::filesystem::exists(dir)) write_synth_case(golden_case(name), dir);
    nlohmann::json cfg;
    std::ifstream(dir + "/config.json") >> cfg;
    cfg.merge_patch(patch);
    for (const std::string& k : drop) cfg.erase(k);
    std::ofstream(dir + "/config.json") << cfg.dump();
    return dir;
  };
  {  // "LLLG": three sliding layers with RoPE, then a global one without
    const ModelConfig c =
        load_model_file(with("hf_exaone4", {{"sliding_window_pattern", "LLLG"}, {"sliding_window", 5}}, {"layer_types"}))->config;
    EXPECT_EQ(c.swa_layers, (std::vector<bool>{true, true, true, false}));
    EXPECT_EQ(c.nope_layers, (std::vector<bool>{false, false, false, true}));
    expect_refused(with("hf_exaone4", {{"sliding_window_pattern", "LGL"}}), "sliding_window_pattern 'LGL' is not supported");
    // No sliding_window key: Exaone4Config's default window of 4096 on three layers of four.
    const ModelConfig d = load_model_file(with("hf_exaone4", {{"sliding_window_pattern", nullptr}}, {"sliding_window", "layer_types"}))->config;
    EXPECT_EQ(d.sliding_window, 4096);
    EXPECT_EQ(d.swa_layers, (std::vector<bool>{true, true, true, false}));
  }
  {  // layers 1..3 of 5 sparse, every second: 1 and 3; the end index 2 leaves only 1
    const ModelConfig c = load_model_file(with("hf_ernie4_5_moe_interval", {{"moe_layer_end_index", 2}}))->config;
    EXPECT_TRUE(c.moe.is_moe_layer(1));
    EXPECT_FALSE(c.moe.is_moe_layer(3));
    expect_refused(with("hf_ernie4_5", {{"use_bias", true}}), "use_bias (biases on ERNIE 4.5's projections) is not supported");
    expect_refused(with("hf_ernie4_5_moe_interval", {{"moe_layer_end_index", 1e30}}), "moe_layer_end_index 1e+30 should be a layer index");
  }
  {  // OLMo 3's per-layer-type RoPE objects (transformers v5): the full layers' scaling, the sliding layers' base
    const nlohmann::json v5 = {{"rope_parameters",
                                {{"full_attention", {{"rope_type", "yarn"}, {"factor", 4.0}, {"rope_theta", 100000.0},
                                                     {"original_max_position_embeddings", 64}}},
                                 {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 20000.0}}}}}};
    const ModelConfig c = load_model_file(with("hf_olmo3", v5))->config;
    EXPECT_EQ(c.rope_scaling.type, "yarn");
    EXPECT_EQ(c.rope_theta, 100000.0f);
    EXPECT_EQ(c.rope_theta_swa, 20000.0f);
    expect_refused(with("hf_olmo3", {{"rope_parameters", {{"sliding_attention", {{"rope_type", "linear"}, {"factor", 2.0}}}}}}),
            "rope_parameters.sliding_attention rope_type 'linear' is not supported");
  }
  expect_refused(with("hf_hunyuan_dense", {{"rope_scaling", {{"alpha", nullptr}, {"factor", 2.0}}}}),  // (null: the key removed)
          "rope_scaling type 'dynamic' without alpha (sequence-length-dependent NTK scaling) is not supported");
  expect_refused(with("hf_hunyuan_dense", {{"rope_scaling", nullptr}, {"attention_bias", true}}),
          "attention_bias (biases on Hunyuan's projections) is not supported");
  {  // Hunyuan-A13B's per-layer lists: one value for every layer, else refused
    EXPECT_EQ(load_model_file(with("hf_hunyuan_moe", {{"moe_topk", {2, 2}}, {"num_experts", {6, 6}}}))->config.moe.n_used, 2);
    expect_refused(with("hf_hunyuan_moe", {{"moe_topk", {2, 3}}}), "field 'moe_topk' differs between layers");
  }
  expect_refused(with("hf_minimax_m2", {{"attn_type_list", {1, 0, 1}}}), "only full attention (1) is supported");
  expect_refused(with("hf_minimax_m2", {{"attn_type_list", {1, 1, 1}}, {"qk_norm_type", "per_head"}}),
          "qk_norm_type 'per_head' is not supported");
  expect_refused(with("hf_seed_oss", {{"attention_out_bias", true}}), "attention_out_bias (biases on Seed-OSS's output projections)");
  expect_refused(with("hf_granite_moe", {{"architectures", {"GraniteMoeSharedForCausalLM"}}, {"shared_intermediate_size", 32}}),
          "has no shared_mlp.input_linear, but shared_intermediate_size is 32");
}

// Embeddings (engine/embedder.h) against transformers' last_hidden_state (after the model's norm)
// for the cases with "hidden": the Llama class (Qwen3, Granite, whose output norm carries
// 1 / logits_scaling), the GQA MoE class (Qwen3-MoE; GraniteMoe, with the same folded scale; MiniMax-M2; ERNIE 4.5 MoE) and
// DeepSeek's MLA, from safetensors and GGUF: the last
// token's state, the mean over the tokens, L2-normalised, in one forward and in chunks of 5 tokens.
TEST(HfGolden, EmbeddingsPoolTransformersHiddenStates) {
  std::ifstream in(kGolden + "hf_cases.json");
  auto cases = nlohmann::json::parse(in);
  const std::vector<int32_t> ids = cases["tokens"].get<std::vector<int32_t>>();
  const auto T = static_cast<int64_t>(ids.size());
  const std::string dir = test::temp_dir("hf_golden_embed");
  int checked = 0;
  for (auto& c : cases["cases"]) {
    if (!c.value("hidden", false)) continue;
    const std::string name = c["name"];
    const auto hidden = test::read_f32_file(kGolden + name + ".hidden.f32");
    const auto d = static_cast<int64_t>(hidden.size()) / T;
    ASSERT_EQ(d * T, static_cast<int64_t>(hidden.size())) << name;
    std::vector<float> last(hidden.end() - d, hidden.end()), mean(static_cast<size_t>(d), 0.0f), unit = last;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < d; ++k) mean[static_cast<size_t>(k)] += hidden[static_cast<size_t>(t * d + k)] / static_cast<float>(T);
    double ss = 0;
    for (float v : last) ss += static_cast<double>(v) * v;
    for (float& v : unit) v = static_cast<float>(v / std::sqrt(ss));
    for (const std::string& ext : {std::string("_hf"), std::string(".gguf")}) {
      LoadOptions lo;
      lo.prefault = false;
      auto m = load_model(write_synth_case(c, dir + "/" + name + ext), lo);
      ASSERT_EQ(m->config().dim, d) << name;
      {
        Embedder e(*m);
        EXPECT_TRUE(m->hidden_output());
        for (int64_t chunk : {int64_t{512}, int64_t{5}}) {
          EmbeddingOptions o;
          o.chunk = chunk;
          o.normalize = false;
          const std::string at = name + ext + " chunk " + std::to_string(chunk);
          EXPECT_LT(max_abs_diff(e.embed(ids, o), last) / max_abs(last), 1e-4) << at << ": last token";
          o.pooling = Pooling::Mean;
          EXPECT_LT(max_abs_diff(e.embed(ids, o), mean) / max_abs(mean), 1e-4) << at << ": mean";
          o.pooling = Pooling::Last;
          o.normalize = true;
          EXPECT_LT(max_abs_diff(e.embed(ids, o), unit), 1e-5) << at << ": normalised";
        }
        EXPECT_THROW(e.embed({}, EmbeddingOptions{}), Error);
        EXPECT_THROW(e.embed(std::vector<int32_t>(static_cast<size_t>(m->config().max_context + 1), 5), EmbeddingOptions{}), Error);
      }
      EXPECT_FALSE(m->hidden_output()) << "the embedder gives the logits back";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 14) << "seven cases, two formats each";
}

// Several texts batched into one forward give each text's own embedding: lengths 1 to 30 in
// batches of up to 32 tokens (and a text longer than that alone, in chunks), both poolings.
TEST(HfGolden, EmbeddingBatchesGiveEachTextItsOwn) {
  for (const char* name : {"hf_qwen3", "hf_deepseek_v2"}) {
    nlohmann::json c = golden_case(name);
    c["config"]["max_position_embeddings"] = 128;
    auto m = load_model(write_synth_case(c, test::temp_dir("embed_batch") + "/" + name + ".gguf"));
    std::vector<std::vector<int32_t>> inputs;
    for (int64_t n : {1, 3, 7, 16, 30, 40, 2, 9}) {
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((n * 37 + i * 11) % 500 + 3));
      inputs.push_back(ids);
    }
    Embedder e(*m);
    for (Pooling p : {Pooling::Last, Pooling::Mean}) {
      EmbeddingOptions o;
      o.pooling = p;
      o.chunk = 32;
      const auto batched = e.embed_batch(inputs, o);
      ASSERT_EQ(batched.size(), inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i)
        EXPECT_LT(max_abs_diff(batched[i], e.embed(inputs[i], o)), 2e-5) << name << " " << pooling_name(p) << " text " << i;
    }
    EXPECT_THROW(e.embed_batch({{1, 2}, {}}, EmbeddingOptions{}), Error) << "an empty text";
  }
}

// The pooling a model directory asks for (sentence-transformers' 1_Pooling/config.json), and the
// command's JSON lines: one per text, unit length, the model's width.
TEST(HfGolden, EmbedCommandAndPoolingConfig) {
  const std::string dir = test::temp_dir("embed_pooling");
  EXPECT_EQ(default_pooling(dir), Pooling::Last) << "no sentence-transformers config";
  std::filesystem::create_directories(dir + "/1_Pooling");
  std::ofstream(dir + "/1_Pooling/config.json") << R"({"word_embedding_dimension": 64, "pooling_mode_mean_tokens": true})";
  EXPECT_EQ(default_pooling(dir), Pooling::Mean);
  std::ofstream(dir + "/1_Pooling/config.json") << R"({"pooling_mode_lasttoken": true})";
  EXPECT_EQ(default_pooling(dir), Pooling::Last);
  std::ofstream(dir + "/1_Pooling/config.json") << R"({"pooling_mode_cls_token": true})";
  EXPECT_THROW(default_pooling(dir), Error);
  EXPECT_THROW(pooling_from_name("max"), Error);

  const std::string model = write_synth_case(golden_case("hf_qwen3"), dir + "/q.gguf");
  int rc = 0;
  const std::string out = test::run_command(test::fastpath_bin() + " embed -q -m " + model +
                                                " -p 'the cat sat' -p 'a dog' --pooling mean 2>&1", &rc);
  ASSERT_EQ(rc, 0) << out;
  std::istringstream lines(out);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["index"], n);
    EXPECT_GT(j["tokens"].get<int>(), 1);
    const auto v = j["embedding"].get<std::vector<float>>();
    ASSERT_EQ(v.size(), 64u);
    double ss = 0;
    for (float x : v) ss += static_cast<double>(x) * x;
    EXPECT_NEAR(ss, 1.0, 1e-5);
  }
  EXPECT_EQ(n, 2) << out;
}

}  // namespace
}  // namespace fp
