// One request's context: per layer, this rank's kv heads of the settled positions, in ring
// buffers (full layers hold max_context positions, sliding layers only window + block, since they
// never read further back). Position p lives in slot p % capacity.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/buffer.h"
#include "kernels/ops.h"

namespace tpdraft::model {

class Session {
 public:
  // Context length: positions [0, length()) are settled; the next anchor sits at length().
  int64_t length() const { return end_; }

 private:
  friend class Drafter;
  struct LayerCache {
    kernels::Buffer k, v;  // [capacity, n_kv_local, D] of DrafterLimits::kv_dtype
    int64_t capacity = 0;
    int64_t begin = 0;
  };
  std::vector<LayerCache> layers_;
  int64_t end_ = 0;
  int64_t max_context_ = 0;
};

}  // namespace tpdraft::model
