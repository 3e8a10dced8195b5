// tools/common.cpp — shared option handling.
#include "tools/common.h"

#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "core/thread_pool.h"
#include "kernels/ledger.h"
#include "kernels/registry.h"

namespace fp::tools {

void add_common(CLI::App* app, CommonOptions& o, bool model_required) {
  auto* m = app->add_option("-m,--model", o.model, "model: a .gguf file, a llama2.c .bin, or a Hugging Face directory");
  if (model_required) m->required();
  app->add_option("--tokenizer", o.tokenizer, "tokenizer.bin for a llama2.c checkpoint (default: found beside it)");
  app->add_option("-t,--threads", o.threads, "worker threads (default: all cores)");
  app->add_option("--kernel", o.kernels, "force a kernel for an op, op=name (repeatable); a forced kernel that cannot run is an error");
  app->add_flag("--profile", o.profile, "time every kernel call for the ledger");
  app->add_flag("-q,--quiet", o.quiet, "only errors on stderr");
  app->add_flag("--no-mmap", o.no_mmap, "copy the weights into (huge-page) anonymous memory instead of mapping the file");
}

void apply_runtime(const CommonOptions& o) {
  if (o.quiet) set_log_level(LogLevel::Error);
  set_num_threads(o.threads);
  for (const auto& kv : o.kernels) {
    auto eq = kv.find('=');
    FP_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < kv.size(), "--kernel '", kv, "': expected op=name");
    KernelOverrides::global().force(kv.substr(0, eq), kv.substr(eq + 1));
  }
  Ledger::global().set_profiling(o.profile);
}

std::unique_ptr<Model> load_with(const CommonOptions& o) {
  apply_runtime(o);
  LoadOptions lo;
  lo.tokenizer_path = o.tokenizer;
  lo.use_mmap = !o.no_mmap;
  std::string path = o.model.empty() ? default_model_path() : o.model;
  return load_model(path, lo);
}

}  // namespace fp::tools
