// kernels/ops.cpp — shape classes: the keys under which dispatch decisions are cached and
// the ledger groups calls. They name what a kernel's requirements depend on.
#include "kernels/ops.h"

#include <sstream>

namespace fp {

std::string EmbeddingArgs::shape_class() const {
  return std::string("table=") + dtype_name(table->dtype) + (scale != 1.0f ? " scaled" : "");
}

std::string MatMulArgs::shape_class() const {
  // Kernels switch paths at 4 tokens (CPU GEMV), 8 (CUDA GEMV), 32 (the CPU's AVX512-BF16
  // kernel packs panels beyond it, the AMX one starts) and 256 (the AVX512-BF16 one takes
  // quantized weights beyond it); the class follows, so a cached decision never meets a call on
  // the other side of any of those lines. 128 splits the range of a timed choice (AMX against
  // the integer tiles): the lead changes with the token count, and a choice timed on a 40-token
  // call should not decide for 250 tokens.
  std::string s = std::string("w=") + dtype_name(w->dtype) +
                  (n <= 4      ? " gemv"
                   : n <= 8    ? " gemv8"
                   : n <= 32   ? " gemm32"
                   : n <= 128  ? " gemm128"
                   : n <= 256  ? " gemm256"
                               : " gemm");
  // The interleaved integer kernels need rows of whole 256-value groups; a model can mix such
  // rows with others of the same dtype (a 96- or 896-wide FFN), so they are a class of their own.
  if (dtype_info(w->dtype).quantized && w->cols() % 256 != 0) s += " k%256!=0";
  // Likewise rows of float weights that are not whole 8-value chunks (stories260K's 172-wide
  // FFN beside its 64-wide rows): the CUDA GEMV reads 8 at a time and refuses them, a decision
  // that must not be cached for the other rows' class (seen on the H200: the FFN's last 4
  // columns dropped, greedy text off the CPU's).
  if (!dtype_info(w->dtype).quantized && w->cols() % 8 != 0) s += " k%8!=0";
  if (w->block_scale) s += " block-scaled";
  if (bias) s += " +bias";
  return s;
}

std::string RmsNormArgs::shape_class() const {
  return std::string(q8 ? "f32 +q8_0" : "f32") + (row_stride() != d ? " strided" : "") + (add ? " +residual" : "");
}

std::string RopeArgs::shape_class() const {
  return std::string(style == RopeStyle::NeoX ? "neox" : "adjacent") + " hd=" + std::to_string(head_dim);
}

std::string AttentionArgs::shape_class() const {
  return "hd=" + std::to_string(head_dim) + " gqa=" + std::to_string(n_kv_heads ? n_heads / n_kv_heads : 0) +
         (n == n_seqs ? " decode" : " prefill") + " page=" + std::to_string(page_size) + " kv=" + dtype_name(kv_dtype) +
         (window > 0 ? " window=" + std::to_string(window) : std::string()) +
         (chunk > 0 ? " chunk=" + std::to_string(chunk) : std::string()) + (sinks ? " sinks" : "") + (softcap > 0 ? " softcap" : "");
}

std::string refuse_attention_options(const AttentionArgs& a, AttentionOptions takes) {
  if (a.window > 0 && !takes.window) return "sliding-window attention (window " + std::to_string(a.window) + ") is not implemented here";
  if (a.chunk > 0 && !takes.chunk) return "chunked attention (chunk " + std::to_string(a.chunk) + ") is not implemented here";
  if (a.sinks && !takes.sinks) return "attention sinks are not implemented here";
  if (a.softcap > 0 && !takes.softcap) {
    std::ostringstream os;
    os << "score soft-capping (softcap " << a.softcap << ") is not implemented here";
    return os.str();
  }
  return {};
}

bool AttentionArgs::wide(int64_t s) const {
  const int64_t tokens = seq_indptr[s + 1] - seq_indptr[s];
  return n_kv_heads > 0 && tokens >= kWideMinTokens && tokens * (n_heads / n_kv_heads) >= kWideMinRows;
}

std::string refuse_kv_dtype(DType t, std::initializer_list<DType> reads) {
  std::string names;
  for (DType r : reads) {
    if (r == t) return {};
    names += (names.empty() ? "" : ", ") + std::string(dtype_name(r));
  }
  return std::string("KV cache dtype ") + dtype_name(t) + ": this kernel reads " + names;
}

std::string KvWriteArgs::shape_class() const { return std::string("kv=") + dtype_name(dtype); }
std::string KvMoveArgs::shape_class() const { return into_pool ? "unpack" : "pack"; }
std::string SiluMulArgs::shape_class() const { return "f32"; }
std::string GeluMulArgs::shape_class() const { return "f32"; }
std::string AddArgs::shape_class() const { return "f32"; }
int64_t LoraArgs::low_width() const {
  int64_t w = 0;
  for (int p = 0; p < n_parts; ++p) w += parts[p].a->dim(0);
  return w;
}
std::string LoraArgs::shape_class() const {
  return std::string("w=") + dtype_name(n_parts > 0 ? parts[0].a->dtype : DType::F32) + (n <= 8 ? " gemv" : " gemm");
}
std::string SoftmaxArgs::shape_class() const { return "f32"; }
std::string SoftcapArgs::shape_class() const { return "f32"; }
std::string ArgmaxArgs::shape_class() const { return "f32"; }
std::string TokenFeedArgs::shape_class() const { return "i32"; }
std::string SampleArgs::shape_class() const { return "f32"; }

}  // namespace fp
