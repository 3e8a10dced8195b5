// kernels/cpu/ceiling.cpp — the bandwidth and peak-throughput probes (AVX2 where present,
// scalar otherwise), and their cache file.
#include "kernels/cpu/ceiling.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cpu_affinity.h"
#include "core/cpu_features.h"
#include "core/log.h"
#include "core/paths.h"
#include "core/thread_pool.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/matmul_common.h"
#include "kernels/cpu/simd_avx2.h"

namespace fp {
namespace {

using Clock = std::chrono::steady_clock;

// The probes measure the machine, so sanitizer builds leave them uninstrumented: instrumented, they
// measured the sanitizer (and took ~20 s of every sanitized test that calibrates).
#define FP_PROBE __attribute__((no_sanitize("address", "undefined")))

// prefetch: also ask for the lines 2 KiB ahead (as the decode GEMVs do, cpu::kStreamAheadBytes),
// which on some machines streams faster than the hardware prefetchers alone.
FP_PROBE FP_AVX2 double sum_avx2(const float* p, int64_t n, bool prefetch) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    if (prefetch) {
      cpu::prefetch_stream(p + i);
      cpu::prefetch_stream(p + i + 16);
    }
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  return avx2::hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

FP_PROBE double sum_scalar(const float* p, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}

// Streams a 1 GiB buffer with every thread reading its own slice; best of 6 passes, alternately
// without and with software prefetch (a kernel that prefetches must not read above the ceiling).
FP_PROBE void fill_pattern(float* p, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) p[i] = static_cast<float>(i & 7);
}

double measure_read_gbps() {
  const int64_t n = (int64_t{1} << 30) / 4;
  float* buf = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * 4));
  if (!buf) return 0;
  const bool avx2 = cpu_features().missing({"avx2", "fma", "f16c"}).empty();
  thread_pool().parallel_for(n, 1 << 20, [&](int64_t b, int64_t e) { fill_pattern(buf, b, e); });
  double best = 0;
  volatile double sink = 0;
  for (int rep = 0; rep < 6; ++rep) {
    auto t0 = Clock::now();
    thread_pool().parallel_for(n / 32, 1, [&](int64_t b, int64_t e) {
      double s = avx2 ? sum_avx2(buf + b * 32, (e - b) * 32, rep % 2 == 1) : sum_scalar(buf + b * 32, (e - b) * 32);
      sink = sink + s;
    });
    double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n) * 4 / sec / 1e9);
  }
  std::free(buf);
  return best;
}

// 12 independent FMA chains per thread hide the FMA latency on every current x86 core.
FP_PROBE FP_AVX2 double fma_loop(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], m, c);
  __m256 s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, acc[i]);
  return avx2::hsum(s);
}

// The int8 dot-product peak is the fastest instruction sequence the CPU has for it:
// vpmaddubsw + vpaddw on AVX2 (32 multiply-adds per step; the 4-bit kernels run this, adding
// pairs in int16), vpdpbusd on AVX-VNNI (32) and AVX512-VNNI (64). Kernels that must widen
// every step with vpmaddwd (8-bit and 6-bit weights on AVX2) reach less of it.
// The step is written in asm: from intrinsics GCC either hoisted the multiply (constant
// operands: an earlier probe timed vpaddd alone, 4.5x the real rate on an AMD EPYC VM) or, once
// told the operands change, kept some of the eight sums on the stack, and the store-to-load
// round trip in each chain held the probe to ~0.65 multiplies per cycle, below what the prefill
// kernels themselves reach. Here eight sums, two operands and the constant stay in registers,
// and every step multiplies.
FP_PROBE FP_AVX2 double int8_loop(int64_t iters) {
  __m256i c0 = _mm256_set1_epi32(0), c1 = _mm256_set1_epi32(1), c2 = _mm256_set1_epi32(2), c3 = _mm256_set1_epi32(3);
  __m256i c4 = _mm256_set1_epi32(4), c5 = _mm256_set1_epi32(5), c6 = _mm256_set1_epi32(6), c7 = _mm256_set1_epi32(7);
  const __m256i a0 = _mm256_set1_epi8(3), a1 = _mm256_set1_epi8(5), b = _mm256_set1_epi8(-2);
  for (int64_t it = 0; it < iters; ++it) {
    __asm__ volatile(
        "vpmaddubsw %[b], %[a0], %%ymm14\n\t vpaddw %%ymm14, %[c0], %[c0]\n\t"
        "vpmaddubsw %[b], %[a1], %%ymm15\n\t vpaddw %%ymm15, %[c1], %[c1]\n\t"
        "vpmaddubsw %[b], %[a0], %%ymm14\n\t vpaddw %%ymm14, %[c2], %[c2]\n\t"
        "vpmaddubsw %[b], %[a1], %%ymm15\n\t vpaddw %%ymm15, %[c3], %[c3]\n\t"
        "vpmaddubsw %[b], %[a0], %%ymm14\n\t vpaddw %%ymm14, %[c4], %[c4]\n\t"
        "vpmaddubsw %[b], %[a1], %%ymm15\n\t vpaddw %%ymm15, %[c5], %[c5]\n\t"
        "vpmaddubsw %[b], %[a0], %%ymm14\n\t vpaddw %%ymm14, %[c6], %[c6]\n\t"
        "vpmaddubsw %[b], %[a1], %%ymm15\n\t vpaddw %%ymm15, %[c7], %[c7]\n\t"
        : [c0] "+x"(c0), [c1] "+x"(c1), [c2] "+x"(c2), [c3] "+x"(c3), [c4] "+x"(c4), [c5] "+x"(c5), [c6] "+x"(c6),
          [c7] "+x"(c7)
        : [a0] "x"(a0), [a1] "x"(a1), [b] "x"(b)
        : "xmm14", "xmm15");
  }
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                               _mm256_add_epi32(_mm256_add_epi32(c4, c5), _mm256_add_epi32(c6, c7)));
  return avx2::hsum_i32(s);
}

// vpdpbusd accumulates into its destination, so the chains carry themselves (as the FMA probe).
FP_PROBE __attribute__((target("avx2,fma,f16c,avxvnni"))) double avxvnni_loop(int64_t iters) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi32(i);
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_dpbusd_avx_epi32(acc[i], a, b);
  }
  __m256i s = acc[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_epi32(s, acc[i]);
  return avx2::hsum_i32(s);
}

FP_PROBE __attribute__((target("avx512f,avx512vnni"))) double avx512vnni_loop(int64_t iters) {
  __m512i acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  __m512i s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_epi32(s, acc[i]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, s);
  double sum = 0;
  for (int32_t v : lanes) sum += v;
  return sum;
}

// vdpbf16ps on 512-bit registers: 16 lanes x 2 BF16 products per step, as the BF16 prefill
// kernel runs them.
// 16 chains, unrolled so that they stay in registers (a loop over an array of 24 was not, and
// measured the stores: 205 instead of 457 GFLOP/s per core here): enough for a core that issues
// two per cycle at a latency of up to 8 cycles.
FP_PROBE __attribute__((target("avx512f,avx512bf16"))) double bf16_loop(int64_t iters) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x33d633d6);  // 1.0, 1e-7
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, s);
  double sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}

// AMX TDPBF16PS: 16 x 16 f32 sums += 16 x 32 BF16 by 32 x 16 BF16 (16384 flops), four
// independent sum tiles per step as the amxbf16 kernel keeps them. One step stands for 16 of
// measure_peak's iterations (a step takes ~16 cycles per tile where a vector loop's takes ~8).
constexpr int64_t kAmxItersPerStep = 16;

FP_PROBE __attribute__((target("amx-tile,amx-bf16"))) double amx_bf16_loop(int64_t iters) {
  alignas(64) uint32_t a[16 * 16], b[16 * 16];  // BF16 pairs (1.0, 1.0) and (1e-7, 1e-7), as bf16_loop
  for (int i = 0; i < 16 * 16; ++i) a[i] = 0x3f803f80u, b[i] = 0x33d633d6u;
  alignas(64) float out[16 * 16];
  asm volatile("" ::: "memory");  // the tile loads below read a and b (GCC does not see it)
  _tile_loadconfig(&cpu::kAmxTiles);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  for (int64_t it = 0; it < iters / kAmxItersPerStep; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  asm volatile("" ::: "memory");
  _tile_stored(0, out, 64);
  asm volatile("" ::: "memory");
  _tile_release();
  return out[0];
}

template <class Loop>
double measure_peak(Loop loop, double ops_per_iter) {
  const int threads = thread_pool().size();
  const int64_t iters = 20'000'000;
  double best = 0;
  volatile double sink = 0;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    thread_pool().parallel_for(threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) sink = sink + loop(iters);
    });
    double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, ops_per_iter * static_cast<double>(iters) * threads / sec / 1e9);
  }
  return best;
}

// In fastpath_cache_dir() (the test suite points XDG_CACHE_HOME into the build tree: figures
// measured while tests run side by side must not become this machine's calibration).
std::string cache_path() { return fastpath_cache_dir() + "/ceiling.json"; }

}  // namespace

double measure_read_bandwidth_now() { return measure_read_gbps(); }

std::string MachineCeiling::describe() const {
  std::ostringstream os;
  os.precision(4);
  os << cpu << ", " << threads << " threads: read " << read_gbps << " GB/s, f32 FMA " << fma_gflops << " GFLOP/s, int8 dot "
     << int8_gops << " GOP/s";
  if (!int8_path.empty()) os << " (" << int8_path << ")";
  if (bf16_gflops > 0) os << ", bf16 dot " << bf16_gflops << " GFLOP/s (" << bf16_path << ")";
  os << (cached ? " (cached calibration)" : " (measured now)");
  return os.str();
}

MachineCeiling machine_ceiling(int threads, bool recalibrate) {
  MachineCeiling c;
  c.cpu = cpu_features().brand.empty() ? "unknown CPU" : cpu_features().brand;
  c.threads = threads;
  // Per CPU, thread count and the CPUs the threads may run on: 2 threads bound to one core (a
  // rank under mpirun's default binding) measure one core, not this machine's two.
  const std::string key = c.cpu + " | " + std::to_string(threads) + " threads on CPUs " + thread_cpus().text();
  nlohmann::json cache = nlohmann::json::object();
  {
    std::ifstream in(cache_path());
    if (in) cache = nlohmann::json::parse(in, nullptr, false);
    if (cache.is_discarded() || !cache.is_object()) cache = nlohmann::json::object();
  }
  if (!recalibrate && cache.contains(key) && cache[key].is_object()) {
    auto& e = cache[key];
    c.read_gbps = e.value("read_gbps", 0.0);
    c.fma_gflops = e.value("fma_gflops", 0.0);
    c.int8_gops = e.value("int8_peak_gops", 0.0);  // older keys hold probes that understated it
    c.int8_path = e.value("int8_path", std::string());
    c.bf16_gflops = e.value("bf16_peak_gflops", 0.0);  // older keys lack the AMX probe
    c.bf16_path = e.value("bf16_path", std::string());
    const bool bf16 = cpu_features().missing({"avx512f", "avx512_bf16"}).empty();
    c.cached = c.read_gbps > 0 && c.fma_gflops > 0 && c.int8_gops > 0 && (c.bf16_gflops > 0 || !bf16);  // older caches lack some
    if (c.cached) return c;
  }
  log_info("measuring this machine's ceilings (bandwidth, FMA and int8 peaks) with ", threads, " threads...");
  set_num_threads(threads);
  c.read_gbps = measure_read_gbps();
  if (cpu_features().missing({"avx2", "fma", "f16c"}).empty()) {
    c.fma_gflops = measure_peak(fma_loop, 12 * 8 * 2);
    c.int8_gops = measure_peak(int8_loop, 8 * 32 * 2);
    c.int8_path = "vpmaddubsw";
  }
  if (cpu_features().missing({"avx_vnni"}).empty()) {
    const double g = measure_peak(avxvnni_loop, 12 * 32 * 2);
    if (g > c.int8_gops) c.int8_gops = g, c.int8_path = "vpdpbusd ymm";
  }
  if (cpu_features().missing({"avx512f", "avx512_vnni"}).empty()) {
    const double g = measure_peak(avx512vnni_loop, 16 * 64 * 2);
    if (g > c.int8_gops) c.int8_gops = g, c.int8_path = "vpdpbusd zmm";
  }
  if (cpu_features().missing({"avx512f", "avx512_bf16"}).empty()) {
    c.bf16_gflops = measure_peak(bf16_loop, 16 * 16 * 2 * 2);
    c.bf16_path = "vdpbf16ps";
  }
  if (cpu_features().missing({"amx_bf16"}).empty() && amx_tile_permission().empty()) {
    const double g = measure_peak(amx_bf16_loop, 4.0 * 16 * 16 * 32 * 2 / kAmxItersPerStep);
    if (g > c.bf16_gflops) c.bf16_gflops = g, c.bf16_path = "tdpbf16ps (AMX)";
  }
  cache[key] = {{"read_gbps", c.read_gbps},     {"fma_gflops", c.fma_gflops},       {"int8_peak_gops", c.int8_gops},
                {"int8_path", c.int8_path},     {"bf16_peak_gflops", c.bf16_gflops}, {"bf16_path", c.bf16_path}};
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(cache_path()).parent_path(), ec);
  std::ofstream(cache_path()) << cache.dump(2) << "\n";
  return c;
}

}  // namespace fp
