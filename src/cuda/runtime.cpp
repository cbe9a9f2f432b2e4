// DeviceGuard, Workspace, the capture query and the memory-management query (runtime.h).
#include "cuda/runtime.h"

#include <cuda.h>  // the driver's types and attribute names only: it is reached through the runtime

#include <algorithm>

#include "core/error.h"
#include "cuda/cuda_check.h"

namespace tpdraft::cuda {

namespace {

// cuDevicePrimaryCtxGetState and cuDeviceGetAttribute through the runtime's driver entry points
// (no link to libcuda).
using PrimaryCtxGetState = int (*)(int device, unsigned int* flags, int* active);
using DeviceGet = int (*)(int* device, int ordinal);
using DeviceGetAttribute = int (*)(int* value, CUdevice_attribute attribute, int device);

template <typename F>
F driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return reinterpret_cast<F>(fn);
}

}  // namespace

bool CudaDeviceCalls::current(int* device) { return cudaGetDevice(device) == cudaSuccess; }

bool CudaDeviceCalls::make_current(int device) { return cudaSetDevice(device) == cudaSuccess; }

bool CudaDeviceCalls::context_active(int device) {
  static const auto get_state = driver_entry<PrimaryCtxGetState>("cuDevicePrimaryCtxGetState");
  static const auto device_get = driver_entry<DeviceGet>("cuDeviceGet");
  if (get_state == nullptr || device_get == nullptr) return false;  // unknown: never restore into it
  int handle = 0;
  unsigned int flags = 0;
  int active = 0;
  if (device_get(&handle, device) != 0 || get_state(handle, &flags, &active) != 0) return false;
  return active != 0;
}

void CudaDeviceCalls::clear_error() { cudaGetLastError(); }

void CudaDeviceCalls::fail(const char* what, int device) {
  const cudaError_t e = cudaGetLastError();
  TPDRAFT_FAIL("cuda: {} (device {}) failed: {}", what, device, cudaGetErrorString(e));
}

CudaDeviceCalls& cuda_device_calls() {
  static CudaDeviceCalls calls;
  return calls;
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

bool device_has_vmm(int device) {
  static const auto device_get = driver_entry<DeviceGet>("cuDeviceGet");
  static const auto get_attribute = driver_entry<DeviceGetAttribute>("cuDeviceGetAttribute");
  int handle = 0, vmm = 0;
  return device_get != nullptr && get_attribute != nullptr && device_get(&handle, device) == 0 &&
         get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, handle) == 0 && vmm != 0;
}

}  // namespace tpdraft::cuda
