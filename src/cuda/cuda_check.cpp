// The failure paths of CUDA_CHECK, CUBLAS_CHECK and TPDRAFT_CHECK_LAUNCH: one message format
// (call, file:line, device, the library's own words) for every CUDA error the library meets.
#include "cuda/cuda_check.h"
#include "cuda/lazy_lib.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace tpdraft::cuda {
namespace {

const char* base_name(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash ? slash + 1 : file;
}

std::string device_label() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) return "device ?";
  return fmt::format("device {}", device);
}

}  // namespace

void cuda_fail(const char* call, cudaError_t code, const char* file, int line) {
  TPDRAFT_FAIL("{} failed at {}:{} on {}: {} ({})", call, base_name(file), line, device_label(),
               cudaGetErrorString(code), cudaGetErrorName(code));
}

void cublas_fail(const char* call, cublasStatus_t code, const char* file, int line) {
  TPDRAFT_FAIL("{} failed at {}:{} on {}: {} ({})", call, base_name(file), line, device_label(),
               TPDRAFT_LAZY(cublas, cublasGetStatusString)(code), TPDRAFT_LAZY(cublas, cublasGetStatusName)(code));
}

void check_launch(const char* op, const char* file, int line) {
  const cudaError_t code = cudaGetLastError();
  if (code == cudaSuccess) return;
  TPDRAFT_FAIL("cuda {}: kernel launch failed at {}:{} on {}: {} ({})", op, base_name(file), line, device_label(),
               cudaGetErrorString(code), cudaGetErrorName(code));
}

}  // namespace tpdraft::cuda
