// kernels/cuda/moe_route.cu — expert routing on the GPU (moe_route): one warp per token computes
// the softmax or sigmoid scores, the group limit (DeepSeek) and the top k by k rounds of a warp
// argmax (ties to the lower id, as the reference's stable sort), then the weights.
#include <climits>

#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/ops_moe.h"

namespace fp::cuda {
namespace {

constexpr int kRouteWarps = 4;
constexpr int kMaxRouteExperts = 1024;

struct RouteParams {
  const float* logits;
  const float* bias;
  int n, E, k, G, topk_group;
  bool softmax, group_top2, norm_topk;
  float masked, norm_eps, scale;
  int32_t* ids;
  float* weights;
};

// Each warp's probs and choice scores (2E floats) and taken marks (E bytes) in shared memory.
__global__ void __launch_bounds__(32 * kRouteWarps) route_kernel(RouteParams p) {
  extern __shared__ float route_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = blockIdx.x * kRouteWarps + warp;
  if (i >= p.n) return;  // whole warps leave together; no block-wide barrier below
  const int E = p.E;
  float* probs = route_smem + warp * 2 * E;
  float* choice = probs + E;
  unsigned char* taken = reinterpret_cast<unsigned char*>(route_smem + kRouteWarps * 2 * E) + warp * E;
  const float* l = p.logits + static_cast<int64_t>(i) * E;

  if (p.softmax) {
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) sum += (probs[e] = expf(l[e] - mx));
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) probs[e] /= sum;
  } else {
    for (int e = lane; e < E; e += 32) probs[e] = 1.0f / (1.0f + expf(-l[e]));
  }
  for (int e = lane; e < E; e += 32) {
    choice[e] = probs[e] + (p.bias ? p.bias[e] : 0.0f);
    taken[e] = 0;
  }
  __syncwarp();

  // Group-limited routing: the best topk_group groups stay, the others' choices become `masked`.
  // Serial in lane 0 (E comparisons); ties go to the lower group, as a stable sort.
  if (p.G > 1 && p.topk_group < p.G) {
    if (lane == 0) {
      const int per = E / p.G;
      unsigned long long keep = 0;  // G <= 64 (refused otherwise)
      float gs[64];
      for (int g = 0; g < p.G; ++g) {
        const float* c = choice + g * per;
        float b0 = -INFINITY, b1 = -INFINITY;
        for (int j = 0; j < per; ++j) {
          if (c[j] > b0) b1 = b0, b0 = c[j];
          else if (c[j] > b1) b1 = c[j];
        }
        gs[g] = p.group_top2 ? (per > 1 ? b0 + b1 : b0) : b0;
      }
      for (int r = 0; r < p.topk_group; ++r) {
        int best = -1;
        for (int g = 0; g < p.G; ++g)
          if (!((keep >> g) & 1ull) && (best < 0 || gs[g] > gs[best])) best = g;
        keep |= 1ull << best;
      }
      for (int e = 0; e < E; ++e)
        if (!((keep >> (e / per)) & 1ull)) choice[e] = p.masked;
    }
    __syncwarp();
  }

  // k rounds of a warp argmax over the untaken choices (ties: the lower id).
  float sel_sum = 0.0f;
  for (int j = 0; j < p.k; ++j) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int e = lane; e < E; e += 32)
      if (!taken[e] && (choice[e] > bv || (choice[e] == bv && e < bi))) bv = choice[e], bi = e;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
    }
    if (bi == INT_MAX) {  // only NaN scores left (NaN logits): the lowest untaken id
      bi = 0;
      while (bi < E - 1 && taken[bi]) ++bi;
    }
    if (lane == 0) {
      taken[bi] = 1;
      p.ids[static_cast<int64_t>(i) * p.k + j] = bi;
    }
    sel_sum += probs[bi];  // every lane holds bi: the sum in the reference's order
    __syncwarp();
  }
  if (lane == 0) {
    for (int j = 0; j < p.k; ++j) {
      const int64_t at = static_cast<int64_t>(i) * p.k + j;
      float w = probs[p.ids[at]];
      if (p.norm_topk) w /= sel_sum + p.norm_eps;
      p.weights[at] = w * p.scale;
    }
  }
}

}  // namespace

std::string refuse_moe_route(const MoeRouteArgs& a) {
  if (a.k <= 0 || a.k > a.n_expert) return "k " + std::to_string(a.k) + " is not in [1, n_expert " + std::to_string(a.n_expert) + "]";
  if (a.n_expert > kMaxRouteExperts) return "more than " + std::to_string(kMaxRouteExperts) + " experts";
  if (a.n_group < 1 || a.n_expert % a.n_group != 0) return "n_group " + std::to_string(a.n_group) + " does not divide n_expert";
  if (a.n_group > 64) return "more than 64 expert groups";
  if (a.topk_group < 1 || a.topk_group > a.n_group) return "topk_group " + std::to_string(a.topk_group) + " is not in [1, n_group]";
  return {};
}

void moe_route(const MoeRouteArgs& a) {
  if (a.n <= 0) return;
  RouteParams p{a.logits, a.bias, static_cast<int>(a.n), static_cast<int>(a.n_expert), static_cast<int>(a.k),
                static_cast<int>(std::max<int64_t>(a.n_group, 1)), static_cast<int>(a.topk_group),
                a.scoring == MoeScoring::Softmax, a.group_score == MoeGroupScore::Top2Sum, a.norm_topk,
                a.masked, a.norm_eps, a.scale, a.ids, a.weights};
  const size_t smem = static_cast<size_t>(kRouteWarps) * static_cast<size_t>(a.n_expert) * (2 * sizeof(float) + 1);
  route_kernel<<<blocks_for(a.n, kRouteWarps), 32 * kRouteWarps, smem, stream()>>>(p);
  FP_CUDA_LAUNCHED("moe_route");
}

}  // namespace fp::cuda
