// kernels/cuda/weights.cuh — weight decoding shared by the matmul kernels: eight consecutive
// weights of a row as float (the unit of the GEMV and of the dequantizing kernels), and one
// weight at a time (the plain kernel). Values match core/dtype.cpp's dequantize_row exactly
// (same products in the same order), so a kernel differs from the CPU reference only in how
// it sums.
//
// Layouts (core/dtype.h, ggml's):
//   F32/F16/BF16/F8_E4M3: plain elements. Chunk c = elements 8c..8c+7: 32/16/16/8 bytes.
//   Q8_0: 34-byte blocks {f16 d; int8 qs[32]}: y = d * q. A chunk is a quarter block; its 8
//         bytes sit at block + 2 + 8*(c%4): 2-byte aligned only, so they load as 4 x u16.
//   Q4_K: 144-byte blocks {f16 d, dmin; u8 scales[12]; u8 qs[128]} of 256 elements in 4 groups
//         of 64: group g's elements 0..31 are the low nibbles of qs[32g..32g+32), 32..63 the
//         high nibbles; sub-block j = 2g + hi has a 6-bit scale and min: y = d*sc*q - dmin*m.
//   Q6_K: 210-byte blocks {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d} of 256 elements in two
//         halves of 128 (n), each four groups of 32 (g): element l of group g takes the low (g < 2)
//         or high nibble of ql[64n + l + 32(g & 1)] and bits 2g..2g+1 of qh[32n + l] as its high
//         two bits; y = d * scales[8n + l/16 + 2g] * (q - 32). Byte loads (blocks are unaligned).
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/device_math.cuh"

namespace fp::cuda {

// FP8 E4M3 (the "FN" variant: no infinities, S.1111.111 is NaN) to float, as fp8e4m3_to_f32.
__device__ __forceinline__ float fp8e4m3_bits_to_float(uint32_t v) {
  const uint32_t sign = (v & 0x80u) << 24, e = (v >> 3) & 0xfu, m = v & 7u;
  if (e == 15u && m == 7u) return __uint_as_float(0x7fc00000u | sign);
  if (e == 0u) return __uint_as_float(sign | __float_as_uint(static_cast<float>(m) * 0.001953125f));  // m/8 * 2^-6
  return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));  // exponent bias 7 -> 127
}

// The 6-bit scale and min of Q4_K sub-block j (0..7) from the 12 packed bytes q.
__device__ __forceinline__ void q4k_scale_min(int j, const uint8_t* q, float* sc, float* m) {
  if (j < 4) {
    *sc = static_cast<float>(q[j] & 63);
    *m = static_cast<float>(q[j + 4] & 63);
  } else {
    *sc = static_cast<float>((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<float>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// 16 and 8 bytes of weights through the read-only path. kStream: not kept in L1 (a GEMV reads each
// weight once; L1 stays with the activations every warp reads), with a 256-byte L2 fetch hint.
// Not volatile: weights do not change while a kernel runs, so the compiler may move these loads
// freely (ahead of pdl_wait() among others).
template <bool kStream>
__device__ __forceinline__ uint4 load_weights16(const void* p) {
  if constexpr (kStream) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
  } else {
    return __ldg(static_cast<const uint4*>(p));
  }
}
template <bool kStream>
__device__ __forceinline__ uint2 load_weights8(const void* p) {
  if constexpr (kStream) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
  } else {
    return __ldg(static_cast<const uint2*>(p));
  }
}

// Weights 8c..8c+7 of `row` (a row of `dtype`; callers check the alignment named above: 16 bytes
// for the row start of F32/F16/BF16/Q4_K, 8 for F8_E4M3, 2 for Q8_0, none for Q6_K). kStream: the
// plain dtypes' loads bypass L1 (load_weights16); the block formats always go through it (a
// block's scales serve several chunks).
template <DType T, bool kStream = false>
__device__ __forceinline__ void load8(const uint8_t* __restrict__ row, int64_t c, float w[8]) {
  if constexpr (T == DType::F32) {
    const uint4 ua = load_weights16<kStream>(row + 32 * c), ub = load_weights16<kStream>(row + 32 * c + 16);
    w[0] = __uint_as_float(ua.x); w[1] = __uint_as_float(ua.y); w[2] = __uint_as_float(ua.z); w[3] = __uint_as_float(ua.w);
    w[4] = __uint_as_float(ub.x); w[5] = __uint_as_float(ub.y); w[6] = __uint_as_float(ub.z); w[7] = __uint_as_float(ub.w);
  } else if constexpr (T == DType::F16 || T == DType::BF16) {
    const uint4 u = load_weights16<kStream>(row + 16 * c);
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (T == DType::F16) {
        w[2 * k] = half_bits_to_float(static_cast<uint16_t>(words[k] & 0xffffu));
        w[2 * k + 1] = half_bits_to_float(static_cast<uint16_t>(words[k] >> 16));
      } else {
        w[2 * k] = __uint_as_float(words[k] << 16);
        w[2 * k + 1] = __uint_as_float(words[k] & 0xffff0000u);
      }
    }
  } else if constexpr (T == DType::F8_E4M3) {
    // Pairs of E4M3 to F16 pairs (exact: every E4M3 value is an F16 one) by the conversion
    // instruction where the GPU has one (sm_89 and later; cuda_fp8.h emulates it before), then
    // to floats: the same values as fp8e4m3_bits_to_float, in a few instructions per pair.
    const uint2 u = load_weights8<kStream>(row + 8 * c);
    const uint32_t words[2] = {u.x, u.y};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const auto pair = static_cast<__nv_fp8x2_storage_t>((words[k >> 1] >> (16 * (k & 1))) & 0xffffu);
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      w[2 * k] = f.x;  // the pair's lower byte
      w[2 * k + 1] = f.y;
    }
  } else if constexpr (T == DType::Q8_0) {
    const uint8_t* blk = row + (c >> 2) * static_cast<int64_t>(sizeof(BlockQ8_0));
    const float d = half_bits_to_float(__ldg(reinterpret_cast<const uint16_t*>(blk)));
    const uint16_t* qs = reinterpret_cast<const uint16_t*>(blk + 2 + 8 * (c & 3));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint16_t v = __ldg(qs + k);
      w[2 * k] = d * static_cast<float>(static_cast<int8_t>(v & 0xffu));
      w[2 * k + 1] = d * static_cast<float>(static_cast<int8_t>(v >> 8));
    }
  } else if constexpr (T == DType::Q6_K) {
    const uint8_t* blk = row + (c >> 5) * static_cast<int64_t>(sizeof(BlockQ6_K));
    const int e = static_cast<int>(c & 31) * 8, n = e >> 7, g = (e >> 5) & 3, l0 = e & 31;
    const float d = half_bits_to_float(static_cast<uint16_t>(__ldg(blk + 208) | (__ldg(blk + 209) << 8)));
    const float dsc = d * static_cast<float>(static_cast<int8_t>(__ldg(blk + 192 + 8 * n + (l0 >> 4) + 2 * g)));
    const uint8_t* ql = blk + 64 * n + l0 + 32 * (g & 1);
    const uint8_t* qh = blk + 128 + 32 * n + l0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t lo = g < 2 ? (__ldg(ql + k) & 0xfu) : (__ldg(ql + k) >> 4);
      const uint32_t hi = (__ldg(qh + k) >> (2 * g)) & 3u;
      w[k] = dsc * static_cast<float>(static_cast<int>(lo | (hi << 4)) - 32);
    }
  } else if constexpr (T == DType::Q4_K) {
    const uint8_t* blk = row + (c >> 5) * static_cast<int64_t>(sizeof(BlockQ4_K));
    const int e = static_cast<int>(c & 31) * 8;  // first element within the block
    const int g = e >> 6, hi = (e >> 5) & 1, l0 = e & 31;
    const uint32_t dd = __ldg(reinterpret_cast<const uint32_t*>(blk));
    const float d = half_bits_to_float(static_cast<uint16_t>(dd & 0xffffu));
    const float dmin = half_bits_to_float(static_cast<uint16_t>(dd >> 16));
    float sc, m;
    q4k_scale_min(2 * g + hi, blk + 4, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    const uint2 q = __ldg(reinterpret_cast<const uint2*>(blk + 16 + 32 * g + l0));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t b0 = (q.x >> (8 * k)) & 0xffu, b1 = (q.y >> (8 * k)) & 0xffu;
      w[k] = d1 * static_cast<float>(hi ? b0 >> 4 : b0 & 0xfu) - m1;
      w[4 + k] = d1 * static_cast<float>(hi ? b1 >> 4 : b1 & 0xfu) - m1;
    }
  }
}

// Weight c of `row` as float, any dtype the matmul kernels read (no alignment needs).
__device__ __forceinline__ float load_weight(const uint8_t* row, DType dtype, int64_t c) {
  switch (dtype) {
    case DType::F8_E4M3: return fp8e4m3_bits_to_float(row[c]);
    case DType::Q4_K: {
      const uint8_t* blk = row + (c / QK_K) * static_cast<int64_t>(sizeof(BlockQ4_K));
      const int e = static_cast<int>(c % QK_K), g = e >> 6, hi = (e >> 5) & 1;
      const float d = half_bits_to_float(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
      const float dmin = half_bits_to_float(static_cast<uint16_t>(blk[2] | (blk[3] << 8)));
      float sc, m;
      q4k_scale_min(2 * g + hi, blk + 4, &sc, &m);
      const uint8_t q = blk[16 + 32 * g + (e & 31)];
      return d * sc * static_cast<float>(hi ? q >> 4 : q & 0xf) - dmin * m;
    }
    case DType::Q6_K: {
      const uint8_t* blk = row + (c / QK_K) * static_cast<int64_t>(sizeof(BlockQ6_K));
      const int e = static_cast<int>(c % QK_K), n = e >> 7, g = (e >> 5) & 3, l = e & 31;
      const float d = half_bits_to_float(static_cast<uint16_t>(blk[208] | (blk[209] << 8)));
      const float dsc = d * static_cast<float>(static_cast<int8_t>(blk[192 + 8 * n + (l >> 4) + 2 * g]));
      const uint8_t b = blk[64 * n + l + 32 * (g & 1)];
      const uint32_t lo = g < 2 ? (b & 0xfu) : (b >> 4), hi = (blk[128 + 32 * n + l] >> (2 * g)) & 3u;
      return dsc * static_cast<float>(static_cast<int>(lo | (hi << 4)) - 32);
    }
    default: return load_element(row, dtype, c);  // F32, F16, BF16, Q8_0
  }
}

}  // namespace fp::cuda
