// kernels/cpu/quantize_act.h — activation quantization for integer dot products: Q8_0
// (32-value blocks, as ggml does for Q8_0/Q4_0 weights) and Q8_K (256-value blocks with
// 16-value sums, for the K-quants).
#pragma once
#include <cstdint>

#include "core/dtype.h"

namespace fp {

struct BlockQ8_K {
  float d;
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];  // sum of each 16 quants (for K-quant minimums and offsets)
};

void quantize_act_q8_0(const float* x, BlockQ8_0* out, int64_t n);  // n % 32 == 0
void quantize_act_q8_k(const float* x, BlockQ8_K* out, int64_t n);  // n % 256 == 0

}  // namespace fp
