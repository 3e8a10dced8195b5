// tools/cmd_synth.cpp — `fastpath synth`: a random-weight model of any shape, for tests and benchmarks.
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "model/lora.h"
#include "model/synth.h"
#include "tools/common.h"

namespace fp::tools {

void add_synth(CLI::App& app) {
  struct Opts {
    std::string arch = "llama", config = "{}", out, type = "f32", tokenizer, lora_out, lora_config = "{}", lora_type = "f32";
    uint64_t seed = 1;
    bool split_kv_b = false, stream = false, fast_fill = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("synth", "write a model with random weights: FILE.gguf, or a safetensors directory");
  cmd->add_option("--arch", o->arch, "architecture: llama, qwen2, qwen3, gemma3, qwen3_moe, deepseek_v2, deepseek_v3, glm4_moe, gpt_oss");
  cmd->add_flag("--stream", o->stream, "GGUF: write tensor by tensor (automatic for models above 2^28 parameters)");
  cmd->add_flag("--split-kv-b", o->split_kv_b, "deepseek GGUF: write attn_k_b/attn_v_b (newer llama.cpp form) instead of attn_kv_b");
  cmd->add_option("--config", o->config, "Hugging Face config.json keys as inline JSON, or a path to a JSON file");
  cmd->add_option("--out", o->out, "output: a path ending in .gguf, or a directory (config.json + model.safetensors)")->required();
  cmd->add_option("--type", o->type, "matrix type: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k iq4_nl iq4_xs (GGUF), fp8 (safetensors, 128x128 block scales), mxfp4 (gpt_oss experts)");
  cmd->add_option("--seed", o->seed, "random seed");
  cmd->add_flag("--fast-fill", o->fast_fill, "draw the random values in parallel (counter-based; other values than the default stream) for large benchmark models");
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json to copy into a safetensors directory");
  cmd->add_option("--lora-out", o->lora_out, "also write a PEFT LoRA adapter with random matrices for the model to this directory");
  cmd->add_option("--lora-config", o->lora_config,
                  "the adapter's adapter_config.json keys as inline JSON (r, lora_alpha, target_modules, use_rslora, "
                  "rank_pattern, alpha_pattern)");
  cmd->add_option("--lora-type", o->lora_type, "the adapter's matrix type: f32, f16 or bf16 (q8_0 for a .gguf adapter)");
  cmd->callback([o] {
    SynthOptions so;
    so.arch = o->arch;
    so.out = o->out;
    so.seed = o->seed;
    so.tokenizer_json = o->tokenizer;
    so.split_kv_b = o->split_kv_b;
    so.stream = o->stream;
    so.fast_fill = o->fast_fill;
    FP_CHECK(dtype_from_name(o->type, &so.type), "--type '", o->type, "' is not a known tensor type");
    std::string text = o->config;
    if (!text.empty() && text[0] != '{' && file_exists(text)) {
      std::ifstream in(text);
      std::stringstream ss;
      ss << in.rdbuf();
      text = ss.str();
    }
    so.config = nlohmann::json::parse(text, nullptr, false);
    FP_CHECK(!so.config.is_discarded() && so.config.is_object(), "--config: not a JSON object: ", o->config);
    log_info(synth_model(so));
    if (!o->lora_out.empty()) {
      const nlohmann::json lc = nlohmann::json::parse(o->lora_config, nullptr, false);
      FP_CHECK(!lc.is_discarded() && lc.is_object(), "--lora-config: not a JSON object: ", o->lora_config);
      DType lora_type = DType::F32;
      FP_CHECK(dtype_from_name(o->lora_type, &lora_type), "--lora-type '", o->lora_type, "' is not a known tensor type");
      log_info(synth_lora(o->out, lc, o->seed, o->lora_out, lora_type));
    }
  });
}

}  // namespace fp::tools
