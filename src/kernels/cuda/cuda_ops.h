// The CUDA backend of the ops interface: device memory, one stream per Ops, kernels per op family
// in src/kernels/cuda/*.cu and cuBLAS for the GEMMs. Exists only in builds with
// TPDRAFT_HAVE_CUDA; kernels/backend.h is the way in that every build has.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "kernels/ops.h"

namespace tpdraft::kernels {

// The CUDA backend on `device`. Throws tpdraft::Error when the device cannot be used.
std::unique_ptr<Ops> make_cuda_ops(int device);

// Devices the CUDA runtime sees; 0 when there is no driver or no device (never throws).
int cuda_device_count();

// GFLOP/s of one plain cuBLAS GEMM [m, k] x [k, n] on `dtype` (BF16 or F16) operands with f32
// accumulation, on `device`, queued on `stream` (a backend's: Ops::device(), Ops::stream()): the
// rate settle's GEMMs are quoted against.
double cuda_cublas_gemm_gflops(int device, cudaStream_t stream, DType dtype, int64_t m, int64_t n, int64_t k);

}  // namespace tpdraft::kernels
