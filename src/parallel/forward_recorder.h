// A forward pass made of ops and all-reduces, captured once per key (the drafter's session
// count) and replayed: a CUDA graph on the GPU, a call tape on the CPU. A communicator that can
// join a capture (one rank, NCCL) becomes part of the graph; any other runs between graph
// segments, so the forward is then captured in one more segment than it has all-reduces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "parallel/communicator.h"

namespace tpdraft::parallel {

class ForwardRecorder {
 public:
  // enabled = false: every forward is issued op by op.
  ForwardRecorder(kernels::Ops& ops, Communicator& comm, bool enabled);

  // Whether forwards are captured and replayed: false when disabled, or after a capture failed on
  // any rank (every rank then goes on op by op, so all keep issuing the same collectives).
  bool enabled() const { return enabled_; }

  // Runs forward `key`: replays its graph when one was captured, else calls `issue` (which must
  // issue the same ops for the same key every time, with its all-reduces through all_reduce_sum
  // below) and, when enabled, captures a graph of it right after: the first run has sized every
  // workspace, so the capture allocates nothing. Returns true when it replayed. `what` names the
  // forward in errors.
  bool run(int64_t key, const std::function<void()>& issue, const std::string& what);

  // The all-reduce of backend memory inside a forward: issued at once, captured into the graph,
  // or, while capturing for a communicator that cannot join, recorded to run between segments.
  void all_reduce_sum(float* data, size_t count);

  // Graph segments held for `key` (0: none captured), and the nodes (kernels, copies; calls on
  // the CPU) they hold together.
  size_t segments(int64_t key) const;
  size_t nodes(int64_t key) const;

 private:
  struct Graph {
    std::vector<std::unique_ptr<kernels::OpGraph>> segments;
    std::vector<std::pair<float*, size_t>> reduces;  // reduces[i] runs after segments[i]
    CommStats captured;  // collectives inside the segments: counted on each replay
  };

  void replay(const Graph& g, const std::string& what);
  void capture(int64_t key, const std::function<void()>& issue, const std::string& what);
  // Every rank keeps graphs only when all of them captured; false on this rank's failure too.
  bool all_captured(bool captured_here);

  kernels::Ops& ops_;
  Communicator& comm_;
  bool enabled_;
  std::map<int64_t, Graph> graphs_;
  Graph* capturing_ = nullptr;  // the graph being captured, if any
};

}  // namespace tpdraft::parallel
