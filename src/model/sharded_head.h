// Head results when the vocabulary is split across ranks (docs/parallel.md): merging local
// top-k candidates into the same global list on every rank, exact sampling without gathering
// the distribution (a max and a sum-of-exp exchange give the exact normaliser; the draw is a
// Gumbel-max over keyed noise), and the full-logits gather for dumps. With one rank every
// exchange is the identity, so tp = 1 takes the same path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/selection.h"
#include "parallel/communicator.h"

namespace tpdraft::model {

// Bytes per item on the wire: a candidate (value f32, valid u32, id i64) and a rank's best
// Gumbel draw of a row (key f64, id i64, logit f32, valid u32). The cost model counts with these.
constexpr size_t kCandidateWireBytes = 16;
constexpr size_t kDrawWireBytes = 24;
// Tokens a top-p draw without top-k may need before falling back to the full gather.
constexpr int64_t kTopPPool = 256;

// This rank's slice of the head: columns [id_base, id_base + width) of `vocab`; `slice_stride` =
// Vp / tp, the widest slice (narrower ones are padded in exchanges). Column c scores token c, or,
// with a draft vocabulary, target id ids[c] (ascending, so candidate order is the same either
// way). Candidates, picks and distributions always carry target ids.
struct VocabSlice {
  int64_t id_base = 0;
  int64_t width = 0;
  int64_t slice_stride = 0;
  int64_t vocab = 0;              // columns of the whole head: V, or the draft vocabulary's N
  const int64_t* ids = nullptr;   // target id of every column [vocab]; null: the column itself
  int64_t target_vocab = 0;       // V when ids are given
  int64_t id(int64_t column) const { return ids != nullptr ? ids[column] : column; }
  int64_t id_range() const { return ids != nullptr ? target_vocab : vocab; }  // target ids lie below this
};

// Local candidates [rows][<= k] (ordered) -> the global top-k of every row, identical on every rank.
std::vector<std::vector<Candidate>> merge_candidates(const std::vector<std::vector<Candidate>>& local, int64_t k,
                                                     parallel::Communicator& comm);

// The k best of a local logits row (candidate order), ids offset by id_base.
std::vector<Candidate> local_top(const float* logits, int64_t width, int64_t id_base, int64_t k);
// The same over a slice's row, in target ids.
std::vector<Candidate> local_top(const float* logits, const VocabSlice& slice, int64_t k);

// All ranks' logits for `rows` rows assembled into [rows, vocab] on every rank (columns of the
// head: ascending target ids).
std::vector<float> gather_logits(const float* local, int64_t rows, const VocabSlice& slice,
                                 parallel::Communicator& comm);

// Samples one draft per row r = first_row .. first_row + rows - 1 from vocabulary-sharded logits
// (local: [rows, slice.width]) following docs/sampling.md exactly; identical on every rank. A draft
// vocabulary draws as the full head would with every other token's logit at -inf. With
// `dists`, each row's draft distribution of `dist_width` (selection.h): exact over the kept set
// when it is filtered; unfiltered, the top dist_width by the exact normaliser; the whole
// vocabulary (kFullDistribution) gathers the logits.
std::vector<Pick> sample_sharded(const float* local, int64_t rows, int64_t first_row, const VocabSlice& slice,
                                 const SamplingParams& s, parallel::Communicator& comm, int64_t dist_width = 0,
                                 std::vector<RowDistribution>* dists = nullptr);

}  // namespace tpdraft::model
