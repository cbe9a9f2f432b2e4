// Element types met in checkpoints and the exact conversions between the 16-bit floats and f32.
// Weights stay in their checkpoint dtype in memory; kernels widen them to f32 as they stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace tpdraft {

// F8E4M3: the OCP 8-bit float ("F8_E4M3" in safetensors: 4 exponent bits, 3 mantissa bits, no
// infinities; S.1111.111 is NaN), met in FP8-quantized checkpoints.
enum class DType : uint8_t { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8E4M3 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
// Parses a safetensors dtype string; returns false for an unknown one.
bool parse_dtype(const std::string& s, DType* out);
inline bool is_float_weight(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// The bits of `from` read as a To of the same size (std::bit_cast, which C++17 lacks).
template <typename To, typename From>
To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

inline float bf16_to_f32(uint16_t h) { return bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
// Exact: every e4m3 value is an f32. The NaN code (exponent and mantissa all ones) gives NaN.
float f8e4m3_to_f32(uint8_t v);
uint16_t f32_to_f16(float f);

// Converts n elements of type `src_type` at src (no alignment needed) to f32 at dst.
void convert_to_f32(DType src_type, const void* src, float* dst, size_t n);
// Converts n f32 values to `dst_type` (F32, F16 or BF16) at dst (no alignment needed).
void convert_from_f32(DType dst_type, const float* src, void* dst, size_t n);

// Index of the first NaN or infinity among n elements of type t at p (no alignment needed), or
// -1 when every one is finite. Integer dtypes have none.
int64_t find_non_finite(DType t, const void* p, size_t n);
// The same, and also the first element of magnitude 2^log2_bound or more (F32, BF16, F16; other
// dtypes: non-finite values only).
int64_t find_out_of_range(DType t, const void* p, size_t n, int log2_bound);

}  // namespace tpdraft
