// The in-process communicator. A collective is two rendezvous around direct reads of the peers'
// buffers: each rank publishes its call and waits for all (enter, which an abort interrupts),
// does its share of the work, then waits again (finish) so that no rank returns, and lets its
// buffers go, while a peer may still be reading or writing them.
#include "parallel/thread_comm.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "core/error.h"

namespace tpdraft::parallel {
namespace {

enum class Op : uint8_t { kAllReduceF32, kAllGather, kBroadcast, kBarrier };

// What one rank asked for in the current collective.
struct Call {
  Op op = Op::kBarrier;
  size_t size = 0;  // elements for the all-reduce, bytes otherwise
  int root = 0;     // broadcast only
  const void* send = nullptr;
  void* recv = nullptr;  // the buffer this rank's result goes to
};

std::string describe(const Call& c) {
  switch (c.op) {
    case Op::kAllReduceF32: return fmt::format("all_reduce_sum(f32, {} elements)", c.size);
    case Op::kAllGather: return fmt::format("all_gather({} bytes)", c.size);
    case Op::kBroadcast: return fmt::format("broadcast({} bytes, root {})", c.size, c.root);
    case Op::kBarrier: return "barrier()";
  }
  return "unknown collective";
}

// The elements [first, second) rank r reduces for everyone: near-equal contiguous slices.
std::pair<size_t, size_t> slice_of(size_t count, int n, int r) {
  const size_t base = count / n, extra = count % n, ur = static_cast<size_t>(r);
  const size_t begin = base * ur + std::min(ur, extra);
  return {begin, begin + base + (ur < extra ? 1 : 0)};
}

// State shared by the ranks of one group: the published calls and a reusable generation barrier.
class Group {
 public:
  explicit Group(int n) : n_(n), calls_(n) {}
  int size() const { return n_; }
  const Call& call(int r) const { return calls_[r]; }

  // Publishes this rank's call and waits for all ranks. Throws on every rank when the calls
  // disagree, and on a waiting or entering rank when the group is aborted or a rank has left.
  void enter(int rank, const Call& call) {
    std::unique_lock<std::mutex> lock(mu_);
    throw_if_broken(rank);
    calls_[rank] = call;
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      check_calls_locked(gen);
      advance_locked();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen || broken_locked(); });
      if (generation_ == gen) {  // interrupted before the last rank arrived
        --arrived_;
        throw_if_broken(rank);
      }
    }
    // Released: the peers' buffers are ours to read until finish(), even if an abort lands now.
    if (mismatch_generation_ == gen) TPDRAFT_FAIL("rank {}: {}", rank, mismatch_);
  }

  // Waits until every rank has done its share. Not interruptible: all ranks have passed enter()
  // and the work in between cannot fail, so every rank is bound to arrive.
  void finish() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      advance_locked();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen; });
  }

  void abort(int rank, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_by_ < 0) {
      aborted_by_ = rank;
      abort_reason_ = reason;
    }
    cv_.notify_all();
  }

  // The rank will make no more calls: collectives still waiting for it can never complete.
  void depart(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    if (left_rank_ < 0) left_rank_ = rank;
    cv_.notify_all();
  }

 private:
  bool broken_locked() const { return aborted_by_ >= 0 || left_rank_ >= 0 || !mismatch_.empty(); }

  void throw_if_broken(int rank) const {
    if (aborted_by_ >= 0) TPDRAFT_FAIL("rank {}: collective aborted by rank {}: {}", rank, aborted_by_, abort_reason_);
    if (!mismatch_.empty()) TPDRAFT_FAIL("rank {}: collective refused after an earlier error: {}", rank, mismatch_);
    if (left_rank_ >= 0) TPDRAFT_FAIL("rank {}: collective cannot complete: rank {} has left the group", rank, left_rank_);
  }

  void advance_locked() {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
  }

  // Run by the last rank to arrive, so every rank sees the same verdict for this generation.
  void check_calls_locked(uint64_t gen) {
    const Call& first = calls_[0];
    for (int r = 1; r < n_; ++r) {
      const Call& c = calls_[r];
      const bool same = c.op == first.op && c.size == first.size && (c.op != Op::kBroadcast || c.root == first.root);
      if (!same) {
        mismatch_ = fmt::format("mismatched collectives: rank 0 called {}, rank {} called {}", describe(first), r, describe(c));
        break;
      }
    }
    if (mismatch_.empty() && first.op == Op::kBroadcast && (first.root < 0 || first.root >= n_))
      mismatch_ = fmt::format("broadcast root {} is not a rank of a group of {}", first.root, n_);
    if (!mismatch_.empty()) mismatch_generation_ = gen;
  }

  const int n_;
  std::vector<Call> calls_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  int aborted_by_ = -1;
  std::string abort_reason_;
  int left_rank_ = -1;
  std::string mismatch_;
  uint64_t mismatch_generation_ = std::numeric_limits<uint64_t>::max();
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> group, int rank)
      : Communicator(rank, group->size()), group_(std::move(group)) {}
  ~ThreadCommunicator() override { group_->depart(rank_); }

  std::string name() const override { return "threads"; }

  void abort(const std::string& reason) override { group_->abort(rank_, reason); }

  void depart() { group_->depart(rank_); }

 protected:
  void do_all_reduce_sum(float* data, size_t count) override {
    group_->enter(rank_, Call{Op::kAllReduceF32, count, 0, data, data});
    reduce_f32_slice(count);
    group_->finish();
  }

  void do_all_gather(const void* send, void* recv, size_t bytes) override {
    group_->enter(rank_, Call{Op::kAllGather, bytes, 0, send, recv});
    auto* out = static_cast<uint8_t*>(recv);
    for (int k = 0; k < size() && bytes > 0; ++k) {
      const void* src = group_->call(k).send;
      void* dst = out + static_cast<size_t>(k) * bytes;
      if (src != dst) std::memmove(dst, src, bytes);  // equal when this rank gathers in place
    }
    group_->finish();
  }

  void do_broadcast(void* data, size_t bytes, int root) override {
    group_->enter(rank_, Call{Op::kBroadcast, bytes, root, data, data});
    if (rank_ != root && bytes > 0) std::memcpy(data, group_->call(root).send, bytes);
    group_->finish();
  }

  void do_barrier() override { group_->enter(rank_, Call{}); }

 private:
  // This rank's slice, summed in rank order into rank 0's buffer and copied to the others. No
  // other rank touches these elements, and everyone gets the very same bits.
  void reduce_f32_slice(size_t count) {
    const auto [begin, end] = slice_of(count, size(), rank_);
    if (begin == end) return;
    float* acc = static_cast<float*>(group_->call(0).recv);
    for (int k = 1; k < size(); ++k) {
      const float* x = static_cast<const float*>(group_->call(k).recv);
      for (size_t i = begin; i < end; ++i) acc[i] += x[i];
    }
    for (int k = 1; k < size(); ++k)
      std::memcpy(static_cast<float*>(group_->call(k).recv) + begin, acc + begin, (end - begin) * sizeof(float));
  }

  std::shared_ptr<Group> group_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_group(int n) {
  TPDRAFT_CHECK(n >= 1, "thread communicator: group size {} must be at least 1", n);
  auto group = std::make_shared<Group>(n);
  std::vector<std::unique_ptr<Communicator>> ranks;
  ranks.reserve(n);
  for (int r = 0; r < n; ++r) ranks.push_back(std::make_unique<ThreadCommunicator>(group, r));
  return ranks;
}

void run_ranks(int n, const std::function<void(Communicator&)>& fn) {
  auto comms = make_thread_group(n);
  std::mutex mu;
  int failed_rank = -1;
  std::string failure;

  auto body = [&](int r) {
    auto& comm = static_cast<ThreadCommunicator&>(*comms[r]);
    try {
      fn(comm);
    } catch (...) {
      const std::string what = message_of(std::current_exception());
      {
        std::lock_guard<std::mutex> lock(mu);
        if (failed_rank < 0) {  // recorded before aborting, so the originator is the one kept
          failed_rank = r;
          failure = what;
        }
      }
      comm.abort(what);
    }
    comm.depart();
  };

  std::vector<std::thread> threads;
  threads.reserve(n);
  try {
    for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  } catch (...) {  // could not start a thread: release the ones that did, then report
    comms[0]->abort("could not start all rank threads");
    for (auto& t : threads) t.join();
    throw;
  }
  for (auto& t : threads) t.join();

  if (failed_rank >= 0) {
    const std::string prefix = fmt::format("rank {}:", failed_rank);
    if (failure.compare(0, prefix.size(), prefix) == 0) TPDRAFT_FAIL("{}", failure);
    TPDRAFT_FAIL("{} {}", prefix, failure);
  }
}

}  // namespace tpdraft::parallel
