// `tpdraft vocab`: a token map from a tokenized corpus: the N most frequent target ids (and every
// id of --keep), written as the JSON list --token-map reads, with the share of the corpus it covers.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/config.h"
#include "cli/commands.h"
#include "cli/job.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/log.h"
#include "model/draft_vocab.h"

namespace tpdraft::cli {

namespace {

struct VocabOpts {
  std::vector<std::string> corpus;
  std::string drafter, out;
  int64_t vocab = 0, size = 0;
  std::vector<int64_t> keep;
};

void run_vocab(const VocabOpts& o) {
  TPDRAFT_CHECK((o.vocab > 0) != !o.drafter.empty(), "vocab: give --vocab-size V or --drafter DIR (its vocab_size), "
                "not both");
  const int64_t V = o.vocab > 0 ? o.vocab : model::DrafterConfig::from_file(o.drafter + "/config.json").vocab;
  TPDRAFT_CHECK(o.size <= V, "vocab: --size {} is above the vocabulary's {} ids", o.size, V);
  for (int64_t id : o.keep) TPDRAFT_CHECK(id < V, "vocab: --keep {} lies outside the vocabulary [0, {})", id, V);
  std::vector<uint64_t> counts(static_cast<size_t>(V), 0);
  uint64_t total = 0;
  for (const std::string& path : o.corpus) {
    total += model::count_corpus_tokens(path, counts, [&](uint64_t n) {
      TPDRAFT_LOG_INFO("{}: {:.1f} M tokens read", path, static_cast<double>(total + n) / 1e6);
    });
  }
  TPDRAFT_CHECK(total > 0, "vocab: the corpus holds no token id");
  const std::vector<int64_t> ids = model::most_frequent(counts, o.size, o.keep);
  uint64_t covered = 0, distinct = 0;
  for (int64_t id : ids) covered += counts[static_cast<size_t>(id)];
  for (uint64_t c : counts) distinct += c > 0 ? 1 : 0;
  model::write_token_map(o.out, ids);
  fmt::print("wrote {}: {} target ids ({} kept by --keep) of {}; they cover {:.2f}% of the corpus's {} tokens ({} "
             "distinct ids seen)\n",
             o.out, ids.size(), o.keep.size(), V, 100.0 * static_cast<double>(covered) / static_cast<double>(total),
             total, distinct);
  if (static_cast<int64_t>(ids.size()) < o.size)
    std::printf("note: the corpus holds fewer distinct ids than --size %lld; the map lists only those seen\n",
                static_cast<long long>(o.size));
}

}  // namespace

void add_vocab(CLI::App& app) {
  auto o = std::make_shared<VocabOpts>();
  CLI::App* cmd = app.add_subcommand(
      "vocab", "Build a token map (a draft vocabulary for --token-map) from a tokenized corpus: the N most frequent "
               "target ids plus every --keep id, as a JSON list; prints how much of the corpus it covers");
  cmd->add_option("--corpus", o->corpus, "Token ids of a corpus tokenized with the target's tokenizer: text (integers "
                  "separated by whitespace, commas or brackets) or safetensors (every integer tensor); repeatable")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--size", o->size, "Ids in the map (N), --keep ids included")
      ->required()
      ->check(whole_number(1, model::size_limit("vocab_size")));
  cmd->add_option("--vocab-size", o->vocab, "The target's vocabulary size V (ids must lie below it)")
      ->check(whole_number(1, model::size_limit("vocab_size")));
  cmd->add_option("--drafter", o->drafter, "Take V from this drafter's config.json instead")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--keep", o->keep, "Ids the map always holds (EOS, special tokens), comma separated or repeated")
      ->delimiter(',')
      ->check(whole_number(0));
  cmd->add_option("--out", o->out, "The token map to write (JSON)")->required();
  cmd->callback([o] { run_alone([&] { run_vocab(*o); }); });
}

}  // namespace tpdraft::cli
