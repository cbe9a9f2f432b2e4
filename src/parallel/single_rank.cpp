// The one-rank communicator: collectives are identities, so tp = 1 runs the same code path.
#include <cstring>

#include "parallel/communicator.h"

namespace tpdraft::parallel {

namespace {
class SingleRank final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "single"; }
  void all_reduce_sum(float*, size_t count) override {
    Timed timed(stats_);
    ++stats_.all_reduce_calls;
    stats_.all_reduce_bytes += count * sizeof(float);
  }
  // A sum over one rank is the value itself, already a bf16: nothing to round.
  void all_reduce_sum_bf16(uint16_t*, size_t count) override {
    Timed timed(stats_);
    ++stats_.all_reduce_calls;
    stats_.all_reduce_bytes += count * sizeof(uint16_t);
  }
  void all_gather(const void* send, void* recv, size_t bytes) override {
    Timed timed(stats_);
    ++stats_.all_gather_calls;
    stats_.all_gather_bytes += bytes;
    if (send != recv) std::memmove(recv, send, bytes);
  }
  void broadcast(void*, size_t bytes, int) override {
    Timed timed(stats_);
    ++stats_.broadcast_calls;
    stats_.broadcast_bytes += bytes;
  }
  void barrier() override {
    Timed timed(stats_);
    ++stats_.barrier_calls;
  }
  void abort(const std::string&) override {}
  bool can_capture() const override { return true; }  // nothing moves
};
}  // namespace

std::unique_ptr<Communicator> make_single_rank() { return std::make_unique<SingleRank>(); }

}  // namespace tpdraft::parallel
