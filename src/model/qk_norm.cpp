// model/qk_norm.cpp — q/k RMS norms per head or over the whole projection (model/qk_norm.h).
#include "model/qk_norm.h"

#include <cmath>

#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {

void QkNorm::run(const ModelConfig& c, float* t, const float* w, int64_t n, int64_t heads, int64_t full_heads,
                 Communicator* comm) {
  const int64_t d = heads * c.head_dim;
  if (!c.qk_norm_full) return dispatch(RmsNormArgs{t, w, n * heads, c.head_dim, c.rms_eps, t});
  if (heads == full_heads) return dispatch(RmsNormArgs{t, w, n, d, c.rms_eps, t});
  sums_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += t[i * d + j] * t[i * d + j];
    sums_[static_cast<size_t>(i)] = ss;
  }
  dispatch(AllReduceArgs{comm, sums_.data(), n});
  const float whole = static_cast<float>(full_heads * c.head_dim);
  for (int64_t i = 0; i < n; ++i) {
    const float scale = 1.0f / std::sqrt(sums_[static_cast<size_t>(i)] / whole + c.rms_eps);
    for (int64_t j = 0; j < d; ++j) t[i * d + j] *= scale * w[j];
  }
}

}  // namespace fp
