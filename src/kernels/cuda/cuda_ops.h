// The CUDA backend of the ops interface (builds with TPDRAFT_HAVE_CUDA only; kernels/backend.h
// is the way in that every build has): CudaOps, its state (device, stream, cuBLAS handle and
// its workspace, grow-only workspaces, the graph capture flag) and the host side of every op,
// the backend's own limits (Ops checks the rest) then the kernel launchers of
// src/kernels/cuda/*.cu and cuBLAS for the GEMMs. Ops read every table they need (positions,
// session views) from device memory, so any op can be captured into a CUDA graph and replayed.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/runtime.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/ops.h"

namespace tpdraft::kernels {

// The CUDA backend on `device`. Throws tpdraft::Error when the device cannot be used.
std::unique_ptr<Ops> make_cuda_ops(int device);
// GFLOP/s of one plain cuBLAS GEMM [m, k] x [k, n] on `dtype` (BF16 or F16) operands with f32
// accumulation, on `device`, queued on `stream` (a backend's: Ops::device(), Ops::stream()): the
// rate settle's GEMMs are quoted against.
double cuda_cublas_gemm_gflops(int device, cudaStream_t stream, DType dtype, int64_t m, int64_t n, int64_t k);

}  // namespace tpdraft::kernels

namespace tpdraft::kernels::cuda {

using tpdraft::cuda::DeviceGuard;
using tpdraft::cuda::Workspace;

class CudaOps final : public Ops {
 public:
  explicit CudaOps(int device);
  ~CudaOps() override;
  const char* name() const override { return "cuda"; }
  bool host_memory() const override { return false; }

  int device() const override { return device_; }
  void* stream() const override { return stream_; }

  void* alloc(size_t bytes) override;
  void release(void* p) override;
  void to_device(void* dst, const void* src, size_t bytes) override;
  void to_host(void* dst, const void* src, size_t bytes) override;
  void sync() override;
  void wait_for(void* stream) override;
  std::string foreign_memory(const void* p) const override;
  bool supports(WeightFormat, WeightOp) const override { return true; }
  int quantized_activation_bits() const override { return 16; }
  bool offers_activation_bits(int bits) const override { return bits == 0 || bits == 16 || bits == 8; }

  void begin_capture() override;
  std::unique_ptr<OpGraph> end_capture() override;
  void abort_capture() noexcept override;
  void replay(const OpGraph& graph) override;

  // "mma" (the default where the head dim allows) or "simt"; TPDRAFT_CUDA_ATTENTION sets it at
  // construction.
  void set_attention_kernel(const std::string& kernel);

 protected:
  void do_widen_to_f32(DType dtype, const void* src, float* dst, int64_t n) override;
  size_t do_quantized_bytes(WeightFormat format, int64_t rows, int64_t cols, int64_t group) const override;
  Matrix do_upload_quantized(const QuantizedRows& src, void* dst) override;
  TPDRAFT_OPS_DO_FUNCTIONS(override)

 private:
  void check_not_capturing(const char* what) const;
  // int8 / int4 matmul (cuda_quant.cpp): weight-only (cuda_qgemm.cu) or, for matrices uploaded
  // with activation_bits 8, with int8 activations (cuda_qgemm_a8.cu).
  void qmatmul(const Matrix& w, const float* x, int64_t m, float* y, const float* bias);
  void qmatmul_a8(const Matrix& w, const float* x, int64_t m, float* y, const float* bias);
  // y (ldy floats per row) [m, n] = x [m, k] . w^T, both bf16 row-major (w [n, k]), on cuBLAS
  // with f32 accumulation and output.
  void gemm_bf16_into(const void* w, int64_t n, int64_t k, const void* x, int64_t m, float* y, int64_t ldy);
  void free_deferred() noexcept;  // frees what release() put aside during a capture
  // Every workspace of this backend (for reset and pin).
  std::array<Workspace*, 12> workspaces() {
    return {&act_,     &parts_,   &logits_, &keys_a_,      &keys_b_, &attn_acc_,
            &attn_ml_, &dequant_, &qhead_,  &qhead_valid_, &xq_,     &xs_};
  }
  // The slice's logits [m, valid_rows] (head_logits' output; head_topk's first pass).
  void head_logits_into(const HeadParams& p, float* logits);
  // GEMM of x [m, K] against w [N, K] into the parts buffer ([parts * m, N] f32, see
  // cuda_gemm.cu); returns the number of parts (1 for f32 weights or unsplit activations).
  int gemm_parts(const Matrix& w, const float* x, int64_t m, int64_t n, float** parts_out);
  // The occupancy API's blocks per SM of an attention kernel, asked once per kernel, head dim and
  // ring element type.
  int attention_blocks_per_sm(AttnKernel kernel, int64_t head_dim, bool kv_bf16);

  int device_ = 0;
  int sm_count_ = 1;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t caller_ready_ = nullptr;  // wait_for: recorded on the caller's stream
  cublasHandle_t blas_ = nullptr;
  static constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;
  void* blas_workspace_ = nullptr;
  bool split_activations_ = true;  // TPDRAFT_CUDA_MATMUL=single turns the lo part off
  bool prefer_mma_attention_ = true;  // TPDRAFT_CUDA_ATTENTION=simt turns the tensor-core kernel off
  std::vector<std::pair<int, int>> attn_occupancy_;  // (head dim x 4 + mma x 2 + bf16, blocks per SM)
  int qgemm_occupancy_[2][kQgemmTcMaxRows / 16][2] = {};  // [int8][row tiles - 1][uniform]: blocks per SM, 0 unknown
  int qgemm_a8_occupancy_[2] = {};  // [int8]: blocks per SM of the int8-activation kernel, 0 unknown
  bool capturing_ = false;
  std::vector<void*> deferred_free_;  // released during the capture
  Workspace act_;          // activations in the weight dtype
  Workspace parts_;        // GEMM outputs before the sum / head post-processing
  Workspace logits_;       // head_topk's logits
  Workspace keys_a_, keys_b_;  // head_topk's passes
  Workspace attn_acc_, attn_ml_;
  Workspace dequant_;      // bf16 weights of quantized matrices for cuBLAS (many rows)
  Workspace qhead_, qhead_valid_;  // a quantized head's dots [m, rows], and its valid columns
  Workspace xq_, xs_;      // int8 activations and their block scales (qmatmul_a8)
  double rope_theta_ = 0.0;
  int64_t rope_dim_ = 0;
  double* rope_inv_freq_ = nullptr;  // device [D/2], kept while theta and D repeat
  std::vector<double*> rope_retired_;  // earlier tables (captured graphs may read them)
};

}  // namespace tpdraft::kernels::cuda
