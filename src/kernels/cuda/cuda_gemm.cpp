// matmul and the head on cuBLAS. f32 weights: cublasSgemm (f32 throughout). bf16 / f16 weights:
// cuBLAS wants both operands in one type, so the f32 activations are converted to the weight
// dtype first and cublasGemmEx runs with f32 accumulation (CUBLAS_COMPUTE_32F) and f32 output.
//
// Precision: by default each activation x is sent as two 16-bit values, hi = round(x) and
// lo = round(x - hi), stacked as 2m rows of one GEMM and summed after it. The weights are read
// once either way (a draft's GEMMs are weight-bandwidth bound at m = 16), and the result is
// within ~2^-16 (bf16) of the f32-activation product the CPU computes, instead of the ~2^-9 of a
// single bf16 rounding. TPDRAFT_CUDA_MATMUL=single sends only hi: half the GEMM FLOPs (matters
// for settle's large m), bf16-activation precision. f16 weights: activations beyond f16's range
// (|x| > 65504) overflow to inf in either mode. docs/gpu.md has the numbers.
#include <algorithm>
#include <climits>

#include "core/error.h"
#include "cuda/cuda_check.h"
#include "cuda/lazy_lib.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_ops.h"

// The exported cublasGemmEx (the header adds a C++ overload taking a cudaDataType compute type).
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

namespace tpdraft::kernels::cuda {
namespace {

cudaDataType_t blas_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F; }

void check_int(int64_t v, const char* what, const char* op) {
  TPDRAFT_CHECK(v >= 0 && v <= INT_MAX, "{}: {} = {} exceeds cuBLAS's int range", op, what, v);
}

// y [m, n] (ldy floats per row) = x [m, k] . W^T for row-major W [n, k] and x of dtype t, with f32
// accumulation and output (see gemm_parts): cublasSgemm for f32, cublasGemmEx for 16-bit operands.
void blas_gemm(cublasHandle_t blas, DType t, const void* w, int64_t n, int64_t k, const void* x, int64_t m, float* y,
               int64_t ldy) {
  const float one = 1.0f, zero = 0.0f;
  const int in = static_cast<int>(n), ik = static_cast<int>(k), im = static_cast<int>(m), ld = static_cast<int>(ldy);
  if (t == DType::F32)
    CUBLAS_CHECK(TPDRAFT_LAZY(cublas, cublasSgemm)(blas, CUBLAS_OP_T, CUBLAS_OP_N, in, im, ik, &one,
                                                   static_cast<const float*>(w), ik, static_cast<const float*>(x), ik,
                                                   &zero, y, ld));
  else
    CUBLAS_CHECK(TPDRAFT_LAZY_T(cublas, cublasGemmEx, GemmExFn)(blas, CUBLAS_OP_T, CUBLAS_OP_N, in, im, ik, &one, w,
                                                                blas_type(t), ik, x, blas_type(t), ik, &zero, y,
                                                                CUDA_R_32F, ld, CUBLAS_COMPUTE_32F,
                                                                CUBLAS_GEMM_DEFAULT));
}

}  // namespace

// Column-major view of the row-major product: y^T [n, rows] = W [n, K] . x^T [K, rows], i.e.
// op(A) = W^T of the column-major [K, n] weight buffer, B = the [K, rows] activation buffer.
int CudaOps::gemm_parts(const Matrix& w, const float* x, int64_t m, int64_t n, float** parts_out) {
  const int64_t k = w.cols;
  if (w.dtype == DType::F32) {
    float* out = parts_.as<float>(static_cast<size_t>(m * n), stream_);
    blas_gemm(blas_, DType::F32, w.data, n, k, x, m, out, n);
    *parts_out = out;
    return 1;
  }
  const int parts = split_activations_ ? 2 : 1;
  check_int(parts * m, "activation rows", "matmul");
  void* xa = act_.get(static_cast<size_t>(parts * m * k) * 2, stream_);
  launch_split_activations(x, m, k, w.dtype, parts, xa, stream_);
  float* out = parts_.as<float>(static_cast<size_t>(parts * m * n), stream_);
  blas_gemm(blas_, w.dtype, w.data, n, k, xa, parts * m, out, n);
  *parts_out = out;
  return parts;
}

void CudaOps::gemm_bf16_into(const void* w, int64_t n, int64_t k, const void* x, int64_t m, float* y, int64_t ldy) {
  check_int(n, "weight rows", "matmul");
  check_int(k, "weight cols", "matmul");
  check_int(m, "rows", "matmul");
  check_int(ldy, "output row length", "matmul");
  blas_gemm(blas_, DType::BF16, w, n, k, x, m, y, ldy);
}

void CudaOps::do_matmul(const Matrix& w, const float* x, int64_t m, float* y, const float* bias) {
  if (m == 0) return;
  if (w.quantized()) return qmatmul(w, x, m, y, bias);
  check_int(w.rows, "weight rows", "matmul");
  check_int(w.cols, "weight cols", "matmul");
  check_int(m, "rows", "matmul");
  DeviceGuard guard(device_);
  if (w.dtype == DType::F32) {
    // Straight into y; the bias (if any) added in place.
    blas_gemm(blas_, DType::F32, w.data, w.rows, w.cols, x, m, y, w.rows);
    if (bias != nullptr) launch_sum_parts(y, 1, m, w.rows, bias, y, stream_);
    return;
  }
  float* parts = nullptr;
  const int count = gemm_parts(w, x, m, w.rows, &parts);
  launch_sum_parts(parts, count, m, w.rows, bias, y, stream_);
}

namespace {

void check_head(const HeadParams& p, const char* op) {
  check_int(p.valid_rows, "valid rows", op);
  check_int(p.head.cols, "hidden", op);
  check_int(p.m, "rows", op);
}

}  // namespace

// head_logits and head_topk run the very same GEMM (same shapes, workspaces and handle) and the
// same post-processing kernel, so head_topk's values equal head_logits' bit for bit. A quantized
// head's dots come from qmatmul (the matmul's kernels), its valid columns copied out as one part.
void CudaOps::head_logits_into(const HeadParams& p, float* logits) {
  const int64_t n = p.valid_rows, rows = p.head.rows;
  float* parts = nullptr;
  int count = 1;
  if (!p.head.quantized()) {
    count = gemm_parts(p.head, p.g, p.m, n, &parts);
  } else {
    parts = qhead_.as<float>(static_cast<size_t>(p.m * rows), stream_);
    qmatmul(p.head, p.g, p.m, parts, nullptr);
    if (n != rows) {
      float* dots = parts;
      parts = qhead_valid_.as<float>(static_cast<size_t>(p.m * n), stream_);
      CUDA_CHECK(cudaMemcpy2DAsync(parts, static_cast<size_t>(n) * sizeof(float), dots,
                                   static_cast<size_t>(rows) * sizeof(float), static_cast<size_t>(n) * sizeof(float),
                                   static_cast<size_t>(p.m), cudaMemcpyDeviceToDevice, stream_));
    }
  }
  launch_head_post(parts, count, p.m, n, p.scale, p.cap, logits, stream_);
}

void CudaOps::do_head_logits(const HeadParams& p, float* logits) {
  check_head(p, "head_logits");
  if (p.m == 0 || p.valid_rows == 0) return;
  DeviceGuard guard(device_);
  head_logits_into(p, logits);
}

void CudaOps::do_head_topk(const HeadParams& p, int k, int64_t id_base, float* values, int64_t* ids) {
  check_head(p, "head_topk");
  TPDRAFT_CHECK(k <= kMaxTopK, "head_topk: k = {} exceeds the cuda backend's limit of {}", k, kMaxTopK);
  TPDRAFT_CHECK(p.m <= 65535, "head_topk: {} rows exceed the cuda grid limit of 65535", p.m);
  if (p.m == 0) return;
  DeviceGuard guard(device_);
  const int64_t n = p.valid_rows;
  float* logits = nullptr;
  if (n > 0) {
    logits = logits_.as<float>(static_cast<size_t>(p.m * n), stream_);
    head_logits_into(p, logits);
  }
  const size_t keys = static_cast<size_t>(topk_key_capacity(p.m, n, k));
  uint64_t* a = keys_a_.as<uint64_t>(keys, stream_);
  uint64_t* b = keys_b_.as<uint64_t>(keys, stream_);
  launch_topk(logits, p.m, n, k, id_base, a, b, values, ids, stream_);
}

}  // namespace tpdraft::kernels::cuda

namespace tpdraft::kernels {

// The ceiling a GEMM of ours is compared with: one plain cublasGemmEx on 16-bit operands (both
// in `dtype`, f32 accumulation and output), timed with events, best of 10 after a warm-up, on a
// cuBLAS handle of its own (the settings of the backend's: host pointers, default math).
double cuda_cublas_gemm_gflops(int device, cudaStream_t stream, DType dtype, int64_t m, int64_t n, int64_t k) {
  using cuda::blas_gemm;
  using cuda::check_int;
  TPDRAFT_CHECK(dtype == DType::BF16 || dtype == DType::F16, "cublas_gemm_gflops: dtype must be BF16 or F16, got {}",
                dtype_name(dtype));
  TPDRAFT_CHECK(m > 0 && n > 0 && k > 0, "cublas_gemm_gflops: bad shape {} x {} x {}", m, n, k);
  check_int(m, "rows", "cublas_gemm_gflops");
  check_int(n, "cols", "cublas_gemm_gflops");
  check_int(k, "inner", "cublas_gemm_gflops");
  TPDRAFT_CHECK(!tpdraft::cuda::stream_capturing(stream),
                "cuda backend: cublas_gemm_gflops during a graph capture (only compute ops may be captured)");
  tpdraft::cuda::DeviceGuard guard(device);
  cublasHandle_t blas = nullptr;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  double best = 0;
  auto cleanup = [&] {
    cudaFree(a), cudaFree(b), cudaFree(c);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (blas != nullptr) TPDRAFT_LAZY(cublas, cublasDestroy)(blas);
  };
  try {
    CUBLAS_CHECK(TPDRAFT_LAZY(cublas, cublasCreate)(&blas));
    CUBLAS_CHECK(TPDRAFT_LAZY(cublas, cublasSetStream)(blas, stream));
    CUDA_CHECK(cudaMalloc(&a, static_cast<size_t>(n * k) * 2));
    CUDA_CHECK(cudaMalloc(&b, static_cast<size_t>(k * m) * 2));
    CUDA_CHECK(cudaMalloc(&c, static_cast<size_t>(n * m) * 4));
    CUDA_CHECK(cudaMemsetAsync(a, 0, static_cast<size_t>(n * k) * 2, stream));
    CUDA_CHECK(cudaMemsetAsync(b, 0, static_cast<size_t>(k * m) * 2, stream));
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    for (int rep = 0; rep < 11; ++rep) {
      CUDA_CHECK(cudaEventRecord(start, stream));
      blas_gemm(blas, dtype, a, n, k, b, m, static_cast<float*>(c), n);
      CUDA_CHECK(cudaEventRecord(stop, stream));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (rep > 0 && ms > 0) best = std::max(best, 2.0 * static_cast<double>(m * n) * static_cast<double>(k) / (ms * 1e6));
    }
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
  return best;
}

}  // namespace tpdraft::kernels
