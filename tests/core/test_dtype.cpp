// dtype names and the bf16 / f16 <-> f32 conversions, checked against decodings written here from
// the IEEE field layouts (ldexp on sign, exponent, mantissa) and against exhaustive sweeps of all
// 65536 bit patterns, including the round-to-nearest-even ties between every pair of neighbours.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "core/dtype.h"
#include "core/error.h"
#include "support/test_support.h"

namespace tpdraft {
namespace {

uint32_t bits_of(float f) { return bit_cast<uint32_t>(f); }
float float_of(uint32_t u) { return bit_cast<float>(u); }

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
double ref_f16(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 10) & 0x1f;
  const int man = h & 0x3ff;
  if (exp == 0x1f) return man ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  if (exp == 0) return sign * std::ldexp(man, -24);  // subnormal: man * 2^(1-15-10)
  return sign * std::ldexp(1024 + man, exp - 25);
}

// bfloat16: 1 sign, 8 exponent (bias 127), 7 mantissa bits.
double ref_bf16(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exp = (h >> 7) & 0xff;
  const int man = h & 0x7f;
  if (exp == 0xff) return man ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  if (exp == 0) return sign * std::ldexp(man, -133);  // man * 2^(1-127-7)
  return sign * std::ldexp(128 + man, exp - 134);
}

// e4m3 from its definition: 1 sign, 4 exponent (bias 7), 3 mantissa bits; subnormals at exponent
// 0; no infinities; S.1111.111 is NaN. Every one of the 256 codes, and as a converted span.
TEST(DType, F8E4M3EveryCode) {
  std::vector<uint8_t> codes(256);
  for (int v = 0; v < 256; ++v) codes[static_cast<size_t>(v)] = static_cast<uint8_t>(v);
  std::vector<float> span(256);
  convert_to_f32(DType::F8E4M3, codes.data(), span.data(), 256);
  for (int v = 0; v < 256; ++v) {
    const int e = (v >> 3) & 15, m = v & 7;
    const double sign = (v & 0x80) ? -1.0 : 1.0;
    const float got = f8e4m3_to_f32(static_cast<uint8_t>(v));
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(got)) << v;
      EXPECT_TRUE(std::isnan(span[static_cast<size_t>(v)])) << v;
      continue;
    }
    const double want = e == 0 ? sign * m * std::pow(2.0, -9) : sign * (8 + m) * std::pow(2.0, e - 10);
    EXPECT_EQ(got, want) << v;
    EXPECT_EQ(span[static_cast<size_t>(v)], want) << v;
  }
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);  // the largest finite value
  EXPECT_EQ(find_non_finite(DType::F8E4M3, codes.data(), 127), -1);
  EXPECT_EQ(find_non_finite(DType::F8E4M3, codes.data(), 256), 127);
}

TEST(DType, NamesSizesAndParsing) {
  const DType all[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32,
                       DType::I16, DType::I8,  DType::U8,  DType::BOOL, DType::F8E4M3};
  const size_t sizes[] = {8, 4, 2, 2, 8, 4, 2, 1, 1, 1, 1};
  const char* names[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3"};
  for (size_t i = 0; i < std::size(all); ++i) {
    EXPECT_EQ(dtype_size(all[i]), sizes[i]);
    EXPECT_STREQ(dtype_name(all[i]), names[i]);
    DType parsed = DType::U8;
    ASSERT_TRUE(parse_dtype(names[i], &parsed)) << names[i];
    EXPECT_EQ(parsed, all[i]);
  }
  DType t = DType::F32;
  EXPECT_FALSE(parse_dtype("F8_E5M2", &t));
  EXPECT_FALSE(parse_dtype("bf16", &t));  // spelling is case sensitive
  EXPECT_FALSE(parse_dtype("", &t));
  EXPECT_TRUE(is_float_weight(DType::BF16));
  EXPECT_FALSE(is_float_weight(DType::F64));
  EXPECT_FALSE(is_float_weight(DType::I64));
}

TEST(DType, HalfDecodeMatchesReferenceOnAllPatterns) {
  for (DType t : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    for (uint32_t h = 0; h < 65536; ++h) {
      const auto x = static_cast<uint16_t>(h);
      const float got = t == DType::F16 ? f16_to_f32(x) : bf16_to_f32(x);
      const double want = t == DType::F16 ? ref_f16(x) : ref_bf16(x);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << std::hex << h;
        EXPECT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
      } else {
        // Compare bits so that -0 and +0 are told apart.
        EXPECT_EQ(bits_of(got), bits_of(static_cast<float>(want))) << std::hex << h;
        EXPECT_EQ(static_cast<double>(got), want) << std::hex << h;
      }
    }
  }
}

TEST(DType, EncodeIsExactOnRepresentableValues) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto x = static_cast<uint16_t>(h);
    if (!std::isnan(ref_f16(x))) {
      EXPECT_EQ(f32_to_f16(f16_to_f32(x)), x) << std::hex << h;
    }
    if (!std::isnan(ref_bf16(x))) {
      EXPECT_EQ(f32_to_bf16(bf16_to_f32(x)), x) << std::hex << h;
    }
  }
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
}

// For every pair of neighbouring positive encodings (lo, lo + 1), the exact midpoint must round to
// the even one of the two, and the floats just beside it to the nearer one. The midpoint of two
// 16-bit floats needs at most 12 significant bits, so it is exact in f32.
template <class Decode, class Encode>
void check_ties(uint16_t last_finite, Decode decode, Encode encode) {
  for (uint32_t lo = 0; lo <= last_finite; ++lo) {
    const auto hi = static_cast<uint16_t>(lo + 1);
    const double a = decode(static_cast<uint16_t>(lo));
    // Past the largest finite value the next "neighbour" is where infinity begins: one ulp more.
    const double b = std::isinf(decode(hi)) ? a + (a - decode(static_cast<uint16_t>(lo - 1))) : decode(hi);
    const auto mid = static_cast<float>((a + b) / 2);
    ASSERT_EQ(static_cast<double>(mid), (a + b) / 2) << "midpoint not exact at " << lo;
    const uint16_t even = (lo & 1) ? hi : static_cast<uint16_t>(lo);
    ASSERT_EQ(encode(mid), even) << std::hex << "tie above " << lo;
    ASSERT_EQ(encode(-mid), even | 0x8000) << std::hex << "negative tie above " << lo;
    ASSERT_EQ(encode(std::nextafter(mid, 0.0f)), lo) << std::hex << "just below the tie above " << lo;
    ASSERT_EQ(encode(std::nextafter(mid, HUGE_VALF)), hi) << std::hex << "just above the tie above " << lo;
  }
}

TEST(DType, F16RoundsToNearestEvenEverywhere) {
  check_ties(0x7bff, ref_f16, f32_to_f16);
}

TEST(DType, Bf16RoundsToNearestEvenEverywhere) {
  check_ties(0x7f7f, ref_bf16, f32_to_bf16);
}

TEST(DType, RoundingExamples) {
  // f16 ulp at 1 is 2^-10.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie, down to even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, up to even
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // tie between 65504 and 2^16: even is infinity
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  // bf16 ulp at 1 is 2^-7.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to infinity
}

TEST(DType, Subnormals) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest f16 subnormal
  EXPECT_EQ(f32_to_f16(tiny), 0x0001);
  EXPECT_EQ(f16_to_f32(0x0001), tiny);
  EXPECT_EQ(f32_to_f16(tiny / 2), 0x0000);  // tie with zero: even
  EXPECT_EQ(f32_to_f16(-tiny / 2), 0x8000);
  EXPECT_EQ(f32_to_f16(tiny * 0.75f), 0x0001);
  EXPECT_EQ(f32_to_f16(tiny * 1.5f), 0x0002);  // tie between 1 and 2: even
  EXPECT_EQ(f32_to_f16(tiny * 1023), 0x03ff);  // largest subnormal
  EXPECT_EQ(f32_to_f16(tiny * 1023.5f), 0x0400);  // rounds up into the normals
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  // bf16 shares f32's exponent range, so f32 subnormals survive when their low bits are zero.
  EXPECT_EQ(f32_to_bf16(float_of(0x00010000u)), 0x0001);
  EXPECT_EQ(bf16_to_f32(0x0001), float_of(0x00010000u));
  EXPECT_EQ(f32_to_bf16(float_of(0x00008000u)), 0x0000);  // tie: even
  EXPECT_EQ(f32_to_bf16(float_of(0x00018000u)), 0x0002);  // tie: even
}

TEST(DType, InfinityAndNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(f32_to_f16(inf), 0x7c00);
  EXPECT_EQ(f32_to_f16(-inf), 0xfc00);
  EXPECT_EQ(f32_to_bf16(inf), 0x7f80);
  EXPECT_EQ(f32_to_bf16(-inf), 0xff80);
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isinf(bf16_to_f32(0xff80)));
  // NaNs whose payload sits only in the low bits must not collapse to infinity.
  for (uint32_t nan_bits : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f802000u}) {
    const float nan = float_of(nan_bits);
    const uint16_t h = f32_to_f16(nan);
    const uint16_t b = f32_to_bf16(nan);
    EXPECT_TRUE(std::isnan(f16_to_f32(h))) << std::hex << nan_bits;
    EXPECT_TRUE(std::isnan(bf16_to_f32(b))) << std::hex << nan_bits;
    EXPECT_EQ((h & 0x8000) != 0, (nan_bits >> 31) != 0);
    EXPECT_EQ((b & 0x8000) != 0, (nan_bits >> 31) != 0);
  }
}

TEST(DType, ArrayConversionsMatchScalarOnes) {
  std::vector<float> src;
  for (int i = -300; i <= 300; ++i) src.push_back(static_cast<float>(i) * 0.37f + 1e-3f * static_cast<float>(i * i));
  src.push_back(std::numeric_limits<float>::infinity());
  src.push_back(std::ldexp(1.0f, -20));
  const size_t n = src.size();

  std::vector<uint16_t> h(n), b(n);
  convert_from_f32(DType::F16, src.data(), h.data(), n);
  convert_from_f32(DType::BF16, src.data(), b.data(), n);
  std::vector<float> back_h(n), back_b(n), same(n);
  convert_to_f32(DType::F16, h.data(), back_h.data(), n);
  convert_to_f32(DType::BF16, b.data(), back_b.data(), n);
  convert_from_f32(DType::F32, src.data(), same.data(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(h[i], f32_to_f16(src[i]));
    EXPECT_EQ(b[i], f32_to_bf16(src[i]));
    EXPECT_EQ(bits_of(back_h[i]), bits_of(f16_to_f32(h[i])));
    EXPECT_EQ(bits_of(back_b[i]), bits_of(bf16_to_f32(b[i])));
    EXPECT_EQ(bits_of(same[i]), bits_of(src[i]));
  }

  const std::vector<double> d = {1.5, -2.25, 1e-3};
  std::vector<float> from_d(d.size());
  convert_to_f32(DType::F64, d.data(), from_d.data(), d.size());
  for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(from_d[i], static_cast<float>(d[i]));
}

TEST(DType, UnsupportedConversionsThrow) {
  int64_t ints[2] = {1, 2};
  float out[2];
  testing::expect_error([&] { convert_to_f32(DType::I64, ints, out, 2); }, {"I64"});
  EXPECT_THROW(convert_from_f32(DType::I32, out, ints, 2), Error);
}

TEST(DType, FindNonFiniteAgreesWithIsfiniteOnEveryHalfPattern) {
  // Every f16 and bf16 bit pattern, stored one byte off alignment, one pattern per array.
  std::vector<uint8_t> buf(1 + 2 * 3);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t pattern = static_cast<uint16_t>(h), one = 0x3c00, bf_one = 0x3f80;
    for (DType t : {DType::F16, DType::BF16}) {
      const uint16_t fine = t == DType::F16 ? one : bf_one;
      std::memcpy(buf.data() + 1, &fine, 2);
      std::memcpy(buf.data() + 3, &fine, 2);
      std::memcpy(buf.data() + 5, &pattern, 2);
      const bool finite = std::isfinite(t == DType::F16 ? ref_f16(pattern) : ref_bf16(pattern));
      ASSERT_EQ(find_non_finite(t, buf.data() + 1, 3), finite ? -1 : 2) << dtype_name(t) << " " << h;
    }
  }
}

TEST(DType, FindNonFiniteOnWideFloats) {
  const std::vector<float> f = {0.0f, -0.0f, std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                                -1.5f};
  EXPECT_EQ(find_non_finite(DType::F32, f.data(), f.size()), -1);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY, float_of(0x7f800001u)}) {
    std::vector<float> g = f;
    g[3] = bad;
    EXPECT_EQ(find_non_finite(DType::F32, g.data(), g.size()), 3) << bad;
    EXPECT_EQ(find_non_finite(DType::F32, g.data(), 3), -1);  // only the first n are looked at
  }
  std::vector<double> d = {1.0, std::numeric_limits<double>::max(), -HUGE_VAL};
  EXPECT_EQ(find_non_finite(DType::F64, d.data(), d.size()), 2);
  // Integer dtypes hold no NaN, whatever their bits.
  const int32_t ints[2] = {-1, 0x7f800000};
  EXPECT_EQ(find_non_finite(DType::I32, ints, 2), -1);
}

// Long arrays are scanned a block at a time: the first hit is found wherever it lies (each edge
// of a block, the last element, two hits in one block or in two), for every float dtype.
TEST(DType, FindNonFiniteReportsTheFirstHitInLongArrays) {
  const size_t n = 3001;
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    std::vector<float> ones(n, 1.0f);
    std::vector<uint8_t> bytes(n * dtype_size(t) + 1);
    auto scan = [&](const std::vector<float>& v) {
      convert_from_f32(t, v.data(), bytes.data() + 1, n);  // one byte off alignment
      return find_non_finite(t, bytes.data() + 1, n);
    };
    EXPECT_EQ(scan(ones), -1) << dtype_name(t);
    for (size_t at : {size_t{0}, size_t{511}, size_t{512}, size_t{1023}, size_t{1024}, size_t{2999}, n - 1}) {
      std::vector<float> v = ones;
      v[at] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_EQ(scan(v), static_cast<int64_t>(at)) << dtype_name(t) << " NaN at " << at;
      v[at] = -INFINITY;
      if (at + 7 < n) v[at + 7] = INFINITY;
      if (at >= 600) v[at - 600] = INFINITY;
      EXPECT_EQ(scan(v), static_cast<int64_t>(at >= 600 ? at - 600 : at)) << dtype_name(t) << " Inf at " << at;
    }
  }
}

// safetensors does not align tensor data: a 16-bit tensor after a header of odd length starts at
// an odd address. Converting from there gives what the aligned copy gives (and, under UBSan,
// performs no misaligned load).
TEST(DType, ConversionsReadFromAnyAddress) {
  const std::vector<float> values = {1.0f, -2.5f, 3.25f, 0.0f, 65504.0f, -0.125f, 1e-3f, 7.0f};
  for (DType t : {DType::BF16, DType::F16, DType::F64}) {
    const size_t size = dtype_size(t);
    std::vector<unsigned char> aligned(values.size() * size), shifted(values.size() * size + 1);
    if (t == DType::F64) {
      for (size_t i = 0; i < values.size(); ++i) {
        const double d = values[i];
        std::memcpy(aligned.data() + i * 8, &d, 8);
      }
    } else {
      convert_from_f32(t, values.data(), aligned.data(), values.size());
    }
    std::memcpy(shifted.data() + 1, aligned.data(), aligned.size());
    std::vector<float> want(values.size()), got(values.size());
    convert_to_f32(t, aligned.data(), want.data(), values.size());
    convert_to_f32(t, shifted.data() + 1, got.data(), values.size());
    EXPECT_EQ(got, want) << dtype_name(t);
    EXPECT_EQ(find_non_finite(t, shifted.data() + 1, values.size()), -1) << dtype_name(t);
  }
}

}  // namespace
}  // namespace tpdraft
