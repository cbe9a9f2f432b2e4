// Numeric option validators and the sampling options (options.h).
#include "cli/options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>

#include <fmt/format.h>

namespace tpdraft::cli {

namespace {
std::string bound_text(long long lo, long long hi) {
  if (hi == std::numeric_limits<long long>::max()) return fmt::format("at least {}", lo);
  return fmt::format("in {}..{}", lo, hi);
}
std::string bound_text(double lo, double hi) {
  if (hi == std::numeric_limits<double>::max()) return fmt::format("at least {}", lo);
  return fmt::format("in [{}, {}]", lo, hi);
}

// A finite number that `in_range` takes; `bound` says which.
CLI::Validator finite_number(const std::string& bound, const std::function<bool(double)>& in_range) {
  return CLI::Validator(
      [bound, in_range](std::string& value) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || !std::isfinite(v)) return "expected a number, got '" + value + "'";
        if (!in_range(v)) return "must be " + bound + ", got " + value;
        return std::string();
      },
      bound);
}
}  // namespace

CLI::Validator whole_number(long long lo, long long hi, const std::string& why) {
  const std::string bound = bound_text(lo, hi) + (why.empty() ? "" : " (" + why + ")");
  return CLI::Validator(
      [lo, hi, bound](std::string& value) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || errno == ERANGE) return "expected a whole number, got '" + value + "'";
        if (v < lo || v > hi) return "must be " + bound + ", got " + value;
        return std::string();
      },
      bound);
}

CLI::Validator real_number(double lo, double hi) {
  return finite_number(bound_text(lo, hi), [lo, hi](double v) { return v >= lo && v <= hi; });
}

CLI::Validator seed_number() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        errno = 0;
        char* end = nullptr;
        const bool digits = !value.empty() && value.find_first_not_of("0123456789") == std::string::npos;
        if (digits) std::strtoull(value.c_str(), &end, 10);
        if (!digits || *end != '\0' || errno == ERANGE)
          return "expected a whole number in 0..18446744073709551615, got '" + value + "'";
        return std::string();
      },
      "0..2^64-1");
}

void add_sampling_options(CLI::App* cmd, model::SamplingParams* s) {
  cmd->add_option("--temperature", s->temperature, "0: greedy; > 0: seeded sampling")->check(real_number(0));
  cmd->add_option("--top-k", s->top_k, "Keep the k best tokens before sampling (DFlash only)")->check(whole_number(0));
  cmd->add_option("--top-p", s->top_p, "Nucleus mass to keep before sampling (DFlash only)")
      ->check(finite_number("in (0, 1]", [](double v) { return v > 0 && v <= 1; }));
}

DType weight_dtype(const std::string& name) {
  if (name == "bf16") return DType::BF16;
  return name == "f16" ? DType::F16 : DType::F32;
}

}  // namespace tpdraft::cli
