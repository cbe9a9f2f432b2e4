// The backend factory. CUDA calls stay behind TPDRAFT_HAVE_CUDA, so this file builds everywhere.
#include "kernels/backend.h"

#include "core/error.h"

#ifdef TPDRAFT_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace tpdraft::kernels {

int cuda_devices() {
#ifdef TPDRAFT_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess) return count;
  cudaGetLastError();  // no driver / no device: not an error for the caller
#endif
  return 0;
}

bool cuda_device_available() { return cuda_devices() > 0; }

std::string default_backend() { return cuda_device_available() ? "cuda" : "cpu"; }

std::unique_ptr<Ops> make_ops(const std::string& backend, int threads, int local_rank) {
  if (backend == "auto") return make_ops(default_backend(), threads, local_rank);
  if (backend == "cpu") return make_cpu_ops(threads);
  TPDRAFT_CHECK(backend == "cuda", "unknown backend '{}': expected 'cpu', 'cuda' or 'auto'", backend);
#ifdef TPDRAFT_HAVE_CUDA
  const int count = cuda_devices();
  TPDRAFT_CHECK(count > 0, "backend 'cuda': no CUDA device is available on this machine (no driver or no GPU)");
  TPDRAFT_CHECK(local_rank >= 0, "backend 'cuda': a rank's place on its machine must be >= 0, got {}", local_rank);
  return make_cuda_ops(local_rank % count);
#else
  (void)local_rank;
  TPDRAFT_FAIL("backend 'cuda': this tpdraft was built without the CUDA backend (configure with -DTPDRAFT_CUDA=ON "
               "on a machine with the CUDA toolkit)");
#endif
}

double cublas_gemm_gflops(Ops& ops, DType dtype, int64_t m, int64_t n, int64_t k) {
#ifdef TPDRAFT_HAVE_CUDA
  TPDRAFT_CHECK(ops.device() >= 0, "cuBLAS GEMM rate: the '{}' backend is not CUDA", ops.name());
  return cuda_cublas_gemm_gflops(ops.device(), static_cast<cudaStream_t>(ops.stream()), dtype, m, n, k);
#else
  (void)dtype, (void)m, (void)n, (void)k;
  TPDRAFT_FAIL("cuBLAS GEMM rate: the '{}' backend is not CUDA (this tpdraft was built without it)", ops.name());
#endif
}

}  // namespace tpdraft::kernels
