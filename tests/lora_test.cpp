// tests/lora_test.cpp — LoRA adapters (model/lora.h): the logits of the golden cases with a
// random adapter against PEFT's (scripts/make_hf_golden.py), from safetensors and GGUF bases;
// several adapters in one engine batch, each sequence with its own; prefix-cache hits only under
// the same adapter; and the refusals, each naming what it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/lora.h"
#include "model/model.h"
#include "test_util.h"

namespace fp {
namespace {

const std::string kGolden = std::string(FASTPATH_SOURCE_DIR_FOR_TESTS) + "/tests/golden/";

nlohmann::json golden_cases() {
  std::ifstream in(kGolden + "hf_cases.json");
  EXPECT_TRUE(in) << kGolden;
  return nlohmann::json::parse(in);
}

const nlohmann::json& golden_case(const nlohmann::json& cases, const std::string& name) {
  for (const auto& c : cases["cases"])
    if (c["name"] == name) return c;
  throw Error("no golden case " + name);
}

std::unique_ptr<Model> load(const std::string& path) {
  LoadOptions lo;
  lo.prefault = false;
  return load_model(path, lo);
}

// Every position's logits of `ids` fed as one sequence, under adapter `lora` (0: none).
std::vector<float> logits_under(Model& m, const std::vector<int32_t>& ids, int32_t lora) {
  m.set_single_lora(lora);
  const auto n = static_cast<int64_t>(ids.size());
  auto cache = m.new_cache(n);
  std::vector<float> out(static_cast<size_t>(n * m.config().n_vocab));
  std::vector<int32_t> pos(ids.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  m.forward(ids.data(), pos.data(), n, *cache, out.data(), true);
  m.set_single_lora(0);
  return out;
}

TEST(Lora, AdaptersMatchPeft) {
  const nlohmann::json cases = golden_cases();
  const auto ids = cases["tokens"].get<std::vector<int32_t>>();
  const std::string dir = test::temp_dir("lora_golden");
  int checked = 0;
  for (const auto& c : cases["cases"]) {
    if (!c.contains("lora")) continue;
    const std::string name = c["name"];
    const auto ref = test::read_f32_file(kGolden + name + ".lora_logits.f32");
    const auto base_ref = test::read_f32_file(kGolden + name + ".logits.f32");
    ASSERT_EQ(ref.size(), ids.size() * 512) << name;
    // The adapter is written once as PEFT writes it and once as llama.cpp's converter does (the
    // same values; not for rsLoRA or per-module alphas, which that format has no field for), and
    // each serves the safetensors model and its GGUF twin.
    const std::string hf = test::write_synth_case(c, dir + "/" + name + "_hf");
    // The adapter's matrices in the case's lora_type (kept in it: F16 and BF16 are read as stored).
    std::vector<std::string> adapters = {dir + "/" + name + "_lora"};
    DType type = DType::F32;
    ASSERT_TRUE(dtype_from_name(c.value("lora_type", std::string("f32")), &type)) << name;
    synth_lora(hf, c["lora"], c["seed"].get<uint64_t>(), adapters[0], type);
    const nlohmann::json& lc = c["lora"];
    if (!lc.value("use_rslora", false) && !lc.contains("alpha_pattern") && !lc.contains("rank_pattern")) {
      adapters.push_back(dir + "/" + name + "_lora.gguf");
      synth_lora(hf, lc, c["seed"].get<uint64_t>(), adapters[1], type);
    }
    for (const std::string& ext : c.value("formats", std::vector<std::string>{"_hf", ".gguf"})) {
      const std::string path = ext == "_hf" ? hf : test::write_synth_case(c, dir + "/" + name + ext);
      auto m = load(path);
      for (const std::string& adapter : adapters) {
        const int32_t id = m->add_lora(read_lora_adapter(adapter, adapter, m->file()));
        const double lora_err = test::rel_err(logits_under(*m, ids, id), ref);
        EXPECT_LT(lora_err, 1e-4) << name << ext << " with " << adapter << ", against PEFT";
        ++checked;
      }
      // Loaded but not chosen: the base model's logits, untouched.
      const double base_err = test::rel_err(logits_under(*m, ids, 0), base_ref);
      EXPECT_LT(base_err, 1e-4) << name << ext << ": adapters loaded, not used";
    }
  }
  EXPECT_GE(checked, 20);
}

// Greedy continuation of `prompt` for `n` tokens under adapter `lora`, one sequence at a time.
std::vector<int32_t> greedy_alone(Model& m, std::vector<int32_t> tokens, int n, int32_t lora) {
  m.set_single_lora(lora);
  const int64_t V = m.config().n_vocab;
  auto cache = m.new_cache(static_cast<int64_t>(tokens.size()) + n);
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<int32_t> out;
  std::vector<int32_t> pos(tokens.size());
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(i);
  m.forward(tokens.data(), pos.data(), static_cast<int64_t>(tokens.size()), *cache, logits.data(), false);
  for (int k = 0; k < n; ++k) {
    const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(best);
    const auto at = static_cast<int32_t>(tokens.size());
    tokens.push_back(best);
    if (k + 1 < n) m.forward(&best, &at, 1, *cache, logits.data(), false);
  }
  m.set_single_lora(0);
  return out;
}

// The engine's tokens for each request, run together.
std::vector<std::vector<int32_t>> run_engine(Engine& e, const std::vector<Request>& reqs) {
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < reqs.size(); ++i) index[e.add_request(reqs[i])] = i;
  std::vector<std::vector<int32_t>> out(reqs.size());
  for (int guard = 0; e.has_work() && guard < 10000; ++guard)
    for (const StepOutput& o : e.step())
      if (o.token >= 0) out[index.at(o.id)].push_back(o.token);
  return out;
}

TEST(Lora, EngineRunsEachSequenceWithItsAdapter) {
  const nlohmann::json cases = golden_cases();
  const std::string dir = test::temp_dir("lora_engine");
  const std::string path = test::write_synth_case(golden_case(cases, "hf_llama_gqa"), dir + "/m");
  auto m = load(path);
  synth_lora(path, {{"r", 4}, {"lora_alpha", 8}, {"target_modules", {"q_proj", "v_proj", "down_proj"}}}, 1, dir + "/a");
  synth_lora(path, {{"r", 2}, {"lora_alpha", 4}, {"target_modules", {"k_proj", "o_proj", "gate_proj", "up_proj"}}}, 2,
             dir + "/b");
  ASSERT_EQ(m->add_lora(read_lora_adapter(dir + "/a", "a", m->file())), 1);
  ASSERT_EQ(m->add_lora(read_lora_adapter(dir + "/b", "b", m->file())), 2);
  // One prompt of 40 tokens (two whole blocks of 16 to share), under adapters 1, none and 2.
  std::vector<int32_t> prompt{1};
  for (int i = 1; i < 40; ++i) prompt.push_back(3 + (i * 37) % 500);
  const int kNew = 12;
  std::vector<std::vector<int32_t>> alone;
  for (int32_t lora : {1, 0, 2}) alone.push_back(greedy_alone(*m, prompt, kNew, lora));
  EXPECT_NE(alone[0], alone[1]);
  EXPECT_NE(alone[2], alone[1]);
  auto request = [&](int32_t lora) {
    Request r;
    r.prompt = prompt;
    r.max_new_tokens = kNew;
    r.stop_at_eog = false;
    r.sampling.temperature = 0;
    r.lora = lora;
    return r;
  };
  EngineConfig cfg;
  cfg.page_size = 16;
  cfg.max_model_len = 128;
  cfg.kv_cache_bytes = m->kv_layout().bytes_per_token() * 16 * 40;
  {
    // One after another: each adapter's prompt computed afresh (its KV is not the others'),
    // then adapter 1 again reuses its own two blocks.
    Engine e(*m, cfg);
    for (size_t i = 0; i < 3; ++i) {
      const int32_t lora = std::vector<int32_t>{1, 0, 2}[i];
      EXPECT_EQ(run_engine(e, {request(lora)})[0], alone[i]) << "adapter " << lora << ", alone in the engine";
      EXPECT_EQ(e.stats().cached_prompt_tokens, 0) << "adapter " << lora << " reused another adapter's KV";
    }
    EXPECT_EQ(run_engine(e, {request(1)})[0], alone[0]);
    EXPECT_EQ(e.stats().cached_prompt_tokens, 32);
  }
  {
    // Together, in one batch per step (prefill and decode rows of three adapters side by side).
    Engine e(*m, cfg);
    const auto together = run_engine(e, {request(1), request(0), request(2), request(1)});
    EXPECT_EQ(together[0], alone[0]);
    EXPECT_EQ(together[1], alone[1]);
    EXPECT_EQ(together[2], alone[2]);
    EXPECT_EQ(together[3], alone[0]);
    Request bad = request(3);
    test::expect_error([&] { e.add_request(bad); }, {"LoRA adapter 3 is not loaded"});
    // Unloading: counted while a request runs with it, refused to new requests afterwards.
    const int64_t id = e.add_request(request(2));
    EXPECT_EQ(e.requests_with_lora(2), 1);
    EXPECT_EQ(e.requests_with_lora(1), 0);
    for (int guard = 0; e.has_work() && guard < 1000; ++guard) e.step();
    EXPECT_EQ(e.sequence(id)->tokens.size(), prompt.size() + kNew);
    EXPECT_EQ(e.requests_with_lora(2), 0);
    m->remove_lora(2);
    EXPECT_FALSE(m->has_lora(2));
    test::expect_error([&] { e.add_request(request(2)); }, {"LoRA adapter 2 is not loaded"});
    test::expect_error([&] { m->remove_lora(2); }, {"LoRA adapter 2 is not loaded"});
    EXPECT_EQ(run_engine(e, {request(1)})[0], alone[0]);  // the others serve on
  }
}

// The ledger names the lora op's kernel: `audit --strict` with an adapter passes on a fast kernel
// (an AVX2 machine) and `logits --lora` writes the adapted logits.
// llama.cpp's Q8_0 adapters (convert_lora_to_gguf.py --outtype q8_0: Q8_0 where rows are whole
// 32-value blocks, F16 elsewhere): read as their dequantized values, they give the logits of an
// F32 GGUF adapter holding those values (the F32 path is PEFT's, Lora.AdaptersMatchPeft), on a
// GGUF base (q/k rows permuted) and a safetensors one; rank 32 quantizes B too, rank 4 leaves it F16.
TEST(Lora, Q8_0GgufAdaptersReadAsTheirValues) {
  const nlohmann::json cases = golden_cases();
  const nlohmann::json& c = golden_case(cases, "hf_llama_gqa");
  const auto ids = cases["tokens"].get<std::vector<int32_t>>();
  const std::string dir = test::temp_dir("lora_q8");
  const std::string hf = test::write_synth_case(c, dir + "/base_hf"), gguf = test::write_synth_case(c, dir + "/base.gguf");
  for (const int64_t rank : {int64_t{32}, int64_t{4}}) {
    const nlohmann::json cfg = {{"r", rank}, {"lora_alpha", 2 * rank},
                                {"target_modules", {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}}};
    const std::string q8 = dir + "/q8_r" + std::to_string(rank) + ".gguf", f32 = dir + "/f32_r" + std::to_string(rank) + ".gguf";
    synth_lora(hf, cfg, 5, q8, DType::Q8_0);
    // The same file with every matrix dequantized to F32.
    auto src = GgufFile::open(q8);
    GgufWriter w;
    w.set_string("general.architecture", src->get_string("general.architecture"));
    w.set_string("general.type", "adapter");
    w.set_string("adapter.type", "lora");
    w.set_f32("adapter.lora.alpha", static_cast<float>(src->get_float("adapter.lora.alpha")));
    int quantized = 0;
    for (const GgufTensorInfo& t : src->tensors()) {
      int64_t n = 1;
      for (int64_t d : t.ne) n *= d;
      std::vector<float> values(static_cast<size_t>(n));
      dequantize_row(t.type, t.data, values.data(), n);
      std::vector<uint8_t> bytes(values.size() * sizeof(float));
      std::memcpy(bytes.data(), values.data(), bytes.size());
      w.add_tensor(t.name, DType::F32, t.ne, std::move(bytes));
      quantized += t.type == DType::Q8_0;
    }
    w.write(f32);
    // Rank 32: every matrix Q8_0 (rows of 64, 96 or 32 values); rank 4: the A's only.
    EXPECT_EQ(quantized, rank == 32 ? 2 * 7 * c["config"]["num_hidden_layers"].get<int>() : 7 * c["config"]["num_hidden_layers"].get<int>());
    for (const std::string& base : {hf, gguf}) {
      auto m = load(base);
      const int32_t a = m->add_lora(read_lora_adapter(q8, "q8", m->file()));
      const int32_t b = m->add_lora(read_lora_adapter(f32, "f32", m->file()));
      const auto with_q8 = logits_under(*m, ids, a), with_f32 = logits_under(*m, ids, b), plain = logits_under(*m, ids, 0);
      EXPECT_LT(test::rel_err(with_q8, with_f32), 1e-6) << base << " rank " << rank;
      EXPECT_GT(test::rel_err(with_q8, plain), 1e-2) << base << " rank " << rank << ": the adapter changes the logits";
    }
  }
}

TEST(Lora, AuditAndLogitsCommandsTakeAnAdapter) {
  const nlohmann::json cases = golden_cases();
  const nlohmann::json& c = golden_case(cases, "hf_llama_gqa");
  const std::string dir = test::temp_dir("lora_cli");
  const std::string path = test::write_synth_case(c, dir + "/m");
  synth_lora(path, c["lora"], c["seed"].get<uint64_t>(), dir + "/a");
  int rc = -1;
  const std::string audit = test::run_command(test::fastpath_bin() + " audit -q -m " + path + " --lora " + dir + "/a", &rc);
  EXPECT_EQ(rc, 0) << audit;
  EXPECT_NE(audit.find("lora "), std::string::npos) << audit;
  if (test::cpu_has_avx2()) {
    EXPECT_EQ(system((test::fastpath_bin() + " audit -q --strict -m " + path + " --lora " + dir + "/a > /dev/null").c_str()), 0);
  }
  std::string ids;
  for (int32_t t : cases["tokens"].get<std::vector<int32_t>>()) ids += std::to_string(t) + " ";
  const std::string out = test::run_command(
      test::fastpath_bin() + " logits -q -m " + path + " --lora " + dir + "/a --tokens '" + ids + "' --out " + dir + "/l.f32", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_LT(test::rel_err(test::read_f32_file(dir + "/l.f32"), test::read_f32_file(kGolden + "hf_llama_gqa.lora_logits.f32")), 1e-4);
}

// rank_pattern / alpha_pattern keys as peft.utils.get_pattern_key reads them: the first key in
// the file's order whose (.*\.)?(key)$ matches the module's whole name.
TEST(Lora, PatternsMatchAsPeftDoes) {
  const std::string q1 = "model.layers.1.self_attn.q_proj";
  auto value = [&](const char* json, const std::string& module) {
    const nlohmann::ordered_json patterns = nlohmann::ordered_json::parse(json);
    const nlohmann::ordered_json* v = lora_pattern_value(patterns, module);
    return v ? v->get<int>() : -1;
  };
  EXPECT_EQ(value(R"({"layers.1.self_attn.q_proj": 8, "q_proj": 4})", q1), 8);
  EXPECT_EQ(value(R"({"q_proj": 4, "layers.1.self_attn.q_proj": 8})", q1), 4);  // the first in the file wins
  EXPECT_EQ(value(R"({"q_proj": 4})", "model.layers.1.self_attn.q_proj_extra"), -1);
  EXPECT_EQ(value(R"({"proj": 4})", q1), -1);  // a whole dotted part, not a suffix of one
  EXPECT_EQ(value(R"({"layers\\.[0-1]\\..*q_proj": 2})", q1), 2);
  EXPECT_EQ(value(R"({"layers\\.[2-9]\\..*q_proj": 2})", q1), -1);
  EXPECT_EQ(value(R"({"(unbalanced": 2})", q1), -1);  // not a regular expression: matches nothing (PEFT raises)
}

// A synthesized adapter directory with its config edited by `edit`.
std::string edited_adapter(const std::string& base, const std::string& out, const std::function<void(nlohmann::json&)>& edit) {
  synth_lora(base, {{"r", 2}, {"lora_alpha", 4}, {"target_modules", {"q_proj"}}}, 3, out);
  std::ifstream in(out + "/adapter_config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  edit(cfg);
  std::ofstream(out + "/adapter_config.json") << cfg.dump();
  return out;
}

TEST(Lora, RefusesWhatItCannotApply) {
  const nlohmann::json cases = golden_cases();
  const std::string dir = test::temp_dir("lora_refusals");
  const std::string path = test::write_synth_case(golden_case(cases, "hf_llama_gqa"), dir + "/m");
  auto m = load(path);
  const ModelFile& f = m->file();
  auto refused = [&](const std::string& adapter, const std::vector<std::string>& needles) {
    test::expect_error([&] { read_lora_adapter(adapter, "x", f); }, needles);
  };
  refused(dir + "/none", {"not a directory"});
  refused(edited_adapter(path, dir + "/ia3", [](nlohmann::json& c) { c["peft_type"] = "IA3"; }), {"adapter_config.json", "IA3"});
  refused(edited_adapter(path, dir + "/dora", [](nlohmann::json& c) { c["use_dora"] = true; }), {"use_dora", "DoRA"});
  refused(edited_adapter(path, dir + "/save", [](nlohmann::json& c) { c["modules_to_save"] = {"lm_head"}; }),
          {"modules_to_save", "lm_head"});
  refused(edited_adapter(path, dir + "/bias", [](nlohmann::json& c) { c["bias"] = "all"; }), {"bias 'all'"});
  refused(edited_adapter(path, dir + "/alpha", [](nlohmann::json& c) { c["lora_alpha"] = "eight"; }), {"lora_alpha", "\"eight\""});
  refused(edited_adapter(path, dir + "/rank", [](nlohmann::json& c) { c["rank_pattern"] = {{"q_proj", 3}}; }),
          {"rank_pattern", "rank 3", "rank 2"});
  std::filesystem::create_directories(dir + "/json");
  test::write_file(dir + "/json/adapter_config.json", "{\"r\": 4,");
  refused(dir + "/json", {"adapter_config.json", "not a JSON object"});
  // Tensors: a pickle only, an lm_head adapter, a lora_A without its lora_B, the wrong width.
  const std::string pickle = edited_adapter(path, dir + "/pickle", [](nlohmann::json&) {});
  std::filesystem::rename(pickle + "/adapter_model.safetensors", pickle + "/adapter_model.bin");
  refused(pickle, {"no adapter_model.safetensors", "pickle"});
  auto with_tensors = [&](const std::string& name, const std::vector<std::pair<std::string, std::vector<int64_t>>>& ts) {
    const std::string d = edited_adapter(path, dir + "/" + name, [](nlohmann::json&) {});
    SafetensorsWriter w;
    for (const auto& [tname, shape] : ts) {
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      w.add(tname, DType::F32, shape, std::vector<uint8_t>(static_cast<size_t>(n) * 4, 0));
    }
    w.write(d + "/adapter_model.safetensors");
    return d;
  };
  const std::string q = "base_model.model.model.layers.0.self_attn.q_proj";
  refused(with_tensors("head", {{"base_model.model.lm_head.lora_A.weight", {2, 64}}, {"base_model.model.lm_head.lora_B.weight", {512, 2}}}),
          {"lm_head", "not one this engine adapts"});
  refused(with_tensors("half", {{q + ".lora_A.weight", {2, 64}}}), {"q_proj", "no lora_B"});
  refused(with_tensors("wide", {{q + ".lora_A.weight", {2, 96}}, {q + ".lora_B.weight", {64, 2}}}), {"lora_A", "[2, 96]", "[rank, 64]"});
  refused(with_tensors("tall", {{q + ".lora_A.weight", {2, 64}}, {q + ".lora_B.weight", {32, 2}}}), {"lora_B", "[32, 2]", "[64, 2]"});
  refused(with_tensors("deep", {{"base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight", {2, 64}},
                                {"base_model.model.model.layers.9.self_attn.q_proj.lora_B.weight", {64, 2}}}),
          {"layer 9", "2 layers"});
  refused(with_tensors("embed", {{"base_model.model.model.embed_tokens.lora_embedding_A", {2, 512}}}), {"embeddings"});
  // llama.cpp's GGUF adapters: a model file is not one, nor is an adapter for another architecture.
  const std::string gguf_model = test::write_synth_case(golden_case(cases, "hf_llama_gqa"), dir + "/m.gguf");
  refused(gguf_model, {"general.type", "not 'adapter'"});
  const std::string qwen = test::write_synth_case(golden_case(cases, "hf_qwen2"), dir + "/qwen");
  synth_lora(qwen, {{"r", 2}, {"lora_alpha", 4}, {"target_modules", {"q_proj"}}}, 4, dir + "/qwen_lora.gguf");
  refused(dir + "/qwen_lora.gguf", {"architecture 'qwen2'", "the model is 'llama'"});
  // The one-sequence forward's adapter must be loaded; architectures without adapters refuse by name.
  test::expect_error([&] { m->set_single_lora(1); }, {"LoRA adapter 1 is not loaded"});
  const LoraAdapterWeights w = read_lora_adapter(edited_adapter(path, dir + "/ok", [](nlohmann::json&) {}), "ok", f);
  const std::string mla = test::write_synth_case(golden_case(cases, "hf_deepseek_v2"), dir + "/mla");
  test::expect_error([&] { load(mla)->add_lora(w); }, {"deepseek2", "does not take LoRA adapters"});
  // Read for one model, added to another: refused by the shapes, naming both.
  const std::string moe = test::write_synth_case(golden_case(cases, "hf_qwen3_moe"), dir + "/moe");
  auto mm = load(moe);
  test::expect_error([&] { mm->add_lora(w); }, {"was read for another model", "q_proj", moe});
  // The experts' FFN takes no adapter: an mlp.gate_proj on a sparse layer is refused.
  synth_lora(moe, {{"r", 2}, {"lora_alpha", 4}, {"target_modules", {"gate_proj"}}}, 5, dir + "/moe_ffn");
  test::expect_error([&] { mm->add_lora(read_lora_adapter(dir + "/moe_ffn", "x", mm->file())); }, {"mixture of experts"});
}

}  // namespace
}  // namespace fp
