// Draft vocabularies through the `tpdraft` program: a speculators checkpoint (init --layout
// speculators) and a token map made by `tpdraft vocab` from a corpus, drafted with --dump at tp 1
// and 2 and compared with the float64 reference over the same vocabulary; `tpdraft vocab`'s map
// and coverage against a count made here; `info` and `bench` counting the draft head.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "core/files.h"
#include "model/draft_vocab.h"
#include "reference/reference.h"
#include "support/test_support.h"

namespace tpdraft {
namespace {

using Result = testing::CommandResult;

Result run(const std::string& args) { return testing::run_command(std::string(TPDRAFT_BIN) + " " + args); }

using testing::json_line;

std::string config(const std::string& name) { return testing::source_path("configs/" + name); }

std::vector<int64_t> ints(const model::TensorInfo& t) {
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  std::memcpy(out.data(), t.data, out.size() * sizeof(int64_t));
  return out;
}

// `tpdraft draft --dump` of CK (settling all its taps, anchor 19) at tp, with `extra` options,
// against the reference over the draft vocabulary `ids` (`token_map`: the reference's map).
void check_draft(const std::string& ck, const testing::TempDir& dir, int tp, const std::string& extra,
                 const std::vector<int64_t>& ids, const std::vector<int64_t>& token_map, const std::string& sampling,
                 const reference::RefSampling& rs) {
  SCOPED_TRACE("tp " + std::to_string(tp) + " " + extra + " " + sampling);
  const std::string dump = dir.file("dump" + std::to_string(tp) + ".safetensors");
  Result draft = run("draft --drafter " + ck + "/drafter --target " + ck + "/target --taps " + ck +
                     "/taps.safetensors --anchor 19 --threads 1 --tp " + std::to_string(tp) + " " + extra + " " +
                     sampling + " --dump " + dump);
  ASSERT_EQ(draft.status, 0) << draft.out;
  const reference::RefModel ref(ck + "/drafter", ck + "/target", token_map);
  const auto taps = model::TensorStore::open(ck + "/taps.safetensors");
  reference::RefContext ctx;
  ref.settle(ctx, 0, model::to_f64(*taps->find("taps")), taps->find("taps")->shape[0]);
  const reference::RefDraft want = ref.draft(ctx, 19, rs);

  const auto got = model::TensorStore::open(dump);
  const int64_t B = ref.config().block, V = ref.config().vocab, N = static_cast<int64_t>(ids.size());
  const model::TensorInfo* logit_ids = got->find("logit_ids");
  ASSERT_NE(logit_ids, nullptr);
  EXPECT_EQ(ints(*logit_ids), ids);
  std::vector<double> columns;
  for (int64_t r = 0; r < B - 1; ++r)
    for (int64_t id : ids) columns.push_back(want.logits[static_cast<size_t>(r * V + id)]);
  EXPECT_LT(testing::relative_error(model::to_f32(got->require("logits", {B - 1, N})), columns), 2e-3);
  EXPECT_EQ(ints(*got->find("tokens")), want.tokens);
  const auto json = nlohmann::json::parse(json_line(draft.out));
  EXPECT_EQ(json["tokens"].get<std::vector<int64_t>>(), want.tokens);
  for (int64_t t : want.tokens) EXPECT_TRUE(std::binary_search(ids.begin(), ids.end(), t)) << t;
}

TEST(CliVocab, SpeculatorsCheckpointDraftsAsTheReference) {
  testing::TempDir dir;
  const std::string ck = dir.file("ck");
  Result made = run("init --config " + config("tiny-dflash.json") + " --out " + ck +
                    " --seed 5 --taps 33 --layout speculators --draft-vocab 90");
  ASSERT_EQ(made.status, 0) << made.out;
  const auto drafter = model::TensorStore::open(ck + "/drafter");
  std::vector<int64_t> ids;
  const std::vector<int64_t> d2t = ints(*drafter->find("d2t"));
  for (size_t i = 0; i < d2t.size(); ++i) ids.push_back(static_cast<int64_t>(i) + d2t[i]);
  std::sort(ids.begin(), ids.end());
  for (int tp : {1, 2}) {
    check_draft(ck, dir, tp, "", ids, {}, "", {});
    check_draft(ck, dir, tp, "", ids, {}, "--temperature 0.9 --top-k 12 --top-p 0.95 --seed 8", {0.9, 12, 0.95, 8});
  }
  Result info = run("info --drafter " + ck + "/drafter --target " + ck + "/target --tp 2");
  ASSERT_EQ(info.status, 0) << info.out;
  EXPECT_NE(info.out.find("draft vocab 90 of the 300 target ids"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("vocab [45, 90)"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("the drafter's own head replaces this one"), std::string::npos) << info.out;
  // A map over a checkpoint with a draft vocabulary of its own is refused, naming both.
  testing::write_text(dir.file("map.json"), "[1, 2, 3]");
  Result both = run("draft --drafter " + ck + "/drafter --target " + ck + "/target --taps " + ck +
                    "/taps.safetensors --anchor 1 --token-map " + dir.file("map.json"));
  EXPECT_EQ(both.status, 3) << both.out;
  EXPECT_NE(both.out.find("draft vocabulary of its own (90 tokens)"), std::string::npos) << both.out;
}

// The corpus: ids with known counts, as text (three ways of writing lists) and as safetensors.
struct Corpus {
  std::map<int64_t, int64_t> counts;
  int64_t total = 0;
};

Corpus write_corpus(const testing::TempDir& dir, int64_t vocab) {
  Corpus c;
  std::ostringstream text;
  std::vector<int64_t> tensor;
  uint64_t s = 12345;
  for (int line = 0; line < 40; ++line) {
    text << (line % 3 == 0 ? "[" : "");
    for (int j = 0; j < 25; ++j) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      // Skewed: small ids are frequent, as in real text.
      const int64_t id = static_cast<int64_t>((s >> 33) % 97) * static_cast<int64_t>((s >> 20) % 3) % vocab;
      ++c.counts[id];
      ++c.total;
      text << id << (line % 3 == 0 ? ", " : " ");
    }
    text << (line % 3 == 0 ? "]" : "") << "\n";
  }
  for (int64_t i = 0; i < 300; ++i) {
    const int64_t id = (i * 37) % vocab;
    tensor.push_back(id);
    ++c.counts[id];
    ++c.total;
  }
  testing::write_text(dir.file("corpus.txt"), text.str());
  model::SafetensorsWriter w;
  w.add("input_ids", DType::I64, {3, 100}, tensor.data(), tensor.size() * sizeof(int64_t));
  w.write(dir.file("corpus.safetensors"));
  return c;
}

TEST(CliVocab, VocabListsTheMostFrequentIdsAndTheirCoverage) {
  testing::TempDir dir;
  const int64_t V = 300, N = 40;
  const Corpus c = write_corpus(dir, V);
  const std::string map = dir.file("map.json");
  Result made = run("vocab --corpus " + dir.file("corpus.txt") + " --corpus " + dir.file("corpus.safetensors") +
                    " --vocab-size 300 --size 40 --keep 299,298 --out " + map);
  ASSERT_EQ(made.status, 0) << made.out;
  // Expected here: 298 and 299, then the 38 most frequent others, ties to the lower id.
  std::vector<std::pair<int64_t, int64_t>> by_count;  // (-count, id)
  for (const auto& [id, n] : c.counts)
    if (id != 298 && id != 299) by_count.push_back({-n, id});
  std::sort(by_count.begin(), by_count.end());
  std::vector<int64_t> want = {298, 299};
  int64_t covered = (c.counts.count(298) ? c.counts.at(298) : 0) + (c.counts.count(299) ? c.counts.at(299) : 0);
  for (int64_t i = 0; i < N - 2; ++i) {
    want.push_back(by_count[static_cast<size_t>(i)].second);
    covered -= by_count[static_cast<size_t>(i)].first;
  }
  std::sort(want.begin(), want.end());
  EXPECT_EQ(model::read_token_map(map, V), want);
  const std::string pct = fmt::format("{:.2f}%", 100.0 * static_cast<double>(covered) / static_cast<double>(c.total));
  EXPECT_NE(made.out.find("cover " + pct + " of the corpus's " + std::to_string(c.total) + " tokens"), std::string::npos)
      << made.out << " (expected " << pct << ")";

  // The map drafts: at tp 1 and 2 against the reference over it.
  const std::string ck = dir.file("ck");
  ASSERT_EQ(run("init --config " + config("tiny-dflash.json") + " --out " + ck + " --seed 6 --taps 25").status, 0);
  for (int tp : {1, 2}) check_draft(ck, dir, tp, "--token-map " + map, want, want, "", {});
  // DFlash 2 (V 257): the same corpus's map at that vocabulary, drafted by the selector.
  ASSERT_EQ(run("init --config " + config("tiny-dflash2.json") + " --out " + ck + " --seed 6 --taps 25").status, 0);
  const std::string map2 = dir.file("map2.json");
  ASSERT_EQ(run("vocab --corpus " + dir.file("corpus.txt") + " --drafter " + ck + "/drafter --size 30 --out " + map2).status,
            0);
  const std::vector<int64_t> want2 = model::read_token_map(map2, 257);
  EXPECT_EQ(want2.size(), 30u);
  for (int tp : {1, 2})
    check_draft(ck, dir, tp, "--token-map " + map2, want2, want2, "--temperature 0.7 --seed 2", {0.7, 0, 1.0, 2});
}

TEST(CliVocab, VocabAndTokenMapErrorsNameTheFile) {
  testing::TempDir dir;
  testing::write_text(dir.file("bad.txt"), "1 2 3\n4 -5\n");
  testing::write_text(dir.file("big.txt"), "1 2\n3 300\n");
  testing::write_text(dir.file("ok.txt"), "1 2 3\n");
  const std::string out = dir.file("m.json");
  struct Bad {
    std::string args, needle;
  };
  const std::vector<Bad> cases = {
      {"vocab --corpus " + dir.file("bad.txt") + " --vocab-size 300 --size 3 --out " + out, "bad.txt: line 2: '-'"},
      {"vocab --corpus " + dir.file("big.txt") + " --vocab-size 300 --size 3 --out " + out,
       "big.txt: line 2: the token id 300 lies outside the vocabulary [0, 300)"},
      {"vocab --corpus " + dir.file("ok.txt") + " --vocab-size 300 --size 1 --keep 4,5 --out " + out,
       "--keep lists 2 ids, more than the map's size 1"},
      {"vocab --corpus " + dir.file("ok.txt") + " --vocab-size 300 --size 3 --keep 300 --out " + out,
       "--keep 300 lies outside the vocabulary"},
      {"vocab --corpus " + dir.file("ok.txt") + " --size 3 --out " + out, "--vocab-size V or --drafter DIR"},
      {"vocab --corpus " + dir.file("ok.txt") + " --vocab-size 300 --size 400 --out " + out, "--size 400 is above"},
      {"vocab --corpus " + dir.file("ok.txt") + " --vocab-size 300 --size 3 --out " + dir.file("no/such/dir/m.json"),
       "cannot write the token map"},
  };
  for (const Bad& b : cases) {
    Result r = run(b.args);
    EXPECT_NE(r.status, 0) << b.args;
    EXPECT_NE(r.out.find(b.needle), std::string::npos) << b.args << "\n" << r.out;
    EXPECT_FALSE(std::filesystem::exists(out)) << "a refused run left " << out << " behind: " << b.args;
  }
  // A bad map for draft / bench / info: the file and the id are named, before any work.
  const std::string ck = dir.file("ck");
  ASSERT_EQ(run("init --config " + config("tiny-dflash.json") + " --out " + ck + " --seed 1 --taps 5").status, 0);
  testing::write_text(dir.file("range.json"), "[1, 2, 300]");
  for (const std::string& cmd :
       {"draft --drafter " + ck + "/drafter --target " + ck + "/target --taps " + ck + "/taps.safetensors --anchor 1",
        "bench --config " + config("tiny-dflash.json") + " --ctx 4 --repeat 1 --warmup 0 --threads 1",
        "info --drafter " + ck + "/drafter"}) {
    Result r = run(cmd + " --token-map " + dir.file("range.json"));
    EXPECT_EQ(r.status, 3) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("range.json: entry 2 is the target id 300, outside the vocabulary [0, 300)"),
              std::string::npos) << cmd << "\n" << r.out;
  }
}

// info and bench count the head as N rows: bytes and FLOPs shrink by N / V.
TEST(CliVocab, InfoAndBenchCountTheDraftHead) {
  const std::string cfg = config("tiny-dflash.json");
  const auto full = nlohmann::json::parse(json_line(run("info --config " + cfg + " --tp 2 --json").out));
  Result mapped_run = run("info --config " + cfg + " --tp 2 --json --token-map-size 100");
  ASSERT_EQ(mapped_run.status, 0) << mapped_run.out;
  const auto mapped = nlohmann::json::parse(json_line(mapped_run.out));
  EXPECT_EQ(mapped["geometry"]["draft_vocab"], 100);
  EXPECT_EQ(mapped["geometry"]["head_rows"], 100);
  // H 64, bf16: 50 rows of 128 bytes per rank, against 150 rows.
  EXPECT_EQ(mapped["ranks"][1]["bytes"]["head"].get<double>(), 50.0 * 64 * 2);
  EXPECT_EQ(full["ranks"][1]["bytes"]["head"].get<double>(), 150.0 * 64 * 2);
  const double head_flops_full = 2.0 * 7 * 150 * 64, head_flops_mapped = 2.0 * 7 * 50 * 64;
  EXPECT_DOUBLE_EQ(full["ranks"][0]["draft"]["flops"].get<double>() - mapped["ranks"][0]["draft"]["flops"].get<double>(),
                   head_flops_full - head_flops_mapped);
  Result text = run("info --config " + cfg + " --token-map-size 100");
  EXPECT_NE(text.out.find("draft vocab 100 of the 300 target ids (33.3%; --token-map-size)"), std::string::npos)
      << text.out;

  Result bench = run("bench --config " + cfg + " --ctx 8 --repeat 2 --warmup 0 --threads 1 --backend cpu --json "
                     "--token-map-size 120 --tp 2");
  ASSERT_EQ(bench.status, 0) << bench.out;
  const auto b = nlohmann::json::parse(json_line(bench.out));
  EXPECT_EQ(b["draft_vocab"], 120);
  EXPECT_EQ(b["vocab"], 300);
  const std::vector<int64_t> ids = model::random_token_ids(300, 120, 0);
  for (int64_t t : b["tokens"].get<std::vector<int64_t>>()) EXPECT_TRUE(std::binary_search(ids.begin(), ids.end(), t)) << t;
  Result both = run("bench --config " + cfg + " --token-map-size 5 --token-map " + cfg);
  EXPECT_EQ(both.status, 2) << both.out;
  EXPECT_NE(both.out.find("--token-map FILE or --token-map-size N, not both"), std::string::npos) << both.out;
}

}  // namespace
}  // namespace tpdraft
