// The in-process command channel: a queue per follower behind one lock.
#include "parallel/command.h"

namespace tpdraft::parallel {

void Mailbox::post(const Command& c) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t r = 1; r < queues_.size(); ++r) queues_[r].push_back(c);
  }
  cv_.notify_all();
}

Command Mailbox::wait(int rank) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto& q = queues_[static_cast<size_t>(rank)];
  cv_.wait(lock, [&] { return !q.empty(); });
  const Command c = q.front();
  q.pop_front();
  return c;
}

std::unique_ptr<CommandChannel> Mailbox::channel(int rank) {
  class End final : public CommandChannel {
   public:
    End(Mailbox& box, int rank) : box_(box), rank_(rank) {}
    void post(const Command& c) override { box_.post(c); }
    Command wait() override { return box_.wait(rank_); }

   private:
    Mailbox& box_;
    int rank_;
  };
  return std::make_unique<End>(*this, rank);
}

}  // namespace tpdraft::parallel
