// kernels/cuda/gemm_cublaslt_fp8.cu — the FP8 E4M3 block-scaled GEMM of DeepSeek-V3's format on
// Hopper, through cuBLASLt: W (FP8, one f32 scale per 128x128 block) times x quantized to FP8 per
// token and 128 columns (one f32 scale each), on the FP8 tensor cores at twice the BF16 rate,
// where `cublas` dequantizes W to BF16 first.
//
//   1. quantize: a warp per (token, 128-column block) scales the block so that its largest
//      magnitude is 448 (E4M3's largest finite value) and rounds to nearest even, saturating;
//      scale = max(amax / 448, 1e-30) (1 for an all-zero block). Scales are stored outer-dimension-major,
//      sx[kb * n_pad + t], as cuBLASLt's VEC128_32F mode reads them; rows t >= n are zeros.
//   2. cublasLtMatmul, column-major view as in gemm_cublas.cu: D (out x n_pad, ld out) =
//      op(A) B with A = W (K x out, ld K, transposed, BLK128x128_32F scales: W's own row-major
//      [out/128][K/128] block scales) and B = the quantized x (K x n_pad, ld K, VEC128_32F),
//      compute F32, C = D = F32 (beta 0); then the bias, and D's first n rows copied into y
//      when n was padded.
// The activations lose precision to FP8 (about 3.6% rms per value); the tests compare with the
// reference run on the same quantized activations (tight) and on the exact ones (loose).
//
// Per call, shapes cuBLASLt's block-scaled path does not take — K not a multiple of 512 (the
// weight scales' row of K/128 floats must be a multiple of 16 bytes), out not a multiple of 16,
// W not 16-byte aligned, or no algorithm from cuBLASLt's heuristic — run the `cublas` path
// instead (the op's shape class is cached, not each size; as `gemv` hands odd addresses to the
// plain kernel). refuse_cublaslt_fp8 covers what is known per class: FP8 with 128x128 scales,
// and a Hopper GPU (compute capability 9.x: the 1D/2D block-scaling modes are Hopper's).
#include <cublasLt.h>
#include <cuda_fp8.h>

#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/launch.h"

namespace fp::cuda {
namespace {

constexpr int kBlock = 128;
constexpr int kThreads = 256;

// vec4: x 16-byte aligned (its rows then are too: K is a multiple of 512), read as float4; the
// four E4M3 bytes of a lane leave as one 32-bit store either way.
template <bool vec4>
__global__ void quantize_x_kernel(const float* __restrict__ x, int64_t n, int64_t n_pad, int64_t K, uint8_t* __restrict__ q,
                                  float* __restrict__ sx) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  const int64_t kblocks = K / kBlock;
  if (w >= n_pad * kblocks) return;  // whole warps
  const int64_t t = w / kblocks, kb = w % kblocks, c0 = kb * kBlock + lane * 4;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (t < n) {
    if constexpr (vec4) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(x + t * K + c0));
      v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = x[t * K + c0 + j];
    }
  }
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  amax = warp_max(amax);
  const float s = amax > 0.0f ? fmaxf(amax / 448.0f, 1e-30f) : 1.0f;  // no 0 scale for a denormal block
  uint32_t packed = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j)
    packed |= static_cast<uint32_t>(static_cast<uint8_t>(__nv_cvt_float_to_fp8(v[j] / s, __NV_SATFINITE, __NV_E4M3))) << (8 * j);
  *reinterpret_cast<uint32_t*>(q + t * K + c0) = packed;
  if (lane == 0) sx[kb * n_pad + t] = s;
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t n, int64_t out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n * out) y[i] += bias[i % out];
}

struct Lt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t{32} << 20;
  std::mutex mu;
  // Per (out, n_pad, K): the heuristic's candidates (best first by its estimate) and the one
  // chosen — the first until the shape is timed (ok = false: no algorithm at all).
  struct Algo {
    bool ok = false;
    bool timed = false;
    std::vector<cublasLtMatmulAlgo_t> candidates;
    cublasLtMatmulAlgo_t algo{};
    Fp8GemmTuning tuning;
  };
  std::map<std::tuple<int64_t, int64_t, int64_t>, Algo> algos;
};

Lt& lt() {
  static Lt* l = [] {
    auto* p = new Lt();  // lives for the process, as the backend's other CUDA objects
    FP_CUBLAS(cublasLtCreate(&p->handle));
    FP_CUDA(cudaMalloc(&p->workspace, p->workspace_bytes));
    return p;
  }();
  return *l;
}

// The descriptors of one call; destroyed with it.
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  ~Descs() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void make_descs(Descs& ds, int64_t out, int64_t n_pad, int64_t K, const float* w_scale, const float* x_scale) {
  FP_CUBLAS(cublasLtMatmulDescCreate(&ds.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  FP_CUBLAS(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  FP_CUBLAS(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtMatmulMatrixScale_t amode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                    bmode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  FP_CUBLAS(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &amode, sizeof(amode)));
  FP_CUBLAS(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bmode, sizeof(bmode)));
  FP_CUBLAS(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)));
  FP_CUBLAS(cublasLtMatmulDescSetAttribute(ds.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)));
  FP_CUBLAS(cublasLtMatrixLayoutCreate(&ds.a, CUDA_R_8F_E4M3, static_cast<uint64_t>(K), static_cast<uint64_t>(out), K));
  FP_CUBLAS(cublasLtMatrixLayoutCreate(&ds.b, CUDA_R_8F_E4M3, static_cast<uint64_t>(K), static_cast<uint64_t>(n_pad), K));
  FP_CUBLAS(cublasLtMatrixLayoutCreate(&ds.d, CUDA_R_32F, static_cast<uint64_t>(out), static_cast<uint64_t>(n_pad), out));
}

constexpr int kCandidates = 8;  // algorithms asked of the heuristic and timed per shape

// cuBLASLt's candidates for this shape (asked once per shape); the entry, or null when it has none.
Lt::Algo* algo_for(const Descs& ds, int64_t out, int64_t n_pad, int64_t K) {
  Lt& l = lt();
  std::lock_guard<std::mutex> lock(l.mu);
  auto key = std::make_tuple(out, n_pad, K);
  auto it = l.algos.find(key);
  if (it == l.algos.end()) {
    Lt::Algo a;
    cublasLtMatmulPreference_t pref = nullptr;
    FP_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &l.workspace_bytes,
                                         sizeof(l.workspace_bytes));
    cublasLtMatmulHeuristicResult_t res[kCandidates]{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(l.handle, ds.op, ds.a, ds.b, ds.d, ds.d, pref, kCandidates, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS)
      for (int i = 0; i < found; ++i)
        if (res[i].state == CUBLAS_STATUS_SUCCESS) a.candidates.push_back(res[i].algo);
    a.ok = !a.candidates.empty();
    if (a.ok) a.algo = a.candidates[0];
    a.tuning.candidates = static_cast<int>(a.candidates.size());
    it = l.algos.emplace(key, a).first;
  }
  return it->second.ok ? &it->second : nullptr;
}

// Times every candidate on this call's operands (once per shape, at its first call outside a
// CUDA graph capture) and keeps the fastest: the heuristic's first choice is its estimate, not a
// measurement, and on block-scaled FP8 the candidates differ by tens of percent. One warm-up and
// three timed runs each; a candidate that fails to launch is skipped. D is overwritten by every
// run; the caller's own run follows.
void time_candidates(Lt::Algo& a, const Descs& ds, const void* w, const void* q, float* d) {
  Lt& l = lt();
  std::lock_guard<std::mutex> lock(l.mu);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  FP_CUDA(cudaStreamIsCapturing(stream(), &capture));
  if (capture != cudaStreamCaptureStatusNone || a.timed) return;
  a.timed = true;
  if (a.candidates.size() < 2) return;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  FP_CUDA(cudaEventCreate(&e0));
  FP_CUDA(cudaEventCreate(&e1));
  const float alpha = 1.0f, beta = 0.0f;
  float best_ms = 0.0f;
  for (size_t i = 0; i < a.candidates.size(); ++i) {
    auto launch = [&] {
      return cublasLtMatmul(l.handle, ds.op, &alpha, w, ds.a, q, ds.b, &beta, d, ds.d, d, ds.d, &a.candidates[i],
                            l.workspace, l.workspace_bytes, stream());
    };
    if (launch() != CUBLAS_STATUS_SUCCESS) continue;
    FP_CUDA(cudaEventRecord(e0, stream()));
    bool ok = true;
    for (int r = 0; r < 3 && ok; ++r) ok = launch() == CUBLAS_STATUS_SUCCESS;
    FP_CUDA(cudaEventRecord(e1, stream()));
    FP_CUDA(cudaEventSynchronize(e1));
    float ms = 0.0f;
    FP_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    ms /= 3.0f;
    if (!ok) continue;
    if (i == 0) a.tuning.first_ms = ms;
    if (best_ms == 0.0f || ms < best_ms) {
      best_ms = ms;
      a.algo = a.candidates[i];
      a.tuning.chosen = static_cast<int>(i);
    }
  }
  a.tuning.chosen_ms = best_ms;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

std::atomic<int64_t> g_fallbacks{0};  // calls handed to gemm_cublas (the shape did not fit)

bool is_hopper() {
  static const bool hopper = [] {
    int major = 0;
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index()) == cudaSuccess && major == 9;
  }();
  return hopper;
}

}  // namespace

int64_t cublaslt_fp8_fallbacks() { return g_fallbacks.load(); }

Fp8GemmTuning cublaslt_fp8_tuning(int64_t out, int64_t n, int64_t K) {
  Lt& l = lt();
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.algos.find(std::make_tuple(out, (n + 15) / 16 * 16, K));
  return it == l.algos.end() ? Fp8GemmTuning{} : it->second.tuning;
}

std::string refuse_cublaslt_fp8(const MatMulArgs& a) {
  if (a.w->dtype != DType::F8_E4M3) return "weights are not F8_E4M3";
  if (!a.w->block_scale || a.w->scale_block != kBlock) return "no 128x128 block scales";
  if (!is_hopper()) return "cuBLASLt's block-scaled FP8 GEMM needs a Hopper GPU (compute capability 9.x)";
  return {};
}

void gemm_cublaslt_fp8(const MatMulArgs& a) {
  if (a.n == 0) return;
  const Tensor& w = *a.w;
  const int64_t out = w.rows(), K = w.cols();
  const bool fits = K > 0 && K % (4 * kBlock) == 0 && out % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(w.block_scale) % 16 == 0;
  if (!fits) {
    ++g_fallbacks;
    return gemm_cublas(a);
  }
  const int64_t n_pad = (a.n + 15) / 16 * 16;
  // Scratch slot 5: the quantized x [n_pad, K], its scales, and D when n is padded.
  const size_t q_bytes = (static_cast<size_t>(n_pad * K) + 255) & ~size_t{255};
  const size_t s_bytes = (static_cast<size_t>(n_pad * (K / kBlock)) * sizeof(float) + 255) & ~size_t{255};
  // D straight into y when no row is padded and y has the alignment cuBLASLt's heuristic assumes
  // by default (256 bytes); else into scratch, then copied.
  const bool direct = n_pad == a.n && reinterpret_cast<uintptr_t>(a.y) % 256 == 0;
  const size_t d_bytes = direct ? 0 : static_cast<size_t>(n_pad * out) * sizeof(float);
  auto* base = static_cast<uint8_t*>(scratch(q_bytes + s_bytes + d_bytes, 5));
  auto* q = base;
  auto* sx = reinterpret_cast<float*>(base + q_bytes);
  float* d = d_bytes ? reinterpret_cast<float*>(base + q_bytes + s_bytes) : a.y;

  Descs ds;
  make_descs(ds, out, n_pad, K, w.block_scale, sx);
  Lt::Algo* algo = algo_for(ds, out, n_pad, K);
  if (!algo) {
    ++g_fallbacks;
    return gemm_cublas(a);
  }

  const int64_t warps = n_pad * (K / kBlock);
  if (reinterpret_cast<uintptr_t>(a.x) % 16 == 0)
    quantize_x_kernel<true><<<blocks_for(warps * 32, kThreads), kThreads, 0, stream()>>>(a.x, a.n, n_pad, K, q, sx);
  else
    quantize_x_kernel<false><<<blocks_for(warps * 32, kThreads), kThreads, 0, stream()>>>(a.x, a.n, n_pad, K, q, sx);
  FP_CUDA_LAUNCHED("fp8 quantize x");
  if (!algo->timed) time_candidates(*algo, ds, w.data, q, d);
  const float alpha = 1.0f, beta = 0.0f;
  Lt& l = lt();
  FP_CUBLAS(cublasLtMatmul(l.handle, ds.op, &alpha, w.data, ds.a, q, ds.b, &beta, d, ds.d, d, ds.d, &algo->algo,
                           l.workspace, l.workspace_bytes, stream()));
  if (d != a.y)
    FP_CUDA(cudaMemcpyAsync(a.y, d, static_cast<size_t>(a.n * out) * sizeof(float), cudaMemcpyDeviceToDevice, stream()));
  if (a.bias) {
    add_bias_kernel<<<blocks_for(a.n * out, kThreads), kThreads, 0, stream()>>>(a.y, a.bias, a.n, out);
    FP_CUDA_LAUNCHED("fp8 bias");
  }
}

}  // namespace fp::cuda
