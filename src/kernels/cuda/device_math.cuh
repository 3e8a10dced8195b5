// kernels/cuda/device_math.cuh — device-side helpers shared by the .cu files: f16/bf16 loads as
// float, warp and block reductions, the GGUF block layouts, and launch-size arithmetic.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace fp::cuda {

__device__ __forceinline__ float half_bits_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
// Round to nearest even, as the CPU's f32 -> f16 / bf16 conversions (NaN stays NaN).
__device__ __forceinline__ uint16_t float_to_half_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }
// F16 for the tensor cores, clamped to its finite range (a larger BF16 / F32 value would become
// inf); NaN stays NaN (fmaxf would turn it into the bound), as in the reference.
__device__ __forceinline__ __half to_half_clamped(float v) {
  return __float2half(isnan(v) ? v : fminf(fmaxf(v, -65504.0f), 65504.0f));
}
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the total.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : -INFINITY;
  return warp_max(v);
}

// A T at p, whatever p's alignment (a weight view can start anywhere in a file: safetensors
// aligns nothing): one load where p is aligned, byte loads where not.
template <class T>
__device__ __forceinline__ T load_any(const uint8_t* p) {
  if ((reinterpret_cast<uintptr_t>(p) & (sizeof(T) - 1)) == 0) return *reinterpret_cast<const T*>(p);
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}

// Element c of a row of `dtype` (F32, F16, BF16, Q8_0) as float, at any alignment of the row.
__device__ __forceinline__ float load_element(const uint8_t* row, DType dtype, int64_t c) {
  switch (dtype) {
    case DType::F32: return load_any<float>(row + 4 * c);
    case DType::F16: return half_bits_to_float(load_any<uint16_t>(row + 2 * c));
    case DType::BF16: return bf16_bits_to_float(load_any<uint16_t>(row + 2 * c));
    case DType::Q8_0: {
      const uint8_t* b = row + (c / QK8_0) * static_cast<int64_t>(sizeof(BlockQ8_0));
      const float d = half_bits_to_float(load_any<uint16_t>(b + offsetof(BlockQ8_0, d)));
      return d * static_cast<float>(reinterpret_cast<const int8_t*>(b + offsetof(BlockQ8_0, qs))[c % QK8_0]);
    }
    default: return 0.0f;  // refused on the host before launch
  }
}

// Element `index` of a KV pool of F32, F16 or BF16 values, as float.
__device__ __forceinline__ float kv_load(const uint8_t* pool, DType t, int64_t index) {
  if (t == DType::F32) return __ldg(reinterpret_cast<const float*>(pool) + index);
  const uint16_t bits = __ldg(reinterpret_cast<const uint16_t*>(pool) + index);
  return t == DType::F16 ? half_bits_to_float(bits) : bf16_bits_to_float(bits);
}

// The sequence of token i in a varlen batch: the last s with seq_indptr[s] <= i (empty
// sequences repeat a value, so they are skipped).
__device__ __forceinline__ int64_t seq_of(const int32_t* seq_indptr, int64_t n_seqs, int64_t i) {
  int64_t lo = 0, hi = n_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (seq_indptr[mid] <= i) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace fp::cuda
