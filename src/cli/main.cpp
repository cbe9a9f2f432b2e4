// `tpdraft`: init a random checkpoint, inspect one, draft from one, benchmark a geometry.
// Errors end here: logged with the rank, exit status 1.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/ranks.h"
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
  int status = 0;
  try {
    tpdraft::log::check_environment();
    tpdraft::cli::init_launch(&argc, &argv);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    status = app.exit(e);
  } catch (const std::exception& e) {
    TPDRAFT_LOG_ERROR("{}", e.what());
    // Under mpirun the peers may sit in a collective: end the whole job now.
    tpdraft::cli::abort_launch(e.what());
    return 1;
  }
  tpdraft::cli::finish_launch();
  return status;
}
