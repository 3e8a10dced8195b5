// kernels/cpu/matmul_interleave.cpp — packing into the interleaved-block layout and the
// row-block / token-tile loop shared by the integer prefill kernels (see the header).
#include "kernels/cpu/matmul_interleave.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/quantize_act.h"

namespace fp::cpu {

bool interleaved_supported(const MatMulArgs& a) {
  const DType t = a.w->dtype;
  return (t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_K) && a.w->cols() % 256 == 0 && !a.w->block_scale;
}

// dst lane j, chunk c  <-  block j, bytes 4c..4c+3
static void interleave(const uint8_t blocks[8][32], uint8_t* dst) {
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

void gemm_interleaved(const MatMulArgs& a, int rows_per_tile, const InterleavedTile& tile) {
  const Tensor& w = *a.w;
  const int64_t K = w.cols(), out = w.rows(), groups = K / 256;
  std::vector<PackedX> xp(static_cast<size_t>(a.n * groups));
  thread_pool().parallel_for(a.n, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) pack_activations(w.dtype, a.x + i * K, K, xp.data() + i * groups);
  });
  constexpr int64_t kRows = 32, kT = 3;
  const int64_t kR = rows_per_tile;
  thread_pool().parallel_for((out + kRows - 1) / kRows, 1, [&](int64_t b0, int64_t b1) {
    std::vector<PackedW> wp(static_cast<size_t>(kRows * groups));
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t o0 = blk * kRows, rows = std::min(kRows, out - o0);
      for (int64_t r = 0; r < rows; ++r) pack_weights(w, o0 + r, wp.data() + r * groups);
      for (int64_t t0 = 0; t0 < a.n; t0 += kT) {
        const int T = static_cast<int>(std::min(kT, a.n - t0));
        const PackedX* xs[3];
        for (int t = 0; t < T; ++t) xs[t] = xp.data() + (t0 + t) * groups;
        for (int64_t r0 = 0; r0 < rows; r0 += kR) {
          const int R = static_cast<int>(std::min(kR, rows - r0));
          const PackedW* ws[4];
          for (int r = 0; r < R; ++r) ws[r] = wp.data() + (r0 + r) * groups;
          float* y = a.y + t0 * out + o0 + r0;
          const float* bias = a.bias ? a.bias + o0 + r0 : nullptr;
          tile(R, T, ws, xs, groups, y, out, bias);
        }
      }
    }
  });
}

}  // namespace fp::cpu
