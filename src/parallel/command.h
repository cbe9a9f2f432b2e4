// The command channel of a group driven by its rank 0: rank 0 posts what the group does next
// (open or close a session, run a step, stop) and every other rank waits for it, in order. The
// commands travel apart from the group's collectives so that an idle follower neither spins a
// core nor sits in a collective (where a --comm-timeout watchdog would end it). In process a
// mailbox carries them; under MPI, parallel/launch.h opens a channel over the group's processes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

namespace tpdraft::parallel {

enum Op : int64_t { kOpStop = 0, kOpOpen = 1, kOpClose = 2, kOpStep = 3 };
struct Command {
  int64_t op = kOpStop, arg = 0, bytes = 0;
  const void* local = nullptr;  // in process: what the command reads in place (a step's entries)
};

class CommandChannel {
 public:
  virtual ~CommandChannel() = default;
  virtual void post(const Command& c) = 0;  // rank 0
  virtual Command wait() = 0;               // the other ranks, in order
};

// In process: one mailbox for the group's threads, a queue per follower. Rank 0 may also wait
// until the followers have finished what it posted (settle): a follower has once it waits for the
// next command or reports a failure. At the start every follower counts as busy, so that rank 0
// can wait for their set-up too.
class Mailbox {
 public:
  explicit Mailbox(int ranks)
      : queues_(static_cast<size_t>(ranks)), busy_(queues_.size(), 1), errors_(queues_.size()) {}
  void post(const Command& c);
  Command wait(int rank);
  void fail(int rank, std::exception_ptr error);
  // Returns once every follower has finished, with the first failure by rank (rank 0's: `mine`).
  std::exception_ptr settle(std::exception_ptr mine);
  // Rank `rank`'s end of the mailbox.
  std::unique_ptr<CommandChannel> channel(int rank);

 private:
  std::mutex mutex_;
  std::condition_variable posted_, finished_;
  std::vector<std::deque<Command>> queues_;
  std::vector<char> busy_;  // a follower's last command is not finished yet
  std::vector<std::exception_ptr> errors_;
};

}  // namespace tpdraft::parallel
