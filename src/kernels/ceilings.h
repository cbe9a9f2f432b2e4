// This machine's ceilings, measured with the backend's own kernels: what `tpdraft bench` and the
// benchmarks under bench/ quote achieved rates against (docs/model.md, "Measured"). Each is the
// best of a few runs, and none keeps memory once it returns.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/ops.h"

namespace tpdraft::kernels {

// GB/s of parallel passes on `threads` threads summing 512 MiB of host memory (far beyond the
// caches): what streaming weights costs at best on a CPU.
double measure_read_gbps(int threads);
// GB/s of device-to-device copies of 1 GiB in `ops`' memory, counting bytes read and written.
double measure_copy_gbps(Ops& ops);
// GFLOP/s of our matmul on a compute-bound shape, [m, dim] x [dim, dim] with `dtype` weights
// (m = 256 rows on a host backend, 4096 on a device, where 256 finish within a launch).
double measure_gemm_gflops(Ops& ops, DType dtype, int64_t dim);
// The same shape on int8 or int4 weights (`bits`; groups of 128 where they divide dim, else one
// scale per row): G multiply-adds x 2 per second, the ceiling of a draft's quantized matrices.
double measure_qgemm_gops(Ops& ops, int bits, int64_t dim);

}  // namespace tpdraft::kernels
