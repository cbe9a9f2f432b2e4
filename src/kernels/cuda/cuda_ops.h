// The CUDA backend of the ops interface: device memory, one stream per Ops, kernels per op family
// in src/kernels/cuda/*.cu and cuBLAS for the GEMMs. Exists only in builds with
// TPDRAFT_HAVE_CUDA; kernels/backend.h is the way in that every build has.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "kernels/ops.h"

namespace tpdraft::kernels {

// The CUDA backend on `device`. Throws tpdraft::Error when the device cannot be used.
std::unique_ptr<Ops> make_cuda_ops(int device);

// Devices the CUDA runtime sees; 0 when there is no driver or no device (never throws).
int cuda_device_count();

// The stream and device of a CUDA backend (for communicators that must order their work with
// the ops' kernels). Throws when `ops` is not the CUDA backend.
cudaStream_t cuda_stream_of(Ops& ops);
int cuda_device_of(Ops& ops);
// The attention kernel of a CUDA backend: "mma" (tensor cores, bf16 q / k / p / v with f32 sums,
// head dims 64 and 128; the default) or "simt" (f32 CUDA cores, every head dim, the fallback).
// TPDRAFT_CUDA_ATTENTION=mma|simt sets it when the backend is made.
void cuda_set_attention_kernel(Ops& ops, const std::string& kernel);
// GFLOP/s of one plain cuBLAS GEMM [m, k] x [k, n] on `dtype` (BF16 or F16) operands with f32
// accumulation, on the device of `ops`: the rate settle's GEMMs are quoted against.
double cuda_cublas_gemm_gflops(Ops& ops, DType dtype, int64_t m, int64_t n, int64_t k);

}  // namespace tpdraft::kernels
