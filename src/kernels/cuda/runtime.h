// The CUDA runtime helpers the backend and the device communicators share: making a rank's
// device current, grow-only device workspaces that captured graphs may keep using, and whether a
// stream is being captured. Built only with TPDRAFT_HAVE_CUDA.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <new>
#include <vector>

namespace tpdraft::kernels::cuda {

// Makes `device` current on the calling thread for the guard's lifetime (ops may be called from
// any thread, e.g. one per in-process rank).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  // For destructors and other paths that must not throw: failures are ignored.
  DeviceGuard(int device, std::nothrow_t) noexcept;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1, device_ = -1;
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

}  // namespace tpdraft::kernels::cuda
