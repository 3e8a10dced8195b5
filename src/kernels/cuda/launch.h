// kernels/cuda/launch.h — host entry points of the CUDA kernels, one per op (every pointer in
// the arguments is device memory). Each launches on the backend's stream and checks the launch;
// the refuse_* functions say why a call is outside what the kernel supports ("" when it runs).
// Registered with the op registry in register_cuda.cpp.
#pragma once
#include <string>

#include "kernels/ops.h"
#include "kernels/ops_moe.h"

namespace fp::cuda {

// elementwise.cu
std::string refuse_embedding(const EmbeddingArgs& a);  // tables of F32, F16, BF16, Q8_0, Q4_K, Q6_K, F8_E4M3 (no block scales)
void embedding(const EmbeddingArgs& a);
std::string refuse_rmsnorm(const RmsNormArgs& a);  // no fused Q8_0 output (a CPU activation layout)
void rmsnorm(const RmsNormArgs& a);
void rope(const RopeArgs& a);
void silu_mul(const SiluMulArgs& a);
void gelu_mul(const GeluMulArgs& a);
std::string refuse_softcap(const SoftcapArgs& a);
void softcap(const SoftcapArgs& a);
void add(const AddArgs& a);
void softmax(const SoftmaxArgs& a);
void argmax(const ArgmaxArgs& a);
void token_feed(const TokenFeedArgs& a);
// sample.cu: temperature / top-k / top-p / min-p by radix selection, one block per row
std::string refuse_sample(const SampleArgs& a);
void sample(const SampleArgs& a);
void kv_write(const KvWriteArgs& a);
void kv_move(const KvMoveArgs& a);  // stored rows between slots and packed rows, as they are

// attention.cu: the plain kernel, one warp per (token, head)
std::string refuse_attention(const AttentionArgs& a);
void attention(const AttentionArgs& a);
// attention_tiled.cu: split-KV decode (n == n_seqs) and tiled prefill (any batch)
std::string refuse_attention_split_kv(const AttentionArgs& a);
void attention_split_kv(const AttentionArgs& a);
std::string refuse_attention_tiled(const AttentionArgs& a);
void attention_tiled(const AttentionArgs& a);
// attention_wmma.cu: flash attention on the tensor cores (F16 WMMA), head_dim = v_dim = 64 or 128
std::string refuse_attention_wmma(const AttentionArgs& a);
void attention_wmma(const AttentionArgs& a);
// attention_mma.cu: flash attention with Q, S, P and O in registers (mma.sync m16n8k16 F16);
// the same calls as wmma (refuse_attention_wmma)
void attention_mma(const AttentionArgs& a);
// attention_mma_pipelined.cu: the same loop on the cache's own F16/BF16 with cp.async double-buffered tiles
std::string refuse_attention_mma_pipelined(const AttentionArgs& a);
void attention_mma_pipelined(const AttentionArgs& a);

// matmul.cu: the plain kernel (every weight dtype below, any alignment)
std::string refuse_matmul(const MatMulArgs& a);
void matmul(const MatMulArgs& a);
// gemv.cu: decode, n <= 8 tokens
std::string refuse_gemv(const MatMulArgs& a);
void gemv(const MatMulArgs& a);
void gemv_warp(const MatMulArgs& a);  // the same calls, a warp per 2 rows (refuse_gemv)
// gemv_q8.cu: decode on Q8_0 weights of in % 256 == 0, whole 16-byte loads staged in shared memory
std::string refuse_gemv_q8(const MatMulArgs& a);
void gemv_q8(const MatMulArgs& a);
// gemm_cublas.cu: cuBLAS GemmEx (quantized weights dequantized to F16/BF16 first)
std::string refuse_gemm_cublas(const MatMulArgs& a);
void gemm_cublas(const MatMulArgs& a);
// gemm_cublaslt_fp8.cu: FP8 E4M3 x 128x128 block scales on Hopper's FP8 tensor cores (x quantized
// per token and 128 columns); shapes its path does not take run gemm_cublas
std::string refuse_cublaslt_fp8(const MatMulArgs& a);
void gemm_cublaslt_fp8(const MatMulArgs& a);
int64_t cublaslt_fp8_fallbacks();  // calls so far that ran gemm_cublas instead (shape or no algorithm)
// What the per-shape timing of cuBLASLt's candidates found (zeros: not timed, e.g. one candidate).
struct Fp8GemmTuning {
  int candidates = 0;      // algorithms the heuristic offered
  int chosen = 0;          // the fastest's rank in the heuristic's order
  float first_ms = 0.0f;   // the heuristic's first choice, one matmul
  float chosen_ms = 0.0f;  // the fastest
};
Fp8GemmTuning cublaslt_fp8_tuning(int64_t out, int64_t n, int64_t K);

// moe_route.cu: one warp per token
std::string refuse_moe_route(const MoeRouteArgs& a);
void moe_route(const MoeRouteArgs& a);
// moe_ffn.cu: tokens sorted by expert, grouped GEMMs, combine (experts one evenly spaced stack)
std::string refuse_moe_ffn(const MoeFfnArgs& a);
void moe_ffn(const MoeFfnArgs& a);

// mla.cu: MLA attention in the absorbed form over the latent cache (per-head weights one stack each)
std::string refuse_mla(const MlaAttentionArgs& a);
void mla_attention(const MlaAttentionArgs& a);

}  // namespace fp::cuda
