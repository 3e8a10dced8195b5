// tools/cmd_audit.cpp — `fastpath audit`: a short prefill + decode, then the fast-path ledger:
// which kernel ran for every op and shape class, what was refused and why. --strict fails on
// any fallback.
#include <cstdio>
#include <iostream>
#include <random>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/ledger.h"
#include "tools/common.h"
#include "tools/engine_options.h"

namespace fp::tools {

void add_audit(CLI::App& app) {
  struct Opts {
    CommonOptions common;
    int prompt = 16, gen = 8;
    bool strict = false, json = false;
    std::string kv_dtype = "auto";
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("audit", "run a short prefill + decode and print the fast-path ledger");
  add_common(cmd, o->common, false);
  add_lora_option(cmd, o->common, false);  // the adapter's lora op in the ledger
  cmd->add_option("-p,--n-prompt", o->prompt, "prompt tokens")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("-n,--n-gen", o->gen, "decode steps")->check(CLI::Range(0, 1 << 16));
  cmd->add_flag("--strict", o->strict, "exit with status 3 if any op fell back to a reference kernel");
  cmd->add_flag("--json", o->json, "print the ledger as JSON");
  cmd->add_option("--kv-cache-dtype", o->kv_dtype, "KV cache element type: auto (follows the weights: f32 for F32, bf16 for BF16, else f16), f32, f16 or bf16")->capture_default_str();
  cmd->callback([o] {
    auto model = load_with(o->common);
    const DType kv_dtype = kv_cache_dtype(o->kv_dtype, *model);
    const ModelConfig& c = model->config();
    int total = std::min<int>(o->prompt + o->gen, static_cast<int>(c.max_context));
    int prompt = std::min(o->prompt, total);
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.n_vocab - 1));
    std::vector<int32_t> ids(static_cast<size_t>(prompt)), pos(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = tok(rng), pos[i] = static_cast<int32_t>(i);
    auto cache = model->new_cache(total, 0, kv_dtype);
    std::vector<float> logits(static_cast<size_t>(c.n_vocab));
    model->forward(ids.data(), pos.data(), prompt, *cache, logits.data(), false);
    for (int p = prompt; p < total; ++p) {
      int32_t id = tok(rng);
      model->forward(&id, &p, 1, *cache, logits.data(), false);
    }
    Ledger& l = Ledger::global();
    auto fallbacks = l.fallbacks();
    if (o->json) {
      std::cout << l.json() << "\n";
    } else {
      const ParallelSizes ps = model->parallel();
      const std::string tp = model->tp_size() > 1 ? ", split over " + std::to_string(model->tp_size()) + " ranks (tensor parallel " +
                                                       std::to_string(ps.tp) + ", expert parallel " + std::to_string(ps.ep) + "; " +
                                                       model->tensor_parallel()->backend() + "; rank 0's ledger)"
                                                 : "";
      std::printf("model: %s (%s)\ncpu:   %s; features: %s\nrun:   prefill %d tokens, decode %d steps, KV cache %s%s%s\n\n",
                  model->file().path.c_str(), c.arch.c_str(), cpu_features().brand.c_str(), cpu_features().describe().c_str(),
                  prompt, total - prompt, dtype_name(kv_dtype), l.profiling() ? " (profiled)" : "", tp.c_str());
      std::cout << l.table() << "\n" << l.summary_line() << "\n";
      for (auto& f : fallbacks) std::printf("FALLBACK: %s\n", f.c_str());
    }
    if (o->strict && !fallbacks.empty()) {
      log_error("audit --strict: ", fallbacks.size(), " op(s) fell back to a reference kernel");
      throw CLI::RuntimeError(3);
    }
  });
}

}  // namespace fp::tools
