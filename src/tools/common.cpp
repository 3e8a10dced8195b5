// tools/common.cpp — shared option handling.
#include "tools/common.h"

#include <fcntl.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <unistd.h>

#include "core/cpu_affinity.h"
#include "core/error.h"
#include "core/log.h"
#include "core/paths.h"
#include "core/thread_pool.h"
#include "kernels/ledger.h"
#include "kernels/registry.h"
#include "model/lora.h"
#include "model/plan_model.h"
#include "parallel/communicator.h"
#include "parallel/layout_choice.h"

namespace fp::tools {

LoraSpec parse_lora_spec(const std::string& text) {
  const size_t eq = text.find('=');
  LoraSpec spec;
  if (eq != std::string::npos && eq > 0 && text.substr(0, eq).find('/') == std::string::npos) {
    spec.name = text.substr(0, eq);
    spec.path = text.substr(eq + 1);
  } else {
    spec.path = text;
    std::string p = text;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const size_t slash = p.rfind('/');
    spec.name = slash == std::string::npos ? p : p.substr(slash + 1);
  }
  FP_CHECK(!spec.name.empty() && !spec.path.empty(), "--lora '", text, "': expected NAME=PATH or PATH");
  FP_CHECK(spec.name.find_first_of("\"\\\n") == std::string::npos, "--lora '", text,
           "': the name must not hold quotes, backslashes or newlines");
  return spec;
}

void add_lora_option(CLI::App* app, CommonOptions& o, bool per_request) {
  o.lora_per_request = per_request;
  auto* opt = app->add_option("--lora,--lora-modules", o.lora,
                              per_request ? "a PEFT LoRA adapter as NAME=PATH (repeatable): requests whose \"model\" is NAME run "
                                            "with it, the others with the base model"
                                          : "a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors) "
                                            "to run with");
  if (!per_request) opt->expected(1);
}

void add_lora_cycle_option(CLI::App* app, CommonOptions& o) {
  app->add_option("--lora", o.lora,
                  "PEFT or GGUF LoRA adapters (repeatable): the one-sequence runs use the first; --requests cycle "
                  "through them, request i with adapter i mod N (several adapters in every step)");
}

void add_common(CLI::App* app, CommonOptions& o, bool model_required) {
  auto* m = app->add_option("-m,--model", o.model, "model: a .gguf file, a llama2.c .bin, or a Hugging Face directory");
  if (model_required) m->required();
  app->add_option("--tokenizer", o.tokenizer, "tokenizer.bin for a llama2.c checkpoint (default: found beside it)");
  app->add_option("-t,--threads", o.threads, "worker threads (default: all cores)");
  app->add_option("--kernel", o.kernels, "force a kernel for an op, op=name (repeatable); a forced kernel that cannot run is an error");
  app->add_flag("--profile", o.profile, "time every kernel call for the ledger");
  app->add_flag("-q,--quiet", o.quiet, "only errors on stderr");
  auto* copy = app->add_flag("--no-mmap", o.no_mmap,
                             "copy the weights into (huge-page) anonymous memory (the default when they take at most half "
                             "of the available memory, on one CPU rank)");
  app->add_flag("--mmap", o.mmap, "map the weights from the file instead of copying them (less memory, slower decode)")
      ->excludes(copy);
  app->add_flag("--no-repack", o.no_repack,
                "keep Q8_0, Q4_K, Q6_K, Q3_K, Q2_K, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS and MXFP4 matmul weights in the file's layout instead of repacking them at load into their _X8 forms (the CPU kernels' interleaved layouts)");
  app->add_option("--tensor-parallel-size,--tp", o.tensor_parallel,
                  "split the model across this many ranks (launch as mpirun -np N; needs a build with MPI)")
      ->check(CLI::Range(1, 1 << 16));
  app->add_option("--expert-parallel-size,--ep", o.expert_parallel,
                  "partition a MoE model's routed experts across this many ranks (mpirun -np N); attention is split too "
                  "with --tensor-parallel-size N, else replicated")
      ->check(CLI::Range(1, 1 << 16));
  app->add_option("--prefill-context-parallel-size,--pcp", o.context_parallel,
                  "cut each prefill batch's tokens across this many ranks (mpirun -np N; CPU); decode "
                  "keeps the --tensor-parallel-size layout")
      ->check(CLI::Range(1, 1 << 16));
  app->add_flag("--data-parallel-attention", o.data_parallel_attention,
                "with --expert-parallel-size N on a DeepSeek (MLA) model: each rank attends only its own sequences "
                "and keeps only their latent KV rows; the expert layers see every token");
  app->add_option("--micro-batch-overlap", o.micro_batch_overlap,
                  "split model steps of at least this many tokens into two micro-batches, so that one's "
                  "collectives overlap the other's compute (--tensor-parallel-size, or the MoE models' "
                  "--expert-parallel-size, with or without --data-parallel-attention; 0: off)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app->add_option("--device", o.device, "where the model runs: cpu or cuda (weights, KV cache and every op on the GPU)")
      ->capture_default_str();
  app->add_flag("--no-cuda-graphs", o.no_cuda_graphs, "on --device cuda, run every decode step eagerly instead of replaying recorded CUDA graphs");
  auto* plan = app->add_option("--parallel-plan", o.parallel_plan,
                               "choose the parallel sizes with the planner for this machine description (hardware/*.json, "
                               "its devices taken as the ranks): the best decode layout this runtime runs, then the best "
                               "prefill layout with it (instead of --tp / --ep / --pcp / --data-parallel-attention)");
  app->add_option("--plan-concurrency", o.plan_concurrency, "the decode concurrency --parallel-plan plans for")
      ->check(CLI::Range(1, 1 << 20))
      ->needs(plan);
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  FP_CHECK(in, path, ": cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail(path, ": not valid JSON (", e.what(), ")");
  }
}

namespace {

// --parallel-plan: the planner's layout for this model on the described machine, with as many
// devices as ranks were launched, turned into the parallel sizes (parallel/layout_choice.h).
void apply_parallel_plan(CommonOptions& o, const std::string& model_path) {
  FP_CHECK(o.tensor_parallel == 1 && o.expert_parallel == 1 && o.context_parallel == 1 && !o.data_parallel_attention,
           "--parallel-plan chooses the parallel sizes itself: give it without --tensor-parallel-size, "
           "--expert-parallel-size, --prefill-context-parallel-size and --data-parallel-attention");
  const int ranks = launched_world_size();
  const PlanModel m = plan_model_from_file(model_path);
  PlanHardware hw = hardware_from_json(read_json_file(o.parallel_plan), o.parallel_plan);
  const int described = hw.devices;
  hw.devices = ranks;  // the ranks launched, each one device as the file describes it
  PlanWorkload w;
  w.concurrency = {o.plan_concurrency};
  const std::vector<LayoutPlan> plans = plan_layouts(m, hw, w);
  const LayoutChoice c = choose_runtime_layout(plans, ranks, m.moe(), m.mla(), 0);
  o.tensor_parallel = c.tp;
  o.expert_parallel = c.ep;
  o.context_parallel = c.cp;
  o.data_parallel_attention = c.dp_attention;
  if (launched_rank() == 0 && !o.quiet)
    log_info("parallel plan for ", ranks, " rank(s) of ", hw.name, described != ranks ? " (the file describes " +
             std::to_string(described) + " devices)" : std::string(), ", ", w.input_len, " in / ", w.output_len,
             " out at concurrency ", o.plan_concurrency, ": ", c.why);
}

}  // namespace

bool is_output_rank() {
  const Communicator* w = current_world();
  return w ? w->rank() == 0 : launched_rank() == 0;
}

namespace {

// How many ranks of this machine (this one included) may run on CPUs this rank's mask holds:
// the ranks' hosts and masks exchanged over the world (a setup step, outside the ledger).
int ranks_sharing_my_cpus() {
  Communicator* w = current_world();
  if (!w || w->size() <= 1) return 1;
  struct Mine {
    char host[64] = {};
    CpuSet cpus;
  } mine;
  ::gethostname(mine.host, sizeof mine.host - 1);
  mine.cpus = thread_cpus();
  std::vector<Mine> all(static_cast<size_t>(w->size()));
  w->all_gather(&mine, all.data(), static_cast<int64_t>(sizeof mine));
  int sharing = 0;
  for (const Mine& r : all) {
    if (std::strncmp(r.host, mine.host, sizeof mine.host) != 0) continue;
    bool overlap = false;
    for (int i = 0; i < CpuSet::kWords && !overlap; ++i) overlap = (r.cpus.words[i] & mine.cpus.words[i]) != 0;
    sharing += overlap;
  }
  return std::max(1, sharing);
}

}  // namespace

void apply_runtime(const CommonOptions& o) {
  if (o.quiet) set_log_level(LogLevel::Error);
  if (!is_output_rank()) {
    // Rank 0 alone writes output: the others keep only errors on stderr, and nothing on stdout.
    set_log_level(LogLevel::Error);
    const int null_fd = ::open("/dev/null", O_WRONLY);
    if (null_fd >= 0) {
      std::fflush(stdout);
      ::dup2(null_fd, STDOUT_FILENO);
      ::close(null_fd);
    }
  }
  std::vector<std::string> why;
  set_num_threads(threads_for_rank(o.threads, launched_local_size(), ranks_sharing_my_cpus(), thread_cpus(), online_cpus(),
                                   &why));
  for (const std::string& w : why) log_warn(w);
  for (const auto& kv : o.kernels) {
    auto eq = kv.find('=');
    FP_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < kv.size(), "--kernel '", kv, "': expected op=name");
    KernelOverrides::global().force(kv.substr(0, eq), kv.substr(eq + 1));
  }
  Ledger::global().set_profiling(o.profile);
}

std::unique_ptr<Model> load_with(const CommonOptions& options, int64_t max_model_len) {
  CommonOptions o = options;
  std::string path = o.model.empty() ? default_model_path() : o.model;
  if (!o.parallel_plan.empty()) apply_parallel_plan(o, path);
  FP_CHECK(!o.data_parallel_attention || o.expert_parallel > 1,
           "--data-parallel-attention splits the attention by sequences beside --expert-parallel-size N (N > 1, "
           "under mpirun -np N); it was given without it");
  std::shared_ptr<Communicator> world = open_world(o.ranks(), o.ranks() == o.tensor_parallel   ? "--tensor-parallel-size"
                                                               : o.ranks() == o.expert_parallel ? "--expert-parallel-size"
                                                                                                : "--prefill-context-parallel-size");
  apply_runtime(o);
  LoadOptions lo;
  lo.tokenizer_path = o.tokenizer;
  lo.weights = o.mmap ? WeightMemory::Mapped : o.no_mmap ? WeightMemory::Copied : WeightMemory::Auto;
  FP_CHECK(device_from_name(o.device, &lo.device), "--device '", o.device, "': expected cpu or cuda");
  lo.device_graphs = !o.no_cuda_graphs;
  lo.repack = !o.no_repack;
  lo.parallel = ParallelSizes{o.tensor_parallel, o.expert_parallel, o.context_parallel,
                              o.data_parallel_attention ? o.ranks() : 1};
  lo.micro_batch_overlap = o.micro_batch_overlap;
  lo.mtp = o.mtp;
  lo.max_model_len = max_model_len;
  // Split across ranks, each touches only the pages of its slices (prefaulting would read all).
  if (world->size() > 1) lo.prefault = false;
  // GPU ranks talk through NCCL (bootstrapped over the MPI world); CPU ranks through MPI.
  std::shared_ptr<Communicator> comm = world;
  if (world->size() > 1 && lo.device != Device::CPU) comm = open_device_communicator(device_name(lo.device), world);
  auto model = load_model(path, lo, world->size() > 1 ? comm : nullptr);
  std::vector<std::string> names;
  for (const std::string& text : o.lora) {
    const LoraSpec spec = parse_lora_spec(text);
    FP_CHECK(std::find(names.begin(), names.end(), spec.name) == names.end(), "--lora: two adapters are named '", spec.name, "'");
    names.push_back(spec.name);
    const int32_t id = model->add_lora(read_lora_adapter(spec.path, spec.name, model->file()));
    log_info("LoRA adapter '", spec.name, "' (", spec.path, "): id ", id);
  }
  if (!o.lora_per_request && model->n_loras() >= 1) model->set_single_lora(1);
  if (world->size() > 1)
    log_info("parallel: rank ", world->rank(), " of ", world->size(), " (", comm->backend(), "), tensor parallel ",
             model->parallel().tp, ", expert parallel ", model->parallel().ep, ", prefill context parallel ",
             model->parallel().cp, ", ", thread_pool().size(), " threads per rank");
  return model;
}

}  // namespace fp::tools
