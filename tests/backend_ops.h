// tests/backend_ops.h — the op-test harness in the manner of ggml's test-backend-ops: every
// kernel registered for an op is run on the same random inputs as a reference kernel, at 1 and
// 2 threads, and compared with a normalised error: max|k - ref| / max|ref|. Outputs are
// poisoned with NaN before each run so a kernel that skips an element fails.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/registry.h"

namespace fp::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

inline double normalised_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double err = 0, mx = 1.0;  // floor: a lone output near zero (cancellation) is judged absolutely
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(got[i]) != std::isnan(ref[i])) return INFINITY;
    err = std::max(err, static_cast<double>(std::fabs(got[i] - ref[i])));
    mx = std::max(mx, static_cast<double>(std::fabs(ref[i])));
  }
  return err / mx;
}

// One test case: `make(out)` builds fresh inputs (same seed every call), sizes `out`, fills it
// with NaN, and returns the op's arguments writing into `out`. Every registered kernel that
// accepts the case runs and is compared with the kernel named `ref`. Returns how many
// non-reference kernels were checked.
template <class Args>
// Every CPU kernel (that `only` accepts, when given) against the reference kernel `ref`.
int check_kernels(const std::string& label, const std::function<Args(std::vector<float>& out)>& make,
                  const std::string& ref, double tol, const std::function<bool(const Kernel<Args>&)>& only = nullptr) {
  const auto& kernels = OpRegistry<Args>::instance().kernels();
  const Kernel<Args>* rk = nullptr;
  for (auto& k : kernels)
    if (k.name == ref) rk = &k;
  EXPECT_TRUE(rk) << "no reference kernel " << ref << " for " << Args::kName;
  if (!rk) return 0;
  std::vector<float> want;
  Args ra = make(want);
  rk->run(ra);
  int checked = 0;
  for (auto& k : kernels) {
    if (&k == rk || k.reference || k.backend != Backend::CPU) continue;  // CUDA kernels: tests/cuda/
    if (only && !only(k)) continue;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      std::vector<float> got;
      Args ka = make(got);
      if (k.refuse && !k.refuse(ka).empty()) continue;
      k.run(ka);
      double e = normalised_error(got, want);
      EXPECT_LE(e, tol) << Args::kName << " kernel " << k.name << " vs " << ref << " on " << label << " (threads "
                        << threads << ")";
      ++checked;
    }
  }
  set_num_threads(0);
  return checked;
}

}  // namespace fp::test
