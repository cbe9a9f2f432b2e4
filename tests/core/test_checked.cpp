// Checked size arithmetic (core/checked.h): exact results inside the 64-bit range, and an Error
// naming what was being computed, with short numbers, as soon as a result would not fit.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/checked.h"
#include "support/test_support.h"

namespace tpdraft {
namespace {

using testing::error_of;
using testing::expect_error;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

TEST(Checked, MulAndAddAreExactInRange) {
  EXPECT_EQ(checked_mul(3, 4, "x"), 12);
  EXPECT_EQ(checked_mul(-3, 4, "x"), -12);
  EXPECT_EQ(checked_mul(0, kMax, "x"), 0);
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "x"), int64_t{1} << 62);
  EXPECT_EQ(checked_mul(kMax, 1, "x"), kMax);
  EXPECT_EQ(checked_add(kMax - 5, 5, "x"), kMax);
  EXPECT_EQ(checked_add(kMin, kMax, "x"), -1);
}

TEST(Checked, OverflowNamesWhatWasComputed) {
  expect_error([] { checked_mul(int64_t{1} << 58, 64, "rows of tensor '{}'", "lm_head.weight"); },
               {"rows of tensor 'lm_head.weight'", "288230376151711744 x 64", "64-bit"});
  expect_error([] { checked_add(kMax, 1, "window + block"); },
               {"window + block", "9223372036854775807 + 1"});

  EXPECT_NE(error_of([] { checked_mul(kMin, -1, "negation"); }), "");
  EXPECT_NE(error_of([] { checked_add(kMin, -1, "sum"); }), "");
}

TEST(Checked, ShapeProducts) {
  EXPECT_EQ(checked_numel({}, "scalar"), 1);
  EXPECT_EQ(checked_numel({2, 3, 4}, "cube"), 24);
  EXPECT_EQ(checked_numel({0, kMax}, "empty"), 0);
  EXPECT_EQ(checked_bytes({2, 3}, 2, "bf16 matrix"), 12u);
  EXPECT_EQ(checked_bytes({}, 8, "f64 scalar"), 8u);

  // 2^58 + 1 rows of 64 wrap to 64 elements (128 bf16 bytes) in unchecked arithmetic.
  const std::vector<int64_t> shape = {(int64_t{1} << 58) + 1, 64};
  expect_error([&] { checked_numel(shape, "tensor '{}'", "embed"); },
               {"tensor 'embed'", "[288230376151711745, 64]"});
  // The element count fits, its bytes do not.
  expect_error([] { checked_bytes({int64_t{1} << 62}, 4, "taps"); },
               {"taps", "[4611686018427387904]", "4-byte"});
  expect_error([] { checked_numel({4, -2}, "weights"); }, {"weights", "negative"});
}

TEST(Checked, DoubleToInt64) {
  EXPECT_EQ(checked_to_int64(64.0, "x"), 64);
  EXPECT_EQ(checked_to_int64(-3.0, "x"), -3);
  EXPECT_EQ(checked_to_int64(-9223372036854775808.0, "x"), kMin);
  EXPECT_EQ(checked_to_int64(9223372036854774784.0, "x"), 9223372036854774784);  // largest double below 2^63

  expect_error([] { checked_to_int64(1e30, "key '{}'", "hidden_size"); },
               {"key 'hidden_size'", "1e+30"});
  // Huge values stay short in messages: no 300-digit expansion.
  const std::string msg = error_of([] { checked_to_int64(-1e300, "value"); });
  EXPECT_NE(msg.find("-1e+300"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 200u) << msg;
  EXPECT_NE(error_of([] { checked_to_int64(9223372036854775808.0, "2^63"); }), "");
  EXPECT_NE(error_of([] { checked_to_int64(std::nan(""), "nan"); }), "");
  EXPECT_NE(error_of([] { checked_to_int64(INFINITY, "inf"); }), "");
  EXPECT_NE(error_of([] { checked_to_int64(2.5, "fraction"); }).find("2.5"), std::string::npos);
}

}  // namespace
}  // namespace tpdraft
