// The NCCL communicator's choice of all-reduce path, which needs no GPU: symmetric windows where
// the NCCL loaded at run time is 2.27 or later, exports the window functions and the device
// supports virtual memory management, unless TPDRAFT_NCCL_SYMMETRIC=off; the ring otherwise,
// each time saying why. Version codes are checked against the ones NCCL's header defines.
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "parallel/nccl_comm.h"
#include "support/test_support.h"

#ifdef TPDRAFT_HAVE_NCCL
#include <nccl.h>
#endif

namespace tpdraft::parallel {
namespace {

constexpr int k2_28_9 = 2 * 10000 + 28 * 100 + 9;

TEST(AllReducePath, VersionNames) {
  EXPECT_EQ(nccl_version_name(k2_28_9), "2.28.9");
  EXPECT_EQ(nccl_version_name(2 * 10000 + 27 * 100), "2.27.0");
  EXPECT_EQ(nccl_version_name(2 * 1000 + 8 * 100 + 4), "2.8.4");  // the code before NCCL 2.9
  EXPECT_EQ(nccl_version_name(kNcclSymmetricVersion), "2.27.0");
#ifdef TPDRAFT_HAVE_NCCL
  EXPECT_EQ(kNcclSymmetricVersion, NCCL_VERSION(2, 27, 0));
  EXPECT_EQ(nccl_version_name(NCCL_VERSION_CODE), fmt::format("{}.{}.{}", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
  EXPECT_EQ(nccl_version_name(NCCL_VERSION(2, 8, 4)), "2.8.4");
#endif
}

TEST(AllReducePath, SymmetricWhereEverythingFits) {
  for (const char* setting : {static_cast<const char*>(nullptr), "", "auto"}) {
    const AllReducePath p = choose_all_reduce_path(k2_28_9, true, true, setting);
    EXPECT_TRUE(p.symmetric) << (setting ? setting : "(unset)");
    EXPECT_EQ(p.reason, "symmetric windows (NCCL 2.28.9)");
  }
  EXPECT_TRUE(choose_all_reduce_path(kNcclSymmetricVersion, true, true, nullptr).symmetric) << "the first release";
}

TEST(AllReducePath, RingOtherwiseSayingWhy) {
  const struct {
    int version;
    bool symbols, vmm;
    const char* setting;
    std::string reason;
  } cases[] = {
      {k2_28_9, true, true, "off", "ring (NCCL 2.28.9; symmetric windows off: TPDRAFT_NCCL_SYMMETRIC=off)"},
      {2 * 10000 + 26 * 100 + 6, true, true, nullptr, "ring (NCCL 2.26.6; symmetric windows need 2.27.0 or later)"},
      {2 * 1000 + 8 * 100 + 4, true, true, nullptr, "ring (NCCL 2.8.4; symmetric windows need 2.27.0 or later)"},
      {k2_28_9, false, true, nullptr, "ring (NCCL 2.28.9; this library lacks ncclMemAlloc or ncclCommWindowRegister)"},
      {k2_28_9, true, false, nullptr,
       "ring (NCCL 2.28.9; the device has no virtual memory management, which ncclMemAlloc needs)"},
  };
  for (const auto& c : cases) {
    const AllReducePath p = choose_all_reduce_path(c.version, c.symbols, c.vmm, c.setting);
    EXPECT_FALSE(p.symmetric) << c.reason;
    EXPECT_EQ(p.reason, c.reason);
  }
}

TEST(AllReducePath, AnUnknownSettingIsRefusedNamingTheVariable) {
  for (const char* bad : {"on", "OFF", "1"})
    testing::expect_error([&] { choose_all_reduce_path(k2_28_9, true, true, bad); },
                          {"TPDRAFT_NCCL_SYMMETRIC", "'auto' or 'off'", fmt::format("'{}'", bad)});
}

}  // namespace
}  // namespace tpdraft::parallel
