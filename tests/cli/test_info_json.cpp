// `tpdraft info --json` as the scaling scripts run it: from a bare config (no checkpoint) at a
// tp no machine here has, and from a checkpoint, where its bytes, work and collectives must equal
// what `tpdraft bench` measures on the same drafter; plus the errors a caller meets.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "support/test_support.h"

namespace tpdraft {
namespace {

using nlohmann::json;

struct Result {
  int status = 0;
  std::string out;     // stdout
  std::string errors;  // stderr
};

Result run(const std::string& args, const testing::TempDir& dir) {
  const std::string err = dir.file("stderr.txt");
  // The program's stderr goes to its file inside the braces: run_command reads stdout alone.
  const auto r = testing::run_command("{ " + std::string(TPDRAFT_BIN) + " " + args + " 2>" + err + "; }");
  return {r.status, r.out, read_regular_file(err, "stderr file")};
}

// The last line of stdout that is a JSON object.
json last_json(const Result& r) {
  const size_t start = r.out.rfind("\n{");
  return json::parse(start == std::string::npos ? r.out : r.out.substr(start + 1));
}

// qwen3-8b-dflash-b16 at tp 16 (kv heads replicated): every number by hand from the config.
TEST(InfoJson, BareConfigAtSixteenRanks) {
  testing::TempDir dir;
  const Result r = run("info --config " + testing::source_path("configs/qwen3-8b-dflash-b16.json") +
                           " --tp 16 --sessions 3 --ctx 512 --json", dir);
  ASSERT_EQ(r.status, 0) << r.errors;
  const json j = last_json(r);
  const double H = 4096, D = 128, L = 5, T = 5, B = 16, S = 3, ctx = 512, V = 151936;
  EXPECT_EQ(j["source"], "config");
  EXPECT_EQ(j["tp"], 16);
  EXPECT_EQ(j["geometry"]["hidden"], 4096);
  EXPECT_EQ(j["vocab_padded"], 151936);
  ASSERT_EQ(j["ranks"].size(), 16u);
  for (const json& rank : j["ranks"]) {
    const json& b = rank["bytes"];
    // 2 of 32 query heads, 1 of 8 kv heads, 768 of 12288 FFN rows; bf16.
    const double per_layer = 2 * (2 * D * H) + 2 * (1 * D * H) + 3 * (768 * H);
    EXPECT_EQ(b["sharded"].get<double>(), L * per_layer * 2);
    EXPECT_EQ(b["head"].get<double>(), V / 16 * H * 2);
    // fc in bf16; the norms as f32.
    EXPECT_EQ(b["replicated"].get<double>(), H * T * H * 2 + (2 * H + L * (2 * H + 2 * D)) * 4);
    EXPECT_EQ(b["context_per_position"].get<double>(), L * 2 * D * 4);
    // A draft streams every split matrix and the head once and reads each position of context.
    const json& draft = rank["draft"];
    EXPECT_EQ(draft["weight_bytes"].get<double>(), b["sharded"].get<double>() + b["head"].get<double>());
    EXPECT_EQ(draft["context_bytes"].get<double>(), S * ctx * b["context_per_position"].get<double>());
    const json& greedy = rank["collectives"]["greedy"];
    EXPECT_EQ(greedy["all_reduce"]["calls"], 2 * L);
    EXPECT_EQ(greedy["all_reduce"]["bytes"].get<double>(), 2 * L * S * B * H * 4);
    EXPECT_EQ(greedy["all_gather"]["calls"], 1);
    EXPECT_EQ(greedy["all_gather"]["bytes"].get<double>(), S * (B - 1) * 16);
    EXPECT_EQ(greedy["broadcast"]["calls"], 0);  // greedy DFlash: every rank merged the same candidates
    EXPECT_EQ(rank["collectives"]["sampled"]["broadcast"]["bytes"].get<double>(), S * (B - 1) * 12);
    const json& gathered = rank["collectives"]["greedy_gather_logits"];
    EXPECT_EQ(gathered["all_gather"]["bytes"].get<double>(), S * (B - 1) * (16 + V / 16 * 4));
  }
}

// A checkpoint: `info` from its files, `info` from its config alone and `bench` on it agree.
TEST(InfoJson, CheckpointAgreesWithConfigAndBench) {
  testing::TempDir dir;
  const std::string config = testing::source_path("configs/tiny-dflash2.json");
  ASSERT_EQ(run("init --config " + config + " --out " + dir.file("ck") + " --dtype bf16", dir).status, 0);
  const std::string ck = " --drafter " + dir.file("ck/drafter") + " --target " + dir.file("ck/target");
  const std::string shape = " --tp 2 --sessions 2 --ctx 24 --json";
  const Result from_files = run("info" + ck + shape, dir);
  const Result from_config = run("info --config " + config + shape, dir);
  ASSERT_EQ(from_files.status, 0) << from_files.errors;
  ASSERT_EQ(from_config.status, 0) << from_config.errors;
  const json files = last_json(from_files), cfg = last_json(from_config);
  EXPECT_EQ(files["source"], "checkpoint");
  EXPECT_EQ(files["ranks"], cfg["ranks"]);
  const Result bench = run("bench" + ck + " --tp 2 --batch 2 --ctx 24 --repeat 2 --warmup 1 --threads 1 --json", dir);
  ASSERT_EQ(bench.status, 0) << bench.errors;
  const json m = last_json(bench), rank0 = files["ranks"][0];
  EXPECT_EQ(m["weights_bytes_per_rank"].get<double>(), rank0["bytes"]["total"].get<double>());
  EXPECT_EQ(m["context_bytes_per_rank"].get<double>(), 2 * 24 * rank0["bytes"]["context_per_position"].get<double>());
  EXPECT_DOUBLE_EQ(m["draft_gflop"].get<double>(), rank0["draft"]["flops"].get<double>() / 1e9);
  EXPECT_DOUBLE_EQ(m["draft_gbytes"].get<double>(), rank0["draft"]["bytes"].get<double>() / 1e9);
  for (const char* op : {"all_reduce", "all_gather", "broadcast"}) {
    EXPECT_EQ(m[std::string(op) + "_calls"].get<double>(), rank0["collectives"]["greedy"][op]["calls"].get<double>()) << op;
    EXPECT_EQ(m[std::string(op) + "_bytes"].get<double>(), rank0["collectives"]["greedy"][op]["bytes"].get<double>()) << op;
  }
  // Sampled drafts (temperature 1, info's "sampled" mode) exchange what the cost model says too.
  const Result sampled = run("bench" + ck + " --tp 2 --batch 2 --ctx 24 --repeat 2 --warmup 1 --threads 1 --json "
                             "--temperature 1", dir);
  ASSERT_EQ(sampled.status, 0) << sampled.errors;
  const json ms = last_json(sampled);
  EXPECT_EQ(ms["sampling"], "temperature 1, top-k 0, top-p 1");
  for (const char* op : {"all_reduce", "all_gather", "broadcast"}) {
    EXPECT_EQ(ms[std::string(op) + "_calls"].get<double>(), rank0["collectives"]["sampled"][op]["calls"].get<double>()) << op;
    EXPECT_EQ(ms[std::string(op) + "_bytes"].get<double>(), rank0["collectives"]["sampled"][op]["bytes"].get<double>()) << op;
  }
}

TEST(InfoJson, ErrorsNameWhatIsWrong) {
  testing::TempDir dir;
  const std::string config = testing::source_path("configs/qwen3-8b-dflash-b16.json");
  struct Case {
    std::string args, needle;
  };
  const Case cases[] = {
      {"info --config " + config + " --tp 3 --json", "num_attention_heads (32) is not divisible by tp = 3"},
      {"info --tp 2", "give --drafter DIR (a checkpoint) or --config FILE"},
      {"info --config " + config + " --drafter " + dir.path(), "not both"},
  };
  for (const Case& c : cases) {
    const Result r = run(c.args, dir);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.errors.find(c.needle), std::string::npos) << c.args << "\n" << r.errors;
  }
}

TEST(InfoJson, TextOutputKeepsOneLinePerRank) {
  testing::TempDir dir;
  const Result r = run("info --config " + testing::source_path("configs/tiny-dflash.json") + " --tp 2", dir);
  ASSERT_EQ(r.status, 0) << r.errors;
  EXPECT_NE(r.out.find("no checkpoint: BF16 assumed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 0/2    sharded"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1/2    sharded"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tpdraft
