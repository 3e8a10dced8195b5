// model/mtp.cpp — the multi-token-prediction layer's input projection and head (model/mtp.h).
#include "model/mtp.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/registry.h"
#include "model/moe_layers.h"

namespace fp {

void MtpHead::load(ModelFile& mf, int64_t layer, const Tensor* embed, const Tensor* output, const Tensor* output_used,
                   Communicator* comm, WeightRepacker& rp, std::deque<Tensor>& shards) {
  const ModelConfig& c = mf.config;
  dim_ = c.dim;
  eps_ = c.rms_eps;
  const std::string p = "blk." + std::to_string(layer) + ".nextn.";
  FP_CHECK(mf.find(p + "eh_proj.weight"), mf.path, ": no tensor '", p, "eh_proj.weight': the file has no multi-token-prediction ",
           "layer to draft with (", c.mtp_layers, " declared after the ", c.n_layers, " layers)");
  eh_proj_ = rp.repack(&mf.get(p + "eh_proj.weight", {c.dim, 2 * c.dim}));
  enorm_ = load_vec_f32(mf, p + "enorm.weight", c.dim);
  hnorm_ = load_vec_f32(mf, p + "hnorm.weight", c.dim);
  head_norm_ = load_vec_f32(mf, p + "shared_head_norm.weight", c.dim);
  embed_ = mf.find(p + "embed_tokens.weight") ? &mf.get(p + "embed_tokens.weight", {c.n_vocab, c.dim}) : embed;
  const Tensor* head = mf.find(p + "shared_head_head.weight") ? &mf.get(p + "shared_head_head.weight", {c.n_vocab, c.dim}) : output;
  head_.init(head, comm, shards, mf.path);
  head_.weight = head == output ? output_used : rp.repack(head_.weight);
}

void MtpHead::input(const int32_t* tokens, const int32_t* pos, const float* hidden, int64_t n, float* x) {
  if (n <= 0) return;
  const int64_t d = dim_, w = 2 * d;
  if (static_cast<int64_t>(cat_.size()) < n * w) cat_.resize(static_cast<size_t>(n * w));
  if (static_cast<int64_t>(emb_.size()) < n * d) emb_.resize(static_cast<size_t>(n * d));
  dispatch(EmbeddingArgs{embed_, tokens, n, emb_.data()});
  for (int64_t i = 0; i < n; ++i) {  // [embedding ; hidden] per row
    float* row = cat_.data() + i * w;
    if (pos[i] == 0) std::fill(row, row + d, 0.0f);
    else std::memcpy(row, emb_.data() + i * d, static_cast<size_t>(d) * sizeof(float));
    std::memcpy(row + d, hidden + i * d, static_cast<size_t>(d) * sizeof(float));
  }
  RmsNormArgs en{cat_.data(), enorm_, n, d, eps_, cat_.data()};
  en.stride = w;
  dispatch(en);
  RmsNormArgs hn{cat_.data() + d, hnorm_, n, d, eps_, cat_.data() + d};
  hn.stride = w;
  dispatch(hn);
  dispatch(MatMulArgs{cat_.data(), n, eh_proj_, nullptr, x});
}

void MtpHead::logits(float* out, int64_t rows, float* logits) {
  if (rows <= 0) return;
  dispatch(RmsNormArgs{out, head_norm_, rows, dim_, eps_, out});
  head_.run(out, rows, logits);
}

}  // namespace fp
