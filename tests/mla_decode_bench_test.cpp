// tests/mla_decode_bench_test.cpp — long-context decode timing for an MLA model (disabled by
// default; a measurement, not a check). The latent cache is filled with random rows for
// positions 0..ctx-1 (instead of a prefill that would take minutes at 16K), then single-token
// decode steps at position ctx are timed. Run (one line):
//   FASTPATH_MLA_BENCH_MODEL=model.gguf FASTPATH_MLA_BENCH_CTX=4096,16384
//     fastpath_tests --gtest_also_run_disabled_tests --gtest_filter='*MlaDecodeBench*'
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>

#include "core/thread_pool.h"
#include "model/model.h"

namespace fp {
namespace {

TEST(MlaDecodeBench, DISABLED_DecodeAtLongContext) {
  const char* path = std::getenv("FASTPATH_MLA_BENCH_MODEL");
  if (!path) GTEST_SKIP() << "set FASTPATH_MLA_BENCH_MODEL";
  std::vector<int64_t> ctxs;
  std::istringstream in(std::getenv("FASTPATH_MLA_BENCH_CTX") ? std::getenv("FASTPATH_MLA_BENCH_CTX") : "4096,16384");
  for (std::string tok; std::getline(in, tok, ',');) ctxs.push_back(std::stoll(tok));
  const int steps = std::getenv("FASTPATH_MLA_BENCH_STEPS") ? std::atoi(std::getenv("FASTPATH_MLA_BENCH_STEPS")) : 8;
  if (const char* t = std::getenv("FASTPATH_MLA_BENCH_THREADS")) set_num_threads(std::atoi(t));
  auto m = load_model(path);
  const KvLayout kv = m->kv_layout();
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> logits(static_cast<size_t>(m->config().n_vocab));
  for (int64_t ctx : ctxs) {
    auto cache = m->new_cache(ctx + steps + 1, 256);
    const int64_t slots = cache->pool->capacity_tokens();
    std::vector<float> rows(static_cast<size_t>(slots * kv.k_width));
    std::vector<int64_t> ids(static_cast<size_t>(slots));
    for (int64_t i = 0; i < slots; ++i) ids[static_cast<size_t>(i)] = i;
    for (int64_t l = 0; l < kv.n_layers; ++l) {
      for (auto& x : rows) x = g(rng);
      cache->pool->write(l, ids.data(), slots, rows.data(), nullptr);
    }
    cache->len = ctx;
    std::vector<double> ms;
    for (int s = 0; s <= steps; ++s) {  // the first step is a warm-up
      const int32_t tok = 100 + s, pos = static_cast<int32_t>(ctx + s);
      auto t0 = std::chrono::steady_clock::now();
      m->forward(&tok, &pos, 1, *cache, logits.data(), false);
      if (s > 0) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    std::printf("context %lld: decode %.2f tok/s (median of %d steps: %.1f ms; min %.1f, max %.1f); latent cache %.1f MiB\n",
                static_cast<long long>(ctx), 1000.0 / med, steps, med, ms.front(), ms.back(),
                static_cast<double>(ctx * kv.bytes_per_token()) / (1 << 20));
  }
}

}  // namespace
}  // namespace fp
