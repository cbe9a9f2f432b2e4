// Range checks for integer options. CLI11's NonNegativeNumber prints its upper bound, the largest
// double, with all of its 309 digits; these print the bounds that apply, as integers.
#pragma once

#include <charconv>
#include <cstdint>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace tpdraft::cli {

// Accepts integers in [lo, hi]; the message names the value and the bound it breaks.
inline CLI::Validator integer_in(int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max()) {
  const bool open_above = hi == std::numeric_limits<int64_t>::max();
  const std::string desc = open_above ? fmt::format("INT >= {}", lo) : fmt::format("INT in [{}, {}]", lo, hi);
  return CLI::Validator(
      [lo, hi, open_above](std::string& text) -> std::string {
        // from_chars, unlike strtoll behind CLI11's conversion, reports values past int64
        // instead of saturating them.
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (ec != std::errc() || ptr != end || text.empty())
          return fmt::format("'{}' is not a 64-bit integer", text);
        if (v < lo) return fmt::format("{} is below the minimum {}", v, lo);
        if (v > hi && !open_above) return fmt::format("{} is above the maximum {}", v, hi);
        return std::string();
      },
      desc);
}

}  // namespace tpdraft::cli
