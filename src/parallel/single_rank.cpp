// The one-rank communicator: collectives are identities, so tp = 1 runs the same code path.
#include <cstring>

#include "parallel/communicator.h"

namespace tpdraft::parallel {

namespace {
class SingleRank final : public Communicator {
 public:
  std::string name() const override { return "single"; }
  void abort(const std::string&) override {}
  bool can_capture() const override { return true; }  // nothing moves

 protected:
  void do_all_reduce_sum(float*, size_t) override {}
  void do_all_gather(const void* send, void* recv, size_t bytes) override {
    if (send != recv) std::memmove(recv, send, bytes);
  }
  void do_broadcast(void*, size_t, int) override {}
  void do_barrier() override {}
};
}  // namespace

std::unique_ptr<Communicator> make_single_rank() { return std::make_unique<SingleRank>(); }

}  // namespace tpdraft::parallel
