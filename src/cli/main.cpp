// `tpdraft`: init a random checkpoint, inspect one, draft from one, benchmark a geometry.
// Errors end here: logged with the rank, exit status 1.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

int main(int argc, char** argv) {
  CLI::App app{
      "tpdraft: DFlash / DFlash 2 block-diffusion drafters for speculative decoding, tensor-parallel.\n"
      "Start with `tpdraft init --config configs/tiny-dflash2.json --out /tmp/ck --taps 64`, then\n"
      "`tpdraft draft --drafter /tmp/ck/drafter --target /tmp/ck/target --taps /tmp/ck/taps.safetensors --anchor 1`."};
  app.require_subcommand(1);
  tpdraft::cli::add_init(app);
  tpdraft::cli::add_info(app);
  tpdraft::cli::add_draft(app);
  tpdraft::cli::add_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tpdraft::Error& e) {
    TPDRAFT_LOG_ERROR("{}", e.what());
    return 1;
  } catch (const std::exception& e) {
    TPDRAFT_LOG_ERROR("unexpected error: {}", e.what());
    return 1;
  }
  return 0;
}
