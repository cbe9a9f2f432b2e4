// `tpdraft init`: a random-weight checkpoint in the real format, for any config. Everything is
// checked before anything is written, and the checkpoint appears at --out whole or not at all.
#include <string>

#include "cli/commands.h"
#include "cli/job.h"
#include "cli/options.h"
#include "model/config.h"
#include "model/random_checkpoint.h"

namespace tpdraft::cli {

void add_init(CLI::App& app) {
  struct Opts {
    std::string config, out, dtype = "bf16";
    int64_t taps = 0;
    model::RandomCheckpointOptions random;  // --seed, --target-vocab and --tie; dtype from --dtype
  };
  auto opts = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "init", "Write a random-weight checkpoint: OUT/drafter (config.json + model.safetensors), OUT/target "
              "(embedding + head) and, with --taps, OUT/taps.safetensors");
  cmd->add_option("--config", opts->config, "Drafter config.json (HF format), e.g. configs/tiny-dflash2.json")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", opts->out,
                  "Output directory. Written beside it under a temporary name, then renamed into place. An existing "
                  "one is replaced only when empty or holding an earlier checkpoint (drafter/, target/ with "
                  "config.json and *.safetensors, taps.safetensors; nothing else); anything else is refused")
      ->required();
  cmd->add_option("--seed", opts->random.seed, "Seed; the same seed gives the same bytes")
      ->capture_default_str()
      ->check(seed_number());
  cmd->add_option("--dtype", opts->dtype, "Weight dtype")->check(CLI::IsMember({"bf16", "f16", "f32"}))->capture_default_str();
  cmd->add_option("--taps", opts->taps, "Also write N random tap rows [N, T*H] to OUT/taps.safetensors")
      ->check(whole_number(0));
  cmd->add_option("--target-vocab", opts->random.target_vocab,
                  "Rows of the target tables (>= vocab_size, at most the vocab_size bound; 0: vocab_size)")
      ->check(whole_number(0, model::size_limit("vocab_size")));
  cmd->add_flag("--tie", opts->random.tie_embeddings, "Tie the target head to its embedding (no lm_head.weight)");
  cmd->callback([opts] {
    run_alone([&] {
      const model::DrafterConfig cfg = model::DrafterConfig::from_file(opts->config);
      opts->random.dtype = weight_dtype(opts->dtype);
      model::write_random_checkpoint(cfg, opts->out, opts->random, opts->taps);
    });
  });
}

}  // namespace tpdraft::cli
