// `tpdraft init`: a random-weight checkpoint in the real format, for any config. Everything is
// checked before anything is written, and the checkpoint appears at --out whole or not at all.
#include <string>

#include "checkpoint/config.h"
#include "cli/commands.h"
#include "cli/job.h"
#include "cli/options.h"
#include "core/error.h"
#include "tools/random_checkpoint.h"

namespace tpdraft::cli {

void add_init(CLI::App& app) {
  struct Opts {
    std::string config, out, dtype = "bf16", layout = "dflash";
    int64_t taps = 0, draft_vocab = 0;
    bool target_embedding = false;
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
  cmd->add_option("--layout", opts->layout,
                  "Checkpoint layout: dflash (z-lab's: the target's embedding and head) or speculators (a DFlash "
                  "drafter in the speculators format, with its own embedding and, with --draft-vocab, its own head "
                  "and d2t / t2d map)")
      ->check(CLI::IsMember({"dflash", "speculators"}))
      ->capture_default_str();
  cmd->add_option("--draft-vocab", opts->draft_vocab,
                  "With --layout speculators: a draft vocabulary of N random target ids (< vocab_size)")
      ->check(whole_number(1, model::size_limit("vocab_size")));
  cmd->add_flag("--target-embedding", opts->target_embedding,
                "With --layout speculators: ship no embedding, so that the target's is read");
  cmd->callback([opts] {
    run_alone([&] {
      model::DrafterConfig cfg = model::DrafterConfig::from_file(opts->config);
      const bool spec = opts->layout == "speculators";
      TPDRAFT_CHECK(spec || (opts->draft_vocab == 0 && !opts->target_embedding),
                    "init: --draft-vocab and --target-embedding go with --layout speculators");
      if (spec) {
        cfg.layout = model::Layout::Speculators;
        if (cfg.arch_name == "DFlashDraftModel") cfg.arch_name = "DFlashSpeculator";
        TPDRAFT_CHECK(opts->draft_vocab < cfg.vocab, "init: --draft-vocab {} must be below vocab_size {} (a draft "
                      "vocabulary is a part of the target's)", opts->draft_vocab, cfg.vocab);
        cfg.draft_vocab = opts->draft_vocab;
        cfg.validate(opts->config + " as a speculators config");
        opts->random.own_embedding = !opts->target_embedding;
      }
      opts->random.dtype = weight_dtype(opts->dtype);
      model::write_random_checkpoint(cfg, opts->out, opts->random, opts->taps);
    });
  });
}

}  // namespace tpdraft::cli
