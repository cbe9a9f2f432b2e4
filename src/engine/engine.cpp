// A step on one rank: check every entry, then roll back, settle and draft (and dump, when asked).
#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "core/bounds.h"
#include "core/checked.h"
#include "core/error.h"
#include "model/shard_plan.h"

namespace tpdraft::engine {

namespace {
// Every layer's context of every kv head, [n, Nk, D], assembled from the ranks' slices (collective).
void gather_context(const model::Drafter& drafter, const model::Session& session, parallel::Communicator& comm,
                    StepDump* dump) {
  const model::DrafterConfig& cfg = drafter.config();
  const int tp = comm.size();
  const int64_t n = session.length(), D = cfg.head_dim;
  std::vector<float> lk, lv;
  dump->k.resize(static_cast<size_t>(cfg.layers));
  dump->v.resize(dump->k.size());
  for (int64_t l = 0; l < cfg.layers; ++l) {
    drafter.read_context(session, l, &lk, &lv);
    const size_t at = static_cast<size_t>(l);
    for (const auto& [mine, out] : {std::pair{&lk, &dump->k[at]}, std::pair{&lv, &dump->v[at]}}) {
      std::vector<float> all(mine->size() * static_cast<size_t>(tp));
      comm.all_gather(mine->data(), all.data(), mine->size() * sizeof(float));
      out->assign(static_cast<size_t>(n * cfg.n_kv * D), 0.0f);
      for (int q = 0; q < tp; ++q) {
        const model::Range heads = model::ShardPlan::make(cfg, q, tp).kv_heads;
        const int64_t w = heads.size() * D;
        for (int64_t p = 0; p < n; ++p)
          std::copy_n(all.data() + static_cast<size_t>(q) * mine->size() + static_cast<size_t>(p * w), w,
                      out->data() + static_cast<size_t>((p * cfg.n_kv + heads.begin) * D));
      }
    }
  }
}
}  // namespace

Engine::Engine(const model::ModelSource& source, parallel::Communicator& group, const model::RuntimeOptions& options,
               int64_t max_open_sessions)
    : rt_(std::make_unique<model::RankRuntime>(source, group, options)) {
  TPDRAFT_CHECK(max_open_sessions >= 1, "the sessions open at once must be at least 1, got {}", max_open_sessions);
  const model::DrafterConfig& cfg = rt_->config();
  const model::DrafterLimits& limits = rt_->drafter().limits();
  caps_ = {cfg.arch_name, cfg.block, cfg.n_taps() * cfg.hidden, cfg.hidden, cfg.vocab, cfg.head_vocab(), cfg.mask_token,
           cfg.taps, rt_->comm().size(), limits.max_sessions, limits.max_context, max_open_sessions};
}

int64_t Engine::open_session() {
  TPDRAFT_CHECK(static_cast<int64_t>(sessions_.size()) < caps_.max_open_sessions,
                "cannot open another session: all {} allowed (max open sessions) are open", sessions_.size());
  const int64_t id = next_id_++;
  sessions_.emplace(id, rt_->drafter().new_session());
  return id;
}

void Engine::close_session(int64_t id) {
  TPDRAFT_CHECK(sessions_.erase(id) == 1, "session {} is not open", id);
}

model::Session& Engine::session(int64_t id) const {
  const auto it = sessions_.find(id);
  TPDRAFT_CHECK(it != sessions_.end(), "session {} is not open", id);
  return *it->second;
}

int64_t Engine::session_length(int64_t id) const { return session(id).length(); }

void Engine::check_taps(const StepEntry& e, int64_t p0) const {
  if (e.n_new == 0) return;
  TPDRAFT_CHECK(e.taps.data != nullptr, "{} new rows but no taps", e.n_new);
  TPDRAFT_CHECK(e.taps.dtype == DType::F32 || e.taps.dtype == DType::BF16 || e.taps.dtype == DType::F16,
                "taps must be f32, bf16 or f16, got {}", dtype_name(e.taps.dtype));
  if (e.taps.on_device) {
    // Device rows are read where they lie; their values show in the draft's own checks.
    TPDRAFT_CHECK(!rt_->ops().host_memory(), "taps in device memory, but the {} backend has no device",
                  rt_->ops().name());
    const std::string foreign = rt_->ops().foreign_memory(e.taps.data);
    TPDRAFT_CHECK(foreign.empty(), "taps_on_device is set, but the taps are {}", foreign);
    return;
  }
  const int64_t count = checked_mul(e.n_new, caps_.taps_width, "{} tap rows of {} floats", e.n_new, caps_.taps_width);
  const int64_t bad = find_out_of_range(e.taps.dtype, e.taps.data, static_cast<size_t>(count), kTapLog2Bound);
  if (bad < 0) return;
  float value = 0;
  convert_to_f32(e.taps.dtype, static_cast<const std::byte*>(e.taps.data) + static_cast<size_t>(bad) * dtype_size(e.taps.dtype),
                 &value, 1);
  TPDRAFT_CHECK(std::isfinite(value), "the taps of position {} (new row {}) hold NaN or Inf at column {}",
                p0 + bad / caps_.taps_width, bad / caps_.taps_width, bad % caps_.taps_width);
  TPDRAFT_FAIL("the taps of position {} (new row {}) hold {} at column {}, beyond the ±2^{} a hidden state may hold "
               "(larger ones overflow the drafter's f32 arithmetic)", p0 + bad / caps_.taps_width,
               bad / caps_.taps_width, value, bad % caps_.taps_width, kTapLog2Bound);
}

void Engine::check(const std::vector<StepEntry>& entries) const {
  TPDRAFT_CHECK(!entries.empty() && static_cast<int64_t>(entries.size()) <= caps_.max_sessions,
                "a step takes 1 to {} entries (max sessions), got {}", caps_.max_sessions, entries.size());
  std::set<int64_t> seen;
  for (size_t i = 0; i < entries.size(); ++i) {
    // Every refusal names its entry, the drafter's own checks (anchor, sampling, roll-back) too.
    try {
      check_entry(entries[i], &seen);
    } catch (const Error& e) {
      throw Error(fmt::format("entry {}: {}", i, e.what()));
    }
  }
}

void Engine::check_entry(const StepEntry& e, std::set<int64_t>* seen) const {
  TPDRAFT_CHECK(seen->insert(e.session).second, "session {} appears twice in one step", e.session);
  const model::Session& s = session(e.session);
  TPDRAFT_CHECK(e.keep >= -1 && e.keep <= s.length(), "keep {} outside 0..{} (session {} holds {})", e.keep,
                s.length(), e.session, s.length());
  const int64_t kept = e.keep < 0 ? s.length() : e.keep;
  TPDRAFT_CHECK(e.p0 >= -1 && e.p0 <= kept, "p0 {} outside 0..{} (the length after keep)", e.p0, kept);
  const int64_t p0 = e.p0 < 0 ? kept : e.p0;
  TPDRAFT_CHECK(e.n_new >= 0 && e.n_new <= caps_.max_context - p0,
                "{} new rows at position {} do not fit the max context {}", e.n_new, p0, caps_.max_context);
  // The session is cut to p0 (keep >= p0) and the new rows settled there: what the draft then
  // reads below p0 must still be held.
  rt_->drafter().check_rollback(s, p0, e.n_new);
  check_taps(e, p0);
  model::Drafter::check_request(rt_->config(), e.anchor, e.sampling);
  TPDRAFT_CHECK(e.dist_width >= model::kFullDistribution && e.dist_width <= caps_.vocab,
                "a distribution width must be 0, 1..{} or {} (every token), got {}", caps_.vocab,
                model::kFullDistribution, e.dist_width);
}

const float* Engine::taps_f32(const StepEntry& e) {
  if (e.n_new == 0) return nullptr;
  if (e.taps.on_device) rt_->ops().wait_for(e.taps.stream);
  if (e.taps.dtype == DType::F32) return static_cast<const float*>(e.taps.data);
  const int64_t count = e.n_new * caps_.taps_width;
  if (e.taps.on_device) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(float);
    if (device_staged_.bytes() < bytes) device_staged_ = kernels::Buffer(rt_->ops(), bytes);
    rt_->ops().widen_to_f32(e.taps.dtype, e.taps.data, device_staged_.f32(), count);
    return device_staged_.f32();
  }
  staged_.resize(std::max(staged_.size(), static_cast<size_t>(count)));
  convert_to_f32(e.taps.dtype, e.taps.data, staged_.data(), static_cast<size_t>(count));
  return staged_.data();
}

std::vector<model::DraftResult> Engine::step(const std::vector<StepEntry>& entries, StepDump* dump) {
  check(entries);
  return apply(entries, dump);
}

std::vector<model::DraftResult> Engine::apply(const std::vector<StepEntry>& entries, StepDump* dump) {
  using Clock = std::chrono::steady_clock;
  model::Drafter& d = rt_->drafter();
  std::vector<model::DraftRequest> requests;
  requests.reserve(entries.size());
  const auto t0 = Clock::now();
  for (const StepEntry& e : entries) {
    model::Session& s = session(e.session);
    // Settling cuts the session to p0 first, so keep (>= p0) needs no roll-back of its own.
    const int64_t p0 = e.p0 >= 0 ? e.p0 : e.keep >= 0 ? e.keep : s.length();
    d.settle(s, p0, taps_f32(e), e.n_new);
    requests.push_back({&s, e.anchor, e.sampling, e.dist_width});
  }
  const auto t1 = Clock::now();
  const parallel::CommStats comm0 = rt_->comm().stats();
  auto results = d.draft(requests, dump != nullptr ? &dump->draft : nullptr);
  times_.settle = std::chrono::duration<double>(t1 - t0).count();
  times_.draft = std::chrono::duration<double>(Clock::now() - t1).count();
  (times_.comm = rt_->comm().stats()) -= comm0;
  if (dump != nullptr && dump->context) gather_context(d, session(entries[0].session), rt_->comm(), dump);
  return results;
}

}  // namespace tpdraft::engine
