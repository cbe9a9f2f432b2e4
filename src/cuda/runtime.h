// The CUDA runtime helpers the backend and the device communicators share: making a rank's
// device current, grow-only device workspaces that captured graphs may keep using, whether a
// stream is being captured, and whether a device has virtual memory management (NCCL's
// symmetric windows need it). Built only with TPDRAFT_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <new>
#include <vector>

#include "cuda/device_guard.h"

namespace tpdraft::cuda {

// The CUDA calls of the device guard (cuda/device_guard.h).
struct CudaDeviceCalls {
  bool current(int* device);
  bool make_current(int device);
  bool context_active(int device);  // the device's primary context exists already
  void clear_error();
  [[noreturn]] void fail(const char* what, int device);
};
CudaDeviceCalls& cuda_device_calls();

// Makes `device` current on the calling thread for the guard's lifetime (ops may be called from
// any thread, e.g. one per in-process rank), by the policy of cuda/device_guard.h.
class DeviceGuard : public BasicDeviceGuard<CudaDeviceCalls> {
 public:
  explicit DeviceGuard(int device) : BasicDeviceGuard(cuda_device_calls(), device) {}
  DeviceGuard(int device, std::nothrow_t) noexcept : BasicDeviceGuard(cuda_device_calls(), device, std::nothrow) {}
};

// Device memory that only grows; its contents do not survive a growth (per-call scratch). A
// graph captured with the current block keeps using it, so pin() makes a later growth retire the
// block (freed by reset) instead of freeing it under the graph.
class Workspace {
 public:
  Workspace() = default;
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  // At least `bytes` bytes; reallocates (after the stream has drained) only to grow.
  void* get(size_t bytes, cudaStream_t stream);
  template <typename T>
  T* as(size_t count, cudaStream_t stream) {
    return static_cast<T*>(get(count * sizeof(T), stream));
  }
  void reset();  // frees the memory, retired blocks included (the owner's device must be current)
  void pin() { pinned_ = ptr_ != nullptr; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
  std::vector<void*> retired_;  // blocks that captured graphs may still use
};

// Whether work issued to `stream` is being captured into a graph now.
bool stream_capturing(cudaStream_t stream);

// Whether `device` supports CUDA's virtual memory management; false where it cannot be asked.
bool device_has_vmm(int device);

}  // namespace tpdraft::cuda
