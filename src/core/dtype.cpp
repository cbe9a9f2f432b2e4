// dtype names, sizes and conversions (the scalar paths; kernels carry their own SIMD ones).
#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace tpdraft {

namespace {
struct DTypeRow {
  DType type;
  const char* name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2}, {DType::BF16, "BF16", 2},
    {DType::I64, "I64", 8}, {DType::I32, "I32", 4}, {DType::I16, "I16", 2}, {DType::I8, "I8", 1},
    {DType::U8, "U8", 1},   {DType::BOOL, "BOOL", 1}, {DType::F8E4M3, "F8_E4M3", 1},
};
}  // namespace

size_t dtype_size(DType t) {
  for (const auto& r : kDTypes)
    if (r.type == t) return r.size;
  TPDRAFT_FAIL("unknown dtype code {}", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  for (const auto& r : kDTypes)
    if (r.type == t) return r.name;
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  for (const auto& r : kDTypes) {
    if (s == r.name) {
      *out = r.type;
      return true;
    }
  }
  return false;
}

float f8e4m3_to_f32(uint8_t v) {
  const float sign = (v & 0x80u) ? -1.0f : 1.0f;
  const int exp = (v >> 3) & 0xf;
  const int man = v & 0x7;
  if (exp == 0xf && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  // Subnormals: man * 2^-9; normals: (1 + man / 8) * 2^(exp - 7).
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -9);
  return sign * std::ldexp(static_cast<float>(8 + man), exp - 10);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in f32
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign != 0 ? -v : v;
  }
  // Infinity and NaN (exponent all ones) keep their mantissa; normals are rebiased.
  return bit_cast<float>(sign | ((exp == 31 ? 0xffu : exp + 127 - 15) << 23) | (man << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow (rounds to inf)
  if (abs < 0x38800000u) {  // subnormal or zero in f16
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t exp = abs >> 23;
    const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (112 - exp)
    uint32_t half = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t v = abs - (112u << 23);  // rebias exponent
  const uint32_t rem = v & 0x1fffu;
  uint32_t half = v >> 13;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

namespace {
// Element i of an array that may sit at any address (loaded or stored): safetensors does not align tensor data (a
// header of odd length puts every 16-bit tensor after it at an odd address). The compiler turns
// the copy into a plain unaligned load.
template <typename T>
T load(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const std::byte*>(p) + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void store(void* p, size_t i, T v) {
  std::memcpy(static_cast<std::byte*>(p) + i * sizeof(T), &v, sizeof(T));
}
}  // namespace

void convert_to_f32(DType src_type, const void* src, float* dst, size_t n) {
  switch (src_type) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load<uint16_t>(src, i));
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load<uint16_t>(src, i));
      return;
    case DType::F64:
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(load<double>(src, i));
      return;
    case DType::F8E4M3:
      for (size_t i = 0; i < n; ++i) dst[i] = f8e4m3_to_f32(load<uint8_t>(src, i));
      return;
    default:
      TPDRAFT_FAIL("cannot convert dtype {} to F32 (expected F32, F16, BF16, F8_E4M3 or F64)", dtype_name(src_type));
  }
}

void convert_from_f32(DType dst_type, const float* src, void* dst, size_t n) {
  switch (dst_type) {
    case DType::F32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) store<uint16_t>(dst, i, f32_to_bf16(src[i]));
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) store<uint16_t>(dst, i, f32_to_f16(src[i]));
      return;
    default:
      TPDRAFT_FAIL("cannot convert F32 to dtype {} (expected F32, F16 or BF16)", dtype_name(dst_type));
  }
}

namespace {
// Whether a float's biased exponent (its bits under `mask`) is at least `least`: all ones (the
// mask itself) is NaN or infinity; a smaller threshold also takes every magnitude from a power of 2.
template <typename Bits>
bool exponent_at_least(const std::byte* p, size_t i, Bits mask, Bits least) {
  return (load<Bits>(p, i) & mask) >= least;
}

// Blocks are scanned without a branch per element, which the compiler vectorises (taps are
// checked on every step: 40k floats of a large drafter took ~10 us element by element); only a
// block holding a hit is searched for the first one.
template <typename Bits>
int64_t first_exponent_at_least(const std::byte* p, size_t n, Bits mask, Bits least) {
  constexpr size_t kBlock = 512;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = std::min(n, begin + kBlock);
    unsigned hits = 0;
    for (size_t i = begin; i < end; ++i) hits |= exponent_at_least(p, i, mask, least) ? 1u : 0u;
    if (hits == 0) continue;
    for (size_t i = begin; i < end; ++i)
      if (exponent_at_least(p, i, mask, least)) return static_cast<int64_t>(i);
  }
  return -1;
}

// The biased exponent field of 2^log2 in a format with `bias` and the exponent at bit `shift`,
// capped at the all-ones field `mask` (a bound past the format's range: only non-finite values).
template <typename Bits>
Bits exponent_field(int log2, int bias, int shift, Bits mask) {
  const int64_t biased = static_cast<int64_t>(bias) + log2;
  const int64_t all_ones = static_cast<int64_t>(mask >> shift);
  return static_cast<Bits>(std::max<int64_t>(1, std::min(biased, all_ones)) << shift);
}
}  // namespace

int64_t find_out_of_range(DType t, const void* p, size_t n, int log2_bound) {
  const auto* bytes = static_cast<const std::byte*>(p);
  switch (t) {
    case DType::F64: return first_exponent_at_least<uint64_t>(bytes, n, 0x7ff0000000000000ull, 0x7ff0000000000000ull);
    case DType::F32:
      return first_exponent_at_least<uint32_t>(bytes, n, 0x7f800000u, exponent_field<uint32_t>(log2_bound, 127, 23, 0x7f800000u));
    case DType::BF16:
      return first_exponent_at_least<uint16_t>(bytes, n, 0x7f80u, exponent_field<uint16_t>(log2_bound, 127, 7, 0x7f80u));
    case DType::F16:
      return first_exponent_at_least<uint16_t>(bytes, n, 0x7c00u, exponent_field<uint16_t>(log2_bound, 15, 10, 0x7c00u));
    case DType::F8E4M3: return first_exponent_at_least<uint8_t>(bytes, n, 0x7f, 0x7f);  // only NaN: no infinities
    default: return -1;
  }
}

// A bound past every format's range: exponent_field caps it at all ones, so only non-finite values count.
int64_t find_non_finite(DType t, const void* p, size_t n) {
  return find_out_of_range(t, p, n, std::numeric_limits<int>::max());
}

}  // namespace tpdraft
