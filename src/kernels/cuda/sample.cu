// kernels/cuda/sample.cu — the sample op on the GPU: one block per logit row picks the token the
// reference (kernels/cpu/sample_ref.cpp) picks, without sorting the vocabulary.
//
// Every element gets a 64-bit key: its logit's bits made order-preserving, then the complement of
// its id, so keys order the elements as the reference sorts them (larger logit first, the lower id
// on ties) and no two are equal. Each filter is then a radix selection over the keys, 8 bits per
// pass from the top, one shared-memory histogram per pass:
//   top-k     the k-th largest key (weights are counts);
//   top-p     the key where the running probability, largest first, first reaches p;
//   min-p     a bound on each element's probability (no selection needed: it keeps a prefix);
//   the draw  the key where the running probability of what is kept first exceeds u x its total.
// A pass whose chosen bucket holds a single element ends the selection with one more pass that
// finds it (usually after 3 or 4 of the 8). Probabilities are exp((l - max) / T) in 2^-40 fixed
// point summed with integer atomics: the answer does not depend on the order of the additions
// (the same token every run), and differs from the reference's float probabilities and double
// sums only when a cut falls within rounding of a boundary. Lanes of a warp that hit the same
// bucket add once (__match_any_sync), since early passes put most of a row in a few buckets.
// With top-k <= kCompact the k candidates are copied to shared memory after the first selection
// and the remaining passes read them there instead of the whole row.
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.h"

namespace fp::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kCompact = 2048;
constexpr double kFixed = 1099511627776.0;  // 2^40: one unit of unnormalised probability

using u64 = unsigned long long;

// A NaN logit counts as -inf, and -0 as 0 (equal logits are then ordered by id alone).
__device__ __forceinline__ float canonical(float l) { return isnan(l) ? -INFINITY : (l == 0.0f ? 0.0f : l); }
__device__ __forceinline__ u64 key_of(float l, uint32_t id) {
  uint32_t b = __float_as_uint(l);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<u64>(b) << 32) | (0xFFFFFFFFu - id);
}
__device__ __forceinline__ uint32_t id_of(u64 key) { return 0xFFFFFFFFu - static_cast<uint32_t>(key); }

struct Shared {
  u64 hist[256];           // weight per bucket of this pass
  unsigned count[256];     // elements per bucket
  u64 stage[kWarps][32];   // each lane's weight, for the lane that adds its group's
  u64 partial[kWarps];     // block reductions
  u64 prefix, above;       // the selection so far: the key's high bits, the weight above them
  int unique;              // the chosen bucket holds one element
  int n_compact;
  float logit[kCompact];   // the top-k candidates, when copied
  uint32_t id[kCompact];
};

// The row in global memory.
struct RowSource {
  const float* x;
  int64_t n;
  __device__ int64_t size() const { return n; }
  __device__ float logit(int64_t j) const { return canonical(x[j]); }
  __device__ uint32_t id(int64_t j) const { return static_cast<uint32_t>(j); }
};
// The top-k candidates copied to shared memory (logits already canonical).
struct CompactSource {
  const float* l;
  const uint32_t* ids;
  int64_t n;
  __device__ int64_t size() const { return n; }
  __device__ float logit(int64_t j) const { return l[j]; }
  __device__ uint32_t id(int64_t j) const { return ids[j]; }
};

// Sum (or max) of v over the block; every thread gets it. 0 is the identity of both.
__device__ u64 block_reduce(u64 v, bool take_max, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const u64 w = __shfl_xor_sync(0xffffffffu, v, o);
    v = take_max ? (w > v ? w : v) : v + w;
  }
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) sh.partial[warp] = v;
  __syncthreads();
  v = lane < kWarps ? sh.partial[lane] : 0;
  for (int o = 16; o > 0; o >>= 1) {
    const u64 w = __shfl_xor_sync(0xffffffffu, v, o);
    v = take_max ? (w > v ? w : v) : v + w;
  }
  return v;
}

template <class Src, class Weight>
__device__ u64 sum_weights(const Src& src, Weight weight, Shared& sh) {
  u64 s = 0;
  for (int64_t j = threadIdx.x; j < src.size(); j += kThreads) {
    const float l = src.logit(j);
    s += weight(l, key_of(l, src.id(j)));
  }
  return block_reduce(s, false, sh);
}

// Adds each weighted element whose key matches `prefix` on the bits under `high` to the histogram
// of its next 8 bits. Warps step together (the trip count is the same for every lane).
template <class Src, class Weight>
__device__ void histogram(const Src& src, Weight weight, u64 prefix, u64 high, int shift, Shared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t base = static_cast<int64_t>(warp) * 32; base < src.size(); base += kThreads) {
    const int64_t j = base + lane;
    int bucket = -1;
    u64 w = 0;
    if (j < src.size()) {
      const float l = src.logit(j);
      const u64 k = key_of(l, src.id(j));
      if ((k & high) == prefix && (w = weight(l, k)) != 0) bucket = static_cast<int>((k >> shift) & 255);
    }
    sh.stage[warp][lane] = w;
    __syncwarp();
    const unsigned peers = __match_any_sync(0xffffffffu, bucket);
    if (bucket >= 0 && lane == __ffs(peers) - 1) {
      u64 sum = 0;
      for (unsigned m = peers; m; m &= m - 1) sum += sh.stage[warp][__ffs(m) - 1];
      atomicAdd(&sh.hist[bucket], sum);
      atomicAdd(&sh.count[bucket], static_cast<unsigned>(__popc(peers)));
    }
    __syncwarp();
  }
}

// Warp 0: the bucket, from the top, where above + the running weight first reaches the target
// (exceeds it when strict); the lowest non-empty bucket when it never does (the last element).
__device__ void choose_bucket(u64 target, bool strict, u64 prefix, u64 above, int shift, Shared& sh) {
  const int lane = threadIdx.x;
  u64 mine = 0;  // lane l owns buckets 255 - 8l down to 248 - 8l
  for (int q = 0; q < 8; ++q) mine += sh.hist[255 - 8 * lane - q];
  u64 incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const u64 v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  const u64 before = above + incl - mine;
  const bool crosses = mine > 0 && (strict ? before + mine > target : before + mine >= target);
  const unsigned crossing = __ballot_sync(0xffffffffu, crosses);
  const unsigned nonempty = __ballot_sync(0xffffffffu, mine > 0);
  const int owner = crossing ? __ffs(crossing) - 1 : 31 - __clz(nonempty);
  if (lane != owner) return;
  u64 acc = before, at = before;
  int chosen = 255 - 8 * lane;
  for (int q = 0; q < 8; ++q) {
    const int b = 255 - 8 * lane - q;
    const u64 h = sh.hist[b];
    if (!h) continue;
    chosen = b;
    at = acc;
    if (crossing && (strict ? acc + h > target : acc + h >= target)) break;
    acc += h;
  }
  sh.prefix = prefix | (static_cast<u64>(chosen) << shift);
  sh.above = at;
  sh.unique = sh.count[chosen] == 1;
}

// The key of the weighted element where the running weight, largest key first, first reaches
// `target` (exceeds it when strict): W(keys > K) < target <= W(keys >= K). Every thread calls it.
template <class Src, class Weight>
__device__ u64 select_key(const Src& src, Weight weight, u64 target, bool strict, Shared& sh) {
  u64 prefix = 0, above = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    const u64 high = shift == 56 ? 0 : ~0ull << (shift + 8);
    for (int b = threadIdx.x; b < 256; b += kThreads) {
      sh.hist[b] = 0;
      sh.count[b] = 0;
    }
    __syncthreads();
    histogram(src, weight, prefix, high, shift, sh);
    __syncthreads();
    if (threadIdx.x < 32) choose_bucket(target, strict, prefix, above, shift, sh);
    __syncthreads();
    prefix = sh.prefix;
    above = sh.above;
    const bool unique = sh.unique;
    __syncthreads();  // everyone has read sh before the next pass or the search below writes it
    if (unique && shift > 0) {  // one weighted element has this prefix: its key is the answer
      const u64 high_now = ~0ull << shift;
      for (int64_t j = threadIdx.x; j < src.size(); j += kThreads) {
        const float l = src.logit(j);
        const u64 k = key_of(l, src.id(j));
        if ((k & high_now) == prefix && weight(l, k) != 0) sh.prefix = k;
      }
      __syncthreads();
      prefix = sh.prefix;
      __syncthreads();
      return prefix;
    }
  }
  return prefix;
}

// The filters after top-k and the draw, over `src` (the row, or the top-k candidates).
template <class Src>
__device__ uint32_t filter_and_draw(const Src& src, const SampleRow& p, float mx, u64 top, u64 lo, Shared& sh) {
  const float t = p.temperature;
  // Unnormalised probability in fixed point of the elements with key >= from and at least
  // `floor` (the largest, `top`, always counts); 0 for the others.
  auto mass = [mx, t, top](u64 from, float floor) {
    return [=](float l, u64 k) -> u64 {
      if (k < from) return 0;
      const float e = expf((l - mx) / t);
      return e >= floor || k == top ? static_cast<u64>(static_cast<double>(e) * kFixed) : 0;
    };
  };
  if (p.top_p < 1.0f) {
    const u64 m = sum_weights(src, mass(lo, 0.0f), sh);
    const u64 target = static_cast<u64>(ceil(static_cast<double>(fmaxf(p.top_p, 0.0f)) * static_cast<double>(m)));
    const u64 cut = select_key(src, mass(lo, 0.0f), target, false, sh);
    lo = cut > lo ? cut : lo;
  }
  const float floor = p.min_p > 0.0f ? p.min_p : 0.0f;
  const u64 total = sum_weights(src, mass(lo, floor), sh);
  const u64 r = static_cast<u64>(p.u * static_cast<double>(total));
  return id_of(select_key(src, mass(lo, floor), r, true, sh));
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* x, int64_t d, const SampleRow* rows, int32_t* out) {
  __shared__ Shared sh;
  const RowSource row{x + blockIdx.x * d, d};
  const SampleRow p = rows[blockIdx.x];
  u64 top = 0;
  for (int64_t j = threadIdx.x; j < d; j += kThreads) {
    const u64 k = key_of(row.logit(j), static_cast<uint32_t>(j));
    top = k > top ? k : top;
  }
  top = block_reduce(top, true, sh);
  const float mx = row.logit(id_of(top));
  uint32_t id = id_of(top);
  if (p.temperature > 0.0f && isfinite(mx)) {
    if (p.top_k > 0 && p.top_k < d) {
      const u64 lo = select_key(row, [](float, u64) -> u64 { return 1; }, static_cast<u64>(p.top_k), false, sh);
      if (p.top_k <= kCompact) {
        if (threadIdx.x == 0) sh.n_compact = 0;
        __syncthreads();
        for (int64_t j = threadIdx.x; j < d; j += kThreads) {
          const float l = row.logit(j);
          if (key_of(l, static_cast<uint32_t>(j)) >= lo) {
            const int s = atomicAdd(&sh.n_compact, 1);
            sh.logit[s] = l;  // exactly top_k elements have a key >= lo
            sh.id[s] = static_cast<uint32_t>(j);
          }
        }
        __syncthreads();
        id = filter_and_draw(CompactSource{sh.logit, sh.id, p.top_k}, p, mx, top, lo, sh);
      } else {
        id = filter_and_draw(row, p, mx, top, lo, sh);
      }
    } else {
      id = filter_and_draw(row, p, mx, top, 0, sh);
    }
  }
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(id);
}

}  // namespace

std::string refuse_sample(const SampleArgs& a) {
  if (a.d <= 0) return "a row has no logits";
  if (a.d > 0x7fffffff) return "a row of " + std::to_string(a.d) + " logits (at most 2^31 - 1)";
  return {};
}

void sample(const SampleArgs& a) {
  if (a.n == 0) return;
  sample_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream()>>>(a.x, a.d, a.rows, a.out);
  FP_CUDA_LAUNCHED("sample");
}

}  // namespace fp::cuda
