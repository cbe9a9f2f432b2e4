// A half-open range [begin, end) of rows, columns, heads or positions: the share of a dimension
// one rank holds, or one reader takes from a tensor.
#pragma once

#include <cstdint>

namespace tpdraft {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

}  // namespace tpdraft
