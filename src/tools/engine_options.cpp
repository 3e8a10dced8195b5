// tools/engine_options.cpp — engine flags to EngineConfig.
#include "tools/engine_options.h"

#include <map>

#include "core/error.h"
#include "model/model.h"

namespace fp::tools {

void add_engine_options(CLI::App* app, EngineOptions& o) {
  app->add_option("--page-size", o.page_size, "KV cache page size in tokens (1, 8, 16, 32, 64, 128 or 256)");
  app->add_option("--kv-cache-dtype", o.kv_cache_dtype,
                  "KV cache element type: auto, f32, f16 or bf16; auto follows the weights: f32 for F32 weights, bf16 for "
                  "BF16, f16 otherwise (F16, quantized); f16/bf16 fit twice the tokens of f32 in the same memory")
      ->capture_default_str();
  app->add_option("--kv-cache-memory", o.kv_cache_memory, "KV cache budget, e.g. 4GiB (default: a fraction of free RAM)");
  app->add_option("--kv-cache-fraction,--gpu-memory-utilization", o.kv_cache_fraction,
                  "fraction of free memory for the KV cache when --kv-cache-memory is not given (host MemAvailable; on --device cuda the GPU's free memory after the weights)")
      ->check(CLI::Range(0.001, 0.95));
  app->add_option("--max-model-len", o.max_model_len, "longest sequence (prompt + output) in tokens (default: the model's context)");
  app->add_option("--max-num-batched-tokens", o.max_num_batched_tokens, "token budget of one engine step")->check(CLI::Range(1, 1 << 24));
  app->add_option("--max-num-seqs", o.max_num_seqs, "most sequences in one engine step")->check(CLI::Range(1, 1 << 20));
  app->add_flag("--no-prefix-caching", o.no_prefix_caching, "do not reuse the KV of shared prompt prefixes");
  app->add_flag("--no-window-trim", o.no_window_trim,
                "keep every position's KV in the sliding-window layers (Gemma, gpt-oss, Mistral, Phi-3) instead of giving "
                "blocks back once they slide out of the window");
  app->add_flag("--no-chunked-prefill", o.no_chunked_prefill, "run each prompt in one step instead of chunks mixed with decodes");
  app->add_flag("--no-shared-prefix-wait", o.no_shared_prefix_wait,
                "admit a prompt at once even when a running request is still computing the same prefix (by default it "
                "waits for those blocks and takes them from the prefix cache, so n choices compute their prompt once)");
  app->add_option("--scheduling-policy", o.scheduling_policy,
                  "which waiting request runs first: fcfs (arrival order) or priority (a request's 'priority', lower "
                  "first, then arrival; a request that does not fit preempts running ones of a lower priority)")
      ->check(CLI::IsMember({"fcfs", "priority"}))
      ->capture_default_str();
  app->add_option("--async-scheduling", o.async_scheduling,
                  "schedule and launch the next step while the model runs this one: auto (on for --device cuda, off on "
                  "the CPU and across ranks), on or off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app->add_option("--speculative-tokens", o.speculative.num_tokens,
                  "speculative decoding: draft up to this many tokens per step and verify them in one forward (0: off; "
                  "with --speculative-method mtp the default is 1)")
      ->check(CLI::Range(0, 64));
  app->add_option_function<std::string>(
         "--speculative-method",
         [&o](const std::string& m) {
           o.speculative.method = m == "mtp" ? DraftMethod::Mtp : DraftMethod::Ngram;
           if (m == "mtp" && o.speculative.num_tokens == 0) o.speculative.num_tokens = 1;
         },
         "where drafts come from: ngram (prompt lookup: an earlier occurrence of the sequence's last n-gram) or mtp "
         "(the model's own multi-token-prediction layer: DeepSeek-V3, GLM-4.5; on the CPU)")
      ->check(CLI::IsMember({"ngram", "mtp"}));
  app->add_option("--prompt-lookup-min", o.speculative.ngram_min, "shortest n-gram the draft lookup matches")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app->add_option("--prompt-lookup-max", o.speculative.ngram_max, "longest n-gram the draft lookup matches (tried first)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
}

EngineConfig engine_config(const EngineOptions& o, const Model& model) {
  EngineConfig c;
  c.page_size = o.page_size;
  c.kv_dtype = kv_cache_dtype(o.kv_cache_dtype, model);
  c.kv_cache_bytes = o.kv_cache_memory.empty() ? 0 : parse_bytes(o.kv_cache_memory);
  c.kv_cache_fraction = o.kv_cache_fraction;
  c.max_model_len = o.max_model_len;
  c.prefix_caching = !o.no_prefix_caching;
  c.window_trim = !o.no_window_trim;
  c.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  c.scheduler.max_num_seqs = o.max_num_seqs;
  c.scheduler.chunked_prefill = !o.no_chunked_prefill;
  c.scheduler.wait_for_shared_prefix = !o.no_shared_prefix_wait;
  c.scheduler.policy = o.scheduling_policy == "priority" ? SchedulingPolicy::Priority : SchedulingPolicy::Fcfs;
  c.async_scheduling = o.async_scheduling == "on"    ? AsyncScheduling::On
                       : o.async_scheduling == "off" ? AsyncScheduling::Off
                                                     : AsyncScheduling::Auto;
  c.speculative = o.speculative;
  return c;
}

DType kv_cache_dtype(const std::string& name, const Model& model) {
  DType t;
  FP_CHECK(kv_dtype_from_name(name, &t, auto_kv_dtype(model)), "--kv-cache-dtype ", name, " is not one of auto, ",
           kv_dtypes_text());
  return t;
}

DType auto_kv_dtype(const Model& model) {
  std::map<DType, int64_t> bytes;  // the weight matrices' bytes by type
  for (const auto& [name, t] : model.file().tensors)
    if (t.ndim >= 2) bytes[t.dtype] += t.nbytes();
  DType most = DType::F32;
  int64_t most_bytes = -1;
  for (const auto& [type, b] : bytes)
    if (b > most_bytes) most = type, most_bytes = b;
  return most == DType::F32 ? DType::F32 : most == DType::BF16 ? DType::BF16 : DType::F16;
}

}  // namespace fp::tools
