// bench/ops_bench.cpp — Google Benchmark micro-benchmarks of the CPU kernels, one section per
// op. Every kernel registered for an op (reference first) runs on the same inputs, named
// OP/KERNEL/SHAPE/threads:T, so `--benchmark_filter=attention` puts the reference and the fast
// kernels side by side. Kernels are run directly (no dispatch). Bytes are the op's compulsory
// traffic (inputs read + outputs written once) and give GB/s; FLOP/s counts multiply-adds as 2.
// Shapes are Llama-3.2-1B's (dim 2048, hidden 8192, 32/8 heads of 64, vocab 128256) and
// Llama-3-8B's where they differ (dim 4096, head_dim 128).
//   build-ew/bench/fastpath_ops_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "kernels/ops_moe.h"
#include "kernels/registry.h"

namespace fp {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

// What one iteration costs, for the rate counters.
struct Work {
  double bytes = 0, flops = 0;
};

// Registers OP/KERNEL/SHAPE for every kernel of the op: the reference at 1 thread, the others
// at 1 and 2. `setup` builds the inputs once and returns the call's arguments; `reset` (optional)
// restores inputs an in-place op overwrote, outside the timed region.
template <class Args>
void register_op(const std::string& shape, Work w, std::function<Args()> setup,
                 std::function<void()> reset = nullptr) {
  for (const auto& k : OpRegistry<Args>::instance().kernels()) {
    for (int threads : {1, 2}) {
      if (k.reference && threads > 1) continue;
      std::string name = std::string(Args::kName) + "/" + k.name + "/" + shape + "/threads:" + std::to_string(threads);
      const Kernel<Args>* kp = &k;
      benchmark::RegisterBenchmark(name.c_str(), [kp, threads, w, setup, reset](benchmark::State& st) {
        set_num_threads(threads);
        Args a = setup();
        if (kp->refuse) {
          std::string why = kp->refuse(a);
          if (!why.empty()) {
            st.SkipWithError(("kernel refuses: " + why).c_str());
            return;
          }
        }
        for (auto _ : st) {
          if (reset) {
            st.PauseTiming();
            reset();
            st.ResumeTiming();
          }
          kp->run(a);
          benchmark::ClobberMemory();
        }
        st.SetBytesProcessed(static_cast<int64_t>(w.bytes * static_cast<double>(st.iterations())));
        if (w.flops > 0)
          st.counters["FLOP/s"] = benchmark::Counter(w.flops * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
        set_num_threads(0);
      })->UseRealTime()->Unit(benchmark::kMicrosecond);
    }
  }
}

std::string shape_nd(int64_t n, int64_t d) { return "n=" + std::to_string(n) + ",d=" + std::to_string(d); }

// ---------------------------------------------------------------- rmsnorm
void bench_rmsnorm() {
  for (auto [n, d] : {std::pair<int64_t, int64_t>{1, 2048}, {1, 4096}, {512, 2048}}) {
    auto x = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(n * d), 1));
    auto w = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(d), 2));
    auto y = std::make_shared<std::vector<float>>(static_cast<size_t>(n * d));
    Work wk{4.0 * static_cast<double>(2 * n * d + d), 3.0 * static_cast<double>(n * d)};
    register_op<RmsNormArgs>(shape_nd(n, d), wk, [=] { return RmsNormArgs{x->data(), w->data(), n, d, 1e-5f, y->data()}; });
  }
}

// ---------------------------------------------------------------- add
void bench_add() {
  for (int64_t n : {int64_t{2048}, int64_t{512} * 2048}) {
    auto a = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(n), 1));
    auto b = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(n), 2));
    auto o = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
    register_op<AddArgs>("n=" + std::to_string(n), Work{12.0 * static_cast<double>(n), static_cast<double>(n)},
                         [=] { return AddArgs{a->data(), b->data(), n, o->data()}; });
  }
}

// ---------------------------------------------------------------- silu_mul
void bench_silu_mul() {
  for (auto [n, d] : {std::pair<int64_t, int64_t>{1, 8192}, {1, 14336}, {512, 8192}}) {
    auto g = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(n * d), 1, 3.0f));
    auto u = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(n * d), 2));
    auto o = std::make_shared<std::vector<float>>(static_cast<size_t>(n * d));
    register_op<SiluMulArgs>(shape_nd(n, d), Work{12.0 * static_cast<double>(n * d), 0},
                             [=] { return SiluMulArgs{g->data(), u->data(), n, d, 0, 0, o->data()}; });
  }
}

// ---------------------------------------------------------------- softmax (in place)
void bench_softmax() {
  for (auto [n, d] : {std::pair<int64_t, int64_t>{1, 128256}, {32, 4096}}) {
    auto src = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(n * d), 1, 3.0f));
    auto x = std::make_shared<std::vector<float>>(*src);
    register_op<SoftmaxArgs>(shape_nd(n, d), Work{8.0 * static_cast<double>(n * d), 0},
                             [=] { return SoftmaxArgs{x->data(), n, d}; }, [=] { *x = *src; });
  }
}

// ---------------------------------------------------------------- rope (in place; values stay bounded)
void bench_rope() {
  struct S {
    int64_t n, heads, hd;
    RopeStyle style;
  };
  for (S s : {S{1, 32, 64, RopeStyle::Adjacent}, S{1, 32, 128, RopeStyle::NeoX}, S{512, 32, 64, RopeStyle::Adjacent},
              S{512, 32, 64, RopeStyle::NeoX}}) {
    auto x = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(s.n * s.heads * s.hd), 1));
    auto pos = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(s.n));
    for (int64_t i = 0; i < s.n; ++i) (*pos)[static_cast<size_t>(i)] = static_cast<int32_t>(1000 + i);
    auto inv = std::make_shared<std::vector<float>>(static_cast<size_t>(s.hd / 2));
    for (int64_t i = 0; i < s.hd / 2; ++i)
      (*inv)[static_cast<size_t>(i)] = std::pow(500000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(s.hd));
    std::string shape = std::string(s.style == RopeStyle::NeoX ? "neox" : "adjacent") + ",n=" + std::to_string(s.n) +
                        ",heads=" + std::to_string(s.heads) + ",hd=" + std::to_string(s.hd);
    double elems = static_cast<double>(s.n * s.heads * s.hd);
    register_op<RopeArgs>(shape, Work{8.0 * elems, 3.0 * elems}, [=] {
      return RopeArgs{x->data(), pos->data(), s.n, s.heads, s.hd, s.hd, s.heads * s.hd, inv->data(), 1.0f, s.style};
    });
  }
}

// ---------------------------------------------------------------- argmax
void bench_argmax() {
  for (auto [n, d] : {std::pair<int64_t, int64_t>{1, 32000}, {1, 128256}}) {
    auto x = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(n * d), 1));
    auto o = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(n));
    register_op<ArgmaxArgs>(shape_nd(n, d), Work{4.0 * static_cast<double>(n * d), 0},
                            [=] { return ArgmaxArgs{x->data(), n, d, o->data()}; });
  }
}

// ---------------------------------------------------------------- sample
// One row of Llama-3's vocabulary (128256). "flat": normal logits (sd 2), the top token under
// 1% (a worst case for top-p: its cut lies thousands of tokens deep); "peaked": the same with 16
// tokens raised by 14 (98% of the mass in those, as a language model puts most in a few). Settings:
// the OpenAI API's defaults (T 1, top-k off, top-p 1), top-p 0.9, and `fastpath generate`'s
// (T 0.8, top-k 40, top-p 0.95, min-p 0.05).
void bench_sample() {
  const int64_t d = 128256;
  for (const char* shape : {"flat", "peaked"}) {
    auto x = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(d), 3, 2.0f));
    if (std::string(shape) == "peaked")
      for (int i = 0; i < 16; ++i) (*x)[static_cast<size_t>(i * 7919 % d)] += 14.0f;
    auto o = std::make_shared<std::vector<int32_t>>(1);
    struct Setting {
      const char* name;
      SampleRow row;
    };
    for (const Setting& s : {Setting{"openai", {0.5, 1.0f, 1.0f, 0.0f, 0}}, Setting{"top_p=0.9", {0.5, 1.0f, 0.9f, 0.0f, 0}},
                             Setting{"generate", {0.5, 0.8f, 0.95f, 0.05f, 40}}}) {
      auto row = std::make_shared<SampleRow>(s.row);
      register_op<SampleArgs>(std::string(shape) + "," + s.name + ",d=" + std::to_string(d), Work{4.0 * static_cast<double>(d), 0},
                              [=] { return SampleArgs{x->data(), 1, d, row.get(), o->data()}; });
    }
  }
}

// ---------------------------------------------------------------- attention
// Decode: one token at the end of a kv_len cache. Prefill: n tokens from pos0 (a cached prefix
// of pos0 tokens). Each with the KV pool in F32, F16 and BF16 (kv=...). Bytes: q + the K/V rows
// read once (in the pool's dtype) + out; FLOPs: 2 (hd + vd) per (head, key).
void bench_attention() {
  struct S {
    const char* what;
    int64_t n, heads, kv_heads, hd, pos0;
  };
  for (S s : {S{"decode", 1, 32, 8, 64, 511}, S{"decode", 1, 32, 8, 64, 4095}, S{"decode", 1, 32, 8, 128, 4095},
              S{"decode", 1, 8, 1, 128, 4095}, S{"decode", 1, 8, 1, 128, 16383},
              S{"prefill", 256, 32, 8, 64, 0}, S{"prefill", 128, 32, 8, 128, 1024}, S{"prefill", 1024, 32, 8, 64, 0},
              S{"prefill", 512, 32, 8, 128, 1536}})
  for (DType kv : {DType::F32, DType::F16, DType::BF16}) {
    const int64_t kv_len = s.pos0 + s.n;
    auto q = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(s.n * s.heads * s.hd), 1));
    auto k = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(kv_len * s.kv_heads * s.hd), 2));
    auto v = std::make_shared<std::vector<float>>(randn(static_cast<size_t>(kv_len * s.kv_heads * s.hd), 3));
    auto pos = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(s.n));
    double keys = 0;
    for (int64_t i = 0; i < s.n; ++i) {
      (*pos)[static_cast<size_t>(i)] = static_cast<int32_t>(s.pos0 + i);
      keys += static_cast<double>(s.pos0 + i + 1);
    }
    auto o = std::make_shared<std::vector<float>>(static_cast<size_t>(s.n * s.heads * s.hd));
    const double kv_bytes = static_cast<double>(dtype_info(kv).block_bytes);
    Work wk{4.0 * static_cast<double>(2 * s.n * s.heads * s.hd) + kv_bytes * static_cast<double>(2 * kv_len * s.kv_heads * s.hd),
            keys * static_cast<double>(s.heads) * 2.0 * static_cast<double>(2 * s.hd)};
    std::string shape = std::string(s.what) + ",n=" + std::to_string(s.n) + ",kv_len=" + std::to_string(kv_len) +
                        ",heads=" + std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) + ",hd=" + std::to_string(s.hd) + ",kv=" + dtype_name(kv);
    float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
    // One sequence in pages of 16 tokens, blocks in order.
    auto idx = std::make_shared<std::vector<int32_t>>();  // seq_indptr[2], page_indptr[2], kv_len[1], pages...
    const int64_t pages = (kv_len + 15) / 16;
    *idx = {0, static_cast<int32_t>(s.n), 0, static_cast<int32_t>(pages), static_cast<int32_t>(kv_len)};
    for (int64_t p = 0; p < pages; ++p) idx->push_back(static_cast<int32_t>(p));
    k->resize(static_cast<size_t>(pages * 16 * s.kv_heads * s.hd));
    v->resize(k->size());
    // The pool in the benchmarked dtype (F32: k and v themselves).
    auto k16 = std::make_shared<std::vector<uint16_t>>(), v16 = std::make_shared<std::vector<uint16_t>>();
    if (kv != DType::F32) {
      k16->resize(k->size());
      v16->resize(v->size());
      quantize_row(kv, k->data(), k16->data(), static_cast<int64_t>(k->size()));
      quantize_row(kv, v->data(), v16->data(), static_cast<int64_t>(v->size()));
    }
    register_op<AttentionArgs>(shape, wk, [=] {
      AttentionArgs a{};
      a.q = q->data();
      a.pos = pos->data();
      a.n = s.n;
      a.n_seqs = 1;
      a.seq_indptr = idx->data();
      a.n_heads = s.heads;
      a.n_kv_heads = s.kv_heads;
      a.head_dim = a.v_dim = s.hd;
      a.k_pool = kv == DType::F32 ? static_cast<const void*>(k->data()) : k16->data();
      a.v_pool = kv == DType::F32 ? static_cast<const void*>(v->data()) : v16->data();
      a.kv_dtype = kv;
      a.k_stride = a.v_stride = s.kv_heads * s.hd;
      a.page_size = 16;
      a.page_indptr = idx->data() + 2;
      a.kv_len = idx->data() + 4;
      a.page_ids = idx->data() + 5;
      a.scale = scale;
      a.out = o->data();
      return a;
    });
  }
}

// ---------------------------------------------------------------- moe_ffn
// Decode of one token through an MoE layer: GLM-4.5-Air's (dim 4096, experts of 1408, 128
// experts, top 8, one shared expert; Q8_0) and Qwen3-30B-A3B's (dim 2048, experts of 768, 128,
// top 8; Q8_0 and BF16). Each iteration selects the next 8 experts (outside the timed region), so the
// weights come from memory as in decode, not from a cache. Bytes: the selected experts' (and the
// shared expert's) three matrices once.
void bench_moe_ffn() {
  struct S {
    const char* name;
    int64_t dim, ff, experts, k, shared;
    DType type;
  };
  for (S s : {S{"glm45air", 4096, 1408, 128, 8, 1, DType::Q8_0}, S{"qwen3_30b", 2048, 768, 128, 8, 0, DType::Q8_0},
              S{"qwen3_30b", 2048, 768, 128, 8, 0, DType::BF16}}) {
    struct Data {
      std::vector<uint8_t> bytes;  // gate, up, down of every expert, then the shared expert's
      std::vector<Tensor> gate, up, down;
      Tensor sg, su, sd;
      std::vector<float> x, w, out;
      std::vector<int32_t> ids;
    };
    auto data = std::make_shared<Data>();
    const double per_expert = 3.0 * static_cast<double>(row_bytes(s.type, s.dim) * s.ff);
    const Work wk{per_expert * static_cast<double>(s.k + s.shared), 2.0 * 3.0 * static_cast<double>(s.ff * s.dim * (s.k + s.shared))};
    auto setup = [=]() {
      Data& d = *data;
      if (d.bytes.empty()) {  // built on first use: GLM's experts take 2.3 GB
        const int64_t gate_bytes = row_bytes(s.type, s.dim) * s.ff, down_bytes = row_bytes(s.type, s.ff) * s.dim;
        const int64_t one = 2 * gate_bytes + down_bytes;
        d.bytes.resize(static_cast<size_t>(one * (s.experts + s.shared)));
        // xorshift: random int8 values (Q8_0, block scale 2^-7), or BF16 values of magnitude
        // 2^-7..2^-6 with random sign and mantissa
        uint64_t state = 88172645463325252ull;
        for (size_t i = 0; i + 1 < d.bytes.size(); i += 2) {
          state ^= state << 13, state ^= state >> 7, state ^= state << 17;
          uint16_t v = static_cast<uint16_t>(state);
          if (s.type == DType::BF16) v = static_cast<uint16_t>(0x3C00u | (v & 0x807Fu));
          std::memcpy(d.bytes.data() + i, &v, 2);
        }
        auto q8 = [&](int64_t off, int64_t rows, int64_t cols) {
          uint8_t* p = d.bytes.data() + off;
          for (int64_t b = 0; s.type == DType::Q8_0 && b < rows * cols / 32; ++b) {
            const uint16_t half = 0x2000;  // 2^-7
            std::memcpy(p + b * 34, &half, 2);
          }
          return Tensor::view(p, s.type, {rows, cols});
        };
        for (int64_t e = 0; e <= s.experts; ++e) {
          if (e == s.experts && !s.shared) break;
          const int64_t o = e * one;
          Tensor g = q8(o, s.ff, s.dim), u = q8(o + gate_bytes, s.ff, s.dim), dn = q8(o + 2 * gate_bytes, s.dim, s.ff);
          if (e < s.experts) {
            d.gate.push_back(g), d.up.push_back(u), d.down.push_back(dn);
          } else {
            d.sg = g, d.su = u, d.sd = dn;
          }
        }
        d.x = randn(static_cast<size_t>(s.dim), 5);
        d.w.assign(static_cast<size_t>(s.k), 1.0f / static_cast<float>(s.k));
        d.out.resize(static_cast<size_t>(s.dim));
        for (int64_t j = 0; j < s.k; ++j) d.ids.push_back(static_cast<int32_t>(j));
      }
      MoeFfnArgs a{};
      a.x = d.x.data();
      a.n = 1;
      a.dim = s.dim;
      a.ids = d.ids.data();
      a.weights = d.w.data();
      a.k = s.k;
      a.n_expert = s.experts;
      a.ff = s.ff;
      a.gate = d.gate.data(), a.up = d.up.data(), a.down = d.down.data();
      if (s.shared) a.shared_gate = &d.sg, a.shared_up = &d.su, a.shared_down = &d.sd, a.shared_ff = s.ff;
      a.out = d.out.data();
      return a;
    };
    auto next_experts = [=]() {  // the next k experts: every iteration reads other weights
      for (auto& id : data->ids) id = static_cast<int32_t>((id + s.k) % s.experts);
    };
    register_op<MoeFfnArgs>(std::string(s.name) + ",n=1,w=" + dtype_name(s.type), wk, setup, next_experts);
  }
}

// ---------------------------------------------------------------- lora
// Llama-3.2-1B's gate + up adapters (rank 16, 2048 -> 2 x 8192) in F32, BF16 and F16, for 1 and
// 128 rows. Each iteration takes the next of 16 layers' matrices (21 MB in F32), so the matrices
// come from memory, as in a decode step, not from the cache.
void bench_lora() {
  constexpr int64_t kRank = 16, kIn = 2048, kOut = 8192, kLayers = 16;
  for (const DType type : {DType::F32, DType::BF16, DType::F16})
    for (const int64_t n : {int64_t{1}, int64_t{128}}) {
      struct Data {
        std::vector<std::vector<uint8_t>> a, bt;  // per layer: gate's then up's
        Tensor ta[2], tbt[2];
        std::vector<float> x, y, low;
        int layer = 0;
      };
      auto d = std::make_shared<Data>();
      const size_t esize = static_cast<size_t>(dtype_info(type).block_bytes);
      auto stored = [&](size_t count, uint32_t seed) {
        const std::vector<float> v = randn(count, seed, 0.05f);
        return quantize_to_bytes(type, v.data(), static_cast<int64_t>(count));
      };
      for (int64_t l = 0; l < 2 * kLayers; ++l) {
        d->a.push_back(stored(static_cast<size_t>(kRank * kIn), static_cast<uint32_t>(2 * l)));
        d->bt.push_back(stored(static_cast<size_t>(kRank * kOut), static_cast<uint32_t>(2 * l + 1)));
      }
      for (size_t part = 0; part < 2; ++part) {  // the views the op reads: the current layer's matrices
        d->ta[part] = Tensor::view(d->a[part].data(), type, {kRank, kIn});
        d->tbt[part] = Tensor::view(d->bt[part].data(), type, {kRank, kOut});
      }
      d->x = randn(static_cast<size_t>(n * kIn), 7);
      d->y.assign(static_cast<size_t>(2 * n * kOut), 0.0f);
      d->low.resize(static_cast<size_t>(n * 2 * kRank));
      auto setup = [d, n] {
        LoraArgs a;
        a.x = d->x.data();
        a.n = n;
        a.low = d->low.data();
        a.parts[a.n_parts++] = {&d->ta[0], &d->tbt[0], d->y.data(), 2.0f};
        a.parts[a.n_parts++] = {&d->ta[1], &d->tbt[1], d->y.data() + n * kOut, 2.0f};
        return a;
      };
      // The matrices read once, x read and y read and written once per row.
      const double bytes = static_cast<double>(2 * kRank * (kIn + kOut) * static_cast<int64_t>(esize)) +
                           4.0 * static_cast<double>(n * (kIn + 4 * kOut));
      const double flops = 2.0 * 2.0 * static_cast<double>(n * kRank * (kIn + kOut));
      // The next layer's matrices every iteration, pointed to by the views the args hold.
      auto next_layer = [d] {
        d->layer = (d->layer + 1) % kLayers;
        for (size_t part = 0; part < 2; ++part) {
          const size_t from = static_cast<size_t>(2 * d->layer) + part;
          d->ta[part].data = d->a[from].data();
          d->tbt[part].data = d->bt[from].data();
        }
      };
      register_op<LoraArgs>("gate+up,r=16,n=" + std::to_string(n) + ",w=" + dtype_name(type), Work{bytes, flops}, setup,
                            next_layer);
    }
}

}  // namespace
}  // namespace fp

int main(int argc, char** argv) {
  fp::bench_rmsnorm();
  fp::bench_add();
  fp::bench_silu_mul();
  fp::bench_softmax();
  fp::bench_rope();
  fp::bench_argmax();
  fp::bench_sample();
  fp::bench_attention();
  fp::bench_moe_ffn();
  fp::bench_lora();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
