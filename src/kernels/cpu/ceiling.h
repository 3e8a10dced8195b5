// kernels/cpu/ceiling.h — what this machine's silicon allows, measured: memory read
// bandwidth and peak f32 FMA, int8 dot-product and (where AVX512-BF16 or AMX is) BF16
// dot-product throughput with a given thread count.
// Benchmarks print every figure as a fraction of these (the realization rate). Results are
// cached in ~/.cache/fastpath/ceiling.json ($XDG_CACHE_HOME) per CPU, thread count and the CPUs
// the threads may run on.
#pragma once
#include <string>

namespace fp {

struct MachineCeiling {
  std::string cpu;       // brand string
  int threads = 1;
  double read_gbps = 0;  // GB/s (1e9 bytes), streaming reads of a buffer far larger than caches
  double fma_gflops = 0; // f32 FMA, GFLOP/s (2 flops per multiply-add)
  double int8_gops = 0;  // int8 multiply-adds as 2 ops each, GOP/s, the fastest instruction for them
  std::string int8_path;  // that instruction: "vpmaddubsw" (AVX2, + vpaddw), "vpdpbusd ymm" / "vpdpbusd zmm" (VNNI)
  double bf16_gflops = 0;  // BF16 multiply-adds as 2 flops each, GFLOP/s, the fastest instruction; 0 without AVX512-BF16
  std::string bf16_path;   // that instruction: "vdpbf16ps", or "tdpbf16ps (AMX)" (Sapphire Rapids and later)
  bool cached = false;   // read from the cache file rather than measured now
  std::string describe() const;
};

// Measures (or reads the cache unless `recalibrate`).
MachineCeiling machine_ceiling(int threads, bool recalibrate = false);
// Streaming read bandwidth measured now, GB/s, with the current thread pool. Memory bandwidth
// on shared machines (VMs) moves with the neighbours' load, so bench measures it beside each
// decode run instead of trusting a cached figure.
double measure_read_bandwidth_now();

}  // namespace fp
