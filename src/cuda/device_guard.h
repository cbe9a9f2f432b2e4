// How a rank's thread makes its GPU current for the span of an op, written apart from the CUDA
// calls so that the policy runs and is tested on machines without a device. The policy: switch
// only when another device is current; on the way out, go back only to a device whose context
// was already active. A fresh thread reports device 0 as current without any context on it, and
// making device 0 current again would create one there (about half a GiB, on every rank's
// thread): that is the restore this guard never makes. A failed switch back is forgotten, its
// error cleared, so that the next launch check does not report it as its own.
#pragma once

#include <new>

namespace tpdraft::cuda {

// Calls: bool current(int*), bool make_current(int), bool context_active(int), void clear_error(),
// and [[noreturn]] void fail(const char* what, int device) for a switch that must not fail.
template <typename Calls>
class BasicDeviceGuard {
 public:
  BasicDeviceGuard(Calls& calls, int device) : calls_(calls) {
    if (!enter(device)) calls_.fail("making the rank's device current", device);
  }
  // For destructors and other paths that must not throw: a failure is ignored (and cleared).
  BasicDeviceGuard(Calls& calls, int device, std::nothrow_t) noexcept : calls_(calls) {
    if (!enter(device)) calls_.clear_error();
  }
  ~BasicDeviceGuard() {
    if (restore_ >= 0 && !calls_.make_current(restore_)) calls_.clear_error();
  }
  BasicDeviceGuard(const BasicDeviceGuard&) = delete;
  BasicDeviceGuard& operator=(const BasicDeviceGuard&) = delete;

 private:
  bool enter(int device) {
    int current = -1;
    if (!calls_.current(&current)) {
      calls_.clear_error();
      current = -1;
    }
    if (current == device) return true;
    const bool was_active = current >= 0 && calls_.context_active(current);
    if (!calls_.make_current(device)) return false;
    restore_ = was_active ? current : -1;
    return true;
  }

  Calls& calls_;
  int restore_ = -1;
};

}  // namespace tpdraft::cuda
