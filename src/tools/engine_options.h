// tools/engine_options.h — the serving-engine flags shared by `generate --batch-file`, `bench
// --requests` and `serve`: page size, KV budget, max model length, batching limits.
#pragma once
#include <CLI/CLI.hpp>

#include <string>

#include "engine/engine.h"

namespace fp::tools {

struct EngineOptions {
  int64_t page_size = 16;
  std::string kv_cache_memory;     // "8GiB"; empty: kv_cache_fraction of MemAvailable
  double kv_cache_fraction = 0.25;
  int64_t max_model_len = 0;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 256;
  bool no_prefix_caching = false;
  bool no_chunked_prefill = false;
};

void add_engine_options(CLI::App* app, EngineOptions& o);
EngineConfig engine_config(const EngineOptions& o);

}  // namespace fp::tools
