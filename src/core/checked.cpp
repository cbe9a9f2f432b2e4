// The failure side of core/checked.h: one message per kind of overflow, each naming what was
// being computed and the operands, so a user can see which key or tensor made the size.
#include "core/checked.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/ranges.h>

#include "core/error.h"

namespace tpdraft {

std::string shape_string(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

namespace detail {

void fail_mul(const std::string& what, int64_t a, int64_t b) {
  TPDRAFT_FAIL("{}: {} x {} overflows a 64-bit integer", what, a, b);
}

void fail_add(const std::string& what, int64_t a, int64_t b) {
  TPDRAFT_FAIL("{}: {} + {} overflows a 64-bit integer", what, a, b);
}

void fail_shape(const std::string& what, const std::vector<int64_t>& shape, size_t elem_size) {
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; }))
    TPDRAFT_FAIL("{}: shape {} has a negative dimension", what, shape_string(shape));
  if (elem_size == 0)
    TPDRAFT_FAIL("{}: shape {} overflows: its element count does not fit in a 64-bit integer", what,
                 shape_string(shape));
  TPDRAFT_FAIL("{}: shape {} of {}-byte elements overflows: its byte count does not fit in a 64-bit integer", what,
               shape_string(shape), elem_size);
}

void fail_to_int64(const std::string& what, double v) {
  TPDRAFT_FAIL("{}: {} is not an integer in the 64-bit range", what, v);
}

bool numel_fits(const std::vector<int64_t>& shape, int64_t* out) {
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) return false;
  // A zero dimension makes the count exactly 0, however large the others are: starting from 0,
  // no product overflows.
  int64_t n = std::find(shape.begin(), shape.end(), 0) == shape.end() ? 1 : 0;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return false;
  *out = n;
  return true;
}

}  // namespace detail

uint64_t machine_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

double gib(uint64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(uint64_t{1} << 30); }

}  // namespace tpdraft
