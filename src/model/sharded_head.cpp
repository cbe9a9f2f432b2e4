// Vocabulary-parallel head exchanges. What crosses the wire per row: k (value, id) pairs for the
// candidates, one max and one sum for sampling; O(V) only for an explicit full-logits gather or
// the rare top-p pool overflow (a top-p without top-k whose mass needs more than kTopPPool tokens).
#include "model/sharded_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace tpdraft::model {

namespace {

// A candidate as it travels: fixed layout.
struct WireCandidate {
  float value;
  uint32_t valid;
  int64_t id;
};
static_assert(sizeof(WireCandidate) == kCandidateWireBytes, "wire layout");

// A rank's best Gumbel key of one row, with the logit behind it.
struct WireDraw {
  double key = 0;
  int64_t id = 0;
  float logit = 0;
  uint32_t valid = 0;
};
static_assert(sizeof(WireDraw) == kDrawWireBytes, "wire layout");

}  // namespace

std::vector<Candidate> local_top(const float* logits, int64_t width, int64_t id_base, int64_t k) {
  k = std::min(k, width);
  std::vector<Candidate> all(static_cast<size_t>(width));
  for (int64_t v = 0; v < width; ++v) all[static_cast<size_t>(v)] = {logits[v], id_base + v};
  std::partial_sort(all.begin(), all.begin() + k, all.end(), candidate_before);
  all.resize(static_cast<size_t>(k));
  return all;
}

std::vector<Candidate> local_top(const float* logits, const VocabSlice& slice, int64_t k) {
  std::vector<Candidate> top = local_top(logits, slice.width, slice.id_base, k);
  for (Candidate& c : top) c.id = slice.id(c.id);
  return top;
}

std::vector<std::vector<Candidate>> merge_candidates(const std::vector<std::vector<Candidate>>& local, int64_t k,
                                                     parallel::Communicator& comm) {
  const int tp = comm.size();
  const size_t rows = local.size();
  if (tp == 1) return local;
  std::vector<WireCandidate> send(rows * static_cast<size_t>(k), WireCandidate{0.0f, 0, 0});
  for (size_t r = 0; r < rows; ++r)
    for (size_t j = 0; j < local[r].size() && j < static_cast<size_t>(k); ++j)
      send[r * static_cast<size_t>(k) + j] = {local[r][j].value, 1, local[r][j].id};
  std::vector<WireCandidate> recv(send.size() * static_cast<size_t>(tp));
  comm.all_gather(send.data(), recv.data(), send.size() * sizeof(WireCandidate));
  std::vector<std::vector<Candidate>> merged(rows);
  for (size_t r = 0; r < rows; ++r) {
    std::vector<Candidate> all;
    for (int q = 0; q < tp; ++q)
      for (int64_t j = 0; j < k; ++j) {
        const WireCandidate& w = recv[(static_cast<size_t>(q) * rows + r) * static_cast<size_t>(k) + static_cast<size_t>(j)];
        if (w.valid) all.push_back({w.value, w.id});
      }
    const size_t keep = std::min(all.size(), static_cast<size_t>(k));
    std::partial_sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(keep), all.end(), candidate_before);
    all.resize(keep);
    merged[r] = std::move(all);
  }
  return merged;
}

std::vector<float> gather_logits(const float* local, int64_t rows, const VocabSlice& s, parallel::Communicator& comm) {
  const int tp = comm.size();
  const size_t stride = static_cast<size_t>(s.slice_stride);
  std::vector<float> send(static_cast<size_t>(rows) * stride, -std::numeric_limits<float>::infinity());
  for (int64_t r = 0; r < rows && s.width > 0; ++r)  // an empty slice (local may be null) sends padding only
    std::memcpy(send.data() + static_cast<size_t>(r) * stride, local + r * s.width, static_cast<size_t>(s.width) * sizeof(float));
  std::vector<float> recv(send.size() * static_cast<size_t>(tp));
  comm.all_gather(send.data(), recv.data(), send.size() * sizeof(float));
  std::vector<float> full(static_cast<size_t>(rows * s.vocab));
  for (int q = 0; q < tp; ++q) {
    const int64_t base = static_cast<int64_t>(q) * s.slice_stride;
    const int64_t width = std::max<int64_t>(0, std::min(s.slice_stride, s.vocab - base));
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(full.data() + r * s.vocab + base, recv.data() + (static_cast<size_t>(q) * static_cast<size_t>(rows) + static_cast<size_t>(r)) * stride,
                  static_cast<size_t>(width) * sizeof(float));
  }
  return full;
}

namespace {

// The exchanges every sampled batch of rows shares: the merged candidate pool of each row (its
// front is the row's max) and, unless top-k bounds the kept set, the all-reduced sum of
// exp((l - max) / T) over the whole vocabulary.
struct SampledRows {
  std::vector<std::vector<Candidate>> pool;
  std::vector<float> sums;
};

SampledRows exchange_pools(const float* local, int64_t rows, const VocabSlice& slice, const SamplingParams& s,
                           int64_t pool, parallel::Communicator& comm) {
  const double inv_t = 1.0 / s.temperature;
  const int64_t w = slice.width;
  std::vector<std::vector<Candidate>> tops(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) tops[static_cast<size_t>(r)] = local_top(local + r * w, slice, pool);
  SampledRows out{merge_candidates(tops, pool, comm), std::vector<float>(static_cast<size_t>(rows), 0.0f)};
  if (s.top_k > 0) return out;
  for (int64_t r = 0; r < rows; ++r) {
    const double mx = out.pool[static_cast<size_t>(r)].front().value * inv_t;
    double z = 0;
    for (int64_t v = 0; v < w; ++v) z += std::exp(local[r * w + v] * inv_t - mx);
    out.sums[static_cast<size_t>(r)] = static_cast<float>(z);
  }
  comm.all_reduce_sum(out.sums.data(), out.sums.size());
  return out;
}

// Unfiltered draws: Gumbel-max over each rank's slice, then the best key across ranks (ties to
// the lower id): one exchange of (key, id, logit) per row.
std::vector<Pick> draw_unfiltered(const float* local, int64_t rows, int64_t first_row, const VocabSlice& slice,
                                  const SamplingParams& s, const SampledRows& x, parallel::Communicator& comm) {
  const double inv_t = 1.0 / s.temperature;
  const int64_t w = slice.width;
  std::vector<WireDraw> mine(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t row = static_cast<uint64_t>(first_row + r);
    WireDraw& d = mine[static_cast<size_t>(r)];
    for (int64_t v = 0; v < w; ++v) {
      const int64_t id = slice.id(slice.id_base + v);
      const double key = local[r * w + v] * inv_t + gumbel_noise(s.seed, row, static_cast<uint64_t>(id));
      if (!d.valid || key > d.key) d = {key, id, local[r * w + v], 1};
    }
  }
  std::vector<WireDraw> all(mine.size() * static_cast<size_t>(comm.size()));
  comm.all_gather(mine.data(), all.data(), mine.size() * sizeof(WireDraw));
  std::vector<Pick> picks(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const WireDraw* best = nullptr;
    for (int q = 0; q < comm.size(); ++q) {
      const WireDraw& d = all[static_cast<size_t>(q) * mine.size() + static_cast<size_t>(r)];
      if (d.valid && (best == nullptr || d.key > best->key || (d.key == best->key && d.id < best->id))) best = &d;
    }
    const double mx = x.pool[static_cast<size_t>(r)].front().value * inv_t;
    picks[static_cast<size_t>(r)] = {best->id, static_cast<float>(std::exp(best->logit * inv_t - mx) / x.sums[static_cast<size_t>(r)])};
  }
  return picks;
}

// The kept prefix of a filtered row's pool (top-k, then the top-p prefix), or 0 when the
// nucleus needs more tokens than the pool holds (the row then takes the full-logits path).
size_t kept_prefix(const std::vector<Candidate>& cand, const SamplingParams& s, double sum_all, int64_t vocab) {
  if (s.top_p >= 1.0) return cand.size();
  const double inv_t = 1.0 / s.temperature, mx = cand.front().value * inv_t;
  double norm = sum_all;
  if (s.top_k > 0) {
    norm = 0;
    for (const Candidate& c : cand) norm += std::exp(c.value * inv_t - mx);
  }
  double mass = 0;
  size_t n = 0;
  while (n < cand.size()) {
    mass += std::exp(cand[n].value * inv_t - mx) / norm;
    ++n;
    if (mass >= s.top_p) break;
  }
  const bool overflow = mass < s.top_p && s.top_k == 0 && static_cast<int64_t>(cand.size()) < vocab;
  return overflow ? 0 : n;
}

// softmax(value / T) over the first `keep` candidates.
Support pool_support(const std::vector<Candidate>& cand, size_t keep, double inv_t) {
  const double mx = cand.front().value * inv_t;
  double z = 0;
  for (size_t i = 0; i < keep; ++i) z += std::exp(cand[i].value * inv_t - mx);
  Support out;
  for (size_t i = 0; i < keep; ++i) out.push_back({cand[i].id, std::exp(cand[i].value * inv_t - mx) / z});
  return out;
}

}  // namespace

std::vector<Pick> sample_sharded(const float* local, int64_t rows, int64_t first_row, const VocabSlice& slice,
                                 const SamplingParams& s, parallel::Communicator& comm, int64_t dist_width,
                                 std::vector<RowDistribution>* dists) {
  check_sampling(s);
  const double inv_t = 1.0 / s.temperature;
  const int64_t V = slice.vocab;
  const bool filtered = s.top_k > 0 || s.top_p < 1.0, want = dists != nullptr && dist_width != 0;
  // The pool: top_k; for top-p alone the nucleus search (and a wider distribution asked for);
  // unfiltered, the max (and the top of the distribution asked for).
  const int64_t asked = want && dist_width > 0 ? dist_width : 1;
  const int64_t pool = std::min(V, s.top_k > 0 ? s.top_k : filtered ? std::max(kTopPPool, asked) : asked);
  const SampledRows x = exchange_pools(local, rows, slice, s, pool, comm);

  std::vector<Pick> picks;
  std::vector<size_t> keep(static_cast<size_t>(rows), 0);
  if (!filtered) {
    picks = draw_unfiltered(local, rows, first_row, slice, s, x, comm);
  } else {
    picks.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const auto& cand = x.pool[static_cast<size_t>(r)];
      keep[static_cast<size_t>(r)] = kept_prefix(cand, s, x.sums[static_cast<size_t>(r)], V);
      if (keep[static_cast<size_t>(r)] == 0) continue;
      // A draw among the kept candidates, keyed by their values.
      picks[static_cast<size_t>(r)] = gumbel_draw(pool_support(cand, keep[static_cast<size_t>(r)], inv_t),
                                                  [&](size_t i) { return cand[i].value; }, inv_t, s.seed,
                                                  static_cast<uint64_t>(first_row + r));
    }
  }
  // Rows whose nucleus is wider than the pool, and whole distributions asked for, read the full
  // logits: every rank sees the same rows and the same request, so all of them gather. A draft
  // vocabulary's columns are spread over the target ids, -inf elsewhere.
  const bool overflow = filtered && std::count(keep.begin(), keep.end(), size_t{0}) > 0;
  const int64_t Vt = slice.id_range();
  std::vector<float> full;
  if (overflow || (want && dist_width == kFullDistribution)) {
    full = gather_logits(local, rows, slice, comm);
    if (slice.ids != nullptr) {
      std::vector<float> by_id(static_cast<size_t>(rows * Vt), -std::numeric_limits<float>::infinity());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < V; ++c) by_id[static_cast<size_t>(r * Vt + slice.ids[c])] = full[static_cast<size_t>(r * V + c)];
      full = std::move(by_id);
    }
  }
  for (int64_t r = 0; r < rows && overflow; ++r)
    if (keep[static_cast<size_t>(r)] == 0) picks[static_cast<size_t>(r)] = sample_from_logits(full.data() + r * Vt, Vt, first_row + r, s);
  if (!want) return picks;
  dists->clear();
  for (int64_t r = 0; r < rows; ++r) {
    const auto& cand = x.pool[static_cast<size_t>(r)];
    Support support;
    if (!full.empty() && (dist_width == kFullDistribution || (filtered && keep[static_cast<size_t>(r)] == 0))) {
      support = support_from_logits(full.data() + r * Vt, Vt, s);
    } else if (filtered) {
      support = pool_support(cand, keep[static_cast<size_t>(r)], inv_t);
    } else {
      const double mx = cand.front().value * inv_t, z = x.sums[static_cast<size_t>(r)];
      for (const Candidate& c : cand) support.push_back({c.id, std::exp(c.value * inv_t - mx) / z});
    }
    dists->push_back(shape_distribution(std::move(support), dist_width, Vt));
  }
  return picks;
}

}  // namespace tpdraft::model
