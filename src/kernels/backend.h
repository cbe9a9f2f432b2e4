// Choosing a backend at run time: "cpu" always, "cuda" when this build has the CUDA backend and
// the machine a device. The one place outside kernels/cuda/ that knows the backends by name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "kernels/ops.h"

namespace tpdraft::kernels {

// True when this build has the CUDA backend and cudaGetDeviceCount finds at least one device.
bool cuda_device_available();
// CUDA devices visible (0 without the CUDA backend, a driver or a device).
int cuda_devices();
// "cuda" when cuda_device_available(), else "cpu": what "auto" stands for.
std::string default_backend();

// backend "cpu": make_cpu_ops(threads); "cuda": the CUDA backend on device local_rank modulo the
// machine's devices (a rank's index among the ranks on its machine picks its GPU; threads
// unused); "auto": default_backend(). Throws tpdraft::Error naming the reason when the backend is
// unknown, not compiled in, or has no device.
std::unique_ptr<Ops> make_ops(const std::string& backend, int threads, int local_rank);

// For a CUDA backend: GFLOP/s of one plain cuBLAS GEMM [m, k] x [k, n] on `dtype` (BF16 or F16)
// operands, f32 accumulation. Throws for other backends and in builds without CUDA.
double cublas_gemm_gflops(Ops& ops, DType dtype, int64_t m, int64_t n, int64_t k);

}  // namespace tpdraft::kernels
