// Capturing and replaying forwards, and keeping the communicator's counters true to what ran:
// collectives issued into a graph during its capture did not run then (their counts are taken
// back), and they run each time the graph replays (their counts are added).
#include "parallel/forward_recorder.h"

#include "core/log.h"

namespace tpdraft::parallel {

ForwardRecorder::ForwardRecorder(kernels::Ops& ops, Communicator& comm, bool enabled)
    : ops_(ops), comm_(comm), enabled_(enabled) {}

size_t ForwardRecorder::segments(int64_t key) const {
  const auto it = graphs_.find(key);
  return it == graphs_.end() ? 0 : it->second.segments.size();
}

size_t ForwardRecorder::nodes(int64_t key) const {
  const auto it = graphs_.find(key);
  size_t n = 0;
  if (it != graphs_.end())
    for (const auto& s : it->second.segments) n += s->nodes();
  return n;
}

bool ForwardRecorder::run(int64_t key, const std::function<void()>& issue, const std::string& what) {
  if (enabled_) {
    const auto it = graphs_.find(key);
    if (it != graphs_.end()) {
      replay(it->second, what);
      return true;
    }
  }
  issue();
  if (enabled_) capture(key, issue, what);
  return false;
}

void ForwardRecorder::replay(const Graph& g, const std::string& what) {
  for (size_t i = 0; i < g.segments.size(); ++i) {
    ops_.replay(*g.segments[i]);
    if (i < g.reduces.size()) comm_.all_reduce_sum(g.reduces[i].first, g.reduces[i].second);
  }
  comm_.stats_ += g.captured;
  if (g.captured.all_reduce_calls > 0) comm_.wait_pending(what);
}

void ForwardRecorder::all_reduce_sum(float* data, size_t count) {
  if (capturing_ != nullptr && !comm_.can_capture()) {
    // A host communicator: close the segment here; on replay the all-reduce runs between this
    // segment and the next.
    capturing_->segments.push_back(ops_.end_capture());
    capturing_->reduces.emplace_back(data, count);
    ops_.begin_capture();
    return;
  }
  comm_.all_reduce_sum(data, count);
}

void ForwardRecorder::capture(int64_t key, const std::function<void()>& issue, const std::string& what) {
  Graph g;
  const CommStats before = comm_.stats();
  std::string failure;
  capturing_ = &g;
  try {
    ops_.begin_capture();
    issue();
    g.segments.push_back(ops_.end_capture());
  } catch (const std::exception& e) {
    ops_.abort_capture();
    failure = e.what();
  }
  capturing_ = nullptr;
  // Collectives that joined the capture were counted as if they had run; they run on replay.
  g.captured = comm_.stats();
  g.captured -= before;
  g.captured.seconds = 0;
  const bool kept = all_captured(failure.empty());
  // Neither the capture nor the agreement moved any of the forward's data.
  comm_.stats_ = before;
  if (kept) {
    graphs_.emplace(key, std::move(g));
    return;
  }
  graphs_.clear();
  enabled_ = false;
  if (!failure.empty())
    TPDRAFT_LOG_WARN("capturing {} failed; issuing forwards op by op from now on: {}", what, failure);
  else
    TPDRAFT_LOG_WARN("another rank could not capture {}; issuing forwards op by op from now on", what);
}

bool ForwardRecorder::all_captured(bool captured_here) {
  float failed = captured_here ? 0.0f : 1.0f;
  if (comm_.size() > 1) comm_.all_reduce_sum(&failed, 1);
  return failed == 0.0f;
}

}  // namespace tpdraft::parallel
