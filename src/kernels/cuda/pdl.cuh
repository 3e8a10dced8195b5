// kernels/cuda/pdl.cuh — programmatic dependent launch (Hopper and later): a kernel launched
// "chained" may start while the kernel before it in the stream still runs, and waits for that
// kernel's results only where it needs them. A decode step is a chain of short kernels; the
// gaps between them (launch, block scheduling, the first loads) are a fixed cost per kernel
// that a batch-1 step pays ~10 times per layer. Chained, the next kernel's blocks are already
// resident when the one before ends, and the GEMV streams its first weights (which no kernel
// writes) before it waits.
//
// The contract, for every kernel launched with launch_chained():
//   - nothing the kernel before may write, or may still read, is touched before pdl_wait()
//     (weights are safe: they are uploaded or stacked at load time and no kernel writes them;
//     a kernel that built a GEMV's weights on the device just before it would break this);
//   - what the kernel before writes is read with ordinary loads, never __ldg / ld.global.nc, and
//     its pointers are not `const __restrict__` (nvcc turns such loads into .nc ones): ptxas
//     treats non-coherent loads as reading memory that nothing changes while the kernel runs
//     and schedules them above griddepcontrol.wait (seen in gemv_warp's SASS, where the PTX
//     had them after it). Weights may use them;
//   - pdl_release() lets the next chained kernel launch; it may come anywhere (the next kernel
//     still waits for this one to finish before its own pdl_wait() returns), and a block that
//     never calls it releases when it exits.
// Without the launch attribute (other GPUs, or FASTPATH_CUDA_PDL unset) both are no-ops and
// launch_chained is a plain launch. Stream capture records the programmatic edges into graphs.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_context.h"

namespace fp::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// kernel<<<grid, block, smem, stream()>>>(args...), chained to the kernel before when
// pdl_launches() is on; the launch is checked (`name` in the error).
template <typename... Params, typename... Args>
void launch_chained(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_launches() ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) fail_cuda(e, name, __FILE__, __LINE__);
}

}  // namespace fp::cuda
