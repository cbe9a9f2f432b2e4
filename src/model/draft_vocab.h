// Draft vocabularies (docs/model.md, "Draft vocabularies"): the target ids a reduced head scores
// and where each one's head row comes from; the token map files that restrict a full head
// (docs/checkpoint.md) and the speculators d2t / t2d tensors that describe a reduced one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tpdraft::model {

class TensorStore;

struct DraftVocab {
  std::vector<int64_t> ids;        // N target ids, strictly ascending, each below V
  std::vector<int64_t> head_rows;  // row of the head tensor that scores ids[j]
  std::string source;              // where the map came from, for messages
  int64_t size() const { return static_cast<int64_t>(ids.size()); }
};

// A draft vocabulary from target ids and the head rows that score them (same order, any order):
// sorted by target id. Refuses an empty list, an id outside [0, vocab) and an id given twice,
// naming `source`.
DraftVocab make_draft_vocab(const std::vector<int64_t>& target_ids, const std::vector<int64_t>& head_rows,
                            const std::string& source, int64_t vocab);

// The ids of a token map file: a JSON list of target ids (vLLM's format), or a safetensors file
// with a 1-D I64 tensor `token_ids`. Sorted and de-duplicated; an id outside [0, vocab) is refused
// naming it, and a PyTorch .pt list (SGLang's format) is refused with the command that converts it.
std::vector<int64_t> read_token_map(const std::string& path, int64_t vocab);
// Writes ascending ids as a token map file (a JSON list): to PATH.tmp, then renamed into place.
void write_token_map(const std::string& path, const std::vector<int64_t>& ids);

// The target id of each draft row of a speculators checkpoint: i + d2t[i] (d2t I64 [N]); t2d
// (BOOL [V]), when present, must mark exactly those ids. Errors name the file and the tensor.
std::vector<int64_t> read_d2t(const TensorStore& store, int64_t draft_vocab, int64_t vocab);

// Adds the token ids of a tokenized corpus file to counts[id] (counts holds the vocabulary):
// a safetensors file (every integer tensor in it, any shape), or text with integers separated
// by whitespace, commas or brackets (one document per line, or JSON lists). An id outside
// [0, counts.size()) or a word that is not an integer is refused, naming the file and where.
// Returns the tokens read; `progress(tokens)` is called every few million.
uint64_t count_corpus_tokens(const std::string& path, std::vector<uint64_t>& counts,
                             const std::function<void(uint64_t)>& progress = {});

// The token map of a corpus: every id of `keep`, then the most frequent others (ties to the
// lower id) up to n ids in all, ascending. Ids never seen are not listed, so the map may be
// shorter than n; a keep list longer than n is refused.
std::vector<int64_t> most_frequent(const std::vector<uint64_t>& counts, int64_t n, const std::vector<int64_t>& keep);

// n distinct ids of [0, vocab), ascending, drawn by `seed` (bench --token-map-size: for timing).
std::vector<int64_t> random_token_ids(int64_t vocab, int64_t n, uint64_t seed);

}  // namespace tpdraft::model
