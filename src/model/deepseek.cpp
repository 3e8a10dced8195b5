// model/deepseek.cpp — DeepSeek-V2/V3 (GGUF deepseek2, HF DeepseekV2ForCausalLM /
// DeepseekV3ForCausalLM): multi-head latent attention and a routed + shared expert FFN.
//
// Attention per layer (H heads, per head q/k = [nope | rope], v):
//   q = attn_q · h, or attn_q_b · RMSNorm(attn_q_a · h) with query compression (q_lora_rank > 0)
//   [c | k_pe] = attn_kv_a_mqa · h;  c = RMSNorm(c) (kv_lora values), k_pe (rope values) shared by all heads
//   RoPE on q_pe and k_pe; the cache keeps only [c | k_pe] per token and layer;
//   keys/values per head come from attn_kv_b (or its split attn_k_b / attn_v_b form) — see the
//   mla_attention op for the two execution forms (expanded for prefill, absorbed for decode).
// FFN: the first `first_dense` layers dense, the others MoE (see moe_layers.h).
// DeepSeek-V3's multi-token-prediction layer (after num_hidden_layers) drafts tokens with
// --speculative-method mtp (Model::mtp_forward, model/mtp.h).
//
// Split across ranks: expert parallel only (--expert-parallel-size N): each rank holds E/N whole
// routed experts and a slice of the shared experts' and dense layers' width, and one all-reduce
// per layer sums the FFN shares. MLA attention is replicated: its latent KV cache has no heads to
// split, so tensor parallel attention would still keep the whole cache on every rank. With cp = N
// (prefill context parallel, model/context_parallel.h) prefill batches run one run of tokens per
// rank through the whole layers, exchanging the latent rows; decode runs whole, or with ep = N
// too, expert parallel (a different layout per phase; MLA replicated in both). Under expert
// parallel a step can run as two micro-batches whose FFN sums travel while the other computes
// (--micro-batch-overlap).
//
// On a device (--device cuda): the weights uploaded once (per-head W_UK / W_UV and each layer's
// experts as one stack per matrix; under expert parallel the rank's experts only), activations,
// router outputs and the latent cache there, the batch staged each step, decode steps replayed
// as recorded graphs (forward_on_device), as the llama family does. Across GPU ranks: expert
// parallel, the FFN all-reduce and the vocabulary-parallel logits' all-gather through NCCL on the
// device buffers.
#include <cmath>
#include <cstring>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "kernels/ledger.h"
#include "kernels/ops.h"
#include "kernels/registry.h"
#include "model/context_parallel.h"
#include "model/data_parallel.h"
#include "model/micro_batch.h"
#include "model/vocab_parallel.h"
#include "model/model.h"
#include "model/moe_layers.h"
#include "model/mtp.h"
#include "model/repack.h"
#include "parallel/collectives.h"

namespace fp {
namespace {

struct DeepseekLayer {
  const float *attn_norm, *ffn_norm, *kv_a_norm, *q_a_norm = nullptr;
  const Tensor *wq = nullptr, *wq_a = nullptr, *wq_b = nullptr, *wkv_a, *wo;
  std::vector<Tensor> wk, wk_t, wv;  // per head, see MlaAttentionArgs
  bool moe = false;
  const Tensor *w_gate = nullptr, *w_up = nullptr, *w_down = nullptr;
  int64_t ffn_width = 0;  // this rank's share of a dense layer's FFN width
  MoeLayerWeights experts;
};

class DeepseekModel : public Model {
 public:
  DeepseekModel(std::shared_ptr<ModelFile> f, std::shared_ptr<Communicator> comm) : Model(std::move(f)) {
    tp_ = std::move(comm);
    const ModelConfig& c = config();
    ModelFile& mf = *file_;
    const int rank = tp_ ? tp_->rank() : 0;
    // Ranks the experts are split across; 1 with context parallel (the whole model on every rank).
    const int ranks = parallel().ep > 1 ? tp_size() : 1;
    context_parallel_ = parallel().cp > 1;
    data_parallel_ = parallel().dp > 1;
    ffn_split_ = ranks > 1;
    FP_CHECK(tp_size() == 1 || parallel().tp == 1, mf.path, ": ", c.arch, " splits across ranks by experts only: MLA attention "
             "is replicated (its latent KV cache has no heads to split); use --expert-parallel-size ", tp_size(),
             " without --tensor-parallel-size");
    const FfnSplit split{rank, ranks, true, &shards_};
    H_ = c.n_heads;
    L_ = c.mla.kv_lora_rank;
    rope_ = c.rot_dim;
    nope_ = c.head_dim - c.rot_dim;
    vd_ = c.v_head_dim;
    FP_CHECK(L_ > 0, mf.path, ": deepseek2 needs kv_lora_rank > 0");
    FP_CHECK(nope_ > 0, mf.path, ": deepseek2 needs key_length (", c.head_dim, ") > rope dims (", rope_, ")");
    const int64_t qd = nope_ + rope_;
    // The FFN weights (dense, shared and routed experts: K-quants) and the output projection
    // into the CPU kernels' interleaved layouts (model/repack.h); the attention projections stay
    // as they are. Not with context-parallel prefill over several ranks (as in llama.cpp).
    if (context_parallel_ && ranks > 1) mf.repack_weights = false;
    WeightRepacker rp(mf);
    embed_ = &mf.get("token_embd.weight", {c.n_vocab, c.dim});
    output_norm_ = load_vec_f32(mf, "output_norm.weight", c.dim);
    // Split by vocabulary rows across the ranks the weights are split over (model/vocab_parallel.h).
    const Tensor* output = c.tied_output ? embed_ : &mf.get("output.weight", {c.n_vocab, c.dim});
    output_.init(output, ranks > 1 ? tp_.get() : nullptr, shards_, mf.path, device());
    output_head_ = &output_;
    // Layer l's weights (l = n_layers: the multi-token-prediction layer's decoder layer).
    auto load_layer = [&](int64_t l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      DeepseekLayer Y{};
      Y.attn_norm = load_vec_f32(mf, p + "attn_norm.weight", c.dim);
      Y.ffn_norm = load_vec_f32(mf, p + "ffn_norm.weight", c.dim);
      if (c.mla.q_lora_rank > 0) {
        Y.wq_a = &mf.get(p + "attn_q_a.weight", {c.mla.q_lora_rank, c.dim});
        Y.q_a_norm = load_vec_f32(mf, p + "attn_q_a_norm.weight", c.mla.q_lora_rank);
        Y.wq_b = &mf.get(p + "attn_q_b.weight", {H_ * qd, c.mla.q_lora_rank});
      } else {
        Y.wq = &mf.get(p + "attn_q.weight", {H_ * qd, c.dim});
      }
      Y.wkv_a = &mf.get(p + "attn_kv_a_mqa.weight", {L_ + rope_, c.dim});
      Y.kv_a_norm = load_vec_f32(mf, p + "attn_kv_a_norm.weight", L_);
      Y.wo = &mf.get(p + "attn_output.weight", {c.dim, H_ * vd_});
      load_kv_b(mf, p, Y);
      Y.moe = c.moe.is_moe_layer(l);
      if (Y.moe) {
        Y.experts = load_moe_layer(mf, p, c, &rp, split);
      } else {
        Y.w_gate = &mf.get(p + "ffn_gate.weight", {c.hidden_dim, c.dim});
        Y.w_up = &mf.get(p + "ffn_up.weight", {c.hidden_dim, c.dim});
        Y.w_down = &mf.get(p + "ffn_down.weight", {c.dim, c.hidden_dim});
        Y.ffn_width = c.hidden_dim;
      }
      // Context-parallel prefill with expert-parallel decode: the prefill keeps the whole layer
      // (views of the file), decode this rank's experts and FFN share.
      if (context_parallel_ && ranks > 1) whole_layers_.push_back(Y);
      if (Y.moe) shard_moe_layer(mf, split, Y.experts, &rp);
      else if (ranks > 1) Y.ffn_width = shard_ffn(mf, split, Y.w_gate, Y.w_up, Y.w_down, "FFN width (intermediate_size)");
      for (const Tensor** w : {&Y.w_gate, &Y.w_up, &Y.w_down}) *w = rp.repack(*w);
      return Y;
    };
    if (mf.mtp) enable_mtp();
    for (int64_t l = 0; l < c.n_layers; ++l) layers_.push_back(load_layer(l));
    if (mtp_) mtp_layer_ = load_layer(c.n_layers);
    output_.weight = rp.repack(output_.weight);
    if (c.tied_output && !output_.split()) embed_ = output_.weight;
    if (mtp_) mtp_head_.load(mf, c.n_layers, embed_, output, output_.weight, ranks > 1 ? tp_.get() : nullptr, rp, shards_);
    rp.report();
    inv_freq_ = c.rope_inv_freq();
    const RopeScaling& rs = c.rope_scaling;
    float mscale = 1.0f;
    if (rs.type == "yarn") {
      rope_mscale_ = rs.attn_factor;
      if (rs.factor > 1.0f) mscale = 1.0f + rs.log_multiplier * std::log(rs.factor);
    }
    scale_ = mscale * mscale / std::sqrt(static_cast<float>(qd));
    inv_freq_at_ = inv_freq_.data();
    if (device() != Device::CPU) place_on_device();
  }

  KvLayout kv_layout() const override { return KvLayout{config().n_layers + (mtp_ ? 1 : 0), L_ + rope_, 0}; }

  void mtp_forward(const ForwardBatch& b, KvPool& pool, const float* hidden, float* logits, float* out_hidden) override {
    const ModelConfig& c = config();
    const int64_t n = begin_mtp(b, pool);
    if (n <= 0) return;
    resize_buffers(n, n, n);
    b.slots(pool.page_size(), slots_);
    const Rows r = rows_at(0, n, b.positions.data(), slots_.data());
    MlaAttentionArgs att = mla_args(host_view(b), pool, r);
    mtp_head_.input(b.tokens.data(), b.positions.data(), hidden, n, x_.data());
    attention(mtp_layer_, c.n_layers, r, false, pool, att);
    dispatch(RmsNormArgs{x_.data(), mtp_layer_.ffn_norm, n, c.dim, c.rms_eps, h_.data()});
    float* out = ffn(mtp_layer_, h_.data(), n, gate_.data(), up_.data(), h_.data());
    if (ffn_split_) dispatch(AllReduceArgs{tp_.get(), out, n * c.dim});  // sum the ranks' experts / FFN shares
    dispatch(AddArgs{x_.data(), out, n * c.dim, x_.data()});
    if (out_hidden) std::copy_n(x_.data(), n * c.dim, out_hidden);
    resize(rows_, static_cast<int64_t>(b.logit_rows.size()) * c.dim);
    mtp_head_.logits(rows_.data(), b.gather_logit_rows(x_.data(), c.dim, rows_.data()), logits);
  }

  void forward(const ForwardBatch& b, KvPool& pool, float* logits) override {
    const ModelConfig& c = config();
    check_batch(b, pool);
    FP_CHECK(pool.layout().k_width == L_ + rope_ && pool.layout().v_width == 0, "deepseek2: the KV pool holds ",
             pool.layout().k_width, "+", pool.layout().v_width, " values per token, the latent cache needs ", L_ + rope_, "+0");
    if (b.n_tokens() <= 0) return;
    // Prefill context parallel: this rank runs its run of the tokens (model/context_parallel.h).
    const bool cp = context_parallel_ && ContextParallelStep::applies(b, tp_size());
    // Data-parallel attention: this rank's sequences only (model/data_parallel.h); the FFN layers
    // see all `m` tokens of the batch.
    const bool dp = data_parallel_;
    const int64_t overlap_min = file_->micro_batch_overlap;
    if (!cp && ffn_split_ && overlap_min > 0 && b.n_tokens() >= std::max<int64_t>(overlap_min, 2))
      return forward_overlapped(b, pool, logits);
    if (device() != Device::CPU) return forward_on_device(b, pool, logits);
    if (cp) cp_.begin(tp_.get(), b, pool.page_size());
    if (dp) dp_.begin(tp_.get(), b, pool);
    const ForwardBatch& run = cp ? cp_.run() : dp ? dp_.run() : b;
    const int64_t n = run.n_tokens(), padded = cp ? cp_.padded_rows() : n;  // rows sent by the gathers
    const int64_t m = dp ? dp_.total_rows() : n;
    resize_buffers(padded, n, m);
    if (dp) resize(all_, m * c.dim);
    run.slots(pool.page_size(), slots_);
    const Rows r = rows_at(0, n, run.positions.data(), slots_.data());
    MlaAttentionArgs att = mla_args(host_view(run), pool, r);

    if (n > 0) dispatch(EmbeddingArgs{embed_, run.tokens.data(), n, x_.data()});
    // A context-parallel step runs the whole layers and sums nothing across the ranks.
    const std::vector<DeepseekLayer>& layers = cp && !whole_layers_.empty() ? whole_layers_ : layers_;
    const bool sum_ffn = ffn_split_ && !cp;
    for (size_t l = 0; l < layers.size(); ++l) {
      const DeepseekLayer& Y = layers[l];
      if (n > 0 || cp) attention(Y, static_cast<int64_t>(l), r, cp, pool, att);  // (a CP rank without tokens joins the K/V exchange)
      // FFN input: this rank's normalised rows, or (data parallel) every rank's, gathered.
      if (n > 0) dispatch(RmsNormArgs{x_.data(), Y.ffn_norm, n, c.dim, c.rms_eps, h_.data()});
      if (dp) dp_.gather(h_.data(), c.dim, all_.data());
      float* out = ffn(Y, dp ? all_.data() : h_.data(), m, gate_.data(), up_.data(), dp ? all_.data() : h_.data());
      if (dp) {  // each rank gets the sum of its own rows
        dp_.reduce_scatter(out, c.dim, h_.data());
        out = h_.data();
      } else if (sum_ffn) {
        dispatch(AllReduceArgs{tp_.get(), out, n * c.dim});  // sum the ranks' experts / FFN shares
      }
      if (n > 0) dispatch(AddArgs{x_.data(), out, n * c.dim, x_.data()});
    }
    finish_logits(b, cp, dp, logits);
  }

 private:
  // Rows [r0, r0 + n) of the step buffers that one pass works on (a whole step, or one
  // micro-batch), with those tokens' positions and KV slots.
  struct Rows {
    float *x, *h, *q, *qa, *kva, *att, *gate, *up;
    const int32_t* pos;
    const int64_t* slots;
    int64_t n;
  };
  Rows rows_at(int64_t r0, int64_t n, const int32_t* pos, const int64_t* slots) {
    const ModelConfig& c = config();
    const int64_t qd = nope_ + rope_, lw = L_ + rope_;
    return Rows{x_.data() + r0 * c.dim,     h_.data() + r0 * c.dim,   q_.data() + r0 * H_ * qd,
                qa_.data() + r0 * c.mla.q_lora_rank, kva_.data() + r0 * lw,
                att_.data() + r0 * H_ * vd_, gate_.data() + r0 * std::max(c.hidden_dim, c.dim),
                up_.data() + r0 * c.hidden_dim, pos, slots, n};
  }

  // n rows of this rank's tokens (padded: as many as the gathers send), m rows for the FFN layers.
  void resize_buffers(int64_t padded, int64_t n, int64_t m) {
    const ModelConfig& c = config();
    const int64_t qd = nope_ + rope_, lw = L_ + rope_;
    resize(x_, padded * c.dim);
    resize(h_, padded * c.dim);
    resize(q_, n * H_ * qd);
    resize(qa_, n * c.mla.q_lora_rank);
    resize(kva_, padded * lw);
    resize(att_, n * H_ * vd_);
    resize(gate_, m * std::max(c.hidden_dim, c.dim));
    resize(up_, m * c.hidden_dim);
  }

  // The MLA op's arguments for `run`'s tokens (host arrays, host_view, or staged on the device),
  // reading r.q and writing r.att.
  MlaAttentionArgs mla_args(const StagedBatch& run, const KvPool& pool, const Rows& r) const {
    MlaAttentionArgs att{};
    att.q = r.q;
    att.pos = r.pos;
    att.n = run.n;
    att.n_seqs = run.n_seqs;
    att.seq_indptr = run.seq_indptr;
    att.n_heads = H_;
    att.nope = nope_;
    att.rope = rope_;
    att.v_dim = vd_;
    att.kv_lora = L_;
    att.latent_stride = L_ + rope_;
    att.kv_dtype = pool.dtype();
    att.page_size = pool.page_size();
    att.page_indptr = run.page_indptr;
    att.page_ids = run.page_ids;
    att.kv_len = run.kv_len;
    att.scale = scale_;
    att.out = r.att;
    return att;
  }

  // Layer Y's attention for r's rows of x (writes their latent rows into the pool):
  // r.x += attn_output(MLA(RMSNorm(r.x))).
  void attention(const DeepseekLayer& Y, int64_t l, const Rows& r, bool cp, KvPool& pool, MlaAttentionArgs& att) {
    const ModelConfig& c = config();
    const int64_t qd = nope_ + rope_, lw = L_ + rope_, n = r.n;
    const BlockQ8_0* hq = rmsnorm_for({r.x, Y.attn_norm, n, c.dim, c.rms_eps, r.h}, {Y.wq_a ? Y.wq_a : Y.wq, Y.wkv_a}, hq_);
    // The latent rows [c | k_pe] first: c normalised in place (rows lw apart), RoPE on the one
    // shared k_pe; under context parallel every rank's rows travel while the queries are computed.
    dispatch(MatMulArgs{r.h, n, Y.wkv_a, nullptr, r.kva, hq});
    RmsNormArgs kv_norm{r.kva, Y.kv_a_norm, n, L_, c.rms_eps, r.kva};
    kv_norm.stride = lw;
    dispatch(kv_norm);
    dispatch(RopeArgs{r.kva + L_, r.pos, n, 1, rope_, rope_, lw, inv_freq_at_, rope_mscale_, c.rope_style});
    if (cp) cp_.start_kv(pool, l, r.kva, nullptr);
    else pool.write(l, r.slots, n, r.kva, nullptr);
    if (Y.wq_a) {
      dispatch(MatMulArgs{r.h, n, Y.wq_a, nullptr, r.qa, hq});
      if (cp) cp_.progress();
      dispatch(RmsNormArgs{r.qa, Y.q_a_norm, n, c.mla.q_lora_rank, c.rms_eps, r.qa});
      dispatch(MatMulArgs{r.qa, n, Y.wq_b, nullptr, r.q});
    } else {
      dispatch(MatMulArgs{r.h, n, Y.wq, nullptr, r.q, hq});
    }
    // RoPE on the last `rope` values of every query head.
    dispatch(RopeArgs{r.q + nope_, r.pos, n, H_, qd, rope_, H_ * qd, inv_freq_at_, rope_mscale_, c.rope_style});
    if (cp) cp_.finish_kv(pool);  // every rank's rows
    att.latent_pool = pool.k(l);
    att.wk = Y.wk.data();
    att.wk_t = Y.wk_t.empty() ? nullptr : Y.wk_t.data();
    att.wv = Y.wv.data();
    dispatch(att);
    dispatch(MatMulArgs{r.att, n, Y.wo, nullptr, r.h});
    dispatch(AddArgs{r.x, r.h, n * c.dim, r.x});
  }

  // Layer Y's FFN over m rows of `in` (normalised): returns its output, `gate` (MoE) or `out`
  // (dense); this rank's share of the sum when the experts / FFN width are split.
  float* ffn(const DeepseekLayer& Y, const float* in, int64_t m, float* gate, float* up, float* out) {
    const ModelConfig& c = config();
    if (Y.moe) {
      moe_.run(Y.experts, c, in, m, gate);
      return gate;
    }
    dispatch(MatMulArgs{in, m, Y.w_gate, nullptr, gate});
    dispatch(MatMulArgs{in, m, Y.w_up, nullptr, up});
    dispatch(SiluMulArgs{gate, up, m, Y.ffn_width, 0, 0, gate});
    dispatch(MatMulArgs{gate, m, Y.w_down, nullptr, out});
    return out;
  }

  // A step as two micro-batches A = tokens [0, n/2) and B = [n/2, n) (--micro-batch-overlap,
  // expert parallel; as qwen3moe's, model/qwen3_moe.cpp): attention is replicated, so the FFN
  // shares' sums are what travels, A's behind B's FFN and B's behind the next layer's attention of A.
  // With data-parallel attention each rank cuts its own tokens in two (dp_parts_: every rank's
  // first halves, every rank's second halves): A's rows are gathered while B attends, B's while
  // A's FFN runs, A's sums reduce-scattered while B's FFN runs, B's while the next layer's A attends.
  void forward_overlapped(const ForwardBatch& b, KvPool& pool, float* logits) {
    const ModelConfig& c = config();
    const bool on_device = device() != Device::CPU, dp = data_parallel_;
    FP_CHECK(pool.device() == device(), "the KV cache is on ", device_name(pool.device()), " but the model runs on ",
             device_name(device()));
    DeviceScope scope(device());
    FP_CHECK(b.feed_rows.empty(), "micro-batch overlap: a step with fed tokens (async scheduling) cannot be cut in two");
    if (dp) {
      dp_.begin(tp_.get(), b, pool);
      for (int i = 0; i < 2; ++i) dp_parts_[i].begin_part(dp_, i);
    }
    const ForwardBatch& run = dp ? dp_.run() : b;  // this rank's tokens
    const int64_t n = run.n_tokens(), qd = nope_ + rope_, lw = L_ + rope_;
    // Rows of x and h: this rank's, and under data parallel room for the gathers' padding (a
    // device gather sends padded_rows() rows from where a micro-batch's rows start); the FFN's
    // rows: every rank's of the larger micro-batch.
    const int64_t cap = dp ? n + dp_.padded_rows() : n;
    const int64_t ffn_rows = dp ? std::max({n, dp_parts_[0].total_rows(), dp_parts_[1].total_rows()}) : n;
    if (!on_device) resize_buffers(cap, n, ffn_rows);
    // The step's rows: host vectors, or the device's activation slots.
    auto rows_of = [&](size_t slot, std::vector<float>& host, int64_t width, int64_t count) {
      return on_device ? act_.f32(slot, count * width) : host.data();
    };
    float *x = rows_of(0, x_, c.dim, cap), *h = rows_of(1, h_, c.dim, cap), *q = rows_of(2, q_, H_ * qd, n);
    float *qa = rows_of(3, qa_, std::max<int64_t>(c.mla.q_lora_rank, 1), n), *kva = rows_of(4, kva_, lw, n);
    float *att = rows_of(5, att_, H_ * vd_, n), *gate = rows_of(6, gate_, std::max(c.hidden_dim, c.dim), ffn_rows);
    float* up = rows_of(7, up_, c.hidden_dim, ffn_rows);
    overlap_.split(run, pool.page_size());
    // Each micro-batch's index arrays where the kernels read them, and the batch's logit rows.
    const StagedBatch whole = on_device ? stager_.stage(run, pool.page_size(), dp ? nullptr : fed_ids()) : host_view(run);
    struct MicroBatch {
      Rows r;
      StagedBatch staged;
      MlaAttentionArgs att;
      PendingSum sum;  // its FFN share's all-reduce
      float* all = nullptr;  // data parallel: every rank's rows of this micro-batch, for the FFN
    } mb[2];
    for (int i = 0; i < 2; ++i) {
      const ForwardBatch& part = overlap_.parts[i];
      const int64_t r0 = overlap_.row0[i];
      MicroBatch& m = mb[i];
      m.staged = on_device ? part_stagers_[i].stage(part, pool.page_size()) : host_view(part);
      m.r = Rows{x + r0 * c.dim,  h + r0 * c.dim, q + r0 * H_ * qd, qa + r0 * c.mla.q_lora_rank, kva + r0 * lw,
                 att + r0 * H_ * vd_, gate + r0 * std::max(c.hidden_dim, c.dim), up + r0 * c.hidden_dim,
                 m.staged.positions, on_device ? m.staged.slots : overlap_.slots[i].data(), part.n_tokens()};
      m.att = mla_args(m.staged, pool, m.r);
      if (!dp) continue;
      FP_CHECK(dp_parts_[i].rows() == m.r.n, "data-parallel micro-batch ", i, ": ", dp_parts_[i].rows(),
               " rows exchanged for ", m.r.n, " computed");
      const int64_t all_rows = dp_parts_[i].total_rows() * c.dim;
      if (on_device) {
        m.all = act_.f32(11 + static_cast<size_t>(i), all_rows);
      } else {
        resize(part_all_[i], all_rows);
        m.all = part_all_[i].data();
      }
    }
    const int64_t m_all = dp ? dp_.total_rows() : n;  // the whole batch's tokens (the logit rows' gather)
    const int64_t rows = dp ? static_cast<int64_t>(b.logit_rows.size()) : whole.n_logits;
    float* out_logits = on_device ? act_.f32(8, rows * c.n_vocab) : logits;
    float* logit_h = on_device ? act_.f32(10, rows * c.dim) : nullptr;
    float* all = on_device && dp ? act_.f32(9, m_all * c.dim) : nullptr;
    // The previous layer's FFN sums into micro-batch i's residual rows.
    auto add_ffn_sums = [&](int i) {
      MicroBatch& m = mb[i];
      if (dp) dp_parts_[i].finish_reduce_scatter(c.dim, m.r.x, true);
      else m.sum.add_into(m.r.x);
    };
    auto step = [&] {
      for (MicroBatch& m : mb) m.sum.reset();  // a recording abandoned midway may have left one in flight
      for (int i = 0; i < 2 && dp; ++i) dp_parts_[i].settle();
      for (MicroBatch& m : mb)
        if (m.r.n > 0) dispatch(EmbeddingArgs{embed_, m.staged.tokens, m.r.n, m.r.x});
      for (size_t l = 0; l < layers_.size(); ++l) {
        const DeepseekLayer& Y = layers_[l];
        for (int i = 0; i < 2; ++i) {
          MicroBatch& m = mb[i];
          if (l > 0) add_ffn_sums(i);
          if (m.r.n > 0) attention(Y, static_cast<int64_t>(l), m.r, false, pool, m.att);
          if (dp) {  // its rows to every rank while the other micro-batch attends
            if (m.r.n > 0) dispatch(RmsNormArgs{m.r.x, Y.ffn_norm, m.r.n, c.dim, c.rms_eps, m.r.h});
            dp_parts_[i].start_gather(m.r.h, c.dim);
          }
          tp_->progress();
        }
        for (int i = 0; i < 2; ++i) {
          MicroBatch& m = mb[i];
          if (dp) {  // every rank's rows of this micro-batch through the rank's experts, the sums back
            DataParallelStep& part = dp_parts_[i];
            part.finish_gather(c.dim, m.all);
            float* out = part.total_rows() > 0 ? ffn(Y, m.all, part.total_rows(), gate, up, m.all) : m.all;
            part.start_reduce_scatter(out, c.dim);
          } else {
            dispatch(RmsNormArgs{m.r.x, Y.ffn_norm, m.r.n, c.dim, c.rms_eps, m.r.h});
            m.sum.start(tp_.get(), ffn(Y, m.r.h, m.r.n, m.r.gate, m.r.up, m.r.h), m.r.n * c.dim);
          }
          tp_->progress();
        }
      }
      for (int i = 0; i < 2; ++i) add_ffn_sums(i);
      if (!on_device || rows == 0) return;
      if (dp) {  // the logit rows from whichever rank holds them
        dp_.gather(x, c.dim, all);
        logit_rows_.run(all, m_all, c.dim, dp_.logit_rows_on_device(), rows, output_norm_, c.rms_eps, logit_h);
      } else {
        logit_rows_.run(x, n, c.dim, whole.logit_rows, rows, output_norm_, c.rms_eps, logit_h);
      }
      output_.run(logit_h, rows, out_logits);
    };
    if (!on_device) {
      step();
      if (dp) resize(all_, m_all * c.dim);
      return finish_logits(b, false, dp, logits);
    }
    // Decode shapes replay a recorded graph (its collectives' forks and joins too). Under data
    // parallel the graph also depends on every rank's token counts: the whole step's (total and
    // most per rank) and how many ranks hold an odd count (which fixes both halves' shapes).
    const int64_t odd_ranks = dp ? dp_parts_[1].total_rows() - dp_parts_[0].total_rows() : 0;
    graphs_.run(n, whole.n_seqs, rows, &pool, step, dp ? (dp_.graph_variant() << 17) | (odd_ranks << 1) | 1 : 1);
    deliver_logits(out_logits, rows, logits);
  }

  // The logits of the batch's logit rows, from whichever rank holds them.
  void finish_logits(const ForwardBatch& b, bool cp, bool dp, float* logits) {
    const ModelConfig& c = config();
    resize(rows_, static_cast<int64_t>(b.logit_rows.size()) * c.dim);
    int64_t rows = 0;
    if (cp) {
      rows = cp_.gather_logit_rows(x_.data(), c.dim, rows_.data());
    } else if (dp) {
      dp_.gather(x_.data(), c.dim, all_.data());
      rows = b.gather_logit_rows(all_.data(), c.dim, rows_.data());
    } else {
      keep_final_hidden(x_.data(), b.n_tokens(), output_norm_);
      rows = b.gather_logit_rows(x_.data(), c.dim, rows_.data());
    }
    if (rows == 0) return;
    dispatch(RmsNormArgs{rows_.data(), output_norm_, rows, c.dim, c.rms_eps, rows_.data()});
    output_.run(rows_.data(), rows, logits);
  }

  // Per-head views of the KV up-projection. One tensor attn_kv_b [H * (nope + v), kv_lora]
  // (rows per head: nope key rows, then v value rows), or llama.cpp's split form attn_k_b
  // [H, kv_lora, nope] (already transposed for absorption) and attn_v_b [H, v, kv_lora].
  // The missing orientation of W_UK is materialised once: in the weights' own type for
  // F32/F16/BF16 (a 16-bit transpose: at DeepSeek-V3 size 16 MiB per layer, where an F32 copy
  // of the whole kv_b took 64 MiB more), in F32 for quantized or block-scaled (FP8) weights,
  // which are dequantized since a head's rows need not start on a block.
  void load_kv_b(ModelFile& mf, const std::string& p, DeepseekLayer& Y) {
    auto f32_view = [](const float* base, int64_t rows, int64_t cols) { return Tensor::view(base, DType::F32, {rows, cols}); };
    // src [rows, cols] of `type` (F32, F16 or BF16) -> an owned [cols, rows] tensor of that type.
    auto transposed = [&](const void* src, DType type, int64_t rows, int64_t cols) {
      const size_t n = static_cast<size_t>(rows * cols);
      if (type == DType::F32) {
        const float* f = static_cast<const float*>(src);
        float* dst = mf.own_f32(n);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t k = 0; k < cols; ++k) dst[k * rows + r] = f[r * cols + k];
        return Tensor::view(dst, type, {cols, rows});
      }
      const uint16_t* h = static_cast<const uint16_t*>(src);
      auto buf = std::shared_ptr<uint16_t[]>(new uint16_t[n]);
      mf.owners.push_back(std::shared_ptr<const void>(buf, buf.get()));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < cols; ++k) buf[static_cast<size_t>(k * rows + r)] = h[r * cols + k];
      return Tensor::view(buf.get(), type, {cols, rows});
    };
    auto plain = [](const Tensor& t) {
      return !t.block_scale && (t.dtype == DType::F32 || t.dtype == DType::F16 || t.dtype == DType::BF16);
    };
    if (mf.find(p + "attn_kv_b.weight")) {
      const Tensor& t = mf.get(p + "attn_kv_b.weight", {H_ * (nope_ + vd_), L_});
      const float* deq = plain(t) ? nullptr : load_dequantized(mf, t);
      for (int64_t h = 0; h < H_; ++h) {
        const int64_t r0 = h * (nope_ + vd_);
        if (plain(t)) {
          Y.wk.push_back(Tensor::view(t.row_ptr(r0), t.dtype, {nope_, L_}));
          Y.wv.push_back(Tensor::view(t.row_ptr(r0 + nope_), t.dtype, {vd_, L_}));
          Y.wk_t.push_back(transposed(t.row_ptr(r0), t.dtype, nope_, L_));
        } else {  // MLA decode's fused per-head GEMVs take F32/F16/BF16
          Y.wk.push_back(f32_view(deq + r0 * L_, nope_, L_));
          Y.wv.push_back(f32_view(deq + (r0 + nope_) * L_, vd_, L_));
          Y.wk_t.push_back(transposed(deq + r0 * L_, DType::F32, nope_, L_));
        }
      }
      return;
    }
    const Tensor& kb = mf.get(p + "attn_k_b.weight", {H_, L_, nope_});
    const Tensor& vb = mf.get(p + "attn_v_b.weight", {H_, vd_, L_});
    FP_CHECK(!kb.block_scale && !vb.block_scale, mf.path, ": ", p, "attn_k_b/attn_v_b must not be block-scaled");
    const float* kdeq = plain(kb) ? nullptr : load_dequantized(mf, kb);
    for (int64_t h = 0; h < H_; ++h) {
      Y.wk_t.push_back(Tensor::view(kb.row_ptr(h * L_), kb.dtype, {L_, nope_}));
      Y.wv.push_back(Tensor::view(vb.row_ptr(h * vd_), vb.dtype, {vd_, L_}));
      Y.wk.push_back(plain(kb) ? transposed(kb.row_ptr(h * L_), kb.dtype, L_, nope_)
                               : transposed(kdeq + h * L_ * nope_, DType::F32, L_, nope_));
    }
  }

  // On a device: forward's plain and data-parallel paths (expert parallel across GPU ranks, the
  // FFN sums or the data-parallel exchanges through the device's collectives) with the buffers on
  // the device, the batch staged there, and the step's device work recorded and replayed for
  // decode shapes.
  void forward_on_device(const ForwardBatch& b, KvPool& pool, float* logits) {
    const ModelConfig& c = config();
    FP_CHECK(pool.device() == device(), "the KV cache is on ", device_name(pool.device()), " but the model runs on ",
             device_name(device()));
    DeviceScope scope(device());  // every op below runs on the model's device
    // Prefill context parallel: this rank's run of the tokens, the whole layers, no FFN sums.
    const bool cp = context_parallel_ && ContextParallelStep::applies(b, tp_size());
    if (cp) cp_.begin(tp_.get(), b, pool.page_size(), pool.device());
    // Data-parallel attention: this rank's sequences only; the FFN layers see all `m` tokens.
    const bool dp = data_parallel_;
    if (dp) dp_.begin(tp_.get(), b, pool);
    const ForwardBatch& run = cp ? cp_.run() : dp ? dp_.run() : b;
    const int64_t n = run.n_tokens(), m = dp ? dp_.total_rows() : n;
    const int64_t padded = cp ? cp_.padded_rows() : dp ? dp_.padded_rows() : n;  // rows the gathers send
    const int64_t qd = nope_ + rope_, lw = L_ + rope_;
    const std::vector<DeepseekLayer>& layers = cp && !whole_layers_.empty() ? whole_layers_ : layers_;
    const bool sum_ffn = ffn_split_ && !cp;
    const StagedBatch sb = stager_.stage(run, pool.page_size(), dp || cp ? nullptr : fed_ids());
    const Rows r{act_.f32(0, padded * c.dim),  act_.f32(1, padded * c.dim), act_.f32(2, n * H_ * qd),
                 act_.f32(3, n * std::max<int64_t>(c.mla.q_lora_rank, 1)), act_.f32(4, padded * lw),
                 act_.f32(5, n * H_ * vd_), act_.f32(6, m * std::max(c.hidden_dim, c.dim)), act_.f32(7, m * c.hidden_dim),
                 sb.positions, sb.slots, n};
    float* all = dp ? act_.f32(9, m * c.dim) : nullptr;  // the whole batch's rows for the FFN layers
    MlaAttentionArgs att = mla_args(sb, pool, r);
    const int64_t rows = static_cast<int64_t>(b.logit_rows.size());
    float* out_logits = act_.f32(8, rows * c.n_vocab);
    float* logit_h = act_.f32(10, rows * c.dim);
    auto step = [&] {
      if (n > 0) dispatch(EmbeddingArgs{embed_, sb.tokens, n, r.x});
      for (size_t l = 0; l < layers.size(); ++l) {
        const DeepseekLayer& Y = layers[l];
        if (n > 0 || cp) attention(Y, static_cast<int64_t>(l), r, cp, pool, att);  // (a CP rank without tokens joins the K/V exchange)
        if (n > 0) dispatch(RmsNormArgs{r.x, Y.ffn_norm, n, c.dim, c.rms_eps, r.h});
        if (dp) dp_.gather(r.h, c.dim, all);
        float* out = ffn(Y, dp ? all : r.h, m, r.gate, r.up, dp ? all : r.h);
        if (dp) {  // each rank gets the sum of its own rows
          dp_.reduce_scatter(out, c.dim, r.h);
          out = r.h;
        } else if (sum_ffn) {
          dispatch(AllReduceArgs{tp_.get(), out, n * c.dim});  // sum the ranks' experts / FFN shares
        }
        if (n > 0) dispatch(AddArgs{r.x, out, n * c.dim, r.x});
      }
      if (rows == 0) return;
      if (dp) {  // the logit rows from whichever rank holds them
        dp_.gather(r.x, c.dim, all);
        logit_rows_.run(all, m, c.dim, dp_.logit_rows_on_device(), rows, output_norm_, c.rms_eps, logit_h);
      } else if (cp) {  // from whichever rank's run holds them
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
      graphs_.run(n, sb.n_seqs, rows, &pool, step, dp ? dp_.graph_variant() << 1 : 0);  // (odd: forward_overlapped's)
    }
    deliver_logits(out_logits, rows, logits);
  }

  // Uploads every weight the forward reads and points the layers at the device copies. The
  // absorbed MLA kernel reads W_UK and W_UV (one stack each); W_UK^T stays on the host.
  void place_on_device() {
    const ModelConfig& c = config();
    DeviceWeights& dw = weights_;
    embed_ = dw.tensor(embed_);
    output_.weight = dw.tensor(output_.weight);
    output_norm_ = dw.floats(output_norm_, c.dim);
    // The rank's layers and, with context-parallel prefill, the whole layers too (separate copies
    // of the split FFNs on a GPU; attention weights are the same tensors, uploaded once).
    for (std::vector<DeepseekLayer>* layers : {&layers_, &whole_layers_})
      for (size_t l = 0; l < layers->size(); ++l) {
        DeepseekLayer& Y = (*layers)[l];
        Y.attn_norm = dw.floats(Y.attn_norm, c.dim);
        Y.ffn_norm = dw.floats(Y.ffn_norm, c.dim);
        Y.kv_a_norm = dw.floats(Y.kv_a_norm, L_);
        Y.q_a_norm = dw.floats(Y.q_a_norm, c.mla.q_lora_rank);
        for (const Tensor** w : {&Y.wq, &Y.wq_a, &Y.wq_b, &Y.wkv_a, &Y.wo, &Y.w_gate, &Y.w_up, &Y.w_down}) *w = dw.tensor(*w);
        const bool whole = layers == &whole_layers_;  // its per-head stacks are the rank's layer's
        Y.wk = whole ? layers_[l].wk : dw.stack(Y.wk, 0, H_);
        Y.wv = whole ? layers_[l].wv : dw.stack(Y.wv, 0, H_);
        Y.wk_t.clear();
        if (Y.moe) Y.experts = place_moe_layer(Y.experts, dw);
      }
    inv_freq_at_ = dw.floats(inv_freq_.data(), static_cast<int64_t>(inv_freq_.size()));
    log_info("placed the weights on ", device_name(device()), ": ", static_cast<double>(dw.bytes()) / (1 << 20), " MiB");
  }

  static void resize(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  }

  int64_t H_ = 0, L_ = 0, rope_ = 0, nope_ = 0, vd_ = 0;
  float scale_ = 1.0f, rope_mscale_ = 1.0f;
  const Tensor* embed_ = nullptr;
  VocabParallelOutput output_;  // the output projection, split by vocabulary rows across the ranks
  const float* output_norm_ = nullptr;
  std::vector<DeepseekLayer> layers_;
  DeepseekLayer mtp_layer_{};  // with the draft layer loaded (Model::has_mtp): its decoder layer
  MtpHead mtp_head_;           // and what goes in and out of it
  std::vector<DeepseekLayer> whole_layers_;  // context-parallel prefill with EP decode: the unsplit layers
  std::vector<float> inv_freq_;
  const float* inv_freq_at_ = nullptr;  // inv_freq_ where the kernels read it (host or device)
  std::vector<float> x_, h_, q_, qa_, kva_, att_, gate_, up_, rows_;
  std::vector<BlockQ8_0> hq_;  // the normalised input quantized once for Q8_0/Q4_0 matmuls
  std::vector<int64_t> slots_;
  MicroBatchSplit overlap_;  // --micro-batch-overlap: the two micro-batches
  MoeBlock moe_{device()};
  DeviceWeights weights_{device()};  // --device cuda: the weights' device copies
  Activations act_{device()};        // --device cuda: the step's buffers and logits
  BatchStager stager_{device()};
  BatchStager part_stagers_[2] = {BatchStager(device()), BatchStager(device())};  // --micro-batch-overlap's halves
  StepGraphs graphs_{device(), file_->device_graphs};
  LogitRowGather logit_rows_{device()};
  std::deque<Tensor> shards_;  // this rank's weight slices (stable addresses)
  bool context_parallel_ = false;  // prefill batches run context parallel
  bool ffn_split_ = false;         // experts / FFN widths split across the ranks (an all-reduce per layer)
  ContextParallelStep cp_;
  bool data_parallel_ = false;  // attention data parallel (ParallelSizes::dp)
  DataParallelStep dp_{device()};
  DataParallelStep dp_parts_[2] = {DataParallelStep(device()), DataParallelStep(device())};  // --micro-batch-overlap's halves
  std::vector<float> part_all_[2];  // on the host: every rank's rows of each half, for the FFN
  std::vector<float> all_;      // data parallel: the whole batch's rows for the FFN layers
};

const bool deepseek_registered = register_sharded_architecture(
    "deepseek2",
    [](std::shared_ptr<ModelFile> f, std::shared_ptr<Communicator> comm) -> std::unique_ptr<Model> {
      return std::make_unique<DeepseekModel>(std::move(f), std::move(comm));
    },
    true);

}  // namespace
}  // namespace fp
