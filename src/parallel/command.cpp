// The in-process command channel: a queue per follower behind one lock.
#include "parallel/command.h"

#include <algorithm>

namespace tpdraft::parallel {

void Mailbox::post(const Command& c) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t r = 1; r < queues_.size(); ++r) queues_[r].push_back(c);
  }
  posted_.notify_all();
}

Command Mailbox::wait(int rank) {
  std::unique_lock<std::mutex> lock(mutex_);
  const size_t r = static_cast<size_t>(rank);
  busy_[r] = 0;
  finished_.notify_one();
  posted_.wait(lock, [&] { return !queues_[r].empty(); });
  const Command c = queues_[r].front();
  queues_[r].pop_front();
  busy_[r] = 1;
  return c;
}

void Mailbox::fail(int rank, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    errors_[static_cast<size_t>(rank)] = std::move(error);
    busy_[static_cast<size_t>(rank)] = 0;
  }
  finished_.notify_one();
}

std::exception_ptr Mailbox::settle(std::exception_ptr mine) {
  std::unique_lock<std::mutex> lock(mutex_);
  finished_.wait(lock, [&] {
    for (size_t r = 1; r < queues_.size(); ++r)
      if (busy_[r] || !queues_[r].empty()) return false;
    return true;
  });
  errors_[0] = std::move(mine);
  const auto first = std::find_if(errors_.begin(), errors_.end(), [](const auto& e) { return e != nullptr; });
  const std::exception_ptr error = first != errors_.end() ? *first : nullptr;
  std::fill(errors_.begin(), errors_.end(), nullptr);
  return error;
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
