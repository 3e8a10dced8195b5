// model/moe_layers.cpp — expert weight views and the routed FFN block.
#include "model/moe_layers.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "model/repack.h"
#include "parallel/shard.h"

namespace fp {

const float* load_vec_f32(ModelFile& mf, const std::string& name, int64_t len) {
  const Tensor& t = mf.get(name, {len});
  if (t.dtype == DType::F32) return static_cast<const float*>(t.data);
  float* buf = mf.own_f32(static_cast<size_t>(len));
  dequantize_row(t.dtype, t.data, buf, len);
  return buf;
}

float* load_dequantized(ModelFile& mf, const Tensor& w) {
  const int64_t rows = w.rows(), cols = w.cols();
  float* buf = mf.own_f32(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = buf + r * cols;
    dequantize_row(w.dtype, w.row_ptr(r), dst, cols);
    if (w.block_scale) {
      const int64_t sb = w.scale_block, sc = (cols + sb - 1) / sb;
      for (int64_t k = 0; k < cols; ++k) dst[k] *= w.block_scale[(r / sb) * sc + k / sb];
    }
  }
  return buf;
}

namespace {

// Expert e's [out, in] matrix: a slice of the stacked GGUF tensor, or its own HF tensor.
std::vector<Tensor> load_experts(ModelFile& mf, const std::string& prefix, const std::string& proj, int64_t n_expert,
                                 int64_t out, int64_t in, WeightRepacker* repacker) {
  std::vector<Tensor> v;
  const std::string stacked = prefix + "ffn_" + proj + "_exps.weight";
  if (mf.find(stacked)) {
    const Tensor* whole = &mf.get(stacked, {n_expert, out, in});
    if (repacker) whole = repacker->repack(whole);
    const Tensor& t = *whole;
    FP_CHECK(!t.block_scale, mf.path, ": '", stacked, "' is block-scaled; stacked experts must not be");
    const int64_t bytes = out * row_bytes(t.dtype, in);
    for (int64_t e = 0; e < n_expert; ++e)
      v.push_back(Tensor::view(static_cast<const uint8_t*>(t.data) + e * bytes, t.dtype, {out, in}));
    return v;
  }
  for (int64_t e = 0; e < n_expert; ++e)
    v.push_back(mf.get(prefix + "ffn_" + proj + "_exps." + std::to_string(e) + ".weight", {out, in}));
  return v;
}

}  // namespace

// A [rows, cols] tensor as F32 (a view, or converted once into an owned buffer).
const float* load_matrix_f32(ModelFile& mf, const std::string& name, int64_t rows, int64_t cols) {
  const Tensor& t = mf.get(name, {rows, cols});
  if (t.dtype == DType::F32) return static_cast<const float*>(t.data);
  float* buf = mf.own_f32(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) dequantize_row(t.dtype, t.row_ptr(r), buf + r * cols, cols);
  return buf;
}

MoeLayerWeights load_moe_layer(ModelFile& mf, const std::string& p, const ModelConfig& c, WeightRepacker* repacker,
                               const FfnSplit& split) {
  const bool cut = split.ranks > 1;  // the shared experts' width is cut
  WeightRepacker* routed = cut && !split.partition_experts ? nullptr : repacker;
  const MoeConfig& m = c.moe;
  MoeLayerWeights w;
  w.router = &mf.get(p + "ffn_gate_inp.weight", {m.n_experts, c.dim});
  if (mf.find(p + "exp_probs_b.bias")) w.bias = load_vec_f32(mf, p + "exp_probs_b.bias", m.n_experts);
  if (m.router_bias) w.router_bias = load_vec_f32(mf, p + "ffn_gate_inp.bias", m.n_experts);
  if (m.expert_bias) {
    w.gate_bias = load_matrix_f32(mf, p + "ffn_gate_exps.bias", m.n_experts, m.ff);
    w.up_bias = load_matrix_f32(mf, p + "ffn_up_exps.bias", m.n_experts, m.ff);
    w.down_bias = load_matrix_f32(mf, p + "ffn_down_exps.bias", m.n_experts, c.dim);
  }
  w.gate = load_experts(mf, p, "gate", m.n_experts, m.ff, c.dim, routed);
  w.up = load_experts(mf, p, "up", m.n_experts, m.ff, c.dim, routed);
  w.down = load_experts(mf, p, "down", m.n_experts, c.dim, m.ff, routed);
  if (m.shared_gate && m.n_shared > 0) {
    // GGUF's ffn_gate_inp_shexp is a [dim] vector, the checkpoint's shared_expert_gate a [1, dim] matrix.
    const std::string name = p + "ffn_gate_inp_shexp.weight";
    const Tensor& t = mf.get(name);
    FP_CHECK(t.numel() == c.dim && t.cols() == c.dim, mf.path, ": '", name, "' has ", t.numel(), " values, expected one row of ",
             c.dim, " (hidden_size)");
    float* g = mf.own_f32(static_cast<size_t>(c.dim));
    dequantize_row(t.dtype, t.data, g, c.dim);
    w.sh_gate_inp = Tensor::view(g, DType::F32, {1, c.dim});
  }
  if (m.n_shared > 0) {
    w.sh_ff = m.shared_width();
    w.sh_gate = &mf.get(p + "ffn_gate_shexp.weight", {w.sh_ff, c.dim});
    w.sh_up = &mf.get(p + "ffn_up_shexp.weight", {w.sh_ff, c.dim});
    w.sh_down = &mf.get(p + "ffn_down_shexp.weight", {c.dim, w.sh_ff});
    // The shared experts as the routed ones (what repackable() takes), unless they will be cut.
    if (repacker && !cut)
      for (const Tensor** t : {&w.sh_gate, &w.sh_up, &w.sh_down}) *t = repacker->repack(*t);
  }
  return w;
}

int64_t shard_ffn(ModelFile& mf, const FfnSplit& s, const Tensor*& gate, const Tensor*& up, const Tensor*& down,
                  const char* what, Range* cut) {
  // The width cut falls on block boundaries of down's columns and (block-scaled) gate's and up's rows.
  const int64_t align = std::lcm(column_alignment(*down), std::lcm(row_alignment(*gate), row_alignment(*up)));
  const Range f = split_range(gate->rows(), s.ranks, s.rank, align, what);
  gate = &s.kept->emplace_back(slice_rows(*gate, f));
  up = &s.kept->emplace_back(slice_rows(*up, f));
  OwnedTensor d = copy_columns(*down, f);
  mf.owners.push_back(d.bytes);
  down = &s.kept->emplace_back(d.view);
  if (cut) *cut = f;
  return f.len;
}

void shard_moe_layer(ModelFile& mf, const FfnSplit& s, MoeLayerWeights& w, WeightRepacker* repacker) {
  if (s.ranks <= 1) return;
  if (w.sh_gate) {
    w.sh_ff = shard_ffn(mf, s, w.sh_gate, w.sh_up, w.sh_down, "shared experts' width");
    if (repacker)
      for (const Tensor** t : {&w.sh_gate, &w.sh_up, &w.sh_down}) *t = repacker->repack(*t);
  }
  const auto E = static_cast<int64_t>(w.gate.size());
  if (s.partition_experts) {
    const Range r = split_range(E, s.ranks, s.rank, 1, "routed experts");
    w.expert_begin = r.begin;
    w.expert_end = r.begin + r.len;
    for (int64_t e = 0; e < E; ++e)
      if (e < w.expert_begin || e >= w.expert_end) {
        const auto i = static_cast<size_t>(e);
        w.gate[i] = w.up[i] = w.down[i] = Tensor{};
      }
    return;
  }
  Range cut;
  const int64_t full_ff = w.gate.empty() ? 0 : w.gate[0].rows();
  for (size_t e = 0; e < w.gate.size(); ++e) {
    const Tensor *g = &w.gate[e], *u = &w.up[e], *d = &w.down[e];
    shard_ffn(mf, s, g, u, d, "expert FFN width (moe_intermediate_size)", &cut);
    if (repacker) {
      g = repacker->repack(g);
      u = repacker->repack(u);
      d = repacker->repack(d);
    }
    w.gate[e] = *g;
    w.up[e] = *u;
    w.down[e] = *d;
  }
  // gpt-oss's expert biases follow the cut: the gate/up bias matrices [E, ff] keep the share's
  // columns; the down bias is added on rank 0 only, so the ranks' partial sums hold it once.
  auto slice_bias = [&](const float*& b) {
    if (!b) return;
    float* out = mf.own_f32(static_cast<size_t>(E * cut.len));
    for (int64_t e = 0; e < E; ++e) std::copy_n(b + e * full_ff + cut.begin, cut.len, out + e * cut.len);
    b = out;
  };
  slice_bias(w.gate_bias);
  slice_bias(w.up_bias);
  if (s.rank != 0) w.down_bias = nullptr;
}

MoeLayerWeights place_moe_layer(const MoeLayerWeights& w, DeviceWeights& dw) {
  if (dw.device() == Device::CPU) return w;
  MoeLayerWeights d = w;
  const auto end = w.expert_end < 0 ? static_cast<int64_t>(w.gate.size()) : w.expert_end;
  d.router = dw.tensor(w.router);
  d.bias = dw.floats(w.bias, w.router->rows());
  d.gate = dw.stack(w.gate, w.expert_begin, end);
  d.up = dw.stack(w.up, w.expert_begin, end);
  d.down = dw.stack(w.down, w.expert_begin, end);
  d.sh_gate = dw.tensor(w.sh_gate);
  d.sh_up = dw.tensor(w.sh_up);
  d.sh_down = dw.tensor(w.sh_down);
  if (w.sh_gate_inp.data) d.sh_gate_inp = *dw.tensor(&w.sh_gate_inp);
  return d;
}

void MoeBlock::run(const MoeLayerWeights& w, const ModelConfig& c, const float* h, int64_t n, float* out) {
  const MoeConfig& m = c.moe;
  float* logits = act_.f32(0, n * m.n_experts);
  float* weights = act_.f32(1, n * m.n_used);
  int32_t* ids = act_.i32(2, n * m.n_used);
  dispatch(MatMulArgs{h, n, w.router, w.router_bias, logits});
  MoeRouteArgs r;
  r.logits = logits;
  r.n = n;
  r.n_expert = m.n_experts;
  r.k = m.n_used;
  r.scoring = m.scoring == "sigmoid" ? MoeScoring::Sigmoid : MoeScoring::Softmax;
  r.bias = w.bias;
  r.n_group = m.n_group;
  r.topk_group = m.topk_group;
  // DeepSeek-V3 drops the other groups' experts (-inf); V2's group-limited greedy zeroes their scores.
  r.group_score = m.group_score == "top2sum" ? MoeGroupScore::Top2Sum : MoeGroupScore::Max;
  r.masked = m.group_score == "top2sum" ? -std::numeric_limits<float>::infinity() : 0.0f;
  r.norm_topk = m.norm_topk;
  r.scale = m.scale;
  r.ids = ids;
  r.weights = weights;
  dispatch(r);
  MoeFfnArgs f;
  f.x = h;
  if (m.scale_input) {
    // Llama 4: expert(score * h) for its one chosen expert (weight 1); the shared expert below
    // on h itself. Only top-1 routing reads so (model_file.cpp refuses more).
    FP_CHECK(m.n_used == 1, "the router score on the expert input needs top-1 routing, not top-", m.n_used);
    float* scaled = act_.f32(4, n * c.dim);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < c.dim; ++j) scaled[i * c.dim + j] = h[i * c.dim + j] * weights[i];
      weights[i] = 1.0f;
    }
    f.x = scaled;
  }
  f.n = n;
  f.dim = c.dim;
  f.ids = ids;
  f.weights = weights;
  f.k = m.n_used;
  f.n_expert = m.n_experts;
  f.ff = w.gate[static_cast<size_t>(w.expert_begin)].rows();  // this rank's width of an expert
  f.expert_begin = w.expert_begin;
  f.expert_end = w.expert_end;
  f.gate = w.gate.data();
  f.up = w.up.data();
  f.down = w.down.data();
  const bool shared_apart = m.scale_input && w.sh_gate;  // the shared expert on other rows than the routed ones
  if (!shared_apart) {
    f.shared_gate = w.sh_gate;
    f.shared_up = w.sh_up;
    f.shared_down = w.sh_down;
    f.shared_ff = w.sh_ff;
  }
  if (w.sh_gate_inp.data) {  // Qwen2-MoE: shared_expert_gate · h, the shared expert's weight through a sigmoid
    float* sh_logits = act_.f32(3, n);
    dispatch(MatMulArgs{h, n, &w.sh_gate_inp, nullptr, sh_logits});
    f.shared_logits = sh_logits;
  }
  f.gate_bias = w.gate_bias;
  f.up_bias = w.up_bias;
  f.down_bias = w.down_bias;
  if (m.swiglu_clamped) {
    f.activation = MoeActivation::SwigluClamped;
    f.swiglu_alpha = m.swiglu_alpha;
    f.swiglu_limit = m.swiglu_limit;
  }
  f.out = out;
  dispatch(f);
  if (shared_apart) {  // out += down(silu(gate h) * up h)
    float* g = act_.f32(5, n * w.sh_ff);
    float* u = act_.f32(6, n * w.sh_ff);
    float* o = act_.f32(7, n * c.dim);
    dispatch(MatMulArgs{h, n, w.sh_gate, nullptr, g});
    dispatch(MatMulArgs{h, n, w.sh_up, nullptr, u});
    dispatch(SiluMulArgs{g, u, n, w.sh_ff, 0, 0, g});
    dispatch(MatMulArgs{g, n, w.sh_down, nullptr, o});
    dispatch(AddArgs{out, o, n * c.dim, out});
  }
}

}  // namespace fp
