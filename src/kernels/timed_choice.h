// kernels/timed_choice.h — choices between two kernels that both accept a call and whose order
// depends on the CPU, settled by timing them (registry.h, Kernel::timed) and kept per machine.
//
// A kernel whose lead over the candidates below it is not known from CPU features alone (the
// AVX512-BF16 panels against the integer tiles for quantized prefill: 1.4-1.6x faster on Zen 4,
// 0.4-0.5x on Sapphire Rapids) is marked `timed`. The first call of a shape class runs it and
// its rivals, twice each, and the best time wins. The result is written to
// $XDG_CACHE_HOME/fastpath/kernel_choices.json (else ~/.cache/...), keyed by CPU, thread count
// and the CPUs the threads run on, so that later runs on this machine take the same kernel (the
// same numerics: greedy output does not change from run to run) without timing again.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fp {

struct TimedChoice {
  std::vector<std::pair<std::string, double>> times;  // kernel, best ms per call; fastest first
  bool cached = false;  // read from the machine's file, not timed in this process
  const std::string& winner() const { return times.front().first; }
  std::string describe() const;  // "avx512vnni 2.445 ms, avx512bf16 3.049 ms per call, ..."
};

// The choice stored for (op, shape class) among these kernels on this machine, if any.
std::optional<TimedChoice> load_timed_choice(const std::string& op, const std::string& shape_class,
                                             std::vector<std::string> kernels);
void store_timed_choice(const std::string& op, const std::string& shape_class, const TimedChoice& c);

// Forget this CPU's stored choices, for every thread count: the next dispatch times again
// (`bench --recalibrate`).
void forget_timed_choices();

}  // namespace fp
