// Overflow-checked arithmetic for every size that comes from a file or an option: products of
// dimensions, byte counts, sums of positions, doubles read as integers. A result that does not
// fit is an Error naming what was being computed, never a wrapped value that later reads past a
// buffer. The description is a format string, formatted only when the check fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace tpdraft {

namespace detail {
// Out of line so that the checks stay small where they are used.
[[noreturn]] void fail_mul(const std::string& what, int64_t a, int64_t b);
[[noreturn]] void fail_add(const std::string& what, int64_t a, int64_t b);
// A negative dimension, else an element count (elem_size 0) or byte count that overflows.
[[noreturn]] void fail_shape(const std::string& what, const std::vector<int64_t>& shape,
                             size_t elem_size);
[[noreturn]] void fail_to_int64(const std::string& what, double v);
bool numel_fits(const std::vector<int64_t>& shape, int64_t* out);  // false: negative or overflow
}  // namespace detail

// a * b; throws naming `what` when the product does not fit in int64.
template <typename... Args>
int64_t checked_mul(int64_t a, int64_t b, fmt::format_string<Args...> what, Args&&... args) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) detail::fail_mul(fmt::format(what, std::forward<Args>(args)...), a, b);
  return r;
}

// a + b; throws naming `what` when the sum does not fit in int64.
template <typename... Args>
int64_t checked_add(int64_t a, int64_t b, fmt::format_string<Args...> what, Args&&... args) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) detail::fail_add(fmt::format(what, std::forward<Args>(args)...), a, b);
  return r;
}

// The element count of a shape (1 for a scalar); throws on a negative dimension or overflow.
template <typename... Args>
int64_t checked_numel(const std::vector<int64_t>& shape, fmt::format_string<Args...> what, Args&&... args) {
  int64_t n = 0;
  if (!detail::numel_fits(shape, &n))
    detail::fail_shape(fmt::format(what, std::forward<Args>(args)...), shape, 0);
  return n;
}

// The bytes of a shape of elements of `elem_size` bytes; throws when they do not fit in int64.
template <typename... Args>
size_t checked_bytes(const std::vector<int64_t>& shape, size_t elem_size, fmt::format_string<Args...> what,
                     Args&&... args) {
  int64_t n = 0, bytes = 0;
  if (!detail::numel_fits(shape, &n) || __builtin_mul_overflow(n, static_cast<int64_t>(elem_size), &bytes))
    detail::fail_shape(fmt::format(what, std::forward<Args>(args)...), shape, elem_size);
  return static_cast<size_t>(bytes);
}

// v as an int64 when it is an integer inside the int64 range; throws otherwise (NaN, inf, 1e30,
// 2.5). Messages print v in its shortest form (1e+30), never hundreds of digits.
template <typename... Args>
int64_t checked_to_int64(double v, fmt::format_string<Args...> what, Args&&... args) {
  // [-2^63, 2^63): both bounds are exact doubles; NaN fails both comparisons.
  constexpr double kLimit = 9223372036854775808.0;
  if (!(v >= -kLimit && v < kLimit) || static_cast<double>(static_cast<int64_t>(v)) != v)
    detail::fail_to_int64(fmt::format(what, std::forward<Args>(args)...), v);
  return static_cast<int64_t>(v);
}

// "[4096, 2048]", for messages.
std::string shape_string(const std::vector<int64_t>& shape);

// This machine's physical memory in bytes; 0 when unknown (checks against it are then skipped).
uint64_t machine_memory();
// bytes in GiB, for messages.
double gib(uint64_t bytes);

}  // namespace tpdraft
