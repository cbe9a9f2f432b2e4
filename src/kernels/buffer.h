// An owning handle to memory of one backend (freed through the same Ops), move-only.
#pragma once

#include <cstddef>
#include <utility>

#include "kernels/ops.h"

namespace tpdraft::kernels {

class Buffer {
 public:
  Buffer() = default;
  Buffer(Ops& ops, size_t bytes) : ops_(&ops), bytes_(bytes), ptr_(bytes ? ops.alloc(bytes) : nullptr) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& o) noexcept : ops_(o.ops_), bytes_(o.bytes_), ptr_(o.ptr_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = o.ops_;
      bytes_ = o.bytes_;
      ptr_ = std::exchange(o.ptr_, nullptr);
      o.bytes_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void reset() {
    if (ptr_ && ops_) ops_->release(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* get() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  Ops* ops_ = nullptr;
  size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

}  // namespace tpdraft::kernels
