// DeviceGuard, Workspace and the capture query (runtime.h).
#include "kernels/cuda/runtime.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace tpdraft::kernels::cuda {

DeviceGuard::DeviceGuard(int device) : device_(device) {
  CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device_) CUDA_CHECK(cudaSetDevice(device_));
}

DeviceGuard::DeviceGuard(int device, std::nothrow_t) noexcept : device_(device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  if (previous_ != device_) cudaSetDevice(device_);
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
}

Workspace::~Workspace() { reset(); }

void Workspace::reset() {
  if (ptr_ != nullptr) cudaFree(ptr_);
  for (void* p : retired_) cudaFree(p);
  retired_.clear();
  ptr_ = nullptr;
  bytes_ = 0;
  pinned_ = false;
}

void* Workspace::get(size_t bytes, cudaStream_t stream) {
  if (bytes <= bytes_ && ptr_ != nullptr) return ptr_;
  TPDRAFT_CHECK(!stream_capturing(stream),
                "cuda backend: a workspace must grow to {} bytes during a graph capture; run the same ops once "
                "before capturing them",
                bytes);
  // Kernels already queued may still use the old block: let them finish before freeing it. A
  // captured graph may use it at any later time: then it is only retired.
  CUDA_CHECK(cudaStreamSynchronize(stream));
  if (ptr_ != nullptr && pinned_)
    retired_.push_back(ptr_);
  else if (ptr_ != nullptr)
    CUDA_CHECK(cudaFree(ptr_));
  ptr_ = nullptr;
  bytes_ = 0;
  pinned_ = false;
  const size_t want = std::max<size_t>(bytes + bytes / 4, 256);  // a little headroom, fewer regrowths
  CUDA_CHECK(cudaMalloc(&ptr_, want));
  bytes_ = want;
  return ptr_;
}

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace tpdraft::kernels::cuda
