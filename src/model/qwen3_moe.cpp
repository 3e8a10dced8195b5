// model/qwen3_moe.cpp — the MoE models with GQA attention:
//   Qwen3-MoE (HF Qwen3MoeForCausalLM, GGUF qwen3moe): GQA, per-head q/k RMSNorm, NeoX RoPE; in
//     the sparse layers a softmax top-k router over routed experts (norm_topk_prob). Dense layers
//     (mlp_only_layers, decoder_sparse_step; in GGUF a layer without ffn_gate_inp) keep a plain
//     SwiGLU FFN.
//   GLM-4.5 / 4.6 (HF Glm4MoeForCausalLM, GGUF glm4moe): GQA with q/k/v biases (attention_bias),
//     q/k norms only where use_qk_norm, NeoX RoPE over the first half of each head
//     (partial_rotary_factor); DeepSeek-V3's router (sigmoid scores, selection bias, top-2-sum
//     groups, routed_scaling_factor) and a shared expert; the first first_k_dense_replace layers
//     dense. Its first multi-token-prediction layer (after num_hidden_layers) drafts tokens
//     with --speculative-method mtp (Model::mtp_forward).
//   Qwen1.5-MoE / Qwen2-MoE (HF Qwen2MoeForCausalLM, GGUF qwen2moe): Qwen2's attention (q/k/v
//     biases), Qwen3-MoE's router (norm_topk_prob usually false), and one shared expert of its
//     own width whose output is scaled by sigmoid(shared_expert_gate · x) (MoeFfnArgs::
//     shared_logits).
//   Mixtral (HF MixtralForCausalLM; GGUF llama with expert_count): Llama's attention (a window
//     on every layer when sliding_window is set), every layer sparse, a softmax over all experts
//     with the top k renormalised, experts as wide as intermediate_size.
//   MiniMax-M2 (HF MiniMaxM2ForCausalLM, GGUF minimax-m2): GQA with q and k RMS-normed over the
//     whole projection, NeoX RoPE over the first rotary_dim of each head; every layer sparse,
//     GLM-4.5's router without groups (sigmoid scores, selection bias, top k renormalised),
//     Mixtral's checkpoint names.
//   ERNIE 4.5 MoE (HF Ernie4_5_MoeForCausalLM, GGUF ernie4_5-moe): Llama's attention with
//     adjacent rotary pairs; a softmax router with a selection bias, the chosen probabilities
//     renormalised; shared experts; dense layers before moe_layer_start_index.
//   Hunyuan MoE (HF HunYuanMoEV1ForCausalLM): Hunyuan dense's attention (q/k norms after RoPE),
//     a softmax router with the top k renormalised and one ungated shared MLP.
//   Llama 4 (HF Llama4ForCausalLM / Llama4ForConditionalGeneration's text model): GQA in
//     adjacent rotary pairs on three layers of four, those attending in chunks of
//     attention_chunk_size with q and k L2-normed after RoPE; the fourth without RoPE, attending
//     to everything, its queries scaled up with the position (attn_temperature_tuning). Sparse
//     layers (interleave_moe_layer_step): a top-1 router whose sigmoid score multiplies the
//     expert's input, and a shared expert; dense layers of intermediate_size_mlp.
//   Granite 3.x MoE (HF GraniteMoeForCausalLM / GraniteMoeSharedForCausalLM, GGUF granitemoe):
//     Mixtral's layers with Granite's multipliers (embeddings, attention scale, logits divided;
//     the residual one folded at load, config.h) and, in the Shared variant, an ungated shared
//     expert beside the routed ones.
//
// Split across ranks (parallel(), see ParallelSizes): with tp = N the attention heads are split
// as in llama.cpp (q/k/v row views, attn_output columns copied, an all-reduce after it); with
// ep = N each rank holds E/N whole experts, else (tp only) a slice of every expert's width. The
// dense layers' FFN and the shared experts are split by width in both cases, so every rank's FFN
// output is a partial sum and one all-reduce per layer completes it. With cp = N (prefill
// context parallel, model/context_parallel.h) prefill batches run the rank's tokens through the
// whole layers (views of the file) and the cache keeps every KV head; decode batches run whole
// on every rank, expert parallel (ep = N, attention replicated) or tensor parallel (tp = N: the
// rank's heads read out of each cache row, its new K/V rows all-gathered and written whole, as
// the llama family does): a different layout per phase on the same ranks.
//
// On a device (--device cuda): the weights uploaded once (each layer's experts as one stack per
// matrix; under expert parallel the rank's experts only), activations, router outputs and KV
// cache there, the batch staged each step, decode steps replayed as recorded graphs
// (forward_on_device), as the llama family does. Across GPU ranks: tensor and expert parallel,
// the all-reduces and the vocabulary-parallel logits' all-gather through NCCL on the device
// buffers.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "kernels/ledger.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "model/context_parallel.h"
#include "model/lora.h"
#include "model/micro_batch.h"
#include "model/qk_norm.h"
#include "model/vocab_parallel.h"
#include "model/model.h"
#include "model/moe_layers.h"
#include "model/mtp.h"
#include "model/repack.h"
#include "parallel/collectives.h"
#include "parallel/shard.h"

namespace fp {
namespace {

struct Qwen3MoeLayer {
  const float *attn_norm, *ffn_norm;
  const float *q_norm = nullptr, *k_norm = nullptr;         // config.qk_norm
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // config.qkv_bias (this rank's heads' share)
  const float* bo = nullptr;     // gpt-oss: attention output bias (config.o_bias; one rank only)
  const float* sinks = nullptr;  // gpt-oss: per-head sink logits (config.attn_sinks)
  int64_t window = 0;            // gpt-oss: sliding window of this layer (0: full attention)
  int64_t chunk = 0;             // Llama 4: attention chunk of this layer (0: none)
  bool rotates = true;           // false: a NoPE layer (Llama 4)
  const Tensor *wq, *wk, *wv, *wo;
  bool moe = false;
  const Tensor *w_gate = nullptr, *w_up = nullptr, *w_down = nullptr;  // dense layers
  int64_t ffn_width = 0;  // this rank's share of a dense layer's FFN width
  MoeLayerWeights experts;
  int64_t index = 0;      // the layer's number (the draft layer's: n_layers)
};

// Where a step's K/V go and are read: the main block tables and slots, and with window trimming
// the windowed layers' (KvPool::in_window_blocks; null otherwise).
struct KvTables {
  const int64_t* slots;
  const int32_t* pages;
  const int64_t* window_slots = nullptr;
  const int32_t* window_pages = nullptr;
};

class Qwen3MoeModel : public Model {
 public:
  Qwen3MoeModel(std::shared_ptr<ModelFile> f, std::shared_ptr<Communicator> comm) : Model(std::move(f)) {
    tp_ = std::move(comm);
    const ModelConfig& c = config();
    ModelFile& mf = *file_;
    const int rank = tp_ ? tp_->rank() : 0;
    // Ranks the weights are split across (tensor or expert parallel); 1 with context parallel,
    // whose prefill runs the whole model on every rank, and so does its decode here.
    const int ranks = parallel().tp > 1 || parallel().ep > 1 ? tp_size() : 1;
    FP_CHECK(parallel().dp <= 1, mf.path, ": --data-parallel-attention is built for DeepSeek's MLA; ", c.arch,
             "'s GQA attention splits by heads instead (--tensor-parallel-size ", tp_size(), " --expert-parallel-size ",
             tp_size(), ")");
    context_parallel_ = parallel().cp > 1;
    ffn_split_ = ranks > 1;
    attn_ranks_ = parallel().tp > 1 ? ranks : 1;  // attention heads split, or replicated on every rank
    FP_CHECK(c.n_heads % attn_ranks_ == 0 && c.n_kv_heads % attn_ranks_ == 0, mf.path, ": --tensor-parallel-size ",
             attn_ranks_, " must divide the attention heads (", c.n_heads, ") and the KV heads (", c.n_kv_heads, ")");
    heads_ = c.n_heads / attn_ranks_;
    kv_heads_ = c.n_kv_heads / attn_ranks_;
    const FfnSplit split{rank, ranks, parallel().ep > 1, &shards_};
    FP_CHECK(c.v_head_dim == c.head_dim, mf.path, ": ", c.arch, " needs value_length == key_length");
    FP_CHECK(c.moe.n_experts > 0, mf.path, ": ", c.arch, " needs an expert count");
    const int64_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
    // Matmul weights into the CPU kernels' interleaved layouts (model/repack.h): expert stacks as
    // they load (K-quants), the rest after sharding. Not with context-parallel prefill over
    // several ranks, whose whole layers and decode slices share bytes (as in llama.cpp).
    if (context_parallel_ && ranks > 1) mf.repack_weights = false;
    WeightRepacker rp(mf);
    embed_ = &mf.get("token_embd.weight", {c.n_vocab, c.dim});
    output_norm_ = load_vec_f32(mf, "output_norm.weight", c.dim);
    if (c.logit_scale != 1.0f) {  // GraniteMoe: logits / logit_scale, folded into the output norm's weights
      float* scaled = mf.own_f32(static_cast<size_t>(c.dim));
      for (int64_t i = 0; i < c.dim; ++i) scaled[i] = output_norm_[i] / c.logit_scale;
      output_norm_ = scaled;
    }
    FP_CHECK(c.residual_scale == 1.0f || c.residual_folded, mf.path, ": the residual multiplier was not folded (config.h)");
    // Split by vocabulary rows across the ranks the weights are split over (model/vocab_parallel.h).
    const Tensor* output = c.tied_output ? embed_ : &mf.get("output.weight", {c.n_vocab, c.dim});
    output_.init(output, ranks > 1 ? tp_.get() : nullptr, shards_, mf.path, device());
    output_.hidden_scale = c.logit_scale;  // the hidden rows without the 1 / logit_scale the output norm carries
    output_head_ = &output_;
    // Layer l's weights (l = n_layers: the multi-token-prediction layer's decoder layer).
    auto load_layer = [&](int64_t l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Qwen3MoeLayer L{};
      L.index = l;
      L.attn_norm = load_vec_f32(mf, p + "attn_norm.weight", c.dim);
      L.ffn_norm = load_vec_f32(mf, p + "ffn_norm.weight", c.dim);
      if (c.qk_norm) {  // per head, or (MiniMax-M2) over the whole projection
        L.q_norm = load_vec_f32(mf, p + "attn_q_norm.weight", c.qk_norm_full ? q_dim : c.head_dim);
        L.k_norm = load_vec_f32(mf, p + "attn_k_norm.weight", c.qk_norm_full ? kv_dim : c.head_dim);
      }
      if (c.qkv_bias) {
        L.bq = load_vec_f32(mf, p + "attn_q.bias", q_dim);
        L.bk = load_vec_f32(mf, p + "attn_k.bias", kv_dim);
        L.bv = load_vec_f32(mf, p + "attn_v.bias", kv_dim);
      }
      if (c.o_bias) L.bo = load_vec_f32(mf, p + "attn_output.bias", c.dim);
      if (c.attn_sinks) L.sinks = load_vec_f32(mf, p + "attn_sinks.weight", c.n_heads);
      L.window = c.window_of(l);
      L.chunk = c.chunk_of(l);
      L.rotates = c.rotates(l);
      L.wq = &mf.get(p + "attn_q.weight", {q_dim, c.dim});
      L.wk = &mf.get(p + "attn_k.weight", {kv_dim, c.dim});
      L.wv = &mf.get(p + "attn_v.weight", {kv_dim, c.dim});
      L.wo = &mf.get(p + "attn_output.weight", {c.dim, q_dim});
      // HF says which layers are sparse in config.json; GGUF by the tensors present.
      L.moe = c.source == "gguf" ? mf.find(p + "ffn_gate_inp.weight") != nullptr : c.moe.is_moe_layer(l);
      if (L.moe) {
        L.experts = load_moe_layer(mf, p, c, &rp, split);
      } else {
        L.w_gate = &mf.get(p + "ffn_gate.weight", {c.hidden_dim, c.dim});
        L.w_up = &mf.get(p + "ffn_up.weight", {c.hidden_dim, c.dim});
        L.w_down = &mf.get(p + "ffn_down.weight", {c.dim, c.hidden_dim});
        L.ffn_width = c.hidden_dim;
      }
      // Context-parallel prefill with expert-parallel decode: the prefill keeps the whole layer
      // (views of the file), decode this rank's experts and FFN share.
      if (context_parallel_ && ranks > 1) whole_layers_.push_back(L);
      if (L.moe) shard_moe_layer(mf, split, L.experts, &rp);
      else if (ranks > 1) L.ffn_width = shard_ffn(mf, split, L.w_gate, L.w_up, L.w_down, "FFN width (hidden_dim)");
      if (attn_ranks_ > 1) {  // this rank's heads: q/k/v rows, attn_output's columns
        const Range q{rank * heads_ * c.head_dim, heads_ * c.head_dim}, kv{rank * kv_heads_ * c.head_dim, kv_heads_ * c.head_dim};
        L.wq = &shards_.emplace_back(slice_rows(*L.wq, q));
        L.wk = &shards_.emplace_back(slice_rows(*L.wk, kv));
        L.wv = &shards_.emplace_back(slice_rows(*L.wv, kv));
        if (L.bq) L.bq += q.begin, L.bk += kv.begin, L.bv += kv.begin;  // the same rows of the biases
        if (L.sinks) L.sinks += rank * heads_;  // this rank's heads' sink logits
        if (c.qk_norm_full) {                    // the norm weights of this rank's heads (qk_norm sums squares across ranks)
          L.q_norm += q.begin;
          L.k_norm += kv.begin;
        }
        if (rank != 0) L.bo = nullptr;          // the output bias once, in the sum of the heads' shares
        OwnedTensor o = copy_columns(*L.wo, q);
        mf.owners.push_back(o.bytes);
        L.wo = &shards_.emplace_back(o.view);
      }
      for (const Tensor** w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) *w = rp.repack(*w);
      return L;
    };
    if (mf.mtp) enable_mtp();
    for (int64_t l = 0; l < c.n_layers; ++l) layers_.push_back(load_layer(l));
    if (mtp_) mtp_layer_ = load_layer(c.n_layers);
    output_.weight = rp.repack(output_.weight);
    if (c.tied_output && !output_.split()) embed_ = output_.weight;
    if (mtp_) mtp_head_.load(mf, c.n_layers, embed_, output, output_.weight, ranks > 1 ? tp_.get() : nullptr, rp, shards_);
    rp.report();
    inv_freq_ = c.rope_inv_freq();
    if (const Tensor* rf = mf.find("rope_freqs.weight")) {  // GGUF llama3-style scaling (Llama 4): per-frequency divisors
      FP_CHECK(rf->numel() == c.rot_dim / 2, mf.path, ": rope_freqs.weight has ", rf->numel(), " values, expected ", c.rot_dim / 2);
      std::vector<float> factors(inv_freq_.size());
      dequantize_row(rf->dtype, rf->data, factors.data(), rf->numel());
      for (size_t i = 0; i < inv_freq_.size(); ++i) inv_freq_[i] /= factors[i];
    }
    inv_freq_at_ = inv_freq_.data();
    rope_mscale_ = c.rope_scaling.type == "yarn" ? c.rope_scaling.attn_factor : 1.0f;
    // Llama 4's parts run on the host (its temperature and input-scaling loops, the chunk option
    // the device attention kernels do not take); it is registered CPU-only, and stays so here.
    FP_CHECK(device() == Device::CPU || (!c.moe.scale_input && c.nope_temp_floor <= 0 && !c.qk_l2_norm && c.attention_chunk == 0),
             mf.path, ": ", c.arch, "'s chunked attention, NoPE temperature, q/k L2 norm and input-scaled experts run on the CPU only");
    if (device() != Device::CPU) place_on_device();
  }

  // This rank's KV heads only (all of them when attention is replicated, or with context-parallel
  // prefill, whose cache every decode layout reads).
  KvLayout kv_layout() const override {
    const ModelConfig& c = config();
    const int64_t h = context_parallel_ ? c.n_kv_heads : kv_heads_;
    return KvLayout{c.n_layers + (mtp_ ? 1 : 0), h * c.head_dim, h * c.head_dim};
  }

  void mtp_forward(const ForwardBatch& b, KvPool& pool, const float* hidden, float* logits, float* out_hidden) override {
    const ModelConfig& c = config();
    const int64_t n = begin_mtp(b, pool);
    if (n <= 0) return;
    lora_on_ = false;  // the draft layer runs without adapters (the model's verification step has them)
    const Heads hd = heads(false, pool);
    resize_buffers(n, n, hd);
    b.slots(pool.page_size(), slots_);
    AttentionArgs att = attention_args(paged_attention_args(b, pool), pool, hd, q_.data(), att_.data());
    mtp_head_.input(b.tokens.data(), b.positions.data(), hidden, n, x_.data());
    const Rows r{x_.data(), h_.data(), q_.data(), k_.data(), v_.data(), att_.data(), gate_.data(), up_.data(), n};
    attention(mtp_layer_, c.n_layers, hd, r, b.positions.data(), KvTables{slots_.data(), b.page_ids.data()}, att, pool, false);
    if (hd.split) dispatch(AllReduceArgs{tp_.get(), h_.data(), n * c.dim});  // sum the heads' shares
    dispatch(AddArgs{x_.data(), h_.data(), n * c.dim, x_.data()});
    float* out = ffn(mtp_layer_, r);
    if (ffn_split_) dispatch(AllReduceArgs{tp_.get(), out, n * c.dim});  // sum the ranks' FFN shares
    dispatch(AddArgs{x_.data(), out, n * c.dim, x_.data()});
    if (out_hidden) std::copy_n(x_.data(), n * c.dim, out_hidden);
    resize(rows_, static_cast<int64_t>(b.logit_rows.size()) * c.dim);
    mtp_head_.logits(rows_.data(), b.gather_logit_rows(x_.data(), c.dim, rows_.data()), logits);
  }

  // An adapter on the attention (cut to this rank's heads as the weights are) and on the dense
  // layers' FFN (one rank); the experts' adapters are refused (module_parts does not name them).
  int32_t add_lora(const LoraAdapterWeights& ad) override {
    const ModelConfig& c = config();
    check_lora_runs_here(ad, context_parallel_);
    const int rank = tp_ ? tp_->rank() : 0;
    LoraShare share;  // the attention's heads when split (the FFN adapters need one rank)
    if (attn_ranks_ > 1)
      share = {rank * heads_ * c.head_dim, heads_ * c.head_dim, rank * kv_heads_ * c.head_dim, kv_heads_ * c.head_dim,
               rank * heads_ * c.head_dim, heads_ * c.head_dim};
    std::vector<LoraMatrices> mine;
    for (const LoraMatrices& m : ad.matrices) {
      const bool ffn = m.target == LoraTarget::Gate || m.target == LoraTarget::Up || m.target == LoraTarget::Down;
      FP_CHECK(!ffn || !layers_[static_cast<size_t>(m.layer)].moe, ad.path, ": layer ", m.layer, "'s ", lora_target_name(m.target),
               ": that layer's FFN is a mixture of experts (adapters on experts are not supported)");
      FP_CHECK(!ffn || !ffn_split_, ad.path, ": adapters on the dense FFN layers run on one rank here (", lora_target_name(m.target),
               " of layer ", m.layer, ")");
      mine.push_back(lora_share(m, share));
    }
    const int32_t id = lora_added();
    FP_CHECK(lora_.add(ad.name, std::move(mine), c.n_layers) == id, "LoRA adapter ids out of step");
    return id;
  }
  void drop_lora(int32_t id) override { lora_.remove(id); }

  void forward(const ForwardBatch& b, KvPool& pool, float* logits) override {
    const ModelConfig& c = config();
    check_batch(b, pool);
    if (b.n_tokens() <= 0) return;
    lora_on_ = lora_.size() > 0 && lora_.begin(b);  // rows by adapter (add_lora refuses context parallel, devices)
    // Prefill context parallel: this rank runs its run of the tokens (model/context_parallel.h).
    const bool cp = context_parallel_ && ContextParallelStep::applies(b, tp_size());
    const int64_t overlap_min = file_->micro_batch_overlap;
    if (!cp && ffn_split_ && overlap_min > 0 && b.n_tokens() >= std::max<int64_t>(overlap_min, 2))
      return forward_overlapped(b, pool, logits);
    if (device() != Device::CPU) return forward_on_device(b, pool, logits);
    if (cp) cp_.begin(tp_.get(), b, pool.page_size());
    const ForwardBatch& run = cp ? cp_.run() : b;
    const int64_t n = run.n_tokens(), padded = cp ? cp_.padded_rows() : n;  // rows sent by the gathers
    const Heads hd = heads(cp, pool);
    resize_buffers(padded, n, hd);
    run.slots(pool.page_size(), slots_);
    run.window_slots(pool.page_size(), window_slots_);
    const KvTables kv{slots_.data(), run.page_ids.data(), window_slots_.data(), run.window_page_ids.data()};
    AttentionArgs att = attention_args(paged_attention_args(run, pool), pool, hd, q_.data(), att_.data());

    // A context-parallel step runs the whole layers and sums nothing across the ranks.
    const std::vector<Qwen3MoeLayer>& layers = cp && !whole_layers_.empty() ? whole_layers_ : layers_;
    const bool sum_ffn = ffn_split_ && !cp;
    dispatch(EmbeddingArgs{embed_, run.tokens.data(), n, x_.data(), c.embed_scale});
    for (size_t l = 0; l < layers.size(); ++l) {
      const Qwen3MoeLayer& L = layers[l];
      const auto layer = static_cast<int64_t>(l);
      const Rows r{x_.data(), h_.data(), q_.data(), k_.data(), v_.data(), att_.data(), gate_.data(), up_.data(), n};
      attention(L, layer, hd, r, run.positions.data(), kv, att, pool, cp);
      if (hd.split) dispatch(AllReduceArgs{tp_.get(), h_.data(), n * c.dim});  // sum the heads' shares
      dispatch(AddArgs{x_.data(), h_.data(), n * c.dim, x_.data()});
      float* out = ffn(L, r);
      if (sum_ffn) dispatch(AllReduceArgs{tp_.get(), out, n * c.dim});  // sum the ranks' FFN shares
      dispatch(AddArgs{x_.data(), out, n * c.dim, x_.data()});
    }

    finish_logits(b, cp, logits);
  }

 private:
  // The heads a step runs: every head (context parallel, or attention replicated) or the rank's,
  // the latter out of a cache of every head when the prefill was context parallel.
  struct Heads {
    int64_t H, KH, q_dim, kv_dim, kv_off;
    bool split, every_head;
  };
  Heads heads(bool cp, const KvPool& pool) const {
    const ModelConfig& c = config();
    Heads h{};
    h.split = attn_ranks_ > 1 && !cp;
    h.H = h.split ? heads_ : c.n_heads;
    h.KH = h.split ? kv_heads_ : c.n_kv_heads;
    h.q_dim = h.H * c.head_dim;
    h.kv_dim = h.KH * c.head_dim;
    h.every_head = h.split && pool.layout().k_width != h.kv_dim;
    h.kv_off = h.every_head ? tp_->rank() * h.kv_dim : 0;
    return h;
  }

  // Rows [0, n) of the step buffers that one pass works on (a whole step, or one micro-batch,
  // rows [row0, row0 + n) of the step).
  struct Rows {
    float *x, *h, *q, *k, *v, *att, *gate, *up;
    int64_t n;
    int64_t row0 = 0;
  };

  // The step's LoRA updates of projections that share the input `in` (r's rows).
  void lora(const Qwen3MoeLayer& L, std::initializer_list<std::pair<LoraTarget, float*>> outs, const Rows& r, const float* in) {
    if (lora_on_) lora_.apply(L.index, outs, r.row0, r.n, in);
  }

  void resize_buffers(int64_t padded, int64_t n, const Heads& hd) {
    const ModelConfig& c = config();
    for (auto* v : {&x_, &h_}) resize(*v, padded * c.dim);
    resize(q_, n * hd.q_dim);
    resize(k_, padded * hd.kv_dim);
    resize(v_, padded * hd.kv_dim);
    resize(att_, n * hd.q_dim);
    resize(gate_, n * std::max(c.hidden_dim, c.dim));
    resize(up_, n * c.hidden_dim);
  }

  // q or k rows normalised in place, per head or over the whole projection (model/qk_norm.h).
  void qk_norm(float* t, const float* w, int64_t n, int64_t heads, int64_t full_heads) {
    qk_norm_.run(config(), t, w, n, heads, full_heads, tp_.get());
  }

  // Llama 4's q/k L2 norm: each of the `rows` head rows RMS-normed without a weight, in place.
  void l2_norm_heads(float* t, int64_t rows) {
    const ModelConfig& c = config();
    if (ones_.size() != static_cast<size_t>(c.head_dim)) ones_.assign(static_cast<size_t>(c.head_dim), 1.0f);
    dispatch(RmsNormArgs{t, ones_.data(), rows, c.head_dim, c.rms_eps, t});
  }

  // The batch's paged attention arguments (paged_attention_args) completed for these heads.
  AttentionArgs attention_args(AttentionArgs att, const KvPool& pool, const Heads& hd, float* q, float* out) const {
    const ModelConfig& c = config();
    att.q = q;
    att.n_heads = hd.H;
    att.n_kv_heads = hd.KH;
    att.head_dim = att.v_dim = c.head_dim;
    att.k_stride = att.v_stride = pool.layout().k_width;
    att.scale = c.attention_scale();
    att.out = out;
    return att;
  }

  // Layer L's attention for r's rows of x (writing their K/V): r.h = the attention output (this
  // rank's heads' share when split: the caller sums it across the ranks).
  void attention(const Qwen3MoeLayer& L, int64_t layer, const Heads& hd, const Rows& r, const int32_t* pos,
                 const KvTables& kv, AttentionArgs& att, KvPool& pool, bool cp) {
    const bool in_window = pool.in_window_blocks(layer);  // window trimming: the windowed layers' own blocks
    const int64_t* slots = in_window ? kv.window_slots : kv.slots;
    att.page_ids = in_window ? kv.window_pages : kv.pages;
    const ModelConfig& c = config();
    const int64_t n = r.n;
    const BlockQ8_0* hq = rmsnorm_for({r.x, L.attn_norm, n, c.dim, c.rms_eps, r.h}, {L.wq, L.wk, L.wv}, hq_);
    // K and V first: under context parallel every rank's rows travel while the queries are computed.
    dispatch(MatMulArgs{r.h, n, L.wk, L.bk, r.k, hq});
    dispatch(MatMulArgs{r.h, n, L.wv, L.bv, r.v, hq});
    lora(L, {{LoraTarget::K, r.k}, {LoraTarget::V, r.v}}, r, r.h);
    // (Hunyuan norms q and k after RoPE.)
    if (L.k_norm && !c.qk_norm_after_rope) qk_norm(r.k, L.k_norm, n, hd.KH, c.n_kv_heads);
    if (L.rotates) dispatch(RopeArgs{r.k, pos, n, hd.KH, c.head_dim, c.rot_dim, hd.kv_dim, inv_freq_at_, rope_mscale_, c.rope_style});
    if (L.k_norm && c.qk_norm_after_rope) qk_norm(r.k, L.k_norm, n, hd.KH, c.n_kv_heads);
    if (c.qk_l2_norm && L.rotates) l2_norm_heads(r.k, n * hd.KH);
    if (cp) cp_.start_kv(pool, layer, r.k, r.v);
    dispatch(MatMulArgs{r.h, n, L.wq, L.bq, r.q, hq});
    lora(L, {{LoraTarget::Q, r.q}}, r, r.h);
    if (cp) cp_.progress();
    if (L.q_norm && !c.qk_norm_after_rope) qk_norm(r.q, L.q_norm, n, hd.H, c.n_heads);
    if (L.rotates) dispatch(RopeArgs{r.q, pos, n, hd.H, c.head_dim, c.rot_dim, hd.q_dim, inv_freq_at_, rope_mscale_, c.rope_style});
    if (L.q_norm && c.qk_norm_after_rope) qk_norm(r.q, L.q_norm, n, hd.H, c.n_heads);
    if (c.qk_l2_norm && L.rotates) l2_norm_heads(r.q, n * hd.H);
    if (!L.rotates && c.nope_temp_floor > 0)  // Llama 4's NoPE layers: queries sharper further into the sequence
      for (int64_t i = 0; i < n; ++i) {
        const float f = c.nope_query_scale(pos[i]);
        for (int64_t j = 0; j < hd.q_dim; ++j) r.q[i * hd.q_dim + j] *= f;
      }
    if (cp) cp_.finish_kv(pool);  // every rank's rows
    else if (hd.every_head) every_head_.write(tp_.get(), pool, layer, slots, n, r.k, r.v, hd.kv_dim, hd.kv_dim);
    else pool.write(layer, slots, n, r.k, r.v);
    att.k_pool = kv_element(pool.k(layer), pool.dtype(), hd.kv_off);
    att.v_pool = kv_element(pool.v(layer), pool.dtype(), hd.kv_off);
    att.window = L.window;
    att.chunk = L.chunk;
    att.sinks = L.sinks;
    dispatch(att);
    dispatch(MatMulArgs{r.att, n, L.wo, L.bo, r.h});
    lora(L, {{LoraTarget::O, r.h}}, r, r.att);
  }

  // Layer L's FFN for r's rows of x: returns its output (r.gate or r.h; this rank's share of the
  // sum when the experts / FFN width are split).
  float* ffn(const Qwen3MoeLayer& L, const Rows& r) {
    const ModelConfig& c = config();
    const int64_t n = r.n;
    dispatch(RmsNormArgs{r.x, L.ffn_norm, n, c.dim, c.rms_eps, r.h});
    if (L.moe) {
      moe_.run(L.experts, c, r.h, n, r.gate);
      return r.gate;
    }
    dispatch(MatMulArgs{r.h, n, L.w_gate, nullptr, r.gate});
    dispatch(MatMulArgs{r.h, n, L.w_up, nullptr, r.up});
    lora(L, {{LoraTarget::Gate, r.gate}, {LoraTarget::Up, r.up}}, r, r.h);
    dispatch(SiluMulArgs{r.gate, r.up, n, L.ffn_width, 0, 0, r.gate});
    dispatch(MatMulArgs{r.gate, n, L.w_down, nullptr, r.h});
    lora(L, {{LoraTarget::Down, r.h}}, r, r.gate);
    return r.h;
  }

  // A step as two micro-batches A = tokens [0, n/2) and B = [n/2, n) whose all-reduces travel
  // while the other computes (--micro-batch-overlap; as the llama family's, model/llama.cpp):
  // per layer A's attention (its heads' sum started when split), B's attention, then A's FFN once
  // A's sum is in, its FFN sum started, and B's. With the experts partitioned and attention
  // replicated, the FFN sums are what travels: A's behind B's FFN and the next layer's attention.
  void forward_overlapped(const ForwardBatch& b, KvPool& pool, float* logits) {
    const ModelConfig& c = config();
    const bool on_device = device() != Device::CPU;
    FP_CHECK(pool.device() == device(), "the KV cache is on ", device_name(pool.device()), " but the model runs on ",
             device_name(device()));
    DeviceScope scope(device());
    const int64_t n = b.n_tokens();
    const Heads hd = heads(false, pool);
    resize_buffers(on_device ? 0 : n, on_device ? 0 : n, hd);
    // The step's rows: host vectors, or the device's activation slots.
    auto rows_of = [&](size_t slot, std::vector<float>& host, int64_t width) {
      return on_device ? act_.f32(slot, n * width) : host.data();
    };
    float *x = rows_of(0, x_, c.dim), *h = rows_of(1, h_, c.dim), *q = rows_of(2, q_, hd.q_dim);
    float *k = rows_of(3, k_, hd.kv_dim), *v = rows_of(4, v_, hd.kv_dim), *att = rows_of(5, att_, hd.q_dim);
    float *gate = rows_of(6, gate_, std::max(c.hidden_dim, c.dim)), *up = rows_of(7, up_, c.hidden_dim);
    FP_CHECK(b.feed_rows.empty(), "micro-batch overlap: a step with fed tokens (async scheduling) cannot be cut in two");
    overlap_.split(b, pool.page_size());
    // Each micro-batch's index arrays where the kernels read them, and the batch's logit rows.
    const StagedBatch whole = on_device ? stager_.stage(b, pool.page_size(), fed_ids()) : host_view(b);
    struct MicroBatch {
      Rows r;
      StagedBatch staged;
      const int64_t* slots;
      const int64_t* window_slots;
      AttentionArgs att;
      PendingSum sum;  // the heads' or the FFN shares' all-reduce
    } mb[2];
    for (int i = 0; i < 2; ++i) {
      const ForwardBatch& part = overlap_.parts[i];
      const int64_t r0 = overlap_.row0[i];
      MicroBatch& m = mb[i];
      m.r = Rows{x + r0 * c.dim,     h + r0 * c.dim,     q + r0 * hd.q_dim, k + r0 * hd.kv_dim,
                 v + r0 * hd.kv_dim, att + r0 * hd.q_dim, gate + r0 * std::max(c.hidden_dim, c.dim),
                 up + r0 * c.hidden_dim, part.n_tokens()};
      m.r.row0 = r0;
      m.staged = on_device ? part_stagers_[i].stage(part, pool.page_size()) : host_view(part);
      m.slots = on_device ? m.staged.slots : overlap_.slots[i].data();
      m.window_slots = on_device ? nullptr : overlap_.window_slots[i].data();
      m.att = attention_args(paged_attention_args(m.staged, pool), pool, hd, m.r.q, m.r.att);
    }
    const int64_t rows = whole.n_logits;
    float* out_logits = on_device ? act_.f32(8, rows * c.n_vocab) : logits;
    float* logit_h = on_device ? act_.f32(9, rows * c.dim) : nullptr;
    auto step = [&] {
      for (MicroBatch& m : mb) m.sum.reset();  // a recording abandoned midway may have left one in flight
      for (MicroBatch& m : mb) dispatch(EmbeddingArgs{embed_, m.staged.tokens, m.r.n, m.r.x, c.embed_scale});
      for (size_t l = 0; l < layers_.size(); ++l) {
        const Qwen3MoeLayer& L = layers_[l];
        for (MicroBatch& m : mb) {
          m.sum.add_into(m.r.x);  // the previous layer's FFN
          attention(L, static_cast<int64_t>(l), hd, m.r, m.staged.positions,
                    KvTables{m.slots, m.staged.page_ids, m.window_slots, m.staged.window_page_ids}, m.att, pool, false);
          if (tp_) tp_->progress();
          if (hd.split) m.sum.start(tp_.get(), m.r.h, m.r.n * c.dim);
          else dispatch(AddArgs{m.r.x, m.r.h, m.r.n * c.dim, m.r.x});
        }
        for (MicroBatch& m : mb) {
          m.sum.add_into(m.r.x);  // the attention's
          m.sum.start(tp_.get(), ffn(L, m.r), m.r.n * c.dim);
          if (tp_) tp_->progress();
        }
      }
      for (MicroBatch& m : mb) m.sum.add_into(m.r.x);
      if (!on_device || rows == 0) return;
      logit_rows_.run(x, n, c.dim, whole.logit_rows, rows, output_norm_, c.rms_eps, logit_h);
      output_.run(logit_h, rows, out_logits);
    };
    if (!on_device) {
      step();
      return finish_logits(b, false, logits);
    }
    // Decode shapes replay a recorded graph (its collectives' forks and joins too).
    graphs_.run(n, whole.n_seqs, rows, &pool, step, /*variant=*/1);
    deliver_logits(out_logits, rows, logits);
  }

  // The logits of the batch's logit rows (context parallel: from whichever rank's run holds them).
  void finish_logits(const ForwardBatch& b, bool cp, float* logits) {
    const ModelConfig& c = config();
    resize(rows_, static_cast<int64_t>(b.logit_rows.size()) * c.dim);
    if (!cp) keep_final_hidden(x_.data(), b.n_tokens(), output_norm_);
    const int64_t rows =
        cp ? cp_.gather_logit_rows(x_.data(), c.dim, rows_.data()) : b.gather_logit_rows(x_.data(), c.dim, rows_.data());
    if (rows == 0) return;
    dispatch(RmsNormArgs{rows_.data(), output_norm_, rows, c.dim, c.rms_eps, rows_.data()});
    output_.run(rows_.data(), rows, logits);
  }

  // On a device: as forward's plain and context-parallel paths (tensor, expert or context
  // parallel across GPU ranks, the sums and exchanges through the device's collectives) with the
  // buffers on the device, the batch staged there, and the step's device work recorded and
  // replayed for decode shapes.
  void forward_on_device(const ForwardBatch& b, KvPool& pool, float* logits) {
    const ModelConfig& c = config();
    FP_CHECK(pool.device() == device(), "the KV cache is on ", device_name(pool.device()), " but the model runs on ",
             device_name(device()));
    DeviceScope scope(device());  // every op below runs on the model's device
    const bool cp = context_parallel_ && ContextParallelStep::applies(b, tp_size());
    if (cp) cp_.begin(tp_.get(), b, pool.page_size(), pool.device());
    const ForwardBatch& run = cp ? cp_.run() : b;
    const int64_t n = run.n_tokens(), padded = cp ? cp_.padded_rows() : n;  // rows sent by the gathers
    const Heads hd = heads(cp, pool);
    const Rows r{act_.f32(0, padded * c.dim),     act_.f32(1, padded * c.dim),     act_.f32(2, n * hd.q_dim),
                 act_.f32(3, padded * hd.kv_dim), act_.f32(4, padded * hd.kv_dim), act_.f32(5, n * hd.q_dim),
                 act_.f32(6, n * std::max(c.hidden_dim, c.dim)),                   act_.f32(7, n * c.hidden_dim), n};
    const StagedBatch sb = stager_.stage(run, pool.page_size(), cp ? nullptr : fed_ids());
    AttentionArgs att = attention_args(paged_attention_args(sb, pool), pool, hd, r.q, r.att);
    // A context-parallel step runs the whole layers and sums nothing across the ranks.
    const std::vector<Qwen3MoeLayer>& layers = cp && !whole_layers_.empty() ? whole_layers_ : layers_;
    const bool sum_ffn = ffn_split_ && !cp;
    const auto rows = static_cast<int64_t>(b.logit_rows.size());
    float* out_logits = act_.f32(8, rows * c.n_vocab);
    float* logit_h = act_.f32(9, rows * c.dim);
    auto step = [&] {
      dispatch(EmbeddingArgs{embed_, sb.tokens, n, r.x, c.embed_scale});
      for (size_t l = 0; l < layers.size(); ++l) {
        const Qwen3MoeLayer& L = layers[l];
        attention(L, static_cast<int64_t>(l), hd, r, sb.positions, KvTables{sb.slots, sb.page_ids}, att, pool, cp);
        if (hd.split) dispatch(AllReduceArgs{tp_.get(), r.h, n * c.dim});  // sum the heads' shares
        dispatch(AddArgs{r.x, r.h, n * c.dim, r.x});
        float* out = ffn(L, r);
        if (sum_ffn) dispatch(AllReduceArgs{tp_.get(), out, n * c.dim});  // sum the ranks' FFN shares
        dispatch(AddArgs{r.x, out, n * c.dim, r.x});
      }
      if (rows == 0) return;
      if (cp) {  // the logit rows from whichever rank's run holds them
        cp_.gather_logit_rows(r.x, c.dim, logit_h);
        dispatch(RmsNormArgs{logit_h, output_norm_, rows, c.dim, c.rms_eps, logit_h});
      } else {
        logit_rows_.run(r.x, n, c.dim, sb.logit_rows, rows, output_norm_, c.rms_eps, logit_h);
      }
      output_.run(logit_h, rows, out_logits);
    };
    if (cp) {
      Ledger::global().note_step("eager: context-parallel prefill");
      step();
    } else {
      graphs_.run(n, sb.n_seqs, rows, &pool, step);
    }
    deliver_logits(out_logits, rows, logits);
  }

  // Uploads every weight the forward reads and points the layers at the device copies.
  void place_on_device() {
    const ModelConfig& c = config();
    DeviceWeights& dw = weights_;
    embed_ = dw.tensor(embed_);
    output_.weight = dw.tensor(output_.weight);
    output_norm_ = dw.floats(output_norm_, c.dim);
    // The rank's layers and, with context-parallel prefill, the whole layers too (separate copies
    // on a GPU, where on the host they share the file's bytes).
    for (std::vector<Qwen3MoeLayer>* layers : {&layers_, &whole_layers_})
      for (Qwen3MoeLayer& L : *layers) {
        L.attn_norm = dw.floats(L.attn_norm, c.dim);
        L.ffn_norm = dw.floats(L.ffn_norm, c.dim);
        if (L.q_norm) L.q_norm = dw.floats(L.q_norm, c.head_dim);
        if (L.k_norm) L.k_norm = dw.floats(L.k_norm, c.head_dim);
        if (L.bq) {  // this rank's heads' share (every head in the whole layers)
          const bool whole = layers == &whole_layers_;
          L.bq = dw.floats(L.bq, (whole ? c.n_heads : heads_) * c.head_dim);
          L.bk = dw.floats(L.bk, (whole ? c.n_kv_heads : kv_heads_) * c.head_dim);
          L.bv = dw.floats(L.bv, (whole ? c.n_kv_heads : kv_heads_) * c.head_dim);
        }
        for (const Tensor** w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) *w = dw.tensor(*w);
        if (L.moe) L.experts = place_moe_layer(L.experts, dw);
      }
    inv_freq_at_ = dw.floats(inv_freq_.data(), static_cast<int64_t>(inv_freq_.size()));
    log_info("placed the weights on ", device_name(device()), ": ", static_cast<double>(dw.bytes()) / (1 << 20), " MiB");
  }

  static void resize(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  }

  const Tensor* embed_ = nullptr;
  VocabParallelOutput output_;  // the output projection, split by vocabulary rows across the ranks
  const float* output_norm_ = nullptr;
  std::vector<Qwen3MoeLayer> layers_;
  Qwen3MoeLayer mtp_layer_{};  // with the draft layer loaded (Model::has_mtp): its decoder layer
  MtpHead mtp_head_;           // and what goes in and out of it
  std::vector<Qwen3MoeLayer> whole_layers_;  // context-parallel prefill with EP or TP decode: the unsplit layers
  std::vector<float> inv_freq_;
  const float* inv_freq_at_ = nullptr;  // inv_freq_ where the kernels read it (host or device)
  float rope_mscale_ = 1.0f;  // YaRN's attention factor (1 without YaRN)
  std::vector<float> x_, h_, q_, k_, v_, att_, gate_, up_, rows_;
  std::vector<BlockQ8_0> hq_;  // the normalised input quantized once for Q8_0/Q4_0 matmuls
  std::vector<int64_t> slots_, window_slots_;
  MicroBatchSplit overlap_;               // --micro-batch-overlap: the two micro-batches
  MoeBlock moe_{device()};
  DeviceWeights weights_{device()};  // --device cuda: the weights' device copies
  Activations act_{device()};        // --device cuda: x, h, q, k, v, attention out, gate, up, logits
  BatchStager stager_{device()};
  BatchStager part_stagers_[2] = {BatchStager(device()), BatchStager(device())};  // --micro-batch-overlap's halves
  StepGraphs graphs_{device(), file_->device_graphs};
  LogitRowGather logit_rows_{device()};
  int attn_ranks_ = 1;                // ranks the attention heads are split across (1: replicated)
  bool ffn_split_ = false;            // the FFN weights are split across the ranks (an all-reduce per layer)
  bool context_parallel_ = false;     // prefill batches run context parallel
  ContextParallelStep cp_;
  EveryHeadKvWriter every_head_;      // TP decode over the cache of every head a CP prefill wrote
  int64_t heads_ = 0, kv_heads_ = 0;  // this rank's query and KV heads
  std::deque<Tensor> shards_;         // this rank's weight slices (stable addresses)
  QkNorm qk_norm_;                    // q/k norms (per head, or over the whole projection across ranks)
  std::vector<float> ones_;           // the weight of Llama 4's q/k L2 norm
  LoraSet lora_;                      // LoRA adapters (add_lora)
  bool lora_on_ = false;              // some row of this step runs with an adapter
};

std::unique_ptr<Model> make_gqa_moe(std::shared_ptr<ModelFile> f, std::shared_ptr<Communicator> comm) {
  return std::make_unique<Qwen3MoeModel>(std::move(f), std::move(comm));
}
const bool qwen3_moe_registered = register_sharded_architecture("qwen3moe", make_gqa_moe, true);
const bool glm4_moe_registered = register_sharded_architecture("glm4moe", make_gqa_moe, true);
const bool mixtral_registered = register_sharded_architecture("mixtral", make_gqa_moe, true);
// Qwen2-MoE: on the CPU (the CUDA expert kernel does not take its shared expert's sigmoid gate yet).
const bool qwen2_moe_registered = register_sharded_architecture("qwen2moe", make_gqa_moe, false);
const bool granite_moe_registered = register_sharded_architecture("granitemoe", make_gqa_moe, false);
const bool ernie_moe_registered = register_sharded_architecture("ernie4_5-moe", make_gqa_moe, false);
const bool hunyuan_moe_registered = register_sharded_architecture("hunyuan-moe", make_gqa_moe, false);
// Llama 4: on the CPU (the device attention kernels take no chunks yet).
const bool llama4_registered = register_sharded_architecture("llama4", make_gqa_moe, false);
// MiniMax-M2: on the CPU (the device path norms q/k per head only).
const bool minimax_m2_registered = register_sharded_architecture("minimax-m2", make_gqa_moe, false);
// gpt-oss: on the CPU (its sinks, windows and expert biases are not on a device yet; build_model
// says so), on one rank or split (experts partitioned; attention heads split or replicated).
const bool gpt_oss_registered = register_sharded_architecture("gpt-oss", make_gqa_moe, false);

}  // namespace
}  // namespace fp
