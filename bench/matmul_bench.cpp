// bench/matmul_bench.cpp — matmul kernels at Llama-3.2-1B shapes (and gpt-oss's 5760x2880 for the 32-value formats, Gemma 3 1B's 1152-wide rows): decode (1 token, weight bytes
// streamed -> GB/s), small batches (4 and 12 tokens) and prefill (512 tokens -> GFLOP/s), for
// every weight dtype the 1B bench uses (the _X8 forms: Q8_0 / Q4_K / Q6_K as repacked at load). Each registered kernel runs directly; the reference only on small n (it is slow).
//   build/bench/fastpath_ops_bench --benchmark_filter=matmul --benchmark_repetitions=3
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

namespace fp {
namespace {

struct MatMulBenchData {
  std::vector<uint8_t> w;
  std::vector<float> x, y;
  Tensor t;
};

MatMulBenchData make(DType type, int64_t n, int64_t out, int64_t in) {
  MatMulBenchData d;
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> row(static_cast<size_t>(in));
  int64_t rb = row_bytes(type, in);
  d.w.resize(static_cast<size_t>(rb * out));
  for (int64_t o = 0; o < out; ++o) {
    for (auto& v : row) v = g(rng);
    quantize_row(type, row.data(), d.w.data() + o * rb, in);
  }
  d.x.resize(static_cast<size_t>(n * in));
  for (auto& v : d.x) v = g(rng);
  d.y.resize(static_cast<size_t>(n * out));
  d.t = Tensor::view(d.w.data(), type, {out, in});
  return d;
}

void register_all() {
  struct Shape { int64_t out, in; };
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q8_0_X8, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                     DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q4_K_X8, DType::Q5_K, DType::Q6_K, DType::Q6_K_X8,
                     DType::Q4_0_X8, DType::Q4_1_X8, DType::Q5_0_X8, DType::Q5_1_X8, DType::Q3_K_X8,
                     DType::Q2_K_X8, DType::IQ4_NL, DType::IQ4_XS, DType::IQ4_NL_X8, DType::IQ4_XS_X8, DType::MXFP4, DType::MXFP4_X8}) {
    std::vector<Shape> shapes{{2048, 2048}, {8192, 2048}, {2048, 8192}};
    // The 32-value file formats also at gpt-oss's expert gate+up (rows of 2880 values: 11 groups of
    // 256 and 2 blocks, the interleaved GEMM's zero-padded last group).
    if (dtype_info(type).block_elems == 32) shapes.push_back({5760, 2880});
    // Gemma 3 1B's output projection cut to a quarter of its 262144 rows (rows of 1152 values: 4
    // groups and 4 blocks), beside rows of 1024 (4 whole groups): per-row costs at many short rows.
    if (type == DType::Q4_0 || type == DType::Q4_0_X8 || type == DType::Q8_0) {
      shapes.push_back({65536, 1152});
      shapes.push_back({65536, 1024});
    }
    for (Shape s : shapes) {
      // 1: decode; 4: the GEMV path's widest token group; 12: an MoE expert's share of a
      // 128-token prefill (64 experts, top 6); 16: batched decode of 16 sequences; 512: prefill.
      for (int64_t n : {1, 4, 12, 16, 32, 64, 128, 256, 512}) {
        // Kernels register during static initialisation too, so they are looked up by name
        // when the benchmark runs, not now.
        for (std::string kname : {"ref", "avx2", "avx512", "avx512vnni", "avxvnni", "avx512bf16", "amxbf16"}) {
          if (kname == "ref" && n > 1) continue;
          for (int threads : {1, 2}) {
            std::string name = "matmul/" + kname + "/" + dtype_name(type) + "/n=" + std::to_string(n) + "/" +
                               std::to_string(s.out) + "x" + std::to_string(s.in) + "/threads:" + std::to_string(threads);
            benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
              const Kernel<MatMulArgs>* kp = nullptr;
              for (const auto& k : OpRegistry<MatMulArgs>::instance().kernels())
                if (k.name == kname) kp = &k;
              if (!kp) {
                st.SkipWithError(("no matmul kernel " + kname).c_str());
                return;
              }
              auto d = make(type, n, s.out, s.in);
              MatMulArgs a{d.x.data(), n, &d.t, nullptr, d.y.data()};
              if (kp->refuse && !kp->refuse(a).empty()) {
                st.SkipWithError(kp->refuse(a).c_str());
                return;
              }
              set_num_threads(threads);
              for (auto _ : st) kp->run(a);
              double it = static_cast<double>(st.iterations());
              st.counters["GFLOP/s"] = benchmark::Counter(it * 2.0 * static_cast<double>(n * s.out * s.in) / 1e9,
                                                          benchmark::Counter::kIsRate);
              st.counters["GB/s"] = benchmark::Counter(it * static_cast<double>(d.w.size()) / 1e9, benchmark::Counter::kIsRate);
              set_num_threads(0);
            })->Unit(benchmark::kMillisecond)->UseRealTime();
          }
        }
      }
    }
  }
}

// Decode as the model streams it: one token through a ring of distinct matrices far larger than
// the caches (~768 MB of weights), so every weight byte comes from DRAM, as in a decode step.
// The cached shapes above measure the kernel; these measure the kernel against memory, at 1 and
// 2 threads (the gap between them is how well the threads share the bandwidth): decode of one
// sequence (n=1), and for Q8_0_X8 a 16-sequence decode step (n=16, the serving engine's batches).
void register_streaming() {
  for (DType type : {DType::F16, DType::BF16, DType::Q8_0_X8, DType::Q4_K, DType::Q4_K_X8, DType::Q6_K, DType::Q6_K_X8,
                     DType::Q4_0, DType::IQ4_NL, DType::MXFP4})
  for (int64_t n : {1, 16}) {
    if (n > 1 && type != DType::Q8_0_X8) continue;
    for (int threads : {1, 2}) {
      std::string name = std::string("matmul_stream/") + dtype_name(type) + "/n=" + std::to_string(n) +
                         "/8192x2048/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
        const int64_t out = 8192, in = 2048;
        const int64_t bytes = row_bytes(type, in) * out;
        const int64_t count = std::max<int64_t>(2, (int64_t{768} << 20) / bytes);
        MatMulBenchData d = make(type, n, out, in);  // quantized once, copied (the bytes' values do not matter here)
        std::vector<std::vector<uint8_t>> copies(static_cast<size_t>(count), d.w);
        std::vector<Tensor> ring;
        for (auto& c : copies) ring.push_back(Tensor::view(c.data(), type, {out, in}));
        set_num_threads(threads);
        int64_t next = 0;
        for (auto _ : st) {
          dispatch(MatMulArgs{d.x.data(), n, &ring[static_cast<size_t>(next)], nullptr, d.y.data()});
          next = (next + 1) % count;
        }
        const double calls = static_cast<double>(st.iterations());
        st.counters["GB/s"] = benchmark::Counter(calls * static_cast<double>(bytes) / 1e9, benchmark::Counter::kIsRate);
        st.counters["GFLOP/s"] =
            benchmark::Counter(calls * 2.0 * static_cast<double>(n * out * in) / 1e9, benchmark::Counter::kIsRate);
        set_num_threads(0);
      })->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1.0);
    }
  }
}

const bool registered = (register_all(), register_streaming(), true);

}  // namespace
}  // namespace fp
