// kernels/cuda/launch.h — host entry points of the CUDA kernels, one per op (every pointer in
// the arguments is device memory). Each launches on the backend's stream and checks the launch;
// the refuse_* functions say why a call is outside what the kernel supports ("" when it runs).
// Registered with the op registry in register_cuda.cpp.
#pragma once
#include <string>

#include "kernels/ops.h"

namespace fp::cuda {

// elementwise.cu
std::string refuse_embedding(const EmbeddingArgs& a);  // tables of F32, F16, BF16, Q8_0
void embedding(const EmbeddingArgs& a);
std::string refuse_rmsnorm(const RmsNormArgs& a);  // no fused Q8_0 output (a CPU activation layout)
void rmsnorm(const RmsNormArgs& a);
void rope(const RopeArgs& a);
void silu_mul(const SiluMulArgs& a);
void add(const AddArgs& a);
void softmax(const SoftmaxArgs& a);
void argmax(const ArgmaxArgs& a);
void kv_write(const KvWriteArgs& a);

// attention.cu
std::string refuse_attention(const AttentionArgs& a);
void attention(const AttentionArgs& a);

// matmul.cu
std::string refuse_matmul(const MatMulArgs& a);
void matmul(const MatMulArgs& a);

}  // namespace fp::cuda
