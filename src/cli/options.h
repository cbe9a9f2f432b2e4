// Validators for numeric options whose errors a user can read: the bound is written as given
// (CLI11's own NonNegativeNumber prints the largest double, 309 digits), and a note may say why;
// and the sampling options draft and bench share.
#pragma once

#include <limits>
#include <string>

#include <CLI/CLI.hpp>

#include "core/dtype.h"
#include "model/selection.h"

namespace tpdraft::cli {

// A whole number in [lo, hi]; `why` (may be empty) explains the bound in the error.
CLI::Validator whole_number(long long lo, long long hi = std::numeric_limits<long long>::max(),
                            const std::string& why = "");
// A finite number in [lo, hi].
CLI::Validator real_number(double lo, double hi = std::numeric_limits<double>::max());
// A seed: a whole number in 0..2^64 - 1 (written without a sign; "-1" is not 2^64 - 1).
CLI::Validator seed_number();

// --temperature, --top-k and --top-p into `s` (each command says what seeds the noise).
void add_sampling_options(CLI::App* cmd, model::SamplingParams* s);

// The dtype a --dtype option names (bf16, f16 or f32: its choices).
DType weight_dtype(const std::string& name);

}  // namespace tpdraft::cli
