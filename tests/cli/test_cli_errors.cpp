// The program's answers to bad input, as a user meets them: the documented exit statuses (2 for
// the command line, 3 for the input), bounds written as given, --dump checked before any work and
// never replacing what is not a regular file, results printed only on success, taps holding NaN
// refused by row, and bench refusing a geometry before it generates its weights.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "core/files.h"
#include "support/test_support.h"
#include "tools/random_checkpoint.h"

namespace tpdraft {
namespace {

testing::CommandResult run(const std::string& args) { return testing::run_command(std::string(TPDRAFT_BIN) + " " + args); }

bool has_json_line(const std::string& out) { return out.find("\n{") != std::string::npos || out.rfind("{", 0) == 0; }

// What a case gives (a command line, or a part of one) and what the message must name.
struct Case {
  std::string input, needle;
};

// A checkpoint written for each test of this file, in its own directory.
class CliErrors : public ::testing::Test {
 protected:
  CliErrors() {
    const auto r = run("init --config " + testing::source_path("configs/tiny-dflash.json") + " --out " + ck + " --taps 6");
    EXPECT_EQ(r.status, 0) << r.out;
  }
  std::string draft_args() const {
    return "draft --drafter " + ck + "/drafter --target " + ck + "/target --taps " + ck + "/taps.safetensors --anchor 1";
  }
  testing::TempDir dir;
  std::string ck = dir.file("ck");
};

TEST_F(CliErrors, ExitStatusesAreTheDocumentedOnes) {
  testing::write_text(dir.file("bad.json"), "{\"architectures\": [\"LlamaForCausalLM\"]}");
  EXPECT_EQ(run("draft --bogus").status, 2);
  EXPECT_EQ(run("bench").status, 2);  // neither --config nor --drafter
  EXPECT_EQ(run("init --config " + dir.file("bad.json") + " --out " + dir.file("x")).status, 3);
  EXPECT_EQ(run(draft_args() + " --tp 3").status, 3);  // 4 heads do not split 3 ways
  EXPECT_EQ(run(draft_args()).status, 0);
  const auto help = run("--help");
  EXPECT_NE(help.out.find("Exit status: 0 success"), std::string::npos) << help.out;
  const auto version = run("--version");
  EXPECT_EQ(version.status, 0);
  EXPECT_TRUE(std::regex_search(version.out, std::regex("^tpdraft [0-9]+\\.[0-9]+\\.[0-9]+"))) << version.out;
}

// Values the engine would refuse later (or, for a seed, wrap silently) are usage errors at
// parse time, naming the option; a mistyped command is named too.
TEST_F(CliErrors, OptionValuesAndCommandsAreCheckedAtParseTime) {
  for (const Case& k : {Case{draft_args() + " --seed -1", "--seed"}, Case{draft_args() + " --top-p 0", "--top-p"},
                        Case{draft_args() + " --anchor=", "--anchor"},
                        Case{draft_args() + " --anchor -1", "--anchor"},
                        Case{"bench --config x --batch 1099511627776", "--batch"},
                        Case{"drfat --config x", "unknown command 'drfat'"}}) {
    const auto r = run(k.input);
    EXPECT_EQ(r.status, 2) << k.input << "\n" << r.out;
    EXPECT_NE(r.out.find(k.needle), std::string::npos) << k.input << "\n" << r.out;
  }
  EXPECT_EQ(run(draft_args() + " --seed 18446744073709551615").status, 0);
}

TEST_F(CliErrors, InfoStopsAtAPlanItCannotMakeBeforePrinting) {
  const auto r = run("info --drafter " + ck + "/drafter --tp 3");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find("not divisible by tp = 3"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("geometry"), std::string::npos) << "printed before the error: " << r.out;
}

TEST_F(CliErrors, BoundsAreReadable) {
  for (const std::string& args : {draft_args() + " --threads 100000", draft_args() + " --temperature -1",
                                  draft_args() + " --tp 100000", std::string("bench --config x --ctx -3")}) {
    const auto r = run(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_FALSE(std::regex_search(r.out, std::regex("[0-9]{25}"))) << "a bound printed in full: " << r.out;
    EXPECT_NE(r.out.find("must be"), std::string::npos) << r.out;
  }
}

TEST_F(CliErrors, DumpIsCheckedFirstAndNeverReplacesOtherFiles) {
  const std::string link = dir.file("link.safetensors"), target = dir.file("kept.txt");
  testing::write_text(target, "keep me");
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  for (const Case& k : {Case{"/dev/null", "not a regular file"}, Case{link, "not a regular file"},
                        Case{dir.file("no/such/dir/out.safetensors"), "cannot write there"}}) {
    const auto r = run(draft_args() + " --dump " + k.input);
    EXPECT_EQ(r.status, 3) << r.out;
    EXPECT_NE(r.out.find(k.needle), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("loaded"), std::string::npos) << "the checkpoint was loaded before the check: " << r.out;
    EXPECT_FALSE(has_json_line(r.out)) << r.out;
  }
  struct stat st {};
  ASSERT_EQ(stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  ASSERT_EQ(lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(read_regular_file(target, "kept file"), "keep me");
  // A good destination: the dump exists and the results follow it.
  const auto ok = run(draft_args() + " --dump " + dir.file("d.safetensors"));
  EXPECT_EQ(ok.status, 0) << ok.out;
  EXPECT_TRUE(has_json_line(ok.out));
  EXPECT_EQ(access(dir.file("d.safetensors").c_str(), R_OK), 0);
}

TEST_F(CliErrors, TapsWithNaNOrInfAreRefusedByRow) {
  const model::DrafterConfig cfg = model::DrafterConfig::from_file(ck + "/drafter/config.json");
  const int64_t width = cfg.n_taps() * cfg.hidden;
  for (float bad : {std::nanf(""), -INFINITY}) {
    std::vector<float> taps = model::random_taps(cfg, 5, 3);
    taps[static_cast<size_t>(2 * width + 7)] = bad;
    model::SafetensorsWriter w;
    w.add("taps", DType::F32, {5, width}, taps.data(), taps.size() * sizeof(float));
    w.write(dir.file("bad-taps.safetensors"));
    const auto r = run("draft --drafter " + ck + "/drafter --target " + ck + "/target --taps " +
                       dir.file("bad-taps.safetensors") + " --anchor 1");
    EXPECT_EQ(r.status, 3) << r.out;
    EXPECT_NE(r.out.find("position 2 (new row 2)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("column 7"), std::string::npos) << r.out;
    EXPECT_FALSE(has_json_line(r.out)) << r.out;
  }
}

TEST_F(CliErrors, BenchRefusesAGeometryBeforeGeneratingItsWeights) {
  const auto r = run("bench --config " + testing::source_path("configs/tiny-dflash.json") + " --tp 3 --ctx 4 --repeat 1");
  EXPECT_EQ(r.status, 3) << r.out;
  EXPECT_NE(r.out.find("not divisible by tp = 3"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("generating"), std::string::npos) << r.out;
  EXPECT_EQ(testing::count_of(r.out, "not divisible"), 1u) << "reported once, not by each of the 3 ranks:\n" << r.out;
}

TEST_F(CliErrors, MoreThreadsThanCoresIsAWarningNotAFailure) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const auto r = run(draft_args() + " --threads " + std::to_string(cores) + " --tp 2");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("take turns on the cores"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tpdraft
