// tools/common.h — options shared by the subcommands (model path, threads, kernel overrides,
// logging) and the subcommand registration functions.
#pragma once
#include <CLI/CLI.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"

namespace fp::tools {

struct CommonOptions {
  std::string model;
  std::string tokenizer;           // llama2.c tokenizer.bin
  int threads = 0;                 // 0: all cores
  std::vector<std::string> kernels;  // op=name
  bool profile = false;
  bool quiet = false;
  bool no_mmap = false;            // copy the weights (default: copied when they fit, resolve_weight_memory)
  bool mmap = false;               // map the file
  bool no_repack = false;          // keep Q8_0 weights as in the file (model/repack.h)
  int tensor_parallel = 1;         // ranks the attention heads (and FFN widths) are split across (mpirun -np N)
  int expert_parallel = 1;         // ranks the routed experts are partitioned across (MoE models)
  int context_parallel = 1;        // ranks a prefill batch's tokens are cut across (llama family)
  int ranks() const { return std::max({tensor_parallel, expert_parallel, context_parallel}); }
  bool data_parallel_attention = false;  // MLA attention per rank's own sequences (with --expert-parallel-size)
  int64_t micro_batch_overlap = 0;  // steps of at least this many tokens split in two overlapped micro-batches
  std::string device = "cpu";      // where the model runs: cpu or cuda
  bool no_cuda_graphs = false;
  std::string parallel_plan;       // hardware/*.json: the planner picks the parallel sizes (parallel/layout_choice.h)
  int plan_concurrency = 16;       // the decode concurrency it plans for
  bool mtp = false;                // load the multi-token-prediction layer (set from --speculative-method mtp)
  std::vector<std::string> lora;   // --lora [NAME=]PATH: PEFT LoRA adapters, ids 1, 2, ... in this order
  bool lora_per_request = false;   // serve: requests pick an adapter by name; else the first runs the one-sequence forwards
};

// One --lora value: NAME=PATH, or PATH (named after its last path component).
struct LoraSpec {
  std::string name, path;
};
LoraSpec parse_lora_spec(const std::string& text);

// A JSON file, parsed; errors name the file.
nlohmann::json read_json_file(const std::string& path);

// Adds -m, --tokenizer, -t, --kernel, --profile, -q, --mmap, --no-mmap, --no-repack, --tensor-parallel-size,
// --expert-parallel-size, --prefill-context-parallel-size, --device to a subcommand.
void add_common(CLI::App* app, CommonOptions& o, bool model_required);
// Adds --lora: one adapter that every sequence runs with, or (per_request: serve) several that
// requests choose by name.
void add_lora_option(CLI::App* app, CommonOptions& o, bool per_request);
// bench: several adapters, the engine's requests cycling through them (the one-sequence runs use the first).
void add_lora_cycle_option(CLI::App* app, CommonOptions& o);
// Opens the ranks (the larger of --tensor-parallel-size and --expert-parallel-size; MPI when more than one), applies threads / kernel
// overrides / log level, then loads this rank's part of the model (default model when -m is empty).
// max_model_len: the engine's --max-model-len (0: the model's context), for what depends on it at
// load (LongRoPE's factor set). Adds the --lora adapters (every rank); with one and not per
// request, the one-sequence forwards run with it (Model::set_single_lora).
std::unique_ptr<Model> load_with(const CommonOptions& o, int64_t max_model_len = 0);
void apply_runtime(const CommonOptions& o);
// Rank 0 of a parallel run, or the only process: the one that writes files and output.
bool is_output_rank();

void add_generate(CLI::App& app);
void add_tokenize(CLI::App& app);
void add_logits(CLI::App& app);
void add_embed(CLI::App& app);
void add_inspect(CLI::App& app);
void add_synth(CLI::App& app);
void add_bench(CLI::App& app);
void add_audit(CLI::App& app);
void add_bench_serve(CLI::App& app);
void add_serve(CLI::App& app);
void add_plan(CLI::App& app);
void add_bench_comm(CLI::App& app);

}  // namespace fp::tools
