// The device guard's policy (kernels/device_guard.h) against a model of the CUDA runtime: a fresh
// thread reports device 0 with no context; making a device current creates its context. Ranks on
// GPUs 1..7 must never create a context on GPU 0, nested guards must switch only when the device
// differs, a caller's active device is restored, and a failed switch back leaves no error behind.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/device_guard.h"

namespace tpdraft::kernels {
namespace {

// One thread's view of the runtime: its current device, which contexts exist, what failed.
struct FakeRuntime {
  int current = 0;          // a fresh thread's default
  std::map<int, bool> contexts;  // device -> primary context exists
  int switches = 0;
  int failing_device = -1;  // make_current(this) fails
  bool pending_error = false;

  bool current_device(int* d) {
    *d = current;
    return true;
  }
  bool make_current(int d) {
    if (d == failing_device) {
      pending_error = true;
      return false;
    }
    ++switches;
    current = d;
    contexts[d] = true;  // the runtime creates the primary context on first use
    return true;
  }
};

struct FakeCalls {
  FakeRuntime& rt;
  bool current(int* d) { return rt.current_device(d); }
  bool make_current(int d) { return rt.make_current(d); }
  bool context_active(int d) { return rt.contexts.count(d) > 0 && rt.contexts[d]; }
  void clear_error() { rt.pending_error = false; }
  [[noreturn]] void fail(const char* what, int device) {
    throw std::runtime_error(std::string(what) + " " + std::to_string(device));
  }
};

using Guard = BasicDeviceGuard<FakeCalls>;

TEST(DeviceGuard, RanksOnOtherGpusNeverTouchGpuZero) {
  for (int device = 1; device < 8; ++device) {
    FakeRuntime rt;  // a fresh rank thread
    FakeCalls calls{rt};
    for (int op = 0; op < 100; ++op) Guard g(calls, device);
    EXPECT_EQ(rt.contexts.count(0), 0u) << "device " << device << ": a context was made on GPU 0";
    EXPECT_EQ(rt.current, device);
    EXPECT_EQ(rt.switches, 1) << "switch once, then find the device current";
  }
}

TEST(DeviceGuard, NestedGuardsSwitchOnlyWhenTheDeviceDiffers) {
  FakeRuntime rt;
  FakeCalls calls{rt};
  {
    Guard outer(calls, 2);
    { Guard same(calls, 2); }
    EXPECT_EQ(rt.switches, 1);
    {
      Guard other(calls, 3);
      EXPECT_EQ(rt.current, 3);
    }
    EXPECT_EQ(rt.current, 2) << "device 2 was active: it is current again";
  }
  EXPECT_EQ(rt.current, 2) << "device 0 had no context: not restored";
  EXPECT_EQ(rt.contexts.count(0), 0u);
}

TEST(DeviceGuard, ACallersActiveDeviceIsRestored) {
  FakeRuntime rt;
  FakeCalls calls{rt};
  rt.make_current(5);  // the caller works on GPU 5
  rt.switches = 0;
  { Guard g(calls, 1); }
  EXPECT_EQ(rt.current, 5);
  EXPECT_EQ(rt.switches, 2);
}

TEST(DeviceGuard, FailuresThrowOrAreClearedAndForgotten) {
  FakeRuntime rt;
  FakeCalls calls{rt};
  rt.failing_device = 4;
  EXPECT_THROW(Guard(calls, 4), std::runtime_error);
  { Guard quiet(calls, 4, std::nothrow); }
  EXPECT_FALSE(rt.pending_error) << "the nothrow guard left the failure's error behind";
  // A failed switch back: the error is cleared, the guard's device stays current.
  rt.failing_device = -1;
  rt.make_current(6);
  {
    Guard g(calls, 1);
    rt.failing_device = 6;
  }
  EXPECT_FALSE(rt.pending_error);
  EXPECT_EQ(rt.current, 1);
}

TEST(DeviceGuard, EachThreadKeepsItsOwnDevice) {
  std::vector<int> ends(4, -1);
  std::vector<bool> zero(4, false);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      FakeRuntime rt;  // per thread, as the runtime's current device is
      FakeCalls calls{rt};
      for (int op = 0; op < 50; ++op) Guard g(calls, r + 1);
      ends[static_cast<size_t>(r)] = rt.current;
      zero[static_cast<size_t>(r)] = rt.contexts.count(0) > 0;
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ends[static_cast<size_t>(r)], r + 1);
    EXPECT_FALSE(zero[static_cast<size_t>(r)]);
  }
}

}  // namespace
}  // namespace tpdraft::kernels
