// model/moe_layers.h — building blocks shared by the MoE architectures (qwen3_moe.cpp,
// deepseek.cpp): expert weights as per-expert 2-D views (GGUF's stacked [n_expert, out, in]
// tensors or Hugging Face's one tensor per expert), and the routed FFN block: router matmul,
// routing op, grouped expert op.
#pragma once
#include <deque>
#include <string>
#include <vector>

#include "kernels/ops_moe.h"
#include "model/model_file.h"
#include "model/placement.h"
#include "parallel/shard.h"

namespace fp {

// A 1-D F32 view of a norm weight or bias (converted from F16/BF16 once at load).
const float* load_vec_f32(ModelFile& mf, const std::string& name, int64_t len);
// The same for a [rows, cols] tensor (gpt-oss's stacked expert biases).
const float* load_matrix_f32(ModelFile& mf, const std::string& name, int64_t rows, int64_t cols);
// A weight dequantized (block scales applied) into an owned F32 [rows, cols] buffer.
float* load_dequantized(ModelFile& mf, const Tensor& w);

struct MoeLayerWeights {
  const Tensor* router = nullptr;  // [n_expert, dim]
  const float* bias = nullptr;     // [n_expert] selection bias (DeepSeek-V3), or null
  const float* router_bias = nullptr;  // [n_expert] added to the router's logits (gpt-oss), or null
  // gpt-oss: each expert's projection biases, [n_expert, ff] (gate, up) and [n_expert, dim] (down).
  const float *gate_bias = nullptr, *up_bias = nullptr, *down_bias = nullptr;
  std::vector<Tensor> gate, up, down;  // per expert: [ff, dim], [ff, dim], [dim, ff]
  const Tensor *sh_gate = nullptr, *sh_up = nullptr, *sh_down = nullptr;  // shared experts, [sh_ff, dim] ...
  int64_t sh_ff = 0;
  // Qwen2-MoE: the shared expert's gate, an F32 [1, dim] view (its output times sigmoid(gate · x));
  // data null elsewhere.
  Tensor sh_gate_inp;
  int64_t expert_begin = 0, expert_end = -1;  // the experts this rank holds (expert parallel; -1: all)
};

// How a rank cuts its FFN weights when the model is split across `ranks` ranks.
struct FfnSplit {
  int rank = 0, ranks = 1;
  bool partition_experts = false;  // expert parallel: whole experts per rank, else slices of every expert
  std::deque<Tensor>* kept = nullptr;  // where the slices' Tensor views live (stable addresses)
};

// A SwiGLU FFN cut to this rank's share of its width: gate/up rows (views into the file), down's
// matching columns (copied; the share stays on down's quant-block boundaries). Returns the width;
// `cut` (when given) receives the share's range of it.
int64_t shard_ffn(ModelFile& mf, const FfnSplit& s, const Tensor*& gate, const Tensor*& up, const Tensor*& down,
                  const char* what, Range* cut = nullptr);
// A MoE layer cut for this rank: with partition_experts, experts [E*r/R, E*(r+1)/R) kept and the
// others emptied (their pages never touched); otherwise every expert's width sliced as above (and
// gpt-oss's expert biases with it). The shared experts' width is sliced in both cases, so each
// rank's block output is a partial sum.
// With `repacker`, what was cut is repacked after the cut (the slices of every expert, the shared
// experts): an interleaved _X8 layout is cut only where its groups of 256 values allow, and a
// slice that ends inside a group is repacked with its own partial group.
class WeightRepacker;
void shard_moe_layer(ModelFile& mf, const FfnSplit& s, MoeLayerWeights& w, WeightRepacker* repacker = nullptr);

// Loads layer `prefix` ("blk.N.")'s router, experts and (when config.moe.n_shared) shared experts.
// With `repacker`, stacked expert tensors are repacked first (model/repack.h), the experts' views
// then reading the repacked bytes; not those that `split` will cut (shard_moe_layer repacks them
// after the cut): every expert's width under tensor parallel, the shared experts on any split.
MoeLayerWeights load_moe_layer(ModelFile& mf, const std::string& prefix, const ModelConfig& c,
                               WeightRepacker* repacker = nullptr, const FfnSplit& split = {});

// The layer's weights on device d (the experts as one stack per matrix, DeviceWeights::stack);
// w itself on the CPU.
MoeLayerWeights place_moe_layer(const MoeLayerWeights& w, DeviceWeights& dw);

// Routes h[n, dim] and runs the experts: out[n, dim] (shared experts included). Its router
// logits, ids and weights live on the model's device.
class MoeBlock {
 public:
  explicit MoeBlock(Device d = Device::CPU) : act_(d) {}
  void run(const MoeLayerWeights& w, const ModelConfig& c, const float* h, int64_t n, float* out);

 private:
  Activations act_;  // 0: router logits, 1: weights, 2: ids, 3: the shared expert's gate logits,
                     // 4-7: Llama 4's scaled input and its shared expert's gate, up and output rows
};

}  // namespace fp
