// The command channel of a group driven by its rank 0: rank 0 posts what the group does next
// (open or close a session, run a step, stop) and every other rank waits for it, in order. The
// commands travel apart from the group's collectives so that an idle follower neither spins a
// core nor sits in a collective (where a --comm-timeout watchdog would end it). In process a
// mailbox carries them; under MPI, parallel/launch.h opens a channel over the group's processes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

namespace tpdraft::parallel {

enum Op : int64_t { kOpStop = 0, kOpOpen = 1, kOpClose = 2, kOpStep = 3 };
struct Command {
  int64_t op = kOpStop, arg = 0, bytes = 0;
};

class CommandChannel {
 public:
  virtual ~CommandChannel() = default;
  virtual void post(const Command& c) = 0;  // rank 0
  virtual Command wait() = 0;               // the other ranks, in order
};

// In process: one mailbox for the group's threads, a queue per follower.
class Mailbox {
 public:
  explicit Mailbox(int ranks) : queues_(static_cast<size_t>(ranks)) {}
  void post(const Command& c);
  Command wait(int rank);
  // Rank `rank`'s end of the mailbox.
  std::unique_ptr<CommandChannel> channel(int rank);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::deque<Command>> queues_;
};

}  // namespace tpdraft::parallel
