// Draft vocabularies (docs/model.md) against the float64 reference at tp = 1, 2 and 4: a
// speculators checkpoint whose own embedding and reduced head differ from the target's (the
// target's tables would give other drafts), a token map over DFlash and DFlash 2 checkpoints,
// greedy and sampled, the draft distribution (zero outside the map), a quantized draft head; and
// the readers: token map files, d2t / t2d, the speculators config.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/config.h"
#include "checkpoint/safetensors.h"
#include "engine/runtime.h"
#include "model/draft_vocab.h"
#include "model/drafter.h"
#include "parallel/thread_comm.h"
#include "reference/reference.h"
#include "support/rank.h"
#include "support/test_support.h"
#include "tools/random_checkpoint.h"

namespace tpdraft {
namespace {

using model::DrafterConfig;
using model::SamplingParams;
using testing::expect_error;
using testing::shipped_config;

// configs/FILE as a speculators checkpoint's config with a draft vocabulary of n ids.
DrafterConfig speculators(const std::string& file, int64_t n) {
  DrafterConfig c = testing::eight_heads_over_two(file);
  c.layout = model::Layout::Speculators;
  c.arch_name = "DFlashSpeculator";
  c.draft_vocab = n;
  c.validate("test config");
  return c;
}

std::string write_ckpt(const testing::TempDir& dir, const DrafterConfig& cfg, bool own_embedding = true) {
  model::RandomCheckpointOptions o;
  o.seed = 9;
  o.target_vocab = cfg.vocab + 5;
  o.own_embedding = own_embedding;
  o.threads = 2;
  model::write_random_checkpoint(cfg, dir.path(), o, 0);
  return dir.path();
}

// Every third id of the vocabulary and a few more: an uneven map (not a multiple of the ranks).
std::vector<int64_t> sample_map(int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < vocab; t += 3) ids.push_back(t);
  for (int64_t t : {int64_t{1}, int64_t{2}, int64_t{5}, vocab - 1}) ids.push_back(t);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

struct Draft {
  std::vector<model::DraftResult> results;
  model::DraftDump dump;
};

// One session settled with `n` random rows and drafted at tp ranks with each sampling; rank r's
// drafts in out[r].
std::vector<std::vector<Draft>> draft_at(const std::string& ckpt, int tp, const std::vector<int64_t>& token_map,
                                         const std::vector<SamplingParams>& samplings, int64_t n, int64_t anchor,
                                         const std::string& quant = "") {
  std::vector<std::vector<Draft>> out(static_cast<size_t>(tp));
  testing::run_group(tp, [&](parallel::Communicator& comm) {
    model::ModelSource source = model::ModelSource::open(ckpt + "/drafter", ckpt + "/target");
    if (!token_map.empty()) model::apply_token_map(source, token_map, "test token map");
    model::quantize_on_load(source, quant);
    model::RuntimeOptions ro = testing::backend("cpu");
    ro.limits.max_context = 64;
    model::RankRuntime rt(source, comm, ro);
    const std::vector<float> taps = model::random_taps(source.config, n, 11);
    auto session = rt.drafter().new_session();
    rt.drafter().settle(*session, 0, taps.data(), n);
    for (const SamplingParams& s : samplings) {
      Draft d;
      model::DraftRequest req{session.get(), anchor, s};
      req.dist_width = s.greedy() ? 0 : model::kFullDistribution;
      d.results = rt.drafter().draft({req}, &d.dump);
      out[static_cast<size_t>(comm.rank())].push_back(std::move(d));
    }
  });
  return out;
}

reference::RefDraft reference_draft(const reference::RefModel& ref, int64_t n, int64_t anchor, const SamplingParams& s) {
  const std::vector<float> taps = model::random_taps(ref.config(), n, 11);
  reference::RefContext ctx;
  ref.settle(ctx, 0, std::vector<double>(taps.begin(), taps.end()), n);
  return ref.draft(ctx, anchor, {s.temperature, s.top_k, s.top_p, s.seed});
}

// The fast draft against the reference over the draft vocabulary `ids`: tokens (in the map),
// probabilities, the dump's columns and their ids, and the whole draft distribution (zero
// outside the map).
void expect_matches(const Draft& got, const reference::RefDraft& want, const std::vector<int64_t>& ids,
                    const DrafterConfig& cfg, const SamplingParams& s, const std::string& what) {
  const int64_t V = cfg.vocab, N = static_cast<int64_t>(ids.size()), B = cfg.block;
  const model::DraftResult& r = got.results.at(0);
  EXPECT_EQ(r.tokens, want.tokens) << what;
  const std::set<int64_t> mapped(ids.begin(), ids.end());
  for (int64_t t : r.tokens) EXPECT_TRUE(mapped.count(t)) << what << ": token " << t << " outside the map";
  for (size_t i = 0; i < r.probs.size(); ++i) EXPECT_NEAR(r.probs[i], want.probs[i], 1e-4) << what << " row " << i + 1;
  EXPECT_EQ(got.dump.logit_ids, ids) << what;
  ASSERT_EQ(static_cast<int64_t>(got.dump.logits.size()), (B - 1) * N) << what;
  std::vector<double> columns;
  for (int64_t row = 0; row < B - 1; ++row)
    for (int64_t j = 0; j < N; ++j) columns.push_back(want.logits[static_cast<size_t>(row * V + ids[static_cast<size_t>(j)])]);
  EXPECT_LT(testing::relative_error(got.dump.logits, columns), 1e-4) << what;
  for (int64_t row = 0; row < B - 1; ++row)
    for (int64_t t = 0; t < V; ++t)
      if (!mapped.count(t)) {
        ASSERT_TRUE(std::isinf(want.logits[static_cast<size_t>(row * V + t)])) << what;
      }
  if (s.greedy() || cfg.is_dflash2()) return;
  ASSERT_EQ(r.dists.size(), static_cast<size_t>(B - 1)) << what;
  for (int64_t row = 0; row < B - 1; ++row) {
    const std::vector<double> logits(want.logits.begin() + row * V, want.logits.begin() + (row + 1) * V);
    const std::vector<double> q = testing::softmax_over(
        logits, testing::documented_kept_set(logits, s.temperature, s.top_k, s.top_p), s.temperature);
    const model::RowDistribution& d = r.dists[static_cast<size_t>(row)];
    ASSERT_EQ(d.probs.size(), static_cast<size_t>(V)) << what;
    double inside = 0;
    for (int64_t t = 0; t < V; ++t) {
      EXPECT_NEAR(d.probs[static_cast<size_t>(t)], q[static_cast<size_t>(t)], 2e-4) << what << " row " << row << " id " << t;
      if (!mapped.count(t)) EXPECT_EQ(d.probs[static_cast<size_t>(t)], 0.0f) << what << " id " << t << " outside the map";
      else inside += d.probs[static_cast<size_t>(t)];
    }
    EXPECT_NEAR(inside, 1.0, 1e-4) << what;
  }
}

const std::vector<SamplingParams> kModes = {{}, {0.8, 0, 1.0, 4}, {1.2, 7, 0.9, 21}};

void check_against_reference(const std::string& ckpt, const DrafterConfig& cfg, const std::vector<int64_t>& token_map,
                             const std::vector<int64_t>& ids, const std::string& what) {
  const reference::RefModel ref(ckpt + "/drafter", ckpt + "/target", token_map);
  const int64_t n = 30, anchor = 17;
  std::vector<SamplingParams> modes = kModes;
  if (cfg.is_dflash2()) modes = {{}, {0.7, 0, 1.0, 3}};  // the selector samples over its candidates
  std::vector<reference::RefDraft> want;
  for (const SamplingParams& s : modes) want.push_back(reference_draft(ref, n, anchor, s));
  for (int tp : {1, 2, 4}) {
    const auto got = draft_at(ckpt, tp, token_map, modes, n, anchor);
    for (int r = 0; r < tp; ++r)
      for (size_t m = 0; m < modes.size(); ++m)
        expect_matches(got[static_cast<size_t>(r)][m], want[m], ids, cfg, modes[m],
                       what + " tp " + std::to_string(tp) + " rank " + std::to_string(r) + " mode " + std::to_string(m));
  }
}

TEST(DraftVocabParity, SpeculatorsOwnEmbeddingAndReducedHead) {
  const DrafterConfig cfg = speculators("tiny-dflash.json", 97);
  testing::TempDir dir;
  const std::string ckpt = write_ckpt(dir, cfg);
  const std::vector<int64_t> ids = model::random_draft_ids(cfg, 9);
  ASSERT_EQ(static_cast<int64_t>(ids.size()), 97);
  check_against_reference(ckpt, cfg, {}, ids, "speculators");
}

TEST(DraftVocabParity, SpeculatorsWithTheTargetsEmbedding) {
  const DrafterConfig cfg = speculators("tiny-dflash.json", 40);
  testing::TempDir dir;
  const std::string ckpt = write_ckpt(dir, cfg, false);
  check_against_reference(ckpt, cfg, {}, model::random_draft_ids(cfg, 9), "speculators, target embedding");
}

// The speculators tables are the drafter's own: the target's embedding gives another residual
// stream, and the target's head rows of the same ids other logits.
TEST(DraftVocabParity, TheTargetsTablesWouldDraftOtherwise) {
  const DrafterConfig cfg = speculators("tiny-dflash.json", 97);
  testing::TempDir own_dir, target_dir;
  const std::string own = write_ckpt(own_dir, cfg), with_target = write_ckpt(target_dir, cfg, false);
  const std::vector<int64_t> ids = model::random_draft_ids(cfg, 9);
  const Draft got = draft_at(own, 1, {}, {{}}, 30, 17)[0][0];
  const reference::RefDraft own_ref = reference_draft(reference::RefModel(own + "/drafter", own + "/target"), 30, 17, {});
  const reference::RefDraft target_ref =
      reference_draft(reference::RefModel(with_target + "/drafter", with_target + "/target"), 30, 17, {});
  EXPECT_LT(testing::relative_error(got.dump.hidden, own_ref.hidden), 1e-4);
  EXPECT_GT(testing::relative_error(got.dump.hidden, target_ref.hidden), 0.1) << "the embedding made no difference";

  // The target head's rows of the mapped ids against the same final rows.
  const auto target = model::TensorStore::open(own + "/target");
  const model::TensorInfo& head = *target->find("lm_head.weight");
  const int64_t H = cfg.hidden, B = cfg.block, N = static_cast<int64_t>(ids.size());
  std::vector<double> target_logits;
  std::vector<float> row(static_cast<size_t>(H));
  for (int64_t r = 1; r < B; ++r)
    for (int64_t j = 0; j < N; ++j) {
      model::copy_rows(head, ids[static_cast<size_t>(j)], 1, DType::F32, row.data());
      double acc = 0;
      for (int64_t i = 0; i < H; ++i) acc += row[static_cast<size_t>(i)] * got.dump.hidden[static_cast<size_t>(r * H + i)];
      target_logits.push_back(acc);
    }
  EXPECT_GT(testing::relative_error(got.dump.logits, target_logits), 0.1) << "the drafter's head is the target's";
}

// A token map over a DFlash head, a DFlash 2 head (the selector's candidates come from the map),
// and a speculators drafter without a draft vocabulary (its own embedding, the target's head).
TEST(DraftVocabParity, TokenMaps) {
  const std::pair<const char*, DrafterConfig> cases[] = {
      {"token map dflash", testing::eight_heads_over_two("tiny-dflash.json")},
      {"token map dflash2", testing::eight_heads_over_two("tiny-dflash2.json")},
      {"token map over a speculators drafter", speculators("tiny-dflash.json", 0)}};
  for (const auto& [what, cfg] : cases) {
    testing::TempDir dir;
    const std::vector<int64_t> ids = sample_map(cfg.vocab);
    check_against_reference(write_ckpt(dir, cfg), cfg, ids, ids, what);
  }
}

// A q8 draft head quantizes each row alone, so the mapped head's logits are the full quantized
// head's at the mapped columns.
TEST(DraftVocabParity, QuantizedDraftHeadIsTheQuantizedHeadsColumns) {
  const DrafterConfig cfg = testing::eight_heads_over_two("tiny-dflash.json");
  testing::TempDir dir;
  const std::string ckpt = write_ckpt(dir, cfg);
  const std::vector<int64_t> ids = sample_map(cfg.vocab);
  for (int tp : {1, 2}) {
    const Draft full = draft_at(ckpt, tp, {}, {{}}, 20, 5, "q8+head")[0][0];
    const Draft mapped = draft_at(ckpt, tp, ids, {{}}, 20, 5, "q8+head")[0][0];
    const int64_t V = cfg.vocab, N = static_cast<int64_t>(ids.size());
    for (int64_t r = 0; r < cfg.block - 1; ++r) {
      int64_t best = ids[0];
      for (int64_t j = 0; j < N; ++j) {
        const float want = full.dump.logits[static_cast<size_t>(r * V + ids[static_cast<size_t>(j)])];
        EXPECT_NEAR(mapped.dump.logits[static_cast<size_t>(r * N + j)], want, 1e-5 * (1 + std::fabs(want)));
        if (want > full.dump.logits[static_cast<size_t>(r * V + best)]) best = ids[static_cast<size_t>(j)];
      }
      EXPECT_EQ(mapped.results[0].tokens[static_cast<size_t>(r)], best) << "tp " << tp << " row " << r + 1;
    }
  }
}

TEST(DraftVocabErrors, SelectorTopKBeyondTheMapIsRefused) {
  const DrafterConfig cfg = shipped_config("tiny-dflash2.json");  // k_top 4
  testing::TempDir dir;
  const std::string ckpt = write_ckpt(dir, cfg);
  model::ModelSource source = model::ModelSource::open(ckpt + "/drafter", ckpt + "/target");
  expect_error([&] { model::apply_token_map(source, {3, 9, 11}, "three.json"); },
               {"three.json", "selector_top_k (4)", "draft vocabulary (3)"});
  EXPECT_EQ(source.config.draft_vocab, 0) << "a refused map changed the source";
}

TEST(DraftVocabErrors, AMapOverADraftVocabularyIsRefused) {
  const DrafterConfig cfg = speculators("tiny-dflash.json", 50);
  testing::TempDir dir;
  const std::string ckpt = write_ckpt(dir, cfg);
  model::ModelSource source = model::ModelSource::open(ckpt + "/drafter", ckpt + "/target");
  expect_error([&] { model::apply_token_map(source, {1, 2}, "map.json"); }, {"map.json", "draft vocabulary of its own (50"});
}

// ---- The files ----

TEST(TokenMapFile, JsonListIsSortedAndDeduplicated) {
  testing::TempDir dir;
  testing::write_text(dir.file("map.json"), "[9, 3, 3, 0, 299, 12]");
  EXPECT_EQ(model::read_token_map(dir.file("map.json"), 300), (std::vector<int64_t>{0, 3, 9, 12, 299}));
}

TEST(TokenMapFile, SafetensorsTokenIds) {
  testing::TempDir dir;
  const std::vector<int64_t> ids = {40, 7, 8};
  model::SafetensorsWriter w;
  w.add("token_ids", DType::I64, {3}, ids.data(), ids.size() * sizeof(int64_t));
  w.write(dir.file("map.safetensors"));
  EXPECT_EQ(model::read_token_map(dir.file("map.safetensors"), 41), (std::vector<int64_t>{7, 8, 40}));
  model::SafetensorsWriter f;
  const float x[2] = {1, 2};
  f.add("token_ids", DType::F32, {2}, x, sizeof(x));
  f.write(dir.file("float.safetensors"));
  expect_error([&] { model::read_token_map(dir.file("float.safetensors"), 41); }, {"'token_ids'", "dtype F32", "I64"});
  model::SafetensorsWriter none;
  none.add("ids", DType::I64, {3}, ids.data(), ids.size() * sizeof(int64_t));
  none.write(dir.file("none.safetensors"));
  expect_error([&] { model::read_token_map(dir.file("none.safetensors"), 41); }, {"none.safetensors", "no tensor 'token_ids'"});
}

TEST(TokenMapFile, BadFilesNameWhatIsWrong) {
  testing::TempDir dir;
  auto bad = [&](const std::string& name, const std::string& text, const std::vector<std::string>& parts) {
    testing::write_text(dir.file(name), text);
    std::vector<std::string> all = parts;
    all.push_back(name);
    expect_error([&] { model::read_token_map(dir.file(name), 300); }, all);
  };
  bad("range.json", "[1, 300]", {"entry 1", "target id 300", "[0, 300)"});
  bad("negative.json", "[-1]", {"entry 0", "target id -1"});
  bad("huge.json", "[18446744073709551615]", {"entry 0", "outside the vocabulary"});
  bad("float.json", "[1.5]", {"entry 0", "1.5", "integer"});
  bad("object.json", R"({"ids": [1]})", {"JSON list", "object"});
  bad("empty.json", "[]", {"lists no token"});
  bad("broken.json", "[1, 2", {"not valid JSON"});
  // SGLang's map is a torch.save'd tensor (a zip): refused with the command that converts it.
  bad("map.pt", "PK\x03\x04 torch", {"PyTorch file", "torch.load", "tolist()"});
}

TEST(TokenMapFile, WrittenMapsReadBack) {
  testing::TempDir dir;
  const std::vector<int64_t> ids = {2, 5, 77};
  model::write_token_map(dir.file("out.json"), ids);
  EXPECT_EQ(model::read_token_map(dir.file("out.json"), 78), ids);
}

TEST(TokenMapFile, RandomIdsAreDistinctAscendingAndSeeded) {
  const auto a = model::random_token_ids(1000, 123, 5), b = model::random_token_ids(1000, 123, 5);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, model::random_token_ids(1000, 123, 6));
  ASSERT_EQ(a.size(), 123u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::adjacent_find(a.begin(), a.end()), a.end());
  EXPECT_LT(a.back(), 1000);
  EXPECT_GT(a.back() - a.front(), 500) << "the ids cluster instead of spreading over the vocabulary";
}

TEST(DraftVocabMap, OrderIsByTargetIdWithTheHeadRowsAlong) {
  const model::DraftVocab v = model::make_draft_vocab({30, 4, 17}, {0, 1, 2}, "d2t", 40);
  EXPECT_EQ(v.ids, (std::vector<int64_t>{4, 17, 30}));
  EXPECT_EQ(v.head_rows, (std::vector<int64_t>{1, 2, 0}));
  expect_error([] { model::make_draft_vocab({3, 3}, {0, 1}, "d2t", 40); }, {"d2t", "target id 3 is mapped twice"});
  expect_error([] { model::make_draft_vocab({3, 40}, {0, 1}, "d2t", 40); }, {"d2t", "draft row 1", "target id 40"});
}

// d2t / t2d as a speculators checkpoint stores them.
void write_map(const std::string& path, const std::vector<int64_t>& d2t, const std::vector<uint8_t>& t2d) {
  model::SafetensorsWriter w;
  w.add("d2t", DType::I64, {static_cast<int64_t>(d2t.size())}, d2t.data(), d2t.size() * sizeof(int64_t));
  if (!t2d.empty()) w.add("t2d", DType::BOOL, {static_cast<int64_t>(t2d.size())}, t2d.data(), t2d.size());
  w.write(path);
}

TEST(DraftVocabMap, D2tOffsetsAndT2dAgree) {
  testing::TempDir dir;
  // Draft rows 0..2 score target ids 1, 4, 6.
  write_map(dir.file("ok.safetensors"), {1, 3, 4}, {0, 1, 0, 0, 1, 0, 1, 0});
  EXPECT_EQ(model::read_d2t(*model::TensorStore::open(dir.file("ok.safetensors")), 3, 8),
            (std::vector<int64_t>{1, 4, 6}));
  write_map(dir.file("no_t2d.safetensors"), {1, 3, 4}, {});
  EXPECT_EQ(model::read_d2t(*model::TensorStore::open(dir.file("no_t2d.safetensors")), 3, 8),
            (std::vector<int64_t>{1, 4, 6}));
  write_map(dir.file("disagree.safetensors"), {1, 3, 4}, {0, 1, 1, 0, 1, 0, 0, 0});
  expect_error([&] { model::read_d2t(*model::TensorStore::open(dir.file("disagree.safetensors")), 3, 8); },
               {"'t2d' and 'd2t' disagree on target id 2"});
  write_map(dir.file("range.safetensors"), {1, 3, 9}, {});
  expect_error([&] { model::read_d2t(*model::TensorStore::open(dir.file("range.safetensors")), 3, 8); },
               {"'d2t' maps draft id 2 to target id 11", "[0, 8)"});
  expect_error([&] { model::read_d2t(*model::TensorStore::open(dir.file("ok.safetensors")), 4, 8); },
               {"'d2t' has 3 entries", "draft_vocab_size = 4"});
  write_map(dir.file("short_t2d.safetensors"), {1, 3, 4}, {0, 1, 0});
  expect_error([&] { model::read_d2t(*model::TensorStore::open(dir.file("short_t2d.safetensors")), 3, 8); },
               {"'t2d' has shape [3]", "BOOL [8]"});
}

// ---- The speculators config ----

nlohmann::json speculators_json() {
  return nlohmann::json::parse(R"({
    "architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash", "speculators_version": "0.3.0",
    "transformer_layer_config": {"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 3,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
      "vocab_size": 300, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "hidden_act": "silu",
      "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "sliding_window": 32,
      "attention_bias": false, "max_position_embeddings": 40960},
    "draft_vocab_size": 120, "block_size": 8, "aux_hidden_state_layer_ids": [2, 10, 18],
    "mask_token_id": 299, "sliding_window_non_causal": false, "projector_type": "dflash",
    "sample_from_anchor": false, "target_hidden_size": null,
    "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy",
      "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 7}],
      "verifier": {"name_or_path": "Qwen/Qwen3-8B", "architectures": ["Qwen3ForCausalLM"]}}
  })");
}

TEST(SpeculatorsConfig, ReadsTheNestedGeometryAndTheFormatsRules) {
  const DrafterConfig c = DrafterConfig::from_json(speculators_json(), "spec.json");
  EXPECT_EQ(c.layout, model::Layout::Speculators);
  EXPECT_EQ(c.arch, model::Arch::DFlash);
  EXPECT_EQ(std::make_tuple(c.hidden, c.layers, c.n_q, c.n_kv, c.head_dim, c.ffn, c.vocab),
            std::make_tuple(64, 3, 4, 2, 16, 96, 300));
  EXPECT_EQ(c.taps, (std::vector<int64_t>{1, 9, 17})) << "aux id k is tap k - 1";
  EXPECT_EQ(std::make_tuple(c.block, c.mask_token, c.draft_vocab, c.head_vocab(), c.window),
            std::make_tuple(8, 299, 120, 120, 32));
  EXPECT_EQ(c.sliding, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(c.causal, (std::vector<bool>{true, false, true})) << "sliding layers causal, full ones bidirectional";
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.eps, 1e-5);

  nlohmann::json j = speculators_json();
  j["sliding_window_non_causal"] = true;
  j.erase("block_size");  // then speculative_tokens + 1
  j["draft_vocab_size"] = 300;  // the whole vocabulary: no draft vocabulary
  const DrafterConfig d = DrafterConfig::from_json(j, "spec.json");
  EXPECT_EQ(d.causal, (std::vector<bool>{false, false, false}));
  EXPECT_EQ(d.block, 8);
  EXPECT_EQ(d.draft_vocab, 0);
}

TEST(SpeculatorsConfig, WritesWhatItReads) {
  const DrafterConfig c = DrafterConfig::from_json(speculators_json(), "spec.json");
  const DrafterConfig back = DrafterConfig::from_json(c.to_json(), "written");
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(std::make_tuple(back.taps, back.causal, back.draft_vocab, back.block, back.arch_name),
            std::make_tuple(c.taps, c.causal, c.draft_vocab, c.block, c.arch_name));
}

TEST(SpeculatorsConfig, RefusesWhatTpdraftDoesNotRun) {
  auto refused = [](const std::function<void(nlohmann::json&)>& change, const std::vector<std::string>& parts) {
    nlohmann::json j = speculators_json();
    change(j);
    std::vector<std::string> all = parts;
    all.push_back("spec.json");
    expect_error([&] { DrafterConfig::from_json(j, "spec.json"); }, all);
  };
  refused([](auto& j) { j["speculators_model_type"] = "eagle3"; }, {"'eagle3'", "'dflash' layout only"});
  refused([](auto& j) { j["projector_type"] = "domino"; }, {"projector_type", "'domino'", "correction head"});
  refused([](auto& j) { j["sample_from_anchor"] = true; }, {"sample_from_anchor", "is true"});
  refused([](auto& j) { j["shift_label"] = true; }, {"shift_label", "is true"});
  refused([](auto& j) { j["target_hidden_size"] = 128; }, {"target_hidden_size", "128", "hidden_size 64"});
  refused([](auto& j) { j["aux_hidden_state_layer_ids"] = {0, 4}; }, {"aux_hidden_state_layer_ids", "holds 0"});
  refused([](auto& j) { j["transformer_layer_config"]["hidden_act"] = "gelu"; }, {"hidden_act", "'gelu'", "silu"});
  refused([](auto& j) { j["transformer_layer_config"]["rope_scaling"] = {{"rope_type", "yarn"}}; },
          {"transformer_layer_config", "rope_scaling.rope_type", "yarn"});
  refused([](auto& j) { j["draft_vocab_size"] = 301; }, {"draft_vocab_size", "301", "vocab_size = 300"});
  refused([](auto& j) { j.erase("aux_hidden_state_layer_ids"); }, {"missing required key 'aux_hidden_state_layer_ids'"});
  refused([](auto& j) { j.erase("transformer_layer_config"); }, {"missing required key 'transformer_layer_config'"});
  refused([](auto& j) { j["transformer_layer_config"].erase("hidden_size"); },
          {"transformer_layer_config", "missing required key 'hidden_size'"});
  refused([](auto& j) {
    j.erase("block_size");
    j.erase("speculators_config");
  }, {"missing required key 'block_size'", "speculative_tokens"});
  refused([](auto& j) { j["mask_token_id"] = nullptr; }, {"missing required key 'mask_token_id'"});
}

}  // namespace
}  // namespace tpdraft
