// CudaOps construction, device memory, the per-call parameter ring, and the host side of the
// ops other than the GEMMs (cuda_gemm.cpp): checks as in the CPU twin, then the launchers.
// Copies: to_device returns when the source may be reused (the copy is done); to_host returns
// when the data is on the host. Everything else is asynchronous on the ops' stream.
#include "kernels/cuda/lazy_lib.h"
#include "kernels/ops_checks.h"
#include "kernels/cuda/cuda_ops_impl.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"

namespace tpdraft::kernels::cuda {

// ---- DeviceGuard, Workspace, UploadRing ----------------------------------------------------------

DeviceGuard::DeviceGuard(int device) : device_(device) {
  CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_) CUDA_CHECK(cudaSetDevice(device_));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
}

Workspace::~Workspace() { reset(); }

void Workspace::reset() {
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

void* Workspace::get(size_t bytes, cudaStream_t stream) {
  if (bytes <= bytes_ && ptr_ != nullptr) return ptr_;
  // Kernels already queued may still use the old block: let them finish before freeing it.
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (ptr_ != nullptr) CUDA_CHECK(cudaFree(ptr_));
  ptr_ = nullptr;
  bytes_ = 0;
  const size_t want = std::max<size_t>(bytes + bytes / 4, 256);  // a little headroom, fewer regrowths
  CUDA_CHECK(cudaMalloc(&ptr_, want));
  bytes_ = want;
  return ptr_;
}

UploadRing::~UploadRing() { reset(); }

void UploadRing::reset() {
  if (host_ != nullptr) cudaFreeHost(host_);
  if (device_ != nullptr) cudaFree(device_);
  host_ = device_ = nullptr;
  capacity_ = used_ = 0;
}

void UploadRing::reserve(size_t bytes, cudaStream_t stream) {
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (host_ != nullptr) CUDA_CHECK(cudaFreeHost(host_));
  if (device_ != nullptr) CUDA_CHECK(cudaFree(device_));
  host_ = nullptr;
  device_ = nullptr;
  capacity_ = used_ = 0;
  CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_), bytes));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&device_), bytes));
  capacity_ = bytes;
}

const void* UploadRing::upload(const void* src, size_t bytes, cudaStream_t stream) {
  const size_t need = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  if (need > capacity_) {
    reserve(std::max<size_t>({need, 2 * capacity_, size_t{1} << 20}), stream);
  } else if (used_ + need > capacity_) {
    CUDA_CHECK(cudaStreamSynchronize(stream));  // every earlier slot's copy has run
    used_ = 0;
  }
  char* h = host_ + used_;
  char* d = device_ + used_;
  used_ += need;
  if (bytes > 0) {
    std::memcpy(h, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream));
  }
  return d;
}

// ---- construction and memory ----------------------------------------------------------------------

CudaOps::CudaOps(int device) : device_(device) {
  if (const char* mode = std::getenv("TPDRAFT_CUDA_MATMUL")) {
    const std::string m(mode);
    TPDRAFT_CHECK(m == "split" || m == "single",
                  "TPDRAFT_CUDA_MATMUL must be 'split' (activations as bf16 hi + lo, the default) or 'single' "
                  "(one bf16 rounding), got '{}'", m);
    split_activations_ = m == "split";
  }
  const int count = cuda_device_count();
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
  } catch (...) {
    if (blas_ != nullptr) TPDRAFT_LAZY(cublas, cublasDestroy)(blas_);
    cudaStreamDestroy(stream_);
    throw;
  }
}

CudaOps::~CudaOps() {
  // No throwing from here: a failed device is reported by the op that met it.
  int previous = -1;
  cudaGetDevice(&previous);
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  ring_.reset();
  for (Workspace* w : {&act_, &parts_, &logits_, &keys_a_, &keys_b_, &attn_acc_, &attn_ml_}) w->reset();
  if (rope_inv_freq_ != nullptr) cudaFree(rope_inv_freq_);
  if (blas_ != nullptr) TPDRAFT_LAZY(cublas, cublasDestroy)(blas_);
  cudaStreamDestroy(stream_);
  cudaGetLastError();
  if (previous >= 0 && previous != device_) cudaSetDevice(previous);
}

void* CudaOps::alloc(size_t bytes) {
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
  DeviceGuard guard(device_);
  // cudaFree waits for the device, so queued kernels that still read p finish first.
  const cudaError_t rc = cudaFree(p);
  if (rc != cudaSuccess)
    TPDRAFT_LOG_ERROR("cuda backend: cudaFree on device {} failed: {}", device_, cudaGetErrorString(rc));
}

void CudaOps::to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceGuard guard(device_);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  // The caller may reuse src at once (weights are staged through one host buffer).
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::to_host(void* dst, const void* src, size_t bytes) {
  DeviceGuard guard(device_);
  if (bytes > 0) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::sync() {
  DeviceGuard guard(device_);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- element-wise, norms, conv, ring stores --------------------------------------------------------

void CudaOps::rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  TPDRAFT_CHECK(rows >= 0 && n > 0, "rms_norm: bad shape [{}, {}] (expected rows >= 0, n > 0)", rows, n);
  DeviceGuard guard(device_);
  launch_rms_norm(x, w, y, rows, n, eps, stream_);
}

void CudaOps::head_norm_rope(float* x, const float* w, int64_t rows, int64_t heads, int64_t head_dim, float eps,
                             const int64_t* positions, double theta) {
  TPDRAFT_CHECK(head_dim > 0 && head_dim % 2 == 0, "head_norm_rope: head_dim must be even and > 0, got {}", head_dim);
  TPDRAFT_CHECK(rows >= 0 && heads > 0, "head_norm_rope: bad shape [{}, {}, {}]", rows, heads, head_dim);
  TPDRAFT_CHECK(theta > 0.0, "head_norm_rope: rope theta must be > 0, got {}", theta);
  if (rows == 0) return;
  DeviceGuard guard(device_);
  const int64_t half = head_dim / 2;
  if (rope_theta_ != theta || rope_dim_ != head_dim) {
    // The CPU twin's table, theta^(-2i/D) in double; rebuilt only when theta or D change.
    std::vector<double> inv(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i)
      inv[static_cast<size_t>(i)] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // queued kernels may read the old table
    if (rope_inv_freq_ != nullptr) CUDA_CHECK(cudaFree(rope_inv_freq_));
    rope_inv_freq_ = nullptr;
    rope_dim_ = 0;
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&rope_inv_freq_), inv.size() * sizeof(double)));
    CUDA_CHECK(cudaMemcpyAsync(rope_inv_freq_, inv.data(), inv.size() * sizeof(double), cudaMemcpyHostToDevice,
                               stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    rope_theta_ = theta;
    rope_dim_ = head_dim;
  }
  const int64_t* pos = ring_.upload(positions, static_cast<size_t>(rows), stream_);
  launch_head_norm_rope(x, w, rows, heads, head_dim, eps, pos, rope_inv_freq_, stream_);
}

void CudaOps::dyn_conv(const ConvParams& p) {
  check_conv_params(p);
  DeviceGuard guard(device_);
  launch_dyn_conv(p, stream_);
}

void CudaOps::silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  TPDRAFT_CHECK(n >= 0, "silu_mul: element count must be >= 0, got {}", n);
  DeviceGuard guard(device_);
  launch_silu_mul(gate, up, out, n, stream_);
}

void CudaOps::add(float* y, const float* x, int64_t n) {
  TPDRAFT_CHECK(n >= 0, "add: element count must be >= 0, got {}", n);
  DeviceGuard guard(device_);
  launch_add(y, x, n, stream_);
}

void CudaOps::store_rows(const float* src, int64_t rows, int64_t row_len, float* dst, int64_t capacity,
                         int64_t first_pos) {
  TPDRAFT_CHECK(capacity > 0, "store_rows: ring capacity must be > 0, got {}", capacity);
  TPDRAFT_CHECK(first_pos >= 0, "store_rows: first position must be >= 0, got {}", first_pos);
  TPDRAFT_CHECK(rows >= 0 && row_len >= 0, "store_rows: bad shape [{}, {}]", rows, row_len);
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

namespace {

void check_attention(const AttentionParams& p) {
  check_attention_params(p);
  TPDRAFT_CHECK(p.head_dim <= kAttnMaxHeadDim, "attention: head_dim {} exceeds the cuda backend's limit of {}",
                p.head_dim, kAttnMaxHeadDim);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

void CudaOps::attention(const AttentionParams& p) {
  check_attention(p);
  if (p.sessions == 0) return;
  DeviceGuard guard(device_);
  const int64_t S = p.sessions, ratio = p.n_q / p.n_kv;
  std::vector<AttnSession>& sessions = attn_sessions_;
  sessions.resize(static_cast<size_t>(S));
  int64_t longest = 0;
  for (int64_t s = 0; s < S; ++s) {
    const ContextView& c = p.context[s];
    AttnSession& se = sessions[static_cast<size_t>(s)];
    se.k = c.k;
    se.v = c.v;
    se.capacity = c.capacity;
    se.begin = c.begin;
    se.end = c.end;
    se.anchor = p.anchor[s];
    // Row 0 sees the most context: [lo, min(end, anchor)).
    se.lo = p.window > 0 ? std::max(c.begin, se.anchor - p.window + 1) : c.begin;
    se.count = std::max<int64_t>(0, std::min(c.end, se.anchor) - se.lo);
    longest = std::max(longest, se.count);
  }
  // Chunk size: enough chunks that the grid is ~4 blocks per multiprocessor, at least 64 keys
  // each (two 32-key tiles) so short contexts do not pay a merge per handful of keys.
  const int64_t qgroups = ceil_div(ratio * p.block, kAttnRowsPerBlock);
  const int64_t row_blocks = S * p.n_kv * qgroups;
  const int64_t target = std::max<int64_t>(1, ceil_div(4 * static_cast<int64_t>(sm_count_), row_blocks));
  const int64_t chunk = std::max<int64_t>(64, ceil_div(ceil_div(std::max<int64_t>(longest, 1), target), 32) * 32);
  int64_t max_chunks = 0;
  for (auto& se : sessions) {
    se.chunks = ceil_div(se.count, chunk);
    max_chunks = std::max(max_chunks, se.chunks);
  }
  TPDRAFT_CHECK(S <= 65535 && p.n_kv * qgroups <= 65535,
                "attention: {} sessions x {} kv heads x {} row groups exceed the cuda grid limits", S, p.n_kv, qgroups);
  AttnArgs a;
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.out = p.out;
  a.S = S;
  a.B = p.block;
  a.n_q = p.n_q;
  a.n_kv = p.n_kv;
  a.D = p.head_dim;
  a.window = p.window;
  a.causal = p.causal;
  a.scale = p.scale;
  a.chunk_keys = chunk;
  a.slots = max_chunks + 1;
  const size_t rows = static_cast<size_t>(S * p.n_q * p.block * a.slots);
  a.part_acc = attn_acc_.as<float>(rows * static_cast<size_t>(p.head_dim), stream_);
  a.part_ml = attn_ml_.as<float>(rows * 2, stream_);
  a.sessions = ring_.upload(sessions.data(), sessions.size(), stream_);
  launch_attention(a, stream_);
}

}  // namespace tpdraft::kernels::cuda

namespace tpdraft::kernels {

int cuda_device_count() {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: not an error for the caller
    return 0;
  }
  return count;
}

std::unique_ptr<Ops> make_cuda_ops(int device) { return std::make_unique<cuda::CudaOps>(device); }

namespace {
cuda::CudaOps& as_cuda(Ops& ops) {
  auto* c = dynamic_cast<cuda::CudaOps*>(&ops);
  TPDRAFT_CHECK(c != nullptr, "expected the cuda backend, got the '{}' backend", ops.name());
  return *c;
}
}  // namespace

cudaStream_t cuda_stream_of(Ops& ops) { return as_cuda(ops).stream(); }
int cuda_device_of(Ops& ops) { return as_cuda(ops).device(); }

}  // namespace tpdraft::kernels
