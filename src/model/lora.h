// model/lora.h — LoRA adapters: PEFT's adapter directories (adapter_config.json +
// adapter_model.safetensors) read into the base model's layout, and their application beside
// the base projections. For the rows of the sequences that use adapter a, a target projection
// computes y = W x + (alpha / r) B_a (A_a x). Several adapters serve one batch, each over its own
// sequences' rows (as S-LoRA / punica do): the base matmul runs once over every row, then each
// adapter's two thin matmuls over its rows.
#pragma once
#include <cstdint>
#include <memory>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/tensor.h"

namespace fp {

struct ForwardBatch;
struct ModelConfig;
struct ModelFile;

// The projections an adapter may update (PEFT's module names q_proj ... down_proj; Phi-3's and
// GLM-4's fused qkv_proj / gate_up_proj are split into their parts).
enum class LoraTarget : int { Q, K, V, O, Gate, Up, Down };
constexpr int kLoraTargets = 7;
const char* lora_target_name(LoraTarget t);

// One projection's low-rank update as read: scale * b (a x), a [rank, in] and b [out, rank] as
// F32 values, which `dtype` (the file's: F32, F16 or BF16) holds exactly; LoraSet keeps them in it.
struct LoraMatrices {
  int64_t layer = 0;
  LoraTarget target = LoraTarget::Q;
  int64_t rank = 0, in = 0, out = 0;
  std::vector<float> a, b;
  float scale = 1.0f;  // alpha / rank, or alpha / sqrt(rank) with rsLoRA
  DType dtype = DType::F32;
};

// An adapter as read from disk, in the base model's layout: b's q/k rows permuted where the
// base is a GGUF whose converter permuted them (llama.cpp's Llama family), fused parts split.
struct LoraAdapterWeights {
  std::string name, path;
  std::vector<LoraMatrices> matrices;
  int64_t max_rank = 0;
};

// Reads the PEFT LoRA adapter at `path` (its directory, or its adapter_config.json) for the base
// model `base`. Errors name the file, the field or tensor, and the value: another PEFT type, DoRA,
// modules_to_save, trained biases, embedding or lm_head adapters, unknown modules, shapes that do
// not match the base, a pickle-only adapter.
LoraAdapterWeights read_lora_adapter(const std::string& path, const std::string& name, const ModelFile& base);

// A projection's input and output widths in a model of config `c` (the whole model).
std::pair<int64_t, int64_t> lora_target_dims(const ModelConfig& c, LoraTarget t);
// Fails, naming both, unless every matrix of `ad` fits the model of config `c` (an adapter read
// for another model; what an architecture's add_lora checks first).
void check_lora_fits(const LoraAdapterWeights& ad, const ModelConfig& c, const std::string& model_path);

// The input and output widths of a PEFT module ("model.layers.0.self_attn.q_proj") in a model of
// config `c` (fused modules: their parts' outputs together); false for a module not adapted here.
bool lora_module_shape(const ModelConfig& c, const std::string& module, int64_t* in, int64_t* out);
// PEFT's rank_pattern / alpha_pattern lookup (peft.utils.get_pattern_key): the value of the first
// key, in the file's order, that names `module` as the regular expression (.*\.)?(key)$ does;
// null when none does.
const nlohmann::ordered_json* lora_pattern_value(const nlohmann::ordered_json& patterns, const std::string& module);

// Writes a PEFT adapter directory, or a llama.cpp GGUF adapter where `out` ends in .gguf (one
// alpha, no rsLoRA or patterns), with random matrices for the model at `base` (synth's --lora-out):
// `config` holds adapter_config.json keys (r, lora_alpha, target_modules: module names such as
// q_proj; use_rslora, rank_pattern, alpha_pattern), written beside PEFT's defaults. A and B are
// uniform in +-1/sqrt(in) and +-1/sqrt(rank) from `seed`, rounded to `type` (F32, F16 or BF16;
// Q8_0 in a GGUF adapter, as llama.cpp's converter writes it: F16 for rows that are not whole
// 32-value blocks) and stored in it. Returns a one-line summary.
std::string synth_lora(const std::string& base, const nlohmann::json& config, uint64_t seed, const std::string& out,
                       DType type = DType::F32);

// Whether llama.cpp's converters reorder this architecture's q/k rows into adjacent rotary
// pairs when they write a GGUF (Llama, and Mixtral, Granite, SmolLM3 built on its converter).
bool gguf_permutes_qk(const std::string& arch);
// The rows of a q or k projection's output side ([rows, cols], `heads` heads) reordered as
// llama.cpp's converters reorder Llama's: each head's two rotary halves into adjacent pairs
// (to_adjacent), or back.
std::vector<float> rope_pair_rows(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t heads, bool to_adjacent);

// One tensor-parallel rank's share of the projections (as Megatron cuts the weights): its rows of
// the column-split q, k, v (heads) and gate, up (FFN width), its columns of the row-split o and
// down. lora_share cuts B's rows or A's columns to it; a whole range (len < 0) keeps them all.
struct LoraShare {
  int64_t q_begin = 0, q_len = -1, kv_begin = 0, kv_len = -1, o_begin = 0, o_len = -1, ffn_begin = 0, ffn_len = -1;
};
LoraMatrices lora_share(LoraMatrices m, const LoraShare& share);

// Rows [begin, begin + len) of a [rows, cols] F32 matrix, or columns of one: what an
// architecture keeps of an adapter on one tensor-parallel rank.
std::vector<float> lora_rows(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t len);
std::vector<float> lora_columns(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t len);

// A model's loaded adapters (ids 1, 2, ...; 0 is the base model alone) and their application in
// a step, on the CPU. The architectures that take adapters own one.
class LoraSet {
 public:
  LoraSet();
  ~LoraSet();
  // Adds an adapter whose matrices the architecture already cut to its rank's share; returns its id.
  int32_t add(const std::string& name, std::vector<LoraMatrices> matrices, int64_t n_layers);
  int32_t size() const { return static_cast<int32_t>(adapters_.size()); }
  // Frees adapter `id`'s matrices; a step that still asks for it is an error.
  void remove(int32_t id);
  // Groups the step's rows by adapter (ForwardBatch::seq_lora; ids checked); false when no row
  // uses one, and apply() then does nothing.
  bool begin(const ForwardBatch& b);
  // For the rows [row0, row0 + n) of this step (n < 0: to the end), where `in` and each output
  // start: out_t[r] += B_t (A_t in[r]) for each target t of `outs` that the row's adapter updates
  // in `layer`. The targets share the input (k and v, or gate and up: one lora op for them).
  // in is [rows, in] and each out [rows, out_t], contiguous, the widths of the target's matrices.
  void apply(int64_t layer, std::initializer_list<std::pair<LoraTarget, float*>> outs, int64_t row0, int64_t n,
             const float* in);

 private:
  struct Adapter;
  struct Run {  // consecutive rows of one adapter
    int32_t adapter;
    int64_t row0, rows;
  };
  std::vector<std::unique_ptr<Adapter>> adapters_;
  std::vector<Run> runs_;
  std::vector<float> low_;  // the lora op's scratch: A x [rows, sum of ranks]
};

}  // namespace fp
