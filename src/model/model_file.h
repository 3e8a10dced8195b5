// model/model_file.h — a model as loaded from disk, whatever the format: its config, its
// tensors under canonical GGUF-style names ("blk.0.attn_q.weight"), its tokenizer, and what
// the loader understood. Tensors are zero-copy views into memory-mapped files.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/device.h"
#include "core/tensor.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace fp {

// How a model is split across the ranks of its communicator (--tensor-parallel-size,
// --expert-parallel-size). Each is 1 or the number of ranks; 0 means "not said": a model built
// with a communicator of N ranks and neither set is tensor parallel over N (the dense default).
//   tp = N: attention heads split across the ranks (Megatron), and, for MoE models without
//           expert parallelism, every expert's FFN width too.
//   ep = N: the routed experts partitioned across the ranks (each holds E/N whole experts);
//           attention is split when tp = N too, else replicated on every rank.
//   cp = N: prefill context parallel (llama family): a batch with prefill tokens is cut into N
//           runs of consecutive tokens, one per rank, each through the whole model; the ranks
//           exchange K/V per layer. Other batches (decode) use the tp layout. A different layout
//           per phase on the same ranks: every rank keeps the whole KV cache (all heads).
//   dp = N: data-parallel attention (DeepSeek MLA, with ep = N; model/data_parallel.h): each rank
//           attends only its own sequences and keeps only their KV rows; the expert layers see
//           every token (all-gather before, reduce-scatter after).
struct ParallelSizes {
  int tp = 0, ep = 0, cp = 0, dp = 0;
};

enum class WeightMemory { Auto, Mapped, Copied };

// Auto's choice, with the reason in `why`: copied, unless the model runs on another device (its
// weights are uploaded there), on several ranks (each would copy the whole file, where mapped
// it touches only its slices), or the weights take more than half of the available memory
// (the KV cache and the rest need room; a mapping can also run a model larger than memory).
// On the 1B shape, decode from 4 KiB mapped pages measured 1.07x (F16) to 1.3x (Q4_K) slower.
WeightMemory resolve_weight_memory(WeightMemory asked, uint64_t weight_bytes, int64_t available_bytes, Device device,
                                   bool several_ranks, std::string* why);

struct LoadOptions {
  std::string tokenizer_path;  // llama2.c: tokenizer.bin (default: tokenizer.bin / tok<vocab>.bin beside the model)
  bool prefault = true;        // touch all pages at load (progress bar on a terminal)
  // Where the weights live: mapped from the file, or copied into anonymous memory backed by
  // transparent huge pages (fewer TLB misses when decode streams every weight each token).
  // Auto (the default) copies when that suits (resolve_weight_memory); --mmap / --no-mmap force.
  WeightMemory weights = WeightMemory::Auto;
  // Where the model runs (--device): the architecture uploads its weights there once.
  Device device = Device::CPU;
  bool device_graphs = true;  // decode steps on a GPU replay recorded CUDA graphs (--no-cuda-graphs)
  // Repack Q8_0 / Q4_K / Q6_K matmul weights into their _X8 forms as the model is built (model/repack.h); --no-repack.
  // CPU only: on another device the weights keep the file's layout.
  bool repack = true;
  ParallelSizes parallel;  // used by build_model with a communicator of several ranks
  // Split-model steps of at least this many tokens run as two micro-batches whose all-reduces
  // overlap the other micro-batch's compute (--micro-batch-overlap; 0: off). CPU ranks.
  int64_t micro_batch_overlap = 0;
  // Load the model's first multi-token-prediction layer (ModelConfig::mtp_layers) as its own
  // draft layer (--speculative-method mtp); its KV cache is one more layer.
  bool mtp = false;
  // The longest sequence (prompt + output) the model will serve (--max-model-len; 0: its context).
  // LongRoPE models pick their short or long factors by it (RopeScaling::use_long).
  int64_t max_model_len = 0;
};

struct ModelFile {
  std::string path;
  std::string format;  // "gguf", "safetensors", "llama2c"
  ModelConfig config;
  std::map<std::string, Tensor> tensors;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the model carries none
  std::vector<std::string> notes;        // what the loader understood, for `inspect`
  std::vector<std::pair<std::string, std::string>> metadata;  // file metadata as key / printable value
  uint64_t file_bytes = 0;
  double load_seconds = 0;
  Device device = Device::CPU;  // where the model built from this file runs (LoadOptions::device)
  bool device_graphs = true;    // LoadOptions::device_graphs
  bool weights_writable = false;  // tensors live in memory this process owns (copied), not a read-only mapping
  bool repack_weights = true;     // LoadOptions::repack on the CPU, for the architecture as it is built
  ParallelSizes parallel;         // LoadOptions::parallel; build_model resolves it against the ranks
  int64_t micro_batch_overlap = 0;  // LoadOptions::micro_batch_overlap
  bool mtp = false;                 // LoadOptions::mtp

  const Tensor* find(const std::string& name) const;
  // The tensor, checked against the expected shape (outermost first); throws naming the
  // file, the tensor, and expected vs found.
  const Tensor& get(const std::string& name, std::initializer_list<int64_t> shape) const;
  const Tensor& get(const std::string& name) const;
  // Keep-alive for mapped files and converted buffers that tensors point into.
  std::vector<std::shared_ptr<const void>> owners;
  float* own_f32(size_t n);  // a new owned f32 buffer
};

// Opens a .gguf file, a llama2.c .bin checkpoint, or a Hugging Face directory
// (config.json + model.safetensors or model.safetensors.index.json).
std::unique_ptr<ModelFile> load_model_file(const std::string& path, const LoadOptions& opts = {});

// A Hugging Face config's LongRoPE scaling (rope_type longrope / su / yarn in Phi-3's configs:
// short and long factors, attention factor) into c.rope_scaling; other rope types are left alone.
// `config` is the whole config.json (its original_max_position_embeddings), `rope_scaling` its
// rope_scaling / rope_parameters object, `file` the name errors quote.
void read_hf_longrope(ModelConfig& c, const nlohmann::json& config, const nlohmann::json& rope_scaling, const std::string& file);

}  // namespace fp
