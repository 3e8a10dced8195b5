// kernels/cuda/cuda_context.h — the CUDA backend's shared state: the device, one stream every
// kernel and copy runs on, the cuBLAS handle, a growable scratch buffer, and error checks that
// turn a failed CUDA or cuBLAS call into fp::Error naming the call.
// Included by the .cu files and by the backend's C++ files (compiled with the CUDA headers).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace fp::cuda {

// "" when a CUDA device can be used, else why not (no driver, no device, ...). Cached.
std::string unavailable();
cudaStream_t stream();
cublasHandle_t cublas();
// Device memory of at least `bytes`, valid until the next scratch() call of the same slot.
// Slots let one op hold two scratch regions at once (e.g. converted activations and weights).
void* scratch(size_t bytes, int slot = 0);
// Multiprocessor count of the device (for grid sizing).
int sm_count();
// The CUDA device this process's kernels run on.
int device_index();
// Whether launch_chained (pdl.cuh) chains kernels by programmatic dependent launch: on a GPU of
// compute capability 9.0 or later with FASTPATH_CUDA_PDL=1 (off by default until a device run
// has timed it); set_pdl_launches overrides the setting (bench times both), ignored where the
// GPU cannot.
bool pdl_launches();
void set_pdl_launches(bool on);

[[noreturn]] void fail_cuda(cudaError_t e, const char* what, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t s, const char* what, const char* file, int line);

}  // namespace fp::cuda

// FP_CUDA(cudaMalloc(...)) throws fp::Error with the call, the file and CUDA's message.
#define FP_CUDA(call)                                                              \
  do {                                                                             \
    cudaError_t fp_cuda_err_ = (call);                                             \
    if (fp_cuda_err_ != cudaSuccess) ::fp::cuda::fail_cuda(fp_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)
#define FP_CUBLAS(call)                                                            \
  do {                                                                             \
    cublasStatus_t fp_cublas_st_ = (call);                                         \
    if (fp_cublas_st_ != CUBLAS_STATUS_SUCCESS) ::fp::cuda::fail_cublas(fp_cublas_st_, #call, __FILE__, __LINE__); \
  } while (0)
// After every kernel launch: a bad launch configuration shows here, not three ops later.
#define FP_CUDA_LAUNCHED(name) FP_CUDA(cudaGetLastError())
