// The device guard's policy (cuda/device_guard.h) against a model of the CUDA runtime: a fresh
// thread reports device 0 with no context; making a device current creates its context. Ranks on
// GPUs 1..7 must never create a context on GPU 0, nested guards must switch only when the device
// differs, a caller's active device is restored, and a failed switch back leaves no error behind.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cuda/device_guard.h"

namespace tpdraft::cuda {
namespace {

// One thread's view of the runtime (its current device, which contexts exist, what failed),
// answering the guard's calls.
struct FakeRuntime {
  int device = 0;                // current; a fresh thread's default
  std::map<int, bool> contexts;  // device -> primary context exists
  int switches = 0;
  int failing_device = -1;  // make_current(this) fails
  bool pending_error = false;

  bool current(int* d) {
    *d = device;
    return true;
  }
  bool make_current(int d) {
    if (d == failing_device) {
      pending_error = true;
      return false;
    }
    ++switches;
    device = d;
    contexts[d] = true;  // the runtime creates the primary context on first use
    return true;
  }
  bool context_active(int d) { return contexts.count(d) > 0 && contexts[d]; }
  void clear_error() { pending_error = false; }
  [[noreturn]] void fail(const char* what, int d) {
    throw std::runtime_error(std::string(what) + " " + std::to_string(d));
  }
};

using Guard = BasicDeviceGuard<FakeRuntime>;

TEST(DeviceGuard, RanksOnOtherGpusNeverTouchGpuZero) {
  for (int device = 1; device < 8; ++device) {
    FakeRuntime rt;  // a fresh rank thread
    for (int op = 0; op < 100; ++op) Guard g(rt, device);
    EXPECT_EQ(rt.contexts.count(0), 0u) << "device " << device << ": a context was made on GPU 0";
    EXPECT_EQ(rt.device, device);
    EXPECT_EQ(rt.switches, 1) << "switch once, then find the device current";
  }
}

TEST(DeviceGuard, NestedGuardsSwitchOnlyWhenTheDeviceDiffers) {
  FakeRuntime rt;
  {
    Guard outer(rt, 2);
    { Guard same(rt, 2); }
    EXPECT_EQ(rt.switches, 1);
    {
      Guard other(rt, 3);
      EXPECT_EQ(rt.device, 3);
    }
    EXPECT_EQ(rt.device, 2) << "device 2 was active: it is current again";
  }
  EXPECT_EQ(rt.device, 2) << "device 0 had no context: not restored";
  EXPECT_EQ(rt.contexts.count(0), 0u);
}

TEST(DeviceGuard, ACallersActiveDeviceIsRestored) {
  FakeRuntime rt;
  rt.make_current(5);  // the caller works on GPU 5
  rt.switches = 0;
  { Guard g(rt, 1); }
  EXPECT_EQ(rt.device, 5);
  EXPECT_EQ(rt.switches, 2);
}

TEST(DeviceGuard, FailuresThrowOrAreClearedAndForgotten) {
  FakeRuntime rt;
  rt.failing_device = 4;
  EXPECT_THROW(Guard(rt, 4), std::runtime_error);
  { Guard quiet(rt, 4, std::nothrow); }
  EXPECT_FALSE(rt.pending_error) << "the nothrow guard left the failure's error behind";
  // A failed switch back: the error is cleared, the guard's device stays current.
  rt.failing_device = -1;
  rt.make_current(6);
  {
    Guard g(rt, 1);
    rt.failing_device = 6;
  }
  EXPECT_FALSE(rt.pending_error);
  EXPECT_EQ(rt.device, 1);
}

TEST(DeviceGuard, EachThreadKeepsItsOwnDevice) {
  std::vector<int> ends(4, -1);
  std::vector<char> zero(4, 0);  // not vector<bool>: its packed bits would make the threads' writes race
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      FakeRuntime rt;  // per thread, as the runtime's current device is
      for (int op = 0; op < 50; ++op) Guard g(rt, r + 1);
      ends[static_cast<size_t>(r)] = rt.device;
      zero[static_cast<size_t>(r)] = rt.contexts.count(0) > 0;
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ends[static_cast<size_t>(r)], r + 1);
    EXPECT_FALSE(zero[static_cast<size_t>(r)]);
  }
}

}  // namespace
}  // namespace tpdraft::cuda
