// tools/engine_options.h — the serving-engine flags shared by `generate --batch-file`, `bench
// --requests` and `serve`: page size, KV dtype and budget, max model length, batching limits.
// (`generate` and `bench` also use --kv-cache-dtype for their one-sequence runs.)
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "engine/engine.h"

namespace fp::tools {

struct EngineOptions {
  int64_t page_size = 16;
  std::string kv_cache_dtype = "auto";  // auto, f32, f16, bf16
  std::string kv_cache_memory;     // "8GiB"; empty: kv_cache_fraction of MemAvailable
  double kv_cache_fraction = 0.25;
  int64_t max_model_len = 0;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 256;
  bool no_prefix_caching = false;
  bool no_window_trim = false;
  bool no_chunked_prefill = false;
  bool no_shared_prefix_wait = false;
  std::string scheduling_policy = "fcfs";
  std::string async_scheduling = "auto";  // auto, on, off
  SpeculativeConfig speculative;          // --speculative-tokens, --speculative-method, --prompt-lookup-min/max
};

void add_engine_options(CLI::App* app, EngineOptions& o);
EngineConfig engine_config(const EngineOptions& o, const Model& model);
// The dtype --kv-cache-dtype names for this model; fails naming the value when it is not
// auto/f32/f16/bf16. auto follows the weights, as llama.cpp's F16 cache and vLLM's "model dtype"
// do: F32 for a model whose weights are mostly F32, BF16 for BF16, F16 for everything else (F16,
// quantized, FP8): half the bytes per token, so twice the tokens in the same memory and half the
// reads per decode step.
DType kv_cache_dtype(const std::string& name, const Model& model);
DType auto_kv_dtype(const Model& model);

}  // namespace fp::tools
