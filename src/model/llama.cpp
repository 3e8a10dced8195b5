// model/llama.cpp — the Llama-family architecture: Llama (GQA, RoPE with linear / llama3
// scaling, tied or untied output), Qwen2 (q/k/v bias), Qwen3 (per-head q/k RMSNorm), Phi-3 /
// Phi-4 (fused q/k/v and gate/up matrices, split into row views at load; partial rotary),
// SmolLM3 (no RoPE on every fourth layer), OLMo 2 (norms after the sublayers only, q/k norms over
// the whole projection), Gemma 2
// (a norm after the attention and the FFN too, GeGLU, embeddings times sqrt(dim), every other
// layer sliding-window, scores and logits soft-capped) and Gemma 3 (the same with q/k norms and
// without the caps, five sliding-window layers with their own RoPE base to each global one),
// GLM-4-0414 (Gemma 2's four norms per layer with SwiGLU, fused gate/up, q/k/v biases, the first
// half of each head rotated in adjacent pairs), Granite 3.x (Llama with multipliers on the
// embeddings, the scores, the sublayer outputs (folded into the embedding scale and the norms'
// eps, config.h) and the logits (folded into the output norm)). Gemma, OLMo 2, GLM-4 and Granite
// run on the CPU (one rank or several).
// Every computation goes through the op registry (kernels/ops.h).
//
// Tensor parallel (Megatron-style, when built with a communicator of several ranks): each rank
// holds the heads [rank * n_heads / tp, ...) of q and their KV heads of k/v (row slices: views
// into the file), the matching columns of attn_output (copied), a block-aligned share of the FFN
// width in gate/up (row views) and down (copied columns). Attention and FFN then produce partial
// sums of the residual update; one all-reduce after attn_output and one after ffn_down per layer
// complete them. Embedding and norms are replicated on every rank; the output projection is split
// by vocabulary rows on the CPU (each rank computes its slice of the logits, all-gathered), so
// every rank ends with the same logits and reads only its share of the largest matrix per token.
//
// Prefill context parallel (--prefill-context-parallel-size N, CPU): a batch that holds prefill
// tokens is cut into N runs of consecutive tokens; each rank runs its run through every layer
// with the whole weights, all-gathers the K/V rows of the layer so that its cache holds the whole
// batch, and attends its queries over them; the last hidden rows are all-gathered for the logits.
// Decode batches keep the tensor-parallel layout (or run whole when tp = 1): the two phases use
// different layouts on the same ranks. Every rank then keeps every KV head: a TP step reads its
// heads out of the whole cache and all-gathers its new K/V rows to write every head.
//
// Micro-batch overlap (--micro-batch-overlap N, tensor parallel on CPU ranks): a step of at
// least N tokens runs as two micro-batches, and each all-reduce is started (non-blocking) so that
// it travels while the other micro-batch computes (forward_overlapped).
//
// On another device (--device cuda) the weights are uploaded once at load (DeviceWeights), the
// activations and the KV cache live there, the batch's index arrays are staged there each step,
// and every op dispatches to that device's kernels; only the logits come back to the host.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "kernels/ledger.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "model/context_parallel.h"
#include "model/lora.h"
#include "model/micro_batch.h"
#include "model/qk_norm.h"
#include "model/model.h"
#include "model/repack.h"
#include "model/vocab_parallel.h"
#include "parallel/collectives.h"
#include "parallel/shard.h"

namespace fp {
namespace {

struct LlamaLayer {
  const float* attn_norm;
  const float* ffn_norm;
  const Tensor *wq, *wk, *wv, *wo, *w_gate, *w_up, *w_down;
  const float *bq = nullptr, *bk = nullptr, *bv = nullptr;       // Qwen2
  const float *q_norm = nullptr, *k_norm = nullptr;              // Qwen3, Gemma 3, [head_dim]
  // Gemma 3: norms of the attention's and the FFN's outputs before their residual adds, the
  // layer's sliding window (0: global) and its RoPE frequencies (null: the model's).
  const float *post_attn_norm = nullptr, *post_ffn_norm = nullptr;
  int64_t window = 0;
  const float* inv_freq = nullptr;
  bool rope = true;  // false: q and k are not rotated (SmolLM3's NoPE layers)
  int64_t ffn_width = 0;  // this rank's share of the FFN width (hidden_dim on one rank)
  int64_t ffn_begin = 0;  // ... starting at this row of gate / up (column of down)
  int64_t index = 0;      // the layer's number
  // On a device, where the parts could be stacked (DeviceWeights::stack_rows): [wq; wk; wv] and
  // [w_gate; w_up] as one matrix each (the parts are views of their rows), and bq|bk|bv. A
  // one-row step runs one matmul for each, writing the parts' outputs side by side.
  const Tensor *wqkv = nullptr, *w_gate_up = nullptr;
  const float* bqkv = nullptr;
};

class LlamaModel : public Model {
 public:
  LlamaModel(std::shared_ptr<ModelFile> f, std::shared_ptr<Communicator> tp) : Model(std::move(f)) {
    tp_ = std::move(tp);
    const ModelConfig& c = config();
    ModelFile& mf = *file_;
    const int64_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim;
    const int64_t v_dim = c.n_kv_heads * c.v_head_dim, o_in = c.n_heads * c.v_head_dim;
    FP_CHECK(c.v_head_dim == c.head_dim, mf.path, ": ", c.arch, " needs value_length == key_length");
    const int ranks = parallel().tp > 1 ? tp_size() : 1, rank = tp_ ? tp_->rank() : 0;  // tensor-parallel ranks
    if (c.post_norms || c.gelu_ffn || c.sliding_window > 0 || c.attn_softcap > 0 || c.final_softcap > 0 || !c.pre_norms)
      FP_CHECK(device() == Device::CPU, mf.path, ": ", c.arch,
               " runs on the CPU here (its sandwich norms, GeGLU, sliding windows and soft-capping are not in the ",
               "device path yet)");
    context_parallel_ = parallel().cp > 1;
    // The whole weights for context-parallel prefill and the TP slices for decode share bytes,
    // so neither is repacked in place (Q8_0 stays in the file's layout).
    if (context_parallel_ && ranks > 1) file_->repack_weights = false;
    FP_CHECK(c.n_heads % ranks == 0 && c.n_kv_heads % ranks == 0, mf.path, ": --tensor-parallel-size ", ranks,
             " must divide the attention heads (", c.n_heads, ") and the KV heads (", c.n_kv_heads, ")");
    heads_ = c.n_heads / ranks;
    kv_heads_ = c.n_kv_heads / ranks;
    embed_ = &mf.get("token_embd.weight", {c.n_vocab, c.dim});
    output_norm_ = norm_f32("output_norm.weight", c.dim);
    if (c.logit_scale != 1.0f) {  // Granite: logits / logit_scale, folded into the output norm's weights
      float* scaled = mf.own_f32(static_cast<size_t>(c.dim));
      for (int64_t i = 0; i < c.dim; ++i) scaled[i] = output_norm_[i] / c.logit_scale;
      output_norm_ = scaled;
    }
    FP_CHECK(c.residual_scale == 1.0f || c.residual_folded, mf.path, ": the residual multiplier was not folded (config.h)");
    const Tensor* output = c.tied_output ? embed_ : &mf.get("output.weight", {c.n_vocab, c.dim});
    for (int64_t l = 0; l < c.n_layers; ++l) {
      std::string p = "blk." + std::to_string(l) + ".";
      LlamaLayer L{};
      if (c.pre_norms) {
        L.attn_norm = norm_f32(p + "attn_norm.weight", c.dim);
        L.ffn_norm = norm_f32(p + "ffn_norm.weight", c.dim);
      }
      if (c.post_norms) {
        L.post_attn_norm = norm_f32(p + "post_attention_norm.weight", c.dim);
        L.post_ffn_norm = norm_f32(p + "post_ffw_norm.weight", c.dim);
      }
      L.window = c.window_of(l);
      L.rope = c.rotates(l);
      L.wq = &mf.get(p + "attn_q.weight", {q_dim, c.dim});
      L.wk = &mf.get(p + "attn_k.weight", {kv_dim, c.dim});
      L.wv = &mf.get(p + "attn_v.weight", {v_dim, c.dim});
      L.wo = &mf.get(p + "attn_output.weight", {c.dim, o_in});
      L.w_gate = &mf.get(p + "ffn_gate.weight", {c.hidden_dim, c.dim});
      L.w_up = &mf.get(p + "ffn_up.weight", {c.hidden_dim, c.dim});
      L.w_down = &mf.get(p + "ffn_down.weight", {c.dim, c.hidden_dim});
      if (c.qkv_bias) {
        L.bq = vec_f32(p + "attn_q.bias", q_dim);
        L.bk = vec_f32(p + "attn_k.bias", kv_dim);
        L.bv = vec_f32(p + "attn_v.bias", v_dim);
      }
      if (c.qk_norm) {
        L.q_norm = norm_f32(p + "attn_q_norm.weight", c.qk_norm_full ? q_dim : c.head_dim);
        L.k_norm = norm_f32(p + "attn_k_norm.weight", c.qk_norm_full ? kv_dim : c.head_dim);
      }
      L.ffn_width = c.hidden_dim;
      L.index = l;
      if (context_parallel_ && ranks > 1) whole_layers_.push_back(L);
      if (ranks > 1) shard_layer(L, rank, ranks);
      layers_.push_back(L);
    }
    // The output projection's vocabulary rows, split across the tensor-parallel ranks.
    output_.init(output, ranks > 1 ? tp_.get() : nullptr, shards_, mf.path, device());
    output_.softcap = c.final_softcap;
    output_.hidden_scale = c.logit_scale;  // the hidden rows without the 1 / logit_scale the output norm carries
    output_head_ = &output_;
    // Q8_0 matmul weights into the CPU kernels' interleaved layout, after sharding (slices of
    // this rank only). The embedding reads the repacked table too when the output is tied.
    if (file_->repack_weights) {
      WeightRepacker rp(mf);
      output_.weight = rp.repack(output_.weight);
      if (c.tied_output && !output_.split()) embed_ = output_.weight;
      for (LlamaLayer& L : layers_)
        for (const Tensor** w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) *w = rp.repack(*w);
      rp.report();
    }
    inv_freq_ = c.rope_inv_freq();
    // LongRoPE's and YaRN's cos/sin factor (1 + 0.1 ln(factor) unless the config gives one).
    if (c.rope_scaling.type == "longrope" || c.rope_scaling.type == "yarn") rope_mscale_ = c.rope_scaling.attn_factor;
    if (const Tensor* rf = mf.find("rope_freqs.weight")) {  // GGUF llama3: per-frequency divisors
      FP_CHECK(rf->numel() == c.rot_dim / 2, mf.path, ": rope_freqs.weight has ", rf->numel(), " values, expected ", c.rot_dim / 2);
      std::vector<float> factors(inv_freq_.size());
      dequantize_row(rf->dtype, rf->data, factors.data(), rf->numel());
      for (size_t i = 0; i < inv_freq_.size(); ++i) inv_freq_[i] /= factors[i];
    }
    inv_freq_at_ = inv_freq_.data();
    if (c.rope_theta_swa > 0) {  // Gemma 3: the sliding layers' own base
      inv_freq_swa_ = c.rope_inv_freq_swa();
      // (and the whole layers a context-parallel prefill runs beside tensor-parallel decode)
      for (auto* set : {&layers_, &whole_layers_})
        for (LlamaLayer& L : *set)
          if (L.window > 0) L.inv_freq = inv_freq_swa_.data();
    }
    if (device() != Device::CPU) place_on_device();
  }

  // This rank's KV heads only; every head with context-parallel prefill.
  KvLayout kv_layout() const override {
    const ModelConfig& c = config();
    const int64_t h = context_parallel_ ? c.n_kv_heads : kv_heads_;
    return KvLayout{c.n_layers, h * c.head_dim, h * c.v_head_dim};
  }

  // An adapter, cut to this rank's share as the weights are (see shard_layer): B's rows for
  // the column-split projections (q, k, v, gate, up), A's columns for the row-split ones (o, down).
  int32_t add_lora(const LoraAdapterWeights& ad) override {
    const ModelConfig& c = config();
    check_lora_runs_here(ad, context_parallel_);
    const int rank = tp_ ? tp_->rank() : 0;
    std::vector<LoraMatrices> mine;
    for (const LoraMatrices& whole : ad.matrices) {
      const LlamaLayer& L = layers_[static_cast<size_t>(whole.layer)];
      LoraShare share;
      if (heads_ < c.n_heads)  // split across the ranks
        share = {rank * heads_ * c.head_dim,   heads_ * c.head_dim,   rank * kv_heads_ * c.head_dim, kv_heads_ * c.head_dim,
                 rank * heads_ * c.v_head_dim, heads_ * c.v_head_dim, L.ffn_begin,                   L.ffn_width};
      mine.push_back(lora_share(whole, share));
    }
    const int32_t id = lora_added();
    FP_CHECK(lora_.add(ad.name, std::move(mine), c.n_layers) == id, "LoRA adapter ids out of step");
    return id;
  }
  void drop_lora(int32_t id) override { lora_.remove(id); }

  void forward(const ForwardBatch& b, KvPool& pool, float* logits) override {
    const ModelConfig& c = config();
    check_batch(b, pool);
    const int64_t n = b.n_tokens();
    if (n <= 0) return;
    lora_on_ = lora_.size() > 0 && lora_.begin(b);  // rows by adapter (add_lora refuses context parallel)
    // Prefill phase: context parallel when every rank gets at least one token.
    if (context_parallel_ && ContextParallelStep::applies(b, tp_size())) return forward_context_parallel(b, pool, logits);
    const bool tp = heads_ < c.n_heads;  // attention heads split across the ranks
    const int64_t overlap_min = file_->micro_batch_overlap;
    if (tp && overlap_min > 0 && n >= std::max<int64_t>(overlap_min, 2)) return forward_overlapped(b, pool, logits);
    // Per-rank widths: this rank's KV heads (the whole model on one rank).
    const int64_t kv_dim = kv_heads_ * c.head_dim, v_dim = kv_heads_ * c.v_head_dim;
    FP_CHECK(pool.device() == device(), "the KV cache is on ", device_name(pool.device()), " but the model runs on ",
             device_name(device()));
    DeviceScope scope(device());  // every op below runs on the model's device
    const StepBuffers buf = step_buffers(n);  // named pointers (lambdas below capture them)
    float *x = buf.x, *h = buf.h, *q = buf.q, *k = buf.k, *v = buf.v, *att_out = buf.att_out, *gate = buf.gate, *up = buf.up;
    const StagedBatch sb = stager_.stage(b, pool.page_size(), fed_ids());
    const int32_t* pos = sb.positions;

    AttentionArgs att = paged_attention_args(sb, pool);
    att.q = q;
    att.n_heads = heads_;
    att.n_kv_heads = kv_heads_;
    att.head_dim = c.head_dim;
    att.v_dim = c.v_head_dim;
    // This rank's heads of the cache: all of it, or (context parallel) a slice of every row.
    att.k_stride = pool.layout().k_width;
    att.v_stride = pool.layout().v_width;
    const bool every_head = pool.layout().k_width != kv_dim;  // a TP step over a cache of every head
    const int64_t k_off = every_head ? tp_->rank() * kv_dim : 0, v_off = every_head ? tp_->rank() * v_dim : 0;
    att.scale = c.attention_scale();
    att.softcap = c.attn_softcap;
    att.out = att_out;

    const int64_t rows = sb.n_logits;
    float* out_logits = device() == Device::CPU ? logits : act_.f32(8, rows * c.n_vocab);
    // Every op of the step, on the device: replayed as one recorded graph for repeated decode shapes.
    graphs_.run(n, sb.n_seqs, rows, &pool, [&] {
      dispatch(EmbeddingArgs{embed_, sb.tokens, n, x, c.embed_scale});
      // Each residual add is fused into the norm after it (x += h; h = norm(x): one pass):
      // `residual` is the h the next norm adds to x first; the last one is added at the end.
      const float* residual = nullptr;
      for (size_t l = 0; l < layers_.size(); ++l) {
        const LlamaLayer& L = layers_[l];
        attention_inputs(L, x, h, n, heads_, kv_heads_, pos, q, k, v, nullptr, residual);
        const bool in_window = pool.in_window_blocks(static_cast<int64_t>(l));  // window trimming
        if (every_head) cp_.every_head.write(tp_.get(), pool, static_cast<int64_t>(l), sb.slots, n, k, v, kv_dim, v_dim);
        else pool.write(static_cast<int64_t>(l), sb.slots_for(in_window), n, k, v);
        att.page_ids = sb.pages_for(in_window);
        att.k_pool = kv_element(pool.k(static_cast<int64_t>(l)), pool.dtype(), k_off);
        att.v_pool = kv_element(pool.v(static_cast<int64_t>(l)), pool.dtype(), v_off);
        att.window = L.window;
        dispatch(att);
        dispatch(MatMulArgs{att_out, n, L.wo, nullptr, h});
        lora(L, {{LoraTarget::O, h}}, 0, n, att_out);
        if (tp) dispatch(AllReduceArgs{tp_.get(), h, n * c.dim});  // sum the heads' shares
        if (L.post_attn_norm) dispatch(RmsNormArgs{h, L.post_attn_norm, n, c.dim, c.rms_eps, h});
        ffn_share(L, x, h, gate, up, n, h);                          // x += h first (fused)
        if (tp) dispatch(AllReduceArgs{tp_.get(), h, n * c.dim});  // sum the ranks' FFN shares
        if (L.post_ffn_norm) dispatch(RmsNormArgs{h, L.post_ffn_norm, n, c.dim, c.rms_eps, h});
        residual = h;
      }
      if (residual) dispatch(AddArgs{x, residual, n * c.dim, x});
      // Final norm and output projection, only for the rows whose logits are wanted (gathered by
      // the embedding op over x seen as a [n, dim] table).
      if (rows == 0) return;
      logit_rows_.run(x, n, c.dim, sb.logit_rows, rows, output_norm_, c.rms_eps, h);
      output_.run(h, rows, out_logits);
    });
    if (device() != Device::CPU) deliver_logits(out_logits, rows, logits);
  }

 private:
  // A step's activations for n rows, this rank's widths: x, h [n, dim], q, k, v, the attention
  // output, and the FFN's gate and up [n, widest FFN share].
  struct StepBuffers {
    float *x, *h, *q, *k, *v, *att_out, *gate, *up;
  };
  StepBuffers step_buffers(int64_t n) {
    const ModelConfig& c = config();
    int64_t ffn = 0;  // the widest FFN share of the layers (their weight types may differ)
    for (const LlamaLayer& L : layers_) ffn = std::max(ffn, L.ffn_width);
    // q, k, v one after another in one buffer, and gate, up likewise: for one row they are the
    // outputs of the stacked matrices (wqkv, w_gate_up) side by side.
    const int64_t q_dim = heads_ * c.head_dim, kv_dim = kv_heads_ * c.head_dim, v_dim = kv_heads_ * c.v_head_dim;
    float* qkv = act_.f32(2, n * (q_dim + kv_dim + v_dim));
    float* gate_up = act_.f32(6, 2 * n * ffn);
    return {act_.f32(0, n * c.dim), act_.f32(1, n * c.dim), qkv, qkv + n * q_dim, qkv + n * (q_dim + kv_dim),
            act_.f32(5, n * heads_ * c.v_head_dim), gate_up, gate_up + n * ffn};
  }

  // Layer L's attention inputs for n rows of x (h receives the normalised rows): q [n, heads *
  // head_dim], k and v [n, kv_heads * head_dim] with biases, q/k norms and RoPE at positions pos.
  // K and V come first: `kv_ready` (when given) runs once they are final, before the queries'
  // work, so that a K/V exchange it starts travels behind it (context-parallel prefill).
  // With `residual`, x += residual first, fused into the norm.
  void attention_inputs(const LlamaLayer& L, float* x, float* h, int64_t n, int64_t heads, int64_t kv_heads,
                        const int32_t* pos, float* q, float* k, float* v,
                        const std::function<void()>& kv_ready = nullptr, const float* residual = nullptr,
                        int64_t row0 = 0) {
    const ModelConfig& c = config();
    const float* inv_freq = L.inv_freq ? L.inv_freq : inv_freq_at_;
    // A layer with its own frequencies rotates unscaled (rope_inv_freq_swa): no YaRN cos/sin factor.
    const float mscale = L.inv_freq ? 1.0f : rope_mscale_;
    const uint16_t* hb = nullptr;
    const BlockQ8_0* hq = nullptr;
    if (L.attn_norm) {
      RmsNormArgs norm = with_residual({x, L.attn_norm, n, c.dim, c.rms_eps, h}, x, residual);
      hb = norm.bf16 = bf16_copy(n, {L.wq, L.wk, L.wv});
      hq = rmsnorm_for(norm, {L.wq, L.wk, L.wv}, hq_);
    } else {
      no_pre_norm(x, h, n, residual);
    }
    // One row, q, k, v side by side (step_buffers): one matmul over the stacked matrices, and
    // q's heads and k's rotated in one call.
    if (n == 1 && L.wqkv && !kv_ready && !lora_on_ && k == q + heads * c.head_dim && v == k + kv_heads * c.head_dim) {
      dispatch(MatMulArgs{h, n, L.wqkv, L.bqkv, q, hq});
      const bool norm_first = c.qk_norm && !c.qk_norm_after_rope, norm_after = c.qk_norm && c.qk_norm_after_rope;
      if (norm_first) qk_norm(k, L.k_norm, n, kv_heads, c.n_kv_heads);
      if (norm_first) qk_norm(q, L.q_norm, n, heads, c.n_heads);
      const int64_t qk_heads = heads + kv_heads;
      if (L.rope) dispatch(RopeArgs{q, pos, n, qk_heads, c.head_dim, c.rot_dim, qk_heads * c.head_dim, inv_freq, mscale, c.rope_style});
      if (norm_after) qk_norm(k, L.k_norm, n, kv_heads, c.n_kv_heads);
      if (norm_after) qk_norm(q, L.q_norm, n, heads, c.n_heads);
      return;
    }
    dispatch(MatMulArgs{h, n, L.wk, L.bk, k, hq, hb});
    dispatch(MatMulArgs{h, n, L.wv, L.bv, v, hq, hb});
    lora(L, {{LoraTarget::K, k}, {LoraTarget::V, v}}, row0, n, h);
    const bool norm_first = c.qk_norm && !c.qk_norm_after_rope, norm_after = c.qk_norm && c.qk_norm_after_rope;
    if (norm_first) qk_norm(k, L.k_norm, n, kv_heads, c.n_kv_heads);
    if (L.rope) dispatch(RopeArgs{k, pos, n, kv_heads, c.head_dim, c.rot_dim, kv_heads * c.head_dim, inv_freq, mscale, c.rope_style});
    if (norm_after) qk_norm(k, L.k_norm, n, kv_heads, c.n_kv_heads);
    if (kv_ready) kv_ready();
    progress();
    dispatch(MatMulArgs{h, n, L.wq, L.bq, q, hq, hb});
    lora(L, {{LoraTarget::Q, q}}, row0, n, h);
    progress();
    if (norm_first) qk_norm(q, L.q_norm, n, heads, c.n_heads);
    if (L.rope) dispatch(RopeArgs{q, pos, n, heads, c.head_dim, c.rot_dim, heads * c.head_dim, inv_freq, mscale, c.rope_style});
    if (norm_after) qk_norm(q, L.q_norm, n, heads, c.n_heads);
  }

  // x += FFN(RMSNorm(x)) for n rows (h, gate, up: scratch); with `sum_ranks` the ranks' partial
  // FFN outputs are all-reduced before the add (tensor parallel).
  void ffn_residual(const LlamaLayer& L, float* x, float* h, float* gate, float* up, int64_t n, bool sum_ranks) {
    const ModelConfig& c = config();
    ffn_share(L, x, h, gate, up, n);
    if (sum_ranks) dispatch(AllReduceArgs{tp_.get(), h, n * c.dim});
    if (L.post_ffn_norm) dispatch(RmsNormArgs{h, L.post_ffn_norm, n, c.dim, c.rms_eps, h});
    dispatch(AddArgs{x, h, n * c.dim, x});
  }

  // Where a device's GEMMs on BF16 weights follow an op, the op also writes its output as BF16
  // (RmsNormArgs / SiluMulArgs::bf16) and the matmuls take it (MatMulArgs::xb) rather than each
  // converting x again: on a device, more rows than the GEMV takes (8), every weight BF16. The
  // buffer: n rows of the widest activation, so it is allocated once per n; one op's copy is
  // read by the matmuls right after it, before the next op writes the next. Null: not worth it.
  uint16_t* bf16_copy(int64_t n, std::initializer_list<const Tensor*> ws) {
    if (device() == Device::CPU || n <= 8) return nullptr;
    for (const Tensor* w : ws)
      if (!w || w->dtype != DType::BF16) return nullptr;
    int64_t width = config().dim;
    for (const LlamaLayer& L : layers_) width = std::max(width, L.ffn_width);
    return reinterpret_cast<uint16_t*>(act_.f32(11, (n * width + 1) / 2));
  }

  // q or k rows normalised in place, per head or over the whole projection (model/qk_norm.h).
  void qk_norm(float* t, const float* w, int64_t n, int64_t heads, int64_t full_heads) {
    qk_norm_.run(config(), t, w, n, heads, full_heads, tp_.get());
  }

  // A sublayer without a norm before it (OLMo 2): x += residual, and h = x, its input (the
  // host path only; the model refuses devices).
  void no_pre_norm(float* x, float* h, int64_t n, const float* residual) {
    const int64_t len = n * config().dim;
    if (residual) dispatch(AddArgs{x, residual, len, x});
    std::memcpy(h, x, static_cast<size_t>(len) * sizeof(float));
  }

  // The norm's arguments with x += residual fused in (x, the norm's input, is written); none: as
  // they are.
  static RmsNormArgs with_residual(RmsNormArgs a, float* x, const float* residual) {
    if (residual) {
      a.add = residual;
      a.sum = x;
    }
    return a;
  }

  // h = this rank's share of FFN(RMSNorm(x)) for n rows (gate, up: scratch); with `residual`,
  // x += residual first (fused into the norm).
  void ffn_share(const LlamaLayer& L, float* x, float* h, float* gate, float* up, int64_t n,
                 const float* residual = nullptr, int64_t row0 = 0) {
    const ModelConfig& c = config();
    const uint16_t* hb = nullptr;
    const BlockQ8_0* hq = nullptr;
    if (L.ffn_norm) {
      RmsNormArgs norm = with_residual({x, L.ffn_norm, n, c.dim, c.rms_eps, h}, x, residual);
      hb = norm.bf16 = bf16_copy(n, {L.w_gate, L.w_up});
      hq = rmsnorm_for(norm, {L.w_gate, L.w_up}, hq_);
    } else {
      no_pre_norm(x, h, n, residual);
    }
    if (n == 1 && L.w_gate_up && !lora_on_ && up == gate + L.ffn_width) {  // one row, gate and up side by side
      dispatch(MatMulArgs{h, n, L.w_gate_up, nullptr, gate, hq});
    } else {
      dispatch(MatMulArgs{h, n, L.w_gate, nullptr, gate, hq, hb});
      progress();
      dispatch(MatMulArgs{h, n, L.w_up, nullptr, up, hq, hb});
      lora(L, {{LoraTarget::Gate, gate}, {LoraTarget::Up, up}}, row0, n, h);
    }
    progress();
    uint16_t* gb = bf16_copy(n, {L.w_down});  // (h's copy above is read by then)
    if (c.gelu_ffn) dispatch(GeluMulArgs{gate, up, n, L.ffn_width, 0, 0, gate, gb});
    else dispatch(SiluMulArgs{gate, up, n, L.ffn_width, 0, 0, gate, gb});
    dispatch(MatMulArgs{gate, n, L.w_down, nullptr, h, nullptr, gb});
    lora(L, {{LoraTarget::Down, h}}, row0, n, gate);
    progress();
  }

  // The step's LoRA updates of projections that share the input `in` (rows [row0, row0 + n) of the step).
  void lora(const LlamaLayer& L, std::initializer_list<std::pair<LoraTarget, float*>> outs, int64_t row0, int64_t n,
            const float* in) {
    if (lora_on_) lora_.apply(L.index, outs, row0, n, in);
  }

  // Lets a started all-reduce advance between the ops of the other micro-batch.
  void progress() {
    if (tp_) tp_->progress();
  }

  // A tensor-parallel step as two micro-batches A = tokens [0, n/2) and B = [n/2, n) (see the
  // comment at the top). Per layer: A's attention, its all-reduce started; B's attention while
  // A's sum travels; A's FFN once its sum is in, while B's travels; B's FFN while A's travels.
  // B attends the K/V that A wrote in the same layer just before (causal order is kept).
  void forward_overlapped(const ForwardBatch& b, KvPool& pool, float* logits) {
    const ModelConfig& c = config();
    const bool on_device = device() != Device::CPU;
    FP_CHECK(pool.device() == device(), "the KV cache is on ", device_name(pool.device()), " but the model runs on ",
             device_name(device()));
    DeviceScope scope(device());
    const int64_t n = b.n_tokens();
    const int64_t q_dim = heads_ * c.head_dim, kv_dim = kv_heads_ * c.head_dim;
    const int64_t v_dim = kv_heads_ * c.v_head_dim, att_dim = heads_ * c.v_head_dim;
    int64_t ffn = 0;
    for (const LlamaLayer& L : layers_) ffn = std::max(ffn, L.ffn_width);
    const StepBuffers buf = step_buffers(n);  // named pointers (lambdas below capture them)
    float *x = buf.x, *h = buf.h, *q = buf.q, *k = buf.k, *v = buf.v, *att_out = buf.att_out, *gate = buf.gate, *up = buf.up;
    const bool every_head = pool.layout().k_width != kv_dim;  // decode over a context-parallel cache
    const int64_t k_off = every_head ? tp_->rank() * kv_dim : 0, v_off = every_head ? tp_->rank() * v_dim : 0;
    FP_CHECK(b.feed_rows.empty(), "micro-batch overlap: a step with fed tokens (async scheduling) cannot be cut in two");
    overlap_.split(b, pool.page_size());
    // Each micro-batch's index arrays where the kernels read them (staged on a device), and the
    // whole batch's logit rows.
    const StagedBatch whole = on_device ? stager_.stage(b, pool.page_size(), fed_ids()) : host_view(b);
    struct MicroBatch {
      int64_t row0, rows;
      StagedBatch staged;
      const int64_t* slots;
      AttentionArgs att;
      PendingSum sum;  // the all-reduce of its h
    } mb[2];
    for (int i = 0; i < 2; ++i) {
      const ForwardBatch& part = overlap_.parts[i];
      MicroBatch& m = mb[i];
      m.row0 = overlap_.row0[i];
      m.rows = part.n_tokens();
      m.staged = on_device ? part_stagers_[i].stage(part, pool.page_size()) : host_view(part);
      m.slots = on_device ? m.staged.slots : overlap_.slots[i].data();
      if (!on_device && !overlap_.window_slots[i].empty()) m.staged.window_slots = overlap_.window_slots[i].data();
      m.att = paged_attention_args(m.staged, pool);
      m.att.q = q + m.row0 * q_dim;
      m.att.n_heads = heads_;
      m.att.n_kv_heads = kv_heads_;
      m.att.head_dim = c.head_dim;
      m.att.v_dim = c.v_head_dim;
      m.att.k_stride = pool.layout().k_width;
      m.att.v_stride = pool.layout().v_width;
      m.att.scale = c.attention_scale();
      m.att.softcap = c.attn_softcap;
      m.att.out = att_out + m.row0 * att_dim;
    }
    auto row = [&](float* base, const MicroBatch& m, int64_t width) { return base + m.row0 * width; };
    // A sum is normalised before its add where the layer has a sandwich norm there (Gemma).
    auto start_sum = [&](MicroBatch& m, const float* post_norm) {
      m.sum.start(tp_.get(), row(h, m, c.dim), m.rows * c.dim, {post_norm, c.dim, c.rms_eps});
    };
    auto add_sum = [&](MicroBatch& m) { m.sum.add_into(row(x, m, c.dim)); };  // x += the summed h
    const int64_t rows = whole.n_logits;
    float* out_logits = on_device ? act_.f32(8, rows * c.n_vocab) : logits;

    auto step = [&] {
      for (MicroBatch& m : mb) m.sum.reset();  // a recording abandoned midway may have left one in flight
      for (MicroBatch& m : mb) dispatch(EmbeddingArgs{embed_, m.staged.tokens, m.rows, row(x, m, c.dim), c.embed_scale});
      for (size_t l = 0; l < layers_.size(); ++l) {
        const LlamaLayer& L = layers_[l];
        const auto layer = static_cast<int64_t>(l);
        for (MicroBatch& m : mb) {
          add_sum(m);  // the previous layer's FFN
          attention_inputs(L, row(x, m, c.dim), row(h, m, c.dim), m.rows, heads_, kv_heads_, m.staged.positions,
                           row(q, m, q_dim), row(k, m, kv_dim), row(v, m, v_dim), nullptr, nullptr, m.row0);
          const bool in_window = pool.in_window_blocks(layer);  // window trimming
          if (every_head)
            cp_.every_head.write(tp_.get(), pool, layer, m.slots, m.rows, row(k, m, kv_dim), row(v, m, v_dim), kv_dim, v_dim);
          else pool.write(layer, in_window ? m.staged.window_slots : m.slots, m.rows, row(k, m, kv_dim), row(v, m, v_dim));
          m.att.page_ids = m.staged.pages_for(in_window);
          m.att.k_pool = kv_element(pool.k(layer), pool.dtype(), k_off);
          m.att.v_pool = kv_element(pool.v(layer), pool.dtype(), v_off);
          m.att.window = L.window;
          dispatch(m.att);
          progress();
          dispatch(MatMulArgs{row(att_out, m, att_dim), m.rows, L.wo, nullptr, row(h, m, c.dim)});
          lora(L, {{LoraTarget::O, row(h, m, c.dim)}}, m.row0, m.rows, row(att_out, m, att_dim));
          start_sum(m, L.post_attn_norm);
        }
        for (MicroBatch& m : mb) {
          add_sum(m);  // the attention's
          ffn_share(L, row(x, m, c.dim), row(h, m, c.dim), row(gate, m, ffn), row(up, m, ffn), m.rows, nullptr, m.row0);
          start_sum(m, L.post_ffn_norm);
        }
      }
      for (MicroBatch& m : mb) add_sum(m);
      if (rows == 0) return;
      logit_rows_.run(x, n, c.dim, whole.logit_rows, rows, output_norm_, c.rms_eps, h);
      output_.run(h, rows, out_logits);
    };
    // On a device, decode shapes replay a recorded graph (its collectives' forks and joins too).
    graphs_.run(n, whole.n_seqs, rows, &pool, step, /*variant=*/1);
    if (on_device) deliver_logits(out_logits, rows, logits);
  }

  // The layers context-parallel prefill runs: the whole weights.
  const std::vector<LlamaLayer>& whole_layers() const { return whole_layers_.empty() ? layers_ : whole_layers_; }

  // Prefill context parallel (see the comment at the top and model/context_parallel.h): this
  // rank runs its run of the batch's tokens through every layer with the whole weights, on the
  // host or on the model's device (its buffers there, the run staged, the logits copied back).
  void forward_context_parallel(const ForwardBatch& b, KvPool& pool, float* logits) {
    const ModelConfig& c = config();
    const bool on_device = device() != Device::CPU;
    FP_CHECK(pool.device() == device(), "the KV cache is on ", device_name(pool.device()), " but the model runs on ",
             device_name(device()));
    DeviceScope scope(device());
    if (on_device) Ledger::global().note_step("eager: context-parallel prefill");
    ContextParallelStep& cp = cp_.step;
    cp.begin(tp_.get(), b, pool.page_size(), pool.device());
    const ForwardBatch& run = cp.run();
    const int64_t m = cp.rows(), padded = cp.padded_rows();
    const int64_t q_dim = c.n_heads * c.head_dim, kv_dim = c.n_kv_heads * c.head_dim, v_dim = c.n_kv_heads * c.v_head_dim;
    int64_t ffn = 0;
    for (const LlamaLayer& L : whole_layers()) ffn = std::max(ffn, L.ffn_width);
    // Host buffers zeroed (the padding of a short run is sent too); a device's are never read
    // past the rows that were written.
    auto buf = [&](size_t slot, std::vector<float>& v, int64_t len) {
      if (on_device) return act_.f32(slot, len);
      v.assign(static_cast<size_t>(len), 0.0f);
      return v.data();
    };
    float* x = buf(0, cp_.x, padded * c.dim);
    float* h = buf(1, cp_.h, padded * c.dim);
    float* q = buf(2, cp_.q, m * q_dim);
    float* k = buf(3, cp_.k, padded * kv_dim);
    float* v = buf(4, cp_.v, padded * v_dim);
    float* att_out = buf(5, cp_.att, m * q_dim);
    float* gate = buf(6, cp_.gate, m * ffn);
    float* up = buf(7, cp_.up, m * ffn);
    const StagedBatch sb = on_device ? stager_.stage(run, pool.page_size()) : host_view(run);

    AttentionArgs att = paged_attention_args(sb, pool);
    att.q = q;
    att.n_heads = c.n_heads;
    att.n_kv_heads = c.n_kv_heads;
    att.head_dim = c.head_dim;
    att.v_dim = c.v_head_dim;
    att.k_stride = kv_dim;
    att.v_stride = v_dim;
    att.scale = c.attention_scale();
    att.softcap = c.attn_softcap;
    att.out = att_out;

    dispatch(EmbeddingArgs{embed_, sb.tokens, m, x, c.embed_scale});
    for (size_t l = 0; l < whole_layers().size(); ++l) {
      const LlamaLayer& L = whole_layers()[l];
      // Every rank's K/V rows into the cache (it holds the whole batch), exchanged while this
      // rank computes its queries.
      attention_inputs(L, x, h, m, c.n_heads, c.n_kv_heads, sb.positions, q, k, v,
                       [&] { cp.start_kv(pool, static_cast<int64_t>(l), k, v); });
      cp.finish_kv(pool);
      att.k_pool = pool.k(static_cast<int64_t>(l));
      att.v_pool = pool.v(static_cast<int64_t>(l));
      att.window = L.window;
      dispatch(att);
      dispatch(MatMulArgs{att_out, m, L.wo, nullptr, h});
      if (L.post_attn_norm) dispatch(RmsNormArgs{h, L.post_attn_norm, m, c.dim, c.rms_eps, h});
      dispatch(AddArgs{x, h, m * c.dim, x});
      ffn_residual(L, x, h, gate, up, m, false);
    }
    // The logit rows may lie in any rank's run.
    const auto n_logits = static_cast<int64_t>(b.logit_rows.size());
    float* xr = buf(9, cp_.rows, n_logits * c.dim);
    const int64_t rows = cp.gather_logit_rows(x, c.dim, xr);
    if (rows == 0) return;
    dispatch(RmsNormArgs{xr, output_norm_, rows, c.dim, c.rms_eps, xr});
    float* out_logits = on_device ? act_.f32(8, rows * c.n_vocab) : logits;
    output_.run(xr, rows, out_logits);
    if (on_device) deliver_logits(out_logits, rows, logits);
  }

  // Replaces a layer's full weights by this rank's slices (see the comment at the top).
  void shard_layer(LlamaLayer& L, int rank, int ranks) {
    const ModelConfig& c = config();
    const Range q{rank * heads_ * c.head_dim, heads_ * c.head_dim};
    const Range kv{rank * kv_heads_ * c.head_dim, kv_heads_ * c.head_dim};
    const Range o{rank * heads_ * c.v_head_dim, heads_ * c.v_head_dim};
    // The FFN share must fall on block boundaries of ffn_down's rows (its columns are cut), and
    // of gate's and up's scale blocks when block-scaled (their rows are cut).
    const int64_t align = std::lcm(column_alignment(*L.w_down), std::lcm(row_alignment(*L.w_gate), row_alignment(*L.w_up)));
    const Range f = split_range(c.hidden_dim, ranks, rank, align, "FFN width (hidden_dim)");
    L.ffn_width = f.len;
    L.ffn_begin = f.begin;
    L.wq = keep(slice_rows(*L.wq, q));
    L.wk = keep(slice_rows(*L.wk, kv));
    L.wv = keep(slice_rows(*L.wv, kv));
    L.wo = keep(copy_columns(*L.wo, o));
    L.w_gate = keep(slice_rows(*L.w_gate, f));
    L.w_up = keep(slice_rows(*L.w_up, f));
    L.w_down = keep(copy_columns(*L.w_down, f));
    if (L.bq) {
      L.bq += q.begin;
      L.bk += kv.begin;
      L.bv += kv.begin;
    }
    if (c.qk_norm_full) {  // OLMo 2: the norm weights span every head (qk_norm sums the squares across ranks)
      L.q_norm += q.begin;
      L.k_norm += kv.begin;
    }
  }
  const Tensor* keep(const Tensor& t) { return &shards_.emplace_back(t); }

  // Uploads every weight the forward reads and points the layers at the device copies.
  void place_on_device() {
    const ModelConfig& c = config();
    DeviceWeights& dw = weights_;
    embed_ = dw.tensor(embed_);
    output_.weight = dw.tensor(output_.weight);
    output_norm_ = dw.floats(output_norm_, c.dim);
    // The rank's layers (its heads) and, with context-parallel prefill beside TP decode, the whole
    // layers too: on a GPU the two are separate copies (on the host they share the file's bytes).
    auto place = [&](LlamaLayer& L, int64_t heads, int64_t kv_heads) {
      L.attn_norm = dw.floats(L.attn_norm, c.dim);
      L.ffn_norm = dw.floats(L.ffn_norm, c.dim);
      // Stacked where the parts allow it (one dtype and width): a decode step's one row then
      // takes one matmul launch for Q, K, V and one for gate, up instead of five.
      L.wqkv = dw.stack_rows({&L.wq, &L.wk, &L.wv});
      L.w_gate_up = dw.stack_rows({&L.w_gate, &L.w_up});
      if (L.wqkv && L.bq) {
        const int64_t q = heads * c.head_dim, kv = kv_heads * c.head_dim, vw = kv_heads * c.v_head_dim;
        float* b = file_->own_f32(static_cast<size_t>(q + kv + vw));
        std::copy(L.bq, L.bq + q, b);
        std::copy(L.bk, L.bk + kv, b + q);
        std::copy(L.bv, L.bv + vw, b + q + kv);
        L.bqkv = dw.floats(b, q + kv + vw);
      }
      for (const Tensor** w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) *w = dw.tensor(*w);
      L.bq = dw.floats(L.bq, heads * c.head_dim);
      L.bk = dw.floats(L.bk, kv_heads * c.head_dim);
      L.bv = dw.floats(L.bv, kv_heads * c.v_head_dim);
      L.q_norm = dw.floats(L.q_norm, c.head_dim);
      L.k_norm = dw.floats(L.k_norm, c.head_dim);
    };
    for (LlamaLayer& L : layers_) place(L, heads_, kv_heads_);
    for (LlamaLayer& L : whole_layers_) place(L, c.n_heads, c.n_kv_heads);
    inv_freq_at_ = dw.floats(inv_freq_.data(), static_cast<int64_t>(inv_freq_.size()));
    log_info("placed the weights on ", device_name(device()), ": ", static_cast<double>(dw.bytes()) / (1 << 20), " MiB");
  }
  // A view made on the host describing device memory.
  Tensor on_device(Tensor t) const {
    t.device = device();
    return t;
  }
  const Tensor* keep(OwnedTensor t) {
    file_->owners.push_back(t.bytes);
    if (file_->repack_weights) repack_in_place(t.view);  // our own copy: rewritten where it lies
    return keep(t.view);
  }

  // A norm's weight as F32 with the config's norm_weight_offset added (Gemma's checkpoints
  // store w - 1): a copy when there is an offset, else as vec_f32.
  const float* norm_f32(const std::string& name, int64_t len) {
    const float offset = config().norm_weight_offset;
    const float* w = vec_f32(name, len);
    if (offset == 0.0f) return w;
    float* buf = file_->own_f32(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) buf[i] = w[i] + offset;
    return buf;
  }

  // A 1-D F32 view of a norm weight or bias, converted from F16/BF16 once at load.
  const float* vec_f32(const std::string& name, int64_t len) {
    const Tensor& t = file_->get(name, {len});
    if (t.dtype == DType::F32) return static_cast<const float*>(t.data);
    float* buf = file_->own_f32(static_cast<size_t>(len));
    dequantize_row(t.dtype, t.data, buf, len);
    return buf;
  }

  const Tensor* embed_ = nullptr;
  VocabParallelOutput output_;  // the output projection, split by vocabulary rows on CPU ranks
  const float* output_norm_ = nullptr;
  std::vector<LlamaLayer> layers_;
  int64_t heads_ = 0, kv_heads_ = 0;  // this rank's query and KV heads
  bool context_parallel_ = false;       // prefill runs context parallel (ParallelSizes::cp)
  std::vector<LlamaLayer> whole_layers_;  // context parallel with TP decode: the unsplit weights
  struct ContextParallelScratch {
    ContextParallelStep step;
    EveryHeadKvWriter every_head;
    std::vector<float> x, h, q, k, v, att, gate, up, rows;
  } cp_;
  MicroBatchSplit overlap_;           // the two micro-batches of forward_overlapped
  std::deque<Tensor> shards_;         // this rank's weight slices (stable addresses)
  std::vector<float> inv_freq_;
  std::vector<float> inv_freq_swa_;  // Gemma 3's sliding layers (config().rope_theta_swa)
  const float* inv_freq_at_ = nullptr;  // inv_freq_ where the kernels read it (host or device)
  float rope_mscale_ = 1.0f;            // cos/sin factor: LongRoPE's attention factor, else 1
  QkNorm qk_norm_;                      // q/k norms (per head, or over the whole projection across ranks)
  DeviceWeights weights_{device()};
  Activations act_{device()};     // x, h, q, k, v, attention out, gate, up, device logits
  BatchStager stager_{device()};
  BatchStager part_stagers_[2] = {BatchStager(device()), BatchStager(device())};  // --micro-batch-overlap's halves
  StepGraphs graphs_{device(), file_->device_graphs};
  LogitRowGather logit_rows_{device()};  // the logit rows of x, normalised
  std::vector<BlockQ8_0> hq_;  // the normalised input quantized once for Q8_0/Q4_0 matmuls
  LoraSet lora_;               // LoRA adapters (add_lora)
  bool lora_on_ = false;       // some row of this step runs with an adapter
};

std::unique_ptr<Model> make_llama(std::shared_ptr<ModelFile> f, std::shared_ptr<Communicator> tp) {
  return std::make_unique<LlamaModel>(std::move(f), std::move(tp));
}

const bool llama_registered = register_sharded_architecture("llama", make_llama, true) &&
                        register_sharded_architecture("qwen2", make_llama, true) &&
                        register_sharded_architecture("qwen3", make_llama, true) &&
                        register_sharded_architecture("phi3", make_llama, true) &&
                        register_sharded_architecture("smollm3", make_llama, true) &&
                        register_sharded_architecture("olmo2", make_llama, false) &&
                        register_sharded_architecture("glm4", make_llama, false) &&
                        register_sharded_architecture("granite", make_llama, false) &&
                        register_sharded_architecture("seed_oss", make_llama, false) &&
                        register_sharded_architecture("ernie4_5", make_llama, false) &&
                        register_sharded_architecture("exaone4", make_llama, false) &&
                        register_sharded_architecture("olmo3", make_llama, false) &&
                        register_sharded_architecture("hunyuan-dense", make_llama, false) &&
                        register_sharded_architecture("gemma2", make_llama, false) &&
                        register_sharded_architecture("gemma3", make_llama, false);

}  // namespace
}  // namespace fp
