// kernels/cpu/quantize_act.cpp — see quantize_act.h. Plain loops; they run once per
// activation row, against a whole weight matrix per row, so they are not the hot path.
#include "kernels/cpu/quantize_act.h"

#include <algorithm>
#include <cmath>

namespace fp {

void quantize_act_q8_0(const float* x, BlockQ8_0* out, int64_t n) { quantize_row_q8_0(x, out, n); }

void quantize_act_q8_k(const float* x, BlockQ8_K* out, int64_t n) {
  for (int64_t b = 0; b < n / QK_K; ++b) {
    const float* v = x + b * QK_K;
    float amax = 0;
    for (int i = 0; i < QK_K; ++i) amax = std::max(amax, std::fabs(v[i]));
    BlockQ8_K& o = out[b];
    o.d = amax / 127.0f;
    float id = amax > 0 ? 127.0f / amax : 0.0f;
    for (int i = 0; i < QK_K; ++i) o.qs[i] = static_cast<int8_t>(std::lround(v[i] * id));
    for (int g = 0; g < QK_K / 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += o.qs[g * 16 + i];
      o.bsums[g] = static_cast<int16_t>(s);
    }
  }
}

}  // namespace fp
