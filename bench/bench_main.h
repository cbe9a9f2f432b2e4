// The main of the C++ benches: their options parsed as CLI11 does (--help, or a bad option's
// message and status), then the run; an exception ends it with "NAME: message" and status 1.
#pragma once

#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

template <typename Run>
int bench_main(CLI::App& app, int argc, char** argv, Run&& run) {
  CLI11_PARSE(app, argc, argv);
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", app.get_name().c_str(), e.what());
    return 1;
  }
}
