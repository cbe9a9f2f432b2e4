// `tpdraft`: init a random checkpoint, inspect one, draft from one, benchmark a geometry.
// Errors end here, once per job: usage errors from rank 0, failures the ranks agreed on from the
// rank that met them, and a fault on one rank while the others run ends the whole job.
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/job.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/launch.h"
#include "tpdraft/tpdraft.h"

namespace {

// The first word must name a command: CLI11 alone answers a typo ("tpdraft drfat") with "A
// subcommand is required", which does not say what was wrong.
void check_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return;
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == argv[1]) return;
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  throw CLI::ValidationError(std::string("unknown command '") + argv[1] + "'; the commands are " + names);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tpdraft::cli;
  namespace parallel = tpdraft::parallel;
  // The program says what it does (info); the library, inside a host's process, only what needs it.
  tpdraft::log::set_default_level(spdlog::level::info);
  CLI::App app{
      "tpdraft: DFlash / DFlash 2 block-diffusion drafters for speculative decoding, tensor-parallel.\n"
      "Start with `tpdraft init --config configs/tiny-dflash2.json --out ck --taps 64`, then\n"
      "`tpdraft draft --drafter ck/drafter --target ck/target --taps ck/taps.safetensors --anchor 1`."};
  app.set_version_flag("--version", "tpdraft " TPDRAFT_VERSION_STRING);
  app.footer(exit_status_help());
  app.require_subcommand(1);
  for (auto add : {add_init, add_info, add_draft, add_bench, add_serve, add_quantize, add_vocab, add_keys}) add(app);
  int status = kExitOk;
  try {
    parallel::launch(&argc, &argv);
    check_same_arguments(argc, argv);
    agree_on(*parallel::world(), kExitUsage, [] { tpdraft::log::check_environment(); });
    check_command(app, argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Every rank got the same command line, so rank 0 of the job speaks for all of them.
    const int code = tpdraft::log::rank() == 0 ? app.exit(e) : e.get_exit_code();
    status = code == 0 ? kExitOk : kExitUsage;
  } catch (const JobFailure& f) {
    status = f.status;  // reported by the rank that met it; every rank ends cleanly
  } catch (const tpdraft::InputError& e) {
    // Bad input met while working (a weight row read by a draft). Alone, that is the input
    // status; under mpirun the peers may wait in a collective, so the job ends as below.
    if (!parallel::multi_process()) {
      TPDRAFT_LOG_ERROR("{}", e.what());
      return kExitInput;
    }
    parallel::abort_job(e.what());
    return kExitRuntime;
  } catch (const std::exception& e) {
    // Under mpirun the peers may sit in a collective: end the whole job now (the abort reports
    // the error with this rank).
    if (!parallel::multi_process()) TPDRAFT_LOG_ERROR("{}", e.what());
    parallel::abort_job(e.what());
    return kExitRuntime;
  }
  parallel::finish();
  return status;
}
