// kernels/cuda/register_cuda.cpp — registers the CUDA kernels with the op registry (backend
// "cuda"): dispatch offers them for calls made under DeviceScope(Device::CUDA), where every
// pointer is device memory. The kernels themselves are in the .cu files beside this one.
#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/launch.h"
#include "kernels/registry.h"

namespace fp::cuda {
namespace {

// Every CUDA kernel first refuses when no GPU can be used (the reason names why), so a process
// without one never launches: only a stand-in device (tests/device_placement_test.cpp) gets
// "cuda" calls there.
template <class Args>
Kernel<Args> cuda_kernel(void (*run)(const Args&), std::string (*refuse)(const Args&) = nullptr, const char* name = "cuda",
                         int priority = 100) {
  Kernel<Args> k;
  k.name = name;
  k.backend = Backend::CUDA;
  k.priority = priority;
  k.refuse = [refuse](const Args& a) {
    std::string why = unavailable();
    if (why.empty() && refuse) why = refuse(a);
    return why;
  };
  k.run = run;
  return k;
}

std::string refuse_kv_write(const KvWriteArgs& a) { return refuse_kv_dtype(a.dtype, {DType::F32, DType::F16, DType::BF16}); }

const bool registered = [] {
  register_kernel(cuda_kernel<EmbeddingArgs>(embedding, refuse_embedding));
  // Best first: the decode GEMV, cuBLASLt's FP8 block-scaled GEMM, cuBLAS, then the plain
  // kernels ("cuda") that read everything.
  register_kernel(cuda_kernel<MatMulArgs>(gemv, refuse_gemv, "gemv", 130));
  // The same calls, a warp per 2 rows: below `gemv` until a device run times them side by side.
  register_kernel(cuda_kernel<MatMulArgs>(gemv_warp, refuse_gemv, "gemv_warp", 129));
  // Q8_0 rows in whole 16-byte loads (Q8_0 blocks are 2-byte aligned): below both until timed.
  register_kernel(cuda_kernel<MatMulArgs>(gemv_q8, refuse_gemv_q8, "gemv_q8", 128));
  register_kernel(cuda_kernel<MatMulArgs>(gemm_cublaslt_fp8, refuse_cublaslt_fp8, "cublaslt_fp8", 125));
  register_kernel(cuda_kernel<MatMulArgs>(gemm_cublas, refuse_gemm_cublas, "cublas", 120));
  register_kernel(cuda_kernel<MatMulArgs>(matmul, refuse_matmul));
  register_kernel(cuda_kernel<RmsNormArgs>(rmsnorm, refuse_rmsnorm));
  register_kernel(cuda_kernel<RopeArgs>(rope));
  register_kernel(cuda_kernel<AttentionArgs>(attention_split_kv, refuse_attention_split_kv, "split_kv", 130));
  register_kernel(cuda_kernel<AttentionArgs>(attention_tiled, refuse_attention_tiled, "tiled", 120));
  // Below `tiled` until a GPU run has checked and timed them (bench/device_check.sh): `wmma`
  // passed its tests on the H200 (2026-12-04) at 1.3x `tiled`'s prefill, still 6-9 TFLOP/s;
  // `mma` (registers instead of shared memory for S, P and O) and `mma_pipelined` (the same on
  // the cache's own 16-bit type, tiles copied by cp.async behind the arithmetic) are not yet run
  // on a GPU.
  register_kernel(cuda_kernel<AttentionArgs>(attention_mma, refuse_attention_wmma, "mma", 115));
  register_kernel(
      cuda_kernel<AttentionArgs>(attention_mma_pipelined, refuse_attention_mma_pipelined, "mma_pipelined", 114));
  register_kernel(cuda_kernel<AttentionArgs>(attention_wmma, refuse_attention_wmma, "wmma", 110));
  register_kernel(cuda_kernel<AttentionArgs>(attention, refuse_attention));
  register_kernel(cuda_kernel<KvWriteArgs>(kv_write, refuse_kv_write));
  register_kernel(cuda_kernel<KvMoveArgs>(kv_move));
  register_kernel(cuda_kernel<SiluMulArgs>(silu_mul));
  register_kernel(cuda_kernel<GeluMulArgs>(gelu_mul));
  register_kernel(cuda_kernel<SoftcapArgs>(softcap, refuse_softcap));
  register_kernel(cuda_kernel<AddArgs>(add));
  register_kernel(cuda_kernel<SoftmaxArgs>(softmax));
  register_kernel(cuda_kernel<ArgmaxArgs>(argmax));
  register_kernel(cuda_kernel<TokenFeedArgs>(token_feed));
  register_kernel(cuda_kernel<SampleArgs>(sample, refuse_sample, "radix_select"));
  register_kernel(cuda_kernel<MoeRouteArgs>(moe_route, refuse_moe_route));
  register_kernel(cuda_kernel<MoeFfnArgs>(moe_ffn, refuse_moe_ffn, "grouped"));
  register_kernel(cuda_kernel<MlaAttentionArgs>(mla_attention, refuse_mla, "absorbed"));
  return true;
}();

}  // namespace
}  // namespace fp::cuda
