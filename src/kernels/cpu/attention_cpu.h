// kernels/cpu/attention_cpu.h — what the CPU flash-attention kernels share: the work plan of a
// call (query blocks, KV heads per item, KV splits) and the driver that runs its items on the
// thread pool and merges the splits (attention_avx2.cpp). `avx2_flash` runs every item with
// its f32 item function; `amx_flash` (attention_amx.cpp) takes over the items of prefill-like
// ("wide", kernels/ops.h) sequences with AMX tiles and leaves the others to the f32 items.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace fp::cpu {

constexpr int64_t kAttnBk = 64;  // keys per block; KV splits start on multiples of it

struct AttnPlan {
  int64_t group = 1, bq = 1, qblocks = 1;
  int64_t heads_per_item = 1;  // KV heads per item: 1, or all of them when there is one query block
  int64_t splits = 1, split_len = 0;
  int64_t max_len = 0;  // keys the sequence's latest query sees: min(max pos + 1, kv_len)
};

// Where an item's rows go: normalized into a.out when m is null, else (m, l, O) into the
// split's slots, slot = (token * n_heads + head) * max_splits + split.
struct AttnPartials {
  float *m = nullptr, *l = nullptr, *o = nullptr;
  int64_t max_splits = 1;
};

// Items of the sequences a kernel computes its own way.
class AttnWideItems {
 public:
  virtual ~AttnWideItems() = default;
  virtual bool takes(const AttentionArgs& a, int64_t s) const = 0;
  // Query rows (tokens x GQA ratio) per item of the sequences it takes.
  virtual int64_t rows_per_item() const = 0;
  // Once per call, before any item runs (on the calling thread; may use the thread pool).
  virtual void prepare(const AttentionArgs& a, const std::vector<AttnPlan>& plans) = 0;
  // Sequence s: KV heads [kvh0, kvh0 + p.heads_per_item), query block qb, KV split sp.
  virtual void run(const AttentionArgs& a, const AttnPlan& p, int64_t s, int64_t kvh0, int64_t qb, int64_t sp,
                   const AttnPartials& out) = 0;
};

// The whole call: the items of the sequences `wide` takes go to it (nullptr: none).
void attention_flash_cpu(const AttentionArgs& a, AttnWideItems* wide);

// What the f32 items need (AVX2, FMA, F16C; head dims multiple of 8; power-of-two pages).
std::string refuse_attention_avx2(const AttentionArgs& a);
// avx2_flash's whole check: the above, and it takes sliding windows and sinks.
std::string refuse_attention_avx2_flash(const AttentionArgs& a);

}  // namespace fp::cpu
