// A served drafter's tensor-parallel group: rank 0 talks to clients and tells the other ranks
// what to do next (open or close a session, run a step, stop); every rank then makes the same
// engine calls, so sessions get the same ids everywhere and the step's collectives meet. The
// command headers travel on their own channel so that an idle follower neither spins a core nor
// sits in a collective (where a --comm-timeout watchdog would end it).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/engine.h"
#include "parallel/communicator.h"

namespace tpdraft::serve {

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

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::deque<Command>> queues_;
};
std::unique_ptr<CommandChannel> mailbox_channel(Mailbox& box, int rank);
// Under MPI: when the group's ranks share one machine, a shared-memory segment a waiting
// follower sleeps on (a futex); otherwise a non-blocking broadcast on a duplicate of the group's
// communicator, polled with a short sleep once the group has been idle for a while. Collective
// over the group. Null without MPI or for other groups.
std::unique_ptr<CommandChannel> mpi_channel(parallel::Communicator& group);

// Called on every rank just before its share of a step (the CLI's fault-injection point).
using StepHook = std::function<void()>;

// Rank 0's side: each call posts the command, then makes the engine call itself.
class GroupLeader {
 public:
  GroupLeader(engine::Engine& engine, parallel::Communicator& comm, CommandChannel* channel, StepHook hook)
      : engine_(engine), comm_(comm), channel_(channel), hook_(std::move(hook)) {}
  ~GroupLeader() { stop(); }
  engine::Engine& engine() { return engine_; }
  int64_t open_session();
  void close_session(int64_t id);
  // The entries were checked by engine().check(); their taps stay valid during the call.
  std::vector<model::DraftResult> apply(const std::vector<engine::StepEntry>& entries);
  // Tells the other ranks to end (once; also on destruction).
  void stop();

 private:
  engine::Engine& engine_;
  parallel::Communicator& comm_;
  CommandChannel* channel_;
  StepHook hook_;
  std::vector<uint64_t> payload_;  // 8-byte aligned
  bool stopped_ = false;
};

// Every other rank: follows rank 0's commands until it says stop.
void follow(engine::Engine& engine, parallel::Communicator& comm, CommandChannel& channel, const StepHook& hook);

}  // namespace tpdraft::serve
