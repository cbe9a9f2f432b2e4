// CudaOps construction, device memory, graph capture and replay, and the host side of the
// ops other than the GEMMs (cuda_gemm.cpp): the backend's own limits, then the launchers.
// Copies: to_device returns when the source may be reused (the copy is done); to_host returns
// when the data is on the host. Everything else is asynchronous on the ops' stream.
#include "cuda/lazy_lib.h"
#include "kernels/cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "cuda/cuda_check.h"
#include "kernels/backend.h"
#include "kernels/cuda/attention_geometry.h"

namespace tpdraft::kernels::cuda {

// ---- construction and memory ----------------------------------------------------------------------

CudaOps::CudaOps(int device) : device_(device) {
  if (const char* mode = std::getenv("TPDRAFT_CUDA_MATMUL")) {
    const std::string m(mode);
    TPDRAFT_CHECK(m == "split" || m == "single",
                  "TPDRAFT_CUDA_MATMUL must be 'split' (activations as bf16 hi + lo, the default) or 'single' "
                  "(one bf16 rounding), got '{}'", m);
    split_activations_ = m == "split";
  }
  if (const char* kernel = std::getenv("TPDRAFT_CUDA_ATTENTION")) set_attention_kernel(kernel);
  const int count = cuda_devices();
  TPDRAFT_CHECK(count > 0, "cuda backend: no CUDA device is available (cudaGetDeviceCount found none)");
  TPDRAFT_CHECK(device >= 0 && device < count, "cuda backend: device {} does not exist ({} device(s) visible)", device,
                count);
  DeviceGuard guard(device_);
  CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  try {
    CUBLAS_CHECK(TPDRAFT_LAZY(cublas, cublasCreate)(&blas_));
    CUBLAS_CHECK(TPDRAFT_LAZY(cublas, cublasSetStream)(blas_, stream_));
    CUBLAS_CHECK(TPDRAFT_LAZY(cublas, cublasSetPointerMode)(blas_, CUBLAS_POINTER_MODE_HOST));
    // Plain f32 for f32 weights: no TF32 unless the caller's environment forces it.
    CUBLAS_CHECK(TPDRAFT_LAZY(cublas, cublasSetMathMode)(blas_, CUBLAS_DEFAULT_MATH));
    // A workspace of our own, so that GEMMs captured into a graph never make cuBLAS allocate.
    CUDA_CHECK(cudaMalloc(&blas_workspace_, kBlasWorkspaceBytes));
    CUBLAS_CHECK(TPDRAFT_LAZY(cublas, cublasSetWorkspace)(blas_, blas_workspace_, kBlasWorkspaceBytes));
  } catch (...) {
    if (blas_ != nullptr) TPDRAFT_LAZY(cublas, cublasDestroy)(blas_);
    if (blas_workspace_ != nullptr) cudaFree(blas_workspace_);
    cudaStreamDestroy(stream_);
    throw;
  }
}

CudaOps::~CudaOps() {
  // No throwing from here: a failed device is reported by the op that met it.
  DeviceGuard guard(device_, std::nothrow);
  cudaStreamSynchronize(stream_);
  abort_capture();
  for (Workspace* w : workspaces()) w->reset();
  if (rope_inv_freq_ != nullptr) cudaFree(rope_inv_freq_);
  for (double* t : rope_retired_) cudaFree(t);
  if (blas_ != nullptr) TPDRAFT_LAZY(cublas, cublasDestroy)(blas_);
  if (blas_workspace_ != nullptr) cudaFree(blas_workspace_);
  if (caller_ready_ != nullptr) cudaEventDestroy(caller_ready_);
  cudaStreamDestroy(stream_);
  cudaGetLastError();
}

void CudaOps::check_not_capturing(const char* what) const {
  TPDRAFT_CHECK(!capturing_, "cuda backend: {} during a graph capture (only compute ops may be captured)", what);
}

void* CudaOps::alloc(size_t bytes) {
  check_not_capturing("alloc");
  DeviceGuard guard(device_);
  void* p = nullptr;
  const cudaError_t rc = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (rc != cudaSuccess) {
    cudaGetLastError();  // allocation failures are not sticky; clear the record
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    TPDRAFT_FAIL("cuda backend: cannot allocate {} bytes on device {} ({} of {} bytes free): {}", bytes, device_,
                 free_bytes, total, cudaGetErrorString(rc));
  }
  return p;
}

void CudaOps::release(void* p) {
  if (p == nullptr) return;
  // Buffers may die while a capture unwinds from an error; cudaFree would break the capture, so
  // their memory goes when it ends.
  if (capturing_) {
    deferred_free_.push_back(p);
    return;
  }
  DeviceGuard guard(device_);
  // cudaFree waits for the device, so queued kernels that still read p finish first.
  const cudaError_t rc = cudaFree(p);
  if (rc != cudaSuccess)
    TPDRAFT_LOG_ERROR("cuda backend: cudaFree on device {} failed: {}", device_, cudaGetErrorString(rc));
}

void CudaOps::to_device(void* dst, const void* src, size_t bytes) {
  check_not_capturing("to_device");
  if (bytes == 0) return;
  DeviceGuard guard(device_);
  // Default: the runtime tells host from device memory, so device sources work too (taps that a
  // target model left on the GPU).
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  // The caller may reuse src at once (weights are staged through one host buffer).
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::to_host(void* dst, const void* src, size_t bytes) {
  check_not_capturing("to_host");
  DeviceGuard guard(device_);
  if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::wait_for(void* stream) {
  if (stream == nullptr) return;
  check_not_capturing("wait_for");
  DeviceGuard guard(device_);
  if (caller_ready_ == nullptr) CUDA_CHECK(cudaEventCreateWithFlags(&caller_ready_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(caller_ready_, static_cast<cudaStream_t>(stream)));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, caller_ready_, 0));
}

std::string CudaOps::foreign_memory(const void* p) const {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // the query's failure is the answer, not a sticky error
    return "memory CUDA does not know";
  }
  if (a.type == cudaMemoryTypeManaged) return "";
  if (a.type != cudaMemoryTypeDevice) return "host memory";
  if (a.device != device_) return fmt::format("memory of GPU {}, and this drafter runs on GPU {}", a.device, device_);
  return "";
}

void CudaOps::do_widen_to_f32(DType dtype, const void* src, float* dst, int64_t n) {
  DeviceGuard guard(device_);
  if (dtype == DType::F32) {
    if (n > 0) CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  launch_widen_to_f32(src, dtype == DType::BF16, dst, n, stream_);
}

void CudaOps::sync() {
  check_not_capturing("sync");
  DeviceGuard guard(device_);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- graphs ------------------------------------------------------------------------------------------

namespace {

// An instantiated CUDA graph of one device.
class CudaGraph final : public OpGraph {
 public:
  CudaGraph(int device, cudaGraphExec_t exec, size_t nodes) : device_(device), exec_(exec), nodes_(nodes) {}
  size_t nodes() const override { return nodes_; }
  ~CudaGraph() override {
    DeviceGuard guard(device_, std::nothrow);
    cudaGraphExecDestroy(exec_);
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  int device() const { return device_; }
  cudaGraphExec_t exec() const { return exec_; }

 private:
  int device_;
  cudaGraphExec_t exec_;
  size_t nodes_;
};

}  // namespace

void CudaOps::begin_capture() {
  check_not_capturing("begin_capture");
  DeviceGuard guard(device_);
  // Thread-local mode: other threads (other in-process ranks on this GPU) may go on allocating
  // and synchronising while this one captures.
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

std::unique_ptr<OpGraph> CudaOps::end_capture() {
  TPDRAFT_CHECK(capturing_, "cuda backend: end_capture without begin_capture");
  DeviceGuard guard(device_);
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  free_deferred();
  CUDA_CHECK(ended);
  cudaGraphExec_t exec = nullptr;
  size_t nodes = 0;
  const cudaError_t counted = cudaGraphGetNodes(graph, nullptr, &nodes);
  const cudaError_t rc = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  cudaGraphDestroy(graph);
  CUDA_CHECK(counted);
  CUDA_CHECK(rc);
  // The graph holds the workspaces' current blocks: growing them later must not free those.
  for (Workspace* w : workspaces()) w->pin();
  return std::make_unique<CudaGraph>(device_, exec, nodes);
}

void CudaOps::abort_capture() noexcept {
  if (!capturing_) return;
  capturing_ = false;
  DeviceGuard guard(device_, std::nothrow);
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
  free_deferred();
  cudaGetLastError();  // an invalidated capture leaves an error record behind
}

void CudaOps::free_deferred() noexcept {
  for (void* p : deferred_free_) cudaFree(p);
  deferred_free_.clear();
}

void CudaOps::replay(const OpGraph& graph) {
  check_not_capturing("replay");
  const auto* g = dynamic_cast<const CudaGraph*>(&graph);
  TPDRAFT_CHECK(g != nullptr, "cuda backend: replay of a graph captured by another backend");
  TPDRAFT_CHECK(g->device() == device_, "cuda backend: replay on device {} of a graph captured on device {}", device_,
                g->device());
  DeviceGuard guard(device_);
  CUDA_CHECK(cudaGraphLaunch(g->exec(), stream_));
}

// ---- element-wise, norms, conv, ring stores --------------------------------------------------------

void CudaOps::do_add_rms_norm(float* h, const float* x, const float* w, float* y, int64_t rows, int64_t n,
                              float eps) {
  DeviceGuard guard(device_);
  launch_rms_norm(h, x, w, y, rows, n, eps, stream_);
}

void CudaOps::do_head_norm_rope(float* x, const float* w, int64_t rows, int64_t heads, int64_t head_dim, float eps,
                                const int64_t* positions, double theta) {
  if (rows == 0) return;
  DeviceGuard guard(device_);
  const int64_t half = head_dim / 2;
  if (rope_theta_ != theta || rope_dim_ != head_dim) {
    check_not_capturing("head_norm_rope with a new theta or head_dim (its table is built first)");
    // The CPU twin's table, theta^(-2i/D) in double; rebuilt only when theta or D change.
    std::vector<double> inv(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
      inv[static_cast<size_t>(i)] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    // Queued kernels and captured graphs may read the old table: it stays until destruction.
    if (rope_inv_freq_ != nullptr) rope_retired_.push_back(rope_inv_freq_);
    rope_inv_freq_ = nullptr;
    rope_dim_ = 0;
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rope_inv_freq_), inv.size() * sizeof(double)));
    CUDA_CHECK(cudaMemcpyAsync(rope_inv_freq_, inv.data(), inv.size() * sizeof(double), cudaMemcpyHostToDevice,
                               stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    rope_theta_ = theta;
    rope_dim_ = head_dim;
  }
  launch_head_norm_rope(x, w, rows, heads, head_dim, eps, positions, rope_inv_freq_, stream_);
}

void CudaOps::do_dyn_conv(const ConvParams& p) {
  DeviceGuard guard(device_);
  launch_dyn_conv(p, stream_);
}

void CudaOps::do_silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  DeviceGuard guard(device_);
  launch_silu_mul(gate, up, out, n, stream_);
}

void CudaOps::do_gather_rows(const float* src, const int64_t* index, int64_t rows, int64_t row_len, float* dst) {
  if (rows == 0 || row_len == 0) return;
  DeviceGuard guard(device_);
  launch_gather_rows(src, index, rows, row_len, dst, stream_);
}

void CudaOps::do_store_rows(const float* src, int64_t rows, int64_t row_len, float* dst, int64_t capacity,
                            int64_t first_pos) {
  if (rows == 0 || row_len == 0) return;
  DeviceGuard guard(device_);
  // Only the last `capacity` rows survive; they land in at most two contiguous runs of slots.
  const int64_t skip = std::max<int64_t>(0, rows - capacity);
  const size_t row_bytes = static_cast<size_t>(row_len) * sizeof(float);
  for (int64_t j = skip; j < rows;) {
    const int64_t slot = (first_pos + j) % capacity;
    const int64_t run = std::min(rows - j, capacity - slot);
    CUDA_CHECK(cudaMemcpyAsync(dst + slot * row_len, src + j * row_len, static_cast<size_t>(run) * row_bytes,
                               cudaMemcpyDeviceToDevice, stream_));
    j += run;
  }
}

// ---- attention ---------------------------------------------------------------------------------------

void CudaOps::set_attention_kernel(const std::string& kernel) {
  TPDRAFT_CHECK(kernel == "mma" || kernel == "simt",
                "TPDRAFT_CUDA_ATTENTION must be 'mma' (tensor cores, head dims 64 and 128, the default) or 'simt' "
                "(f32 CUDA cores, the fallback), got '{}'", kernel);
  prefer_mma_attention_ = kernel == "mma";
}

int CudaOps::attention_blocks_per_sm(AttnKernel kernel, int64_t head_dim, bool kv_bf16) {
  const int key = static_cast<int>(head_dim) * 4 + (kernel == AttnKernel::mma ? 2 : 0) + (kv_bf16 ? 1 : 0);
  for (const auto& [k, blocks] : attn_occupancy_)
    if (k == key) return blocks;
  const int blocks = cuda::attention_blocks_per_sm(kernel, head_dim, kv_bf16);
  attn_occupancy_.emplace_back(key, blocks);
  return blocks;
}

void CudaOps::do_attention(const AttentionParams& p) {
  TPDRAFT_CHECK(p.head_dim <= kAttnMaxHeadDim, "attention: head_dim {} exceeds the cuda backend's limit of {}",
                p.head_dim, kAttnMaxHeadDim);
  if (p.sessions == 0) return;
  DeviceGuard guard(device_);
  const int64_t S = p.sessions, ratio = p.n_q / p.n_kv;
  // bf16 rings only the tensor-core kernel reads (the engine stores them only where holds_context).
  const bool kv_bf16 = p.kv_dtype == DType::BF16;
  TPDRAFT_CHECK(!kv_bf16 || attention_mma_supports(p.head_dim),
                "attention: bf16 context rings need the cuda backend's tensor-core kernel, which takes head dims 64 "
                "and 128, not {}", p.head_dim);
  const AttnKernel kernel = kv_bf16 || (prefer_mma_attention_ && attention_mma_supports(p.head_dim))
                                ? AttnKernel::mma
                                : AttnKernel::simt;
  // The session tables stay on the device, so the split is sized from max_context: as many chunks
  // as one wave of resident blocks holds (the occupancy API's figure), none shorter than 64 keys
  // at max_context.
  const int64_t rows_per_block = attention_rows_per_block(kernel);
  const int64_t qgroups = (ratio * p.block + rows_per_block - 1) / rows_per_block;
  const int64_t row_blocks = S * p.n_kv * qgroups;
  const int64_t splits = attn_plan_splits(
      row_blocks, p.max_context, static_cast<int64_t>(attention_blocks_per_sm(kernel, p.head_dim, kv_bf16)) * sm_count_);
  TPDRAFT_CHECK(S <= 65535 && p.n_kv * qgroups <= 65535,
                "attention: {} sessions x {} kv heads x {} row groups exceed the cuda grid limits", S, p.n_kv, qgroups);
  AttnArgs a{p};
  a.splits = splits;
  const size_t rows = static_cast<size_t>(S * p.n_q * p.block * (splits + 1));
  a.part_acc = attn_acc_.as<float>(rows * static_cast<size_t>(p.head_dim), stream_);
  a.part_ml = attn_ml_.as<float>(rows * 2, stream_);
  launch_attention(a, kernel, stream_);
}

}  // namespace tpdraft::kernels::cuda

namespace tpdraft::kernels {

std::unique_ptr<Ops> make_cuda_ops(int device) { return std::make_unique<cuda::CudaOps>(device); }

}  // namespace tpdraft::kernels
