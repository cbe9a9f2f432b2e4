// Error checks for CUDA runtime and cuBLAS calls, usable from .cu and .cpp files alike (no fmt
// here, so nvcc never parses the formatting library). Each macro evaluates its call once and, on
// failure, throws tpdraft::Error naming the call, file:line, the current device and the error.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace tpdraft::cuda {

[[noreturn]] void cuda_fail(const char* call, cudaError_t code, const char* file, int line);
[[noreturn]] void cublas_fail(const char* call, cublasStatus_t code, const char* file, int line);
// After a kernel launch: a bad configuration (or an earlier asynchronous fault) surfaces here,
// reported with the op's name.
void check_launch(const char* op, const char* file, int line);

inline void check_status(cudaError_t code, const char* call, const char* file, int line) {
  if (code != cudaSuccess) cuda_fail(call, code, file, line);
}
inline void check_status(cublasStatus_t code, const char* call, const char* file, int line) {
  if (code != CUBLAS_STATUS_SUCCESS) cublas_fail(call, code, file, line);
}

}  // namespace tpdraft::cuda

#define CUDA_CHECK(call) ::tpdraft::cuda::check_status((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) ::tpdraft::cuda::check_status((call), #call, __FILE__, __LINE__)
#define TPDRAFT_CHECK_LAUNCH(op) ::tpdraft::cuda::check_launch(op, __FILE__, __LINE__)
