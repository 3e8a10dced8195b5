// kernels/cuda/elementwise.cu — the CUDA kernels of the row-wise and element-wise ops:
// embedding (Gemma's scaled rows too), RMSNorm, RoPE, SiLU- and GELU-and-multiply, logit
// soft-capping, add, softmax, argmax, the token feed and the KV-cache write and row moves.
// Each mirrors its reference in kernels/cpu/reference.cpp; rows go one per block, elements
// one per thread. The ops of a decode layer's chain (RMSNorm, RoPE, SiLU, add, the KV write) are
// launched chained (pdl.cuh): each waits for the kernel before at its start.
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/weights.cuh"

namespace fp::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embedding_kernel(const uint8_t* table, DType dtype, int64_t row_bytes, int64_t dim, const int32_t* ids,
                                 float scale, float* out) {
  const int64_t i = blockIdx.x;
  const uint8_t* row = table + static_cast<int64_t>(ids[i]) * row_bytes;
  for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) {
    const float v = load_weight(row, dtype, c);
    out[i * dim + c] = scale != 1.0f ? v * scale : v;
  }
}

// With a residual (add, sum non-null): sum = x + add, normalised. Each thread reads and writes
// the same elements in both passes, so sum may alias x and out may alias add.
__global__ void rmsnorm_kernel(const float* x, const float* add, float* sum, const float* w, int64_t d, int64_t stride,
                               float eps, float* out, uint16_t* bf16) {
  pdl_release();
  pdl_wait();
  const float* xr = x + blockIdx.x * stride;
  float* yr = out + blockIdx.x * stride;
  float ss = 0.0f;
  if (add) {
    const float* ar = add + blockIdx.x * stride;
    float* sr = sum + blockIdx.x * stride;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float v = xr[j] + ar[j];
      sr[j] = v;
      ss += v * v;
    }
    xr = sr;
  } else {
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xr[j] * xr[j];
  }
  ss = block_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(d) + eps);
  uint16_t* br = bf16 ? bf16 + blockIdx.x * d : nullptr;  // packed rows
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = xr[j] * inv * w[j];
    yr[j] = v;
    if (br) br[j] = float_to_bf16_bits(v);
  }
}

// One thread per (token, pair index i, head).
__global__ void rope_kernel(float* x, const int32_t* pos, int64_t n, int64_t n_heads, int64_t head_dim, int64_t half,
                            int64_t row_stride, const float* inv_freq, float mscale, bool neox) {
  pdl_release();
  pdl_wait();
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= n * half * n_heads) return;
  const int64_t h = idx % n_heads, i = (idx / n_heads) % half, t = idx / (n_heads * half);
  const float angle = static_cast<float>(pos[t]) * inv_freq[i];
  float s, c;
  sincosf(angle, &s, &c);
  c *= mscale;
  s *= mscale;
  float* xh = x + t * row_stride + h * head_dim;
  const int64_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
  const float x0 = xh[i0], x1 = xh[i1];
  xh[i0] = x0 * c - x1 * s;
  xh[i1] = x0 * s + x1 * c;
}

// act(gate) * up: SiLU g / (1 + e^-g), or GELU's tanh form (transformers' gelu_pytorch_tanh)
// g / 2 (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
template <bool kGelu>
__global__ void glu_kernel(const float* gate, const float* up, int64_t n, int64_t d, int64_t gs, int64_t us, float* out,
                           uint16_t* bf16) {
  pdl_release();
  pdl_wait();
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (idx >= n * d) return;
  const int64_t i = idx / d, j = idx % d;
  const float g = gate[i * gs + j];
  const float act = kGelu ? 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) : g / (1.0f + expf(-g));
  const float v = act * up[i * us + j];
  out[idx] = v;
  if (bf16) bf16[idx] = float_to_bf16_bits(v);
}

__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* out) {
  pdl_release();
  pdl_wait();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

__global__ void softmax_kernel(float* x, int64_t d) {
  float* r = x + blockIdx.x * d;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) mx = fmaxf(mx, r[j]);
  mx = block_max(mx);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sum += (r[j] = expf(r[j] - mx));
  sum = block_sum(sum);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) r[j] *= inv;
}

// First index of the largest value, as the reference scans: a NaN never wins, except at index 0
// where nothing beats it. Each thread keeps its best (value, lowest index), then a block-wide
// reduction that prefers the lower index on equal values.
__global__ void token_feed_kernel(int32_t* tokens, const int32_t* from_row, const int32_t* ids, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && from_row[i] >= 0) tokens[i] = ids[from_row[i]];
}

__global__ void argmax_kernel(const float* x, int64_t d, int32_t* out) {
  const float* r = x + blockIdx.x * d;
  if (isnan(r[0])) {
    if (threadIdx.x == 0) out[blockIdx.x] = 0;
    return;
  }
  float best = -INFINITY;
  int64_t at = d;  // "none yet" sorts after every real index
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    if (!isnan(r[j]) && (at == d || r[j] > best)) {  // j grows: a later equal value never wins
      best = r[j];
      at = j;
    }
  __shared__ float sv[kThreads];
  __shared__ int64_t si[kThreads];
  sv[threadIdx.x] = best;
  si[threadIdx.x] = at;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float v2 = sv[threadIdx.x + s];
      const int64_t i2 = si[threadIdx.x + s];
      const bool take = i2 < d && (si[threadIdx.x] == d || v2 > sv[threadIdx.x] || (v2 == sv[threadIdx.x] && i2 < si[threadIdx.x]));
      if (take) {
        sv[threadIdx.x] = v2;
        si[threadIdx.x] = i2;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = static_cast<int32_t>(si[0] == d ? 0 : si[0]);
}

// One thread per (token, element) of a token's K row and V row side by side (vw 0: K only).
__global__ void kv_write_kernel(uint8_t* k_pool, uint8_t* v_pool, DType dtype, int64_t kw, int64_t vw, const int64_t* slots,
                                int64_t n, const float* k_rows, const float* v_rows) {
  pdl_release();
  pdl_wait();
  const int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t both = kw + vw;
  if (idx >= n * both) return;
  const int64_t i = idx / both, j = idx % both;
  const bool is_k = j < kw;
  const int64_t width = is_k ? kw : vw, col = is_k ? j : j - kw;
  uint8_t* pool = is_k ? k_pool : v_pool;
  const int64_t dst = slots[i] * width + col;
  const float v = (is_k ? k_rows : v_rows)[i * width + col];
  if (dtype == DType::F32) reinterpret_cast<float*>(pool)[dst] = v;
  else if (dtype == DType::F16) reinterpret_cast<uint16_t*>(pool)[dst] = float_to_half_bits(v);
  else reinterpret_cast<uint16_t*>(pool)[dst] = float_to_bf16_bits(v);
}

// One block per row: the slot's K row then V row, moved in words of W bytes (the widest that
// every row length and base address allows).
template <class W>
__global__ void kv_move_kernel(uint8_t* k_pool, uint8_t* v_pool, int64_t kb, int64_t vb, const int64_t* slots,
                               const int32_t* rows, uint8_t* packed, bool into_pool) {
  const int64_t i = blockIdx.x;
  uint8_t* row = packed + (rows ? static_cast<int64_t>(rows[i]) : i) * (kb + vb);
  W* ks = reinterpret_cast<W*>(k_pool + slots[i] * kb);
  W* pk = reinterpret_cast<W*>(row);
  for (int64_t j = threadIdx.x; j < kb / static_cast<int64_t>(sizeof(W)); j += blockDim.x) {
    if (into_pool) ks[j] = pk[j];
    else pk[j] = ks[j];
  }
  if (vb == 0) return;
  W* vs = reinterpret_cast<W*>(v_pool + slots[i] * vb);
  W* pv = reinterpret_cast<W*>(row + kb);
  for (int64_t j = threadIdx.x; j < vb / static_cast<int64_t>(sizeof(W)); j += blockDim.x) {
    if (into_pool) vs[j] = pv[j];
    else pv[j] = vs[j];
  }
}

}  // namespace

std::string refuse_embedding(const EmbeddingArgs& a) {
  const DType t = a.table->dtype;
  if (t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::Q8_0 && t != DType::Q4_K && t != DType::Q6_K &&
      t != DType::F8_E4M3)
    return std::string("table is ") + dtype_name(t) + ", this kernel reads F32, F16, BF16, Q8_0, Q4_K, Q6_K, F8_E4M3";
  if (a.table->block_scale) return "a block-scaled table";
  return {};
}

void embedding(const EmbeddingArgs& a) {
  if (a.n == 0) return;
  const Tensor& t = *a.table;
  embedding_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream()>>>(static_cast<const uint8_t*>(t.data), t.dtype,
                                                                           row_bytes(t.dtype, t.cols()), t.cols(), a.ids, a.scale,
                                                                           a.out);
  FP_CUDA_LAUNCHED("embedding");
}

std::string refuse_rmsnorm(const RmsNormArgs& a) {
  if (!a.add != !a.sum) return "a residual needs both add and sum";
  return a.q8 ? "a fused Q8_0 output is the CPU matmuls' activation layout" : "";
}

void rmsnorm(const RmsNormArgs& a) {
  if (a.n == 0) return;
  launch_chained("rmsnorm", rmsnorm_kernel, dim3(static_cast<unsigned>(a.n)), dim3(kThreads), 0, a.x, a.add, a.sum, a.weight,
                 a.d, a.row_stride(), a.eps, a.out, a.bf16);
}

void rope(const RopeArgs& a) {
  const int64_t half = a.rot_dim / 2, total = a.n * half * a.n_heads;
  if (total == 0) return;
  launch_chained("rope", rope_kernel, dim3(blocks_for(total, kThreads)), dim3(kThreads), 0, a.x, a.pos, a.n, a.n_heads,
                 a.head_dim, half, a.row_stride, a.inv_freq, a.mscale, a.style == RopeStyle::NeoX);
}

void silu_mul(const SiluMulArgs& a) {
  const int64_t total = a.n * a.d;
  if (total == 0) return;
  launch_chained("silu_mul", glu_kernel<false>, dim3(blocks_for(total, kThreads)), dim3(kThreads), 0, a.gate, a.up, a.n, a.d,
                 a.gate_stride ? a.gate_stride : a.d, a.up_stride ? a.up_stride : a.d, a.out, a.bf16);
}

void gelu_mul(const GeluMulArgs& a) {
  const int64_t total = a.n * a.d;
  if (total == 0) return;
  launch_chained("gelu_mul", glu_kernel<true>, dim3(blocks_for(total, kThreads)), dim3(kThreads), 0, a.gate, a.up, a.n, a.d,
                 a.gate_stride ? a.gate_stride : a.d, a.up_stride ? a.up_stride : a.d, a.out, a.bf16);
}

std::string refuse_softcap(const SoftcapArgs& a) {
  return a.cap > 0 ? "" : "softcap: the cap must be positive";
}

void softcap(const SoftcapArgs& a) {
  if (a.n == 0) return;
  softcap_kernel<<<blocks_for(a.n, kThreads), kThreads, 0, stream()>>>(a.x, a.n, a.cap);
  FP_CUDA_LAUNCHED("softcap");
}

void add(const AddArgs& a) {
  if (a.n == 0) return;
  launch_chained("add", add_kernel, dim3(blocks_for(a.n, kThreads)), dim3(kThreads), 0, a.a, a.b, a.n, a.out);
}

void softmax(const SoftmaxArgs& a) {
  if (a.n == 0 || a.d == 0) return;
  softmax_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream()>>>(a.x, a.d);
  FP_CUDA_LAUNCHED("softmax");
}

void argmax(const ArgmaxArgs& a) {
  if (a.n == 0) return;
  argmax_kernel<<<static_cast<unsigned>(a.n), kThreads, 0, stream()>>>(a.x, a.d, a.out);
  FP_CUDA_LAUNCHED("argmax");
}

void token_feed(const TokenFeedArgs& a) {
  if (a.n == 0) return;
  token_feed_kernel<<<blocks_for(a.n, kThreads), kThreads, 0, stream()>>>(a.tokens, a.from_row, a.ids, a.n);
  FP_CUDA_LAUNCHED("token_feed");
}

void kv_write(const KvWriteArgs& a) {
  if (a.n == 0) return;
  const int64_t vw = a.v_rows ? a.v_width : 0;  // one launch for K and V
  launch_chained("kv_write", kv_write_kernel, dim3(blocks_for(a.n * (a.k_width + vw), kThreads)), dim3(kThreads), 0,
                 static_cast<uint8_t*>(a.k_pool), static_cast<uint8_t*>(a.v_pool), a.dtype, a.k_width, vw, a.slots, a.n,
                 a.k_rows, a.v_rows);
}

void kv_move(const KvMoveArgs& a) {
  if (a.n == 0) return;
  // The widest word that divides both row lengths and every base address.
  uint64_t align = static_cast<uint64_t>(a.k_row_bytes) | static_cast<uint64_t>(a.v_row_bytes) |
                   reinterpret_cast<uintptr_t>(a.k_pool) | reinterpret_cast<uintptr_t>(a.packed) |
                   (a.v_row_bytes ? reinterpret_cast<uintptr_t>(a.v_pool) : 0);
  auto* k = static_cast<uint8_t*>(a.k_pool);
  auto* v = static_cast<uint8_t*>(a.v_pool);
  auto* p = static_cast<uint8_t*>(a.packed);
  const auto blocks = static_cast<unsigned>(a.n);
  if (align % 16 == 0)
    kv_move_kernel<uint4><<<blocks, 128, 0, stream()>>>(k, v, a.k_row_bytes, a.v_row_bytes, a.slots, a.rows, p, a.into_pool);
  else if (align % 4 == 0)
    kv_move_kernel<uint32_t><<<blocks, 128, 0, stream()>>>(k, v, a.k_row_bytes, a.v_row_bytes, a.slots, a.rows, p, a.into_pool);
  else if (align % 2 == 0)
    kv_move_kernel<uint16_t><<<blocks, 128, 0, stream()>>>(k, v, a.k_row_bytes, a.v_row_bytes, a.slots, a.rows, p, a.into_pool);
  else
    kv_move_kernel<uint8_t><<<blocks, 128, 0, stream()>>>(k, v, a.k_row_bytes, a.v_row_bytes, a.slots, a.rows, p, a.into_pool);
  FP_CUDA_LAUNCHED("kv_move");
}

}  // namespace fp::cuda
