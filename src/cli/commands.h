// The `tpdraft` subcommands; each file registers one with CLI11 and runs it through the library.
#pragma once

#include <CLI/CLI.hpp>

namespace tpdraft::cli {

void add_init(CLI::App& app);
void add_info(CLI::App& app);
void add_draft(CLI::App& app);
void add_bench(CLI::App& app);
void add_serve(CLI::App& app);
void add_quantize(CLI::App& app);
void add_vocab(CLI::App& app);
void add_keys(CLI::App& app);

}  // namespace tpdraft::cli
