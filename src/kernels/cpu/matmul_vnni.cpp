// kernels/cpu/matmul_vnni.cpp — Q8_0, Q4_0 (and Q4_K prefill) matmul with AVX-512 VNNI (vpdpbusd on 256-bit
// registers, AVX512-VL), every batch size. vpdpbusd multiplies unsigned by signed bytes and
// accumulates in int32 without saturation, which saves the sign juggling AVX2 needs:
//  - Q8_0 (signed weights): activations are offset to unsigned (x + 128); the offset's share,
//    128 x sum(w), is subtracted through the accumulator's starting value, once per weight block.
//  - Q4_0 (weights q - 8, q in 0..15): the unsigned q meets the signed activations directly;
//    the -8 x sum(x) term starts the accumulator (sum(x) per block is computed once per call).
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"

#include "core/cpu_features.h"
#include "core/error.h"
#include "kernels/cpu/matmul_common.h"
#include "kernels/cpu/quantize_act.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/ops.h"
#include "kernels/registry.h"

#define FP_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))

namespace fp {
namespace {

// Activations of one call, quantized to Q8_0 blocks, in the two forms the kernels need.
struct QuantizedActs {
  std::vector<BlockQ8_0> q;       // signed
  std::vector<uint8_t> u;         // q + 128, 32 bytes per block
  std::vector<int32_t> sums;      // sum of q per block
};

template <int N>
FP_VNNI void q8_0_rows(const MatMulArgs& a, const QuantizedActs& x, int64_t i0, int64_t r0, int64_t r1) {
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), nb = K / QK8_0;
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t o = r0; o < r1; ++o) {
    const BlockQ8_0* wb = reinterpret_cast<const BlockQ8_0*>(w.row_ptr(o));
    __m256 acc[N];
    for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qs));
      // -128 x (partial sums of w over each 4 bytes): the offset's contribution, removed up front.
      __m256i init = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, wq), 7));
      const float dw = _cvtsh_ss(wb[b].d);
      for (int i = 0; i < N; ++i) {
        const int64_t xb = (i0 + i) * nb + b;
        __m256i xu = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.u.data() + xb * 32));
        __m256i dot = _mm256_dpbusd_epi32(init, xu, wq);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * _cvtsh_ss(x.q[static_cast<size_t>(xb)].d)), acc[i]);
      }
    }
    for (int i = 0; i < N; ++i) a.y[(i0 + i) * out + o] = avx2::hsum(acc[i]) + (a.bias ? a.bias[o] : 0.0f);
  }
}

template <int N>
FP_VNNI void q4_0_rows(const MatMulArgs& a, const QuantizedActs& x, int64_t i0, int64_t r0, int64_t r1) {
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), nb = K / QK4_0;
  const __m128i m4 = _mm_set1_epi8(0x0f);
  for (int64_t o = r0; o < r1; ++o) {
    const BlockQ4_0* wb = reinterpret_cast<const BlockQ4_0*>(w.row_ptr(o));
    __m256 acc[N];
    for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[b].qs));
      __m256i wu = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
      const float dw = _cvtsh_ss(wb[b].d);
      for (int i = 0; i < N; ++i) {
        const int64_t xb = (i0 + i) * nb + b;
        __m256i xs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q[static_cast<size_t>(xb)].qs));
        __m256i init = _mm256_setr_epi32(-8 * x.sums[static_cast<size_t>(xb)], 0, 0, 0, 0, 0, 0, 0);
        __m256i dot = _mm256_dpbusd_epi32(init, wu, xs);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * _cvtsh_ss(x.q[static_cast<size_t>(xb)].d)), acc[i]);
      }
    }
    for (int i = 0; i < N; ++i) a.y[(i0 + i) * out + o] = avx2::hsum(acc[i]) + (a.bias ? a.bias[o] : 0.0f);
  }
}

// ---------------------------------------------------------------- prefill: interleaved blocks
// For many tokens, weights and activations are repacked so that one 32-byte vector holds 4
// bytes of each of 8 consecutive 32-value blocks: 8 vpdpbusd then leave the complete dot
// product of block j in int32 lane j, and the 8 per-block scales apply with one multiply-add
// per 8 blocks instead of one per block. A "group" is 8 blocks = 256 values (one Q4_K
// super-block). Weights are repacked per row block (L2-resident), activations once per call.
struct PackedW {
  uint8_t q[256];
  float scale[8];    // per block: d (Q8_0/Q4_0) or d * sub-block scale (Q4_K)
  int32_t init[8];   // Q8_0: -128 * sum(w) per block, cancelling the activation offset
  float min[8];      // Q4_K: dmin * sub-block min
};
struct PackedX {
  uint8_t q[256];
  float d[8];        // per block activation scale
  int32_t init[8];   // Q4_0: -8 * sum(x) per block, for the weights' -8 offset
  float bsum[8];     // Q4_K: d * sum(x) per sub-block, for the minimums
};

// dst lane j, chunk c  <-  block j, bytes 4c..4c+3
inline void interleave(const uint8_t blocks[8][32], uint8_t* dst) {
  for (int c = 0; c < 8; ++c)
    for (int j = 0; j < 8; ++j) std::memcpy(dst + c * 32 + j * 4, blocks[j] + 4 * c, 4);
}

void pack_weights(const Tensor& w, int64_t o, PackedW* dst) {
  const int64_t groups = w.cols() / 256;
  for (int64_t g = 0; g < groups; ++g) {
    PackedW& p = dst[g];
    uint8_t blocks[8][32];
    std::memset(p.init, 0, sizeof p.init);
    std::memset(p.min, 0, sizeof p.min);
    if (w.dtype == DType::Q8_0) {
      const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(w.row_ptr(o)) + g * 8;
      for (int j = 0; j < 8; ++j) {
        std::memcpy(blocks[j], b[j].qs, 32);
        int32_t sum = 0;
        for (int k = 0; k < 32; ++k) sum += b[j].qs[k];
        p.init[j] = -128 * sum;
        p.scale[j] = f16_to_f32(b[j].d);
      }
    } else if (w.dtype == DType::Q4_0) {
      const BlockQ4_0* b = reinterpret_cast<const BlockQ4_0*>(w.row_ptr(o)) + g * 8;
      for (int j = 0; j < 8; ++j) {
        for (int k = 0; k < 16; ++k) {
          blocks[j][k] = b[j].qs[k] & 0xf;
          blocks[j][k + 16] = b[j].qs[k] >> 4;
        }
        p.scale[j] = f16_to_f32(b[j].d);
      }
    } else {  // Q4_K: sub-block 2i = low nibbles of qs[32i..], 2i+1 = high nibbles
      const BlockQ4_K& b = reinterpret_cast<const BlockQ4_K*>(w.row_ptr(o))[g];
      uint8_t sc[8], m[8];
      for (int j = 0; j < 4; ++j) {
        sc[j] = b.scales[j] & 63;
        m[j] = b.scales[j + 4] & 63;
        sc[j + 4] = static_cast<uint8_t>((b.scales[j + 8] & 0xf) | ((b.scales[j] >> 6) << 4));
        m[j + 4] = static_cast<uint8_t>((b.scales[j + 8] >> 4) | ((b.scales[j + 4] >> 6) << 4));
      }
      for (int i = 0; i < 4; ++i)
        for (int k = 0; k < 32; ++k) {
          blocks[2 * i][k] = b.qs[32 * i + k] & 0xf;
          blocks[2 * i + 1][k] = b.qs[32 * i + k] >> 4;
        }
      const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
      for (int j = 0; j < 8; ++j) {
        p.scale[j] = d * sc[j];
        p.min[j] = dmin * m[j];
      }
    }
    interleave(blocks, p.q);
  }
}

void pack_activations(DType wtype, const float* x, int64_t K, PackedX* dst) {
  const int64_t groups = K / 256;
  uint8_t blocks[8][32];
  if (wtype == DType::Q4_K) {
    std::vector<BlockQ8_K> q(static_cast<size_t>(groups));
    quantize_act_q8_k(x, q.data(), K);
    for (int64_t g = 0; g < groups; ++g) {
      PackedX& p = dst[g];
      for (int j = 0; j < 8; ++j) {
        std::memcpy(blocks[j], q[static_cast<size_t>(g)].qs + 32 * j, 32);
        p.d[j] = q[static_cast<size_t>(g)].d;
        p.init[j] = 0;
        p.bsum[j] = q[static_cast<size_t>(g)].d * static_cast<float>(q[static_cast<size_t>(g)].bsums[2 * j] + q[static_cast<size_t>(g)].bsums[2 * j + 1]);
      }
      interleave(blocks, p.q);
    }
    return;
  }
  std::vector<BlockQ8_0> q(static_cast<size_t>(groups * 8));
  quantize_act_q8_0(x, q.data(), K);
  for (int64_t g = 0; g < groups; ++g) {
    PackedX& p = dst[g];
    for (int j = 0; j < 8; ++j) {
      const BlockQ8_0& b = q[static_cast<size_t>(g * 8 + j)];
      int32_t sum = 0;
      for (int k = 0; k < 32; ++k) {
        // Q8_0 weights are signed, so the activations become the unsigned operand (x + 128).
        blocks[j][k] = wtype == DType::Q8_0 ? static_cast<uint8_t>(b.qs[k] + 128) : static_cast<uint8_t>(b.qs[k]);
        sum += b.qs[k];
      }
      p.d[j] = f16_to_f32(b.d);
      p.init[j] = wtype == DType::Q4_0 ? -8 * sum : 0;
      p.bsum[j] = 0;
    }
    interleave(blocks, p.q);
  }
}

// y[t][o] for R rows x T tokens over all groups. kWeightsUnsigned: weights are the unsigned
// operand of vpdpbusd (Q4_0, Q4_K), else the activations are (Q8_0).
template <int R, int T, bool kWeightsUnsigned, bool kMins>
FP_VNNI void tile_kernel(const PackedW* const* w, const PackedX* const* x, int64_t groups, float* y, int64_t ldy,
                         const float* bias) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m256i iacc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t)
        iacc[r][t] = kWeightsUnsigned ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].init))
                                      : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][g].init));
    for (int c = 0; c < 8; ++c) {
      __m256i wv[R];
      for (int r = 0; r < R; ++r) wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r][g].q + 32 * c));
      for (int t = 0; t < T; ++t) {
        __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t][g].q + 32 * c));
        for (int r = 0; r < R; ++r)
          iacc[r][t] = kWeightsUnsigned ? _mm256_dpbusd_epi32(iacc[r][t], wv[r], xv) : _mm256_dpbusd_epi32(iacc[r][t], xv, wv[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      __m256 ws = _mm256_loadu_ps(w[r][g].scale);
      for (int t = 0; t < T; ++t) {
        __m256 s = _mm256_mul_ps(ws, _mm256_loadu_ps(x[t][g].d));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r][t]), s, acc[r][t]);
        if (kMins) acc[r][t] = _mm256_fnmadd_ps(_mm256_loadu_ps(w[r][g].min), _mm256_loadu_ps(x[t][g].bsum), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = avx2::hsum(acc[r][t]) + (bias ? bias[r] : 0.0f);
}

template <bool U, bool M>
void tile_dispatch(int R, int T, const PackedW* const* w, const PackedX* const* x, int64_t groups, float* y, int64_t ldy,
                   const float* bias) {
  // R in 1..4 rows, T in 1..3 tokens.
  switch (R * 4 + T) {
#define FP_TILE(r, t) case r * 4 + t: return tile_kernel<r, t, U, M>(w, x, groups, y, ldy, bias);
    FP_TILE(1, 1) FP_TILE(1, 2) FP_TILE(1, 3) FP_TILE(2, 1) FP_TILE(2, 2) FP_TILE(2, 3)
    FP_TILE(3, 1) FP_TILE(3, 2) FP_TILE(3, 3) FP_TILE(4, 1) FP_TILE(4, 2) FP_TILE(4, 3)
#undef FP_TILE
  }
}

void gemm_interleaved(const MatMulArgs& a) {
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), groups = K / 256;
  std::vector<PackedX> xp(static_cast<size_t>(a.n * groups));
  thread_pool().parallel_for(a.n, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) pack_activations(w.dtype, a.x + i * K, K, xp.data() + i * groups);
  });
  const bool unsigned_w = w.dtype != DType::Q8_0, mins = w.dtype == DType::Q4_K;
  constexpr int64_t kRows = 32, kR = 4, kT = 3;
  thread_pool().parallel_for((out + kRows - 1) / kRows, 1, [&](int64_t b0, int64_t b1) {
    std::vector<PackedW> wp(static_cast<size_t>(kRows * groups));
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t o0 = blk * kRows, rows = std::min(kRows, out - o0);
      for (int64_t r = 0; r < rows; ++r) pack_weights(w, o0 + r, wp.data() + r * groups);
      for (int64_t t0 = 0; t0 < a.n; t0 += kT) {
        const int T = static_cast<int>(std::min(kT, a.n - t0));
        const PackedX* xs[kT];
        for (int t = 0; t < T; ++t) xs[t] = xp.data() + (t0 + t) * groups;
        for (int64_t r0 = 0; r0 < rows; r0 += kR) {
          const int R = static_cast<int>(std::min(kR, rows - r0));
          const PackedW* ws[kR];
          for (int r = 0; r < R; ++r) ws[r] = wp.data() + (r0 + r) * groups;
          float* y = a.y + t0 * out + o0 + r0;
          const float* bias = a.bias ? a.bias + o0 + r0 : nullptr;
          if (!unsigned_w) tile_dispatch<false, false>(R, T, ws, xs, groups, y, out, bias);
          else if (mins) tile_dispatch<true, true>(R, T, ws, xs, groups, y, out, bias);
          else tile_dispatch<true, false>(R, T, ws, xs, groups, y, out, bias);
        }
      }
    }
  });
}

void matmul_vnni(const MatMulArgs& a) {
  if (a.n <= 0) return;
  if (a.n > cpu::kGemvMaxTokens && a.w->cols() % 256 == 0) return gemm_interleaved(a);
  FP_CHECK(a.w->dtype != DType::Q4_K, "matmul avx512vnni: Q4_K needs rows that are a multiple of 256");
  const int64_t K = a.w->cols(), nb = K / QK8_0;
  QuantizedActs x;
  x.q.resize(static_cast<size_t>(a.n * nb));
  for (int64_t i = 0; i < a.n; ++i) quantize_act_q8_0(a.x + i * K, x.q.data() + i * nb, K);
  const bool q8 = a.w->dtype == DType::Q8_0;
  if (q8) {
    x.u.resize(x.q.size() * 32);
    for (size_t b = 0; b < x.q.size(); ++b)
      for (int j = 0; j < 32; ++j) x.u[b * 32 + static_cast<size_t>(j)] = static_cast<uint8_t>(x.q[b].qs[j] + 128);
  } else {
    x.sums.resize(x.q.size());
    for (size_t b = 0; b < x.q.size(); ++b) {
      int32_t s = 0;
      for (int j = 0; j < 32; ++j) s += x.q[b].qs[j];
      x.sums[b] = s;
    }
  }
  cpu::gemv_tokens(a, [&](auto N, int64_t i, int64_t r0, int64_t r1) {
    if (q8) q8_0_rows<decltype(N)::value>(a, x, i, r0, r1);
    else q4_0_rows<decltype(N)::value>(a, x, i, r0, r1);
  });
}

std::string refuse_vnni(const MatMulArgs& a) {
  std::string cpu = cpu_features().missing({"avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512bw", "avx512_vnni"});
  if (!cpu.empty()) return cpu;
  const DType t = a.w->dtype;
  if (t != DType::Q8_0 && t != DType::Q4_0 && t != DType::Q4_K)
    return std::string("only Q8_0/Q4_0/Q4_K weights (these are ") + dtype_name(t) + ")";
  if (t == DType::Q4_K && a.n <= cpu::kGemvMaxTokens) return "Q4_K decode (<= 4 tokens) is left to the AVX2 kernel";
  return {};
}

const bool registered = register_kernel(Kernel<MatMulArgs>{"avx512vnni", Backend::CPU, 200, false, refuse_vnni, matmul_vnni});

}  // namespace
}  // namespace fp
