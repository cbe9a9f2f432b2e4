// main() of the GoogleTest binaries run directly by CTest. Like gtest_main, except that a run in
// which every selected test skipped itself (a GPU test on a machine without a device, a build
// without the CUDA backend) exits with kAllSkipped, which tests/CMakeLists.txt declares as the
// SKIP_RETURN_CODE: CTest then lists the binary as skipped instead of passed.
#include <gtest/gtest.h>

#include "support/test_support.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  if (rc == 0 && unit.test_to_run_count() > 0 && unit.skipped_test_count() == unit.test_to_run_count())
    return tpdraft::testing::kAllSkipped;
  return rc;
}
