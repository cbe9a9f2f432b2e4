// A tensor-parallel group of engines driven as one: sessions opened and closed on every rank
// (they get the same ids everywhere) and steps checked once, on rank 0, then applied on every rank,
// so that the step's collectives meet. Rank 0 leads (a LeaderGroup): it posts each command over a
// channel, and every other rank follows it. The followers are threads of this process in the
// library's handle (a LocalGroup), and MPI processes or threads in the program's groups (`tpdraft
// draft`, `bench` or `serve`). How many CPU threads each rank takes is decided here too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "parallel/command.h"
#include "parallel/communicator.h"

namespace tpdraft::engine {

// CPU threads per rank: `threads` when set, else this machine's cores shared among the
// `ranks_here` ranks placed on it (at least one each).
int threads_per_rank(int threads, int ranks_here);

class Group {
 public:
  virtual ~Group() = default;
  // Rank 0's engine: the caps, and what only rank 0 reports (session lengths, step times).
  virtual Engine& leader() = 0;
  const Caps& caps() { return leader().caps(); }
  virtual int64_t open_session() = 0;
  virtual void close_session(int64_t id) = 0;
  // A step: the entries were checked on rank 0 first (leader().check(): a bad one throws and
  // nothing changes; one rank's verdict is every rank's); their taps stay valid during the call.
  // With `dump`, every rank dumps alike and rank 0's lands there.
  virtual std::vector<model::DraftResult> apply(const std::vector<StepEntry>& entries, StepDump* dump = nullptr) = 0;
  // Ends the other ranks' part (once; also on destruction).
  virtual void close() = 0;
};

// Called on every rank of a led group just before its share of a step (the CLI's fault-injection point).
using StepHook = std::function<void()>;

// Rank 0 of a group led over a command channel: each call posts the command, then makes the
// engine call itself; the step's entries, tap rows inline (copied to the host from a device),
// follow on the group's communicator. With one rank there is no channel. With a mailbox
// (`local`) in its place, the followers are threads of this process: they read the entries and
// tap rows in place, and a call returns once every rank is done with it. When a call fails on
// any rank, the others are released from any collective they wait in and the first error is
// rethrown; the group is then broken, and every later call fails with that reason.
class LeaderGroup final : public Group {
 public:
  LeaderGroup(Engine& engine, parallel::Communicator& comm, parallel::CommandChannel* channel, StepHook hook,
              parallel::Mailbox* local = nullptr)
      : engine_(engine), comm_(comm), channel_(channel), hook_(std::move(hook)), local_(local) {}
  ~LeaderGroup() override { close(); }

  Engine& leader() override { return engine_; }
  int64_t open_session() override;
  void close_session(int64_t id) override;
  std::vector<model::DraftResult> apply(const std::vector<StepEntry>& entries, StepDump* dump = nullptr) override;
  void close() override;

 private:
  // Posts c, then runs this rank's share of it (and, in process, waits for the others').
  void lead(const parallel::Command& c, const std::function<void()>& mine);

  Engine& engine_;
  parallel::Communicator& comm_;
  parallel::CommandChannel* channel_;
  StepHook hook_;
  parallel::Mailbox* local_;
  std::vector<uint64_t> payload_;  // 8-byte aligned
  std::string broken_;
  bool closed_ = false;
};

// Every other rank of a led group: follows rank 0's commands until it says stop.
void follow(Engine& engine, parallel::Communicator& comm, parallel::CommandChannel& channel, const StepHook& hook);

// Ranks as threads of this process, the in-process communicator between them: a LeaderGroup on
// the caller's thread, and a thread per other rank that builds its engine and follows for as long
// as the group lives, so that a call costs a hand-off to waiting threads, not thread starts. With
// one rank there are no threads: the caller's thread runs it.
class LocalGroup final : public Group {
 public:
  // Builds `tp` ranks (each on its own thread, rank 0 on the caller's) and their engines.
  LocalGroup(const model::ModelSource& source, const model::RuntimeOptions& options, int tp,
             int64_t max_open_sessions);
  ~LocalGroup() override { close(); }
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  Engine& leader() override { return *engines_[0]; }
  int64_t open_session() override { return lead_->open_session(); }
  void close_session(int64_t id) override { lead_->close_session(id); }
  std::vector<model::DraftResult> apply(const std::vector<StepEntry>& entries, StepDump* dump = nullptr) override {
    return lead_->apply(entries, dump);
  }
  void close() override;  // ends and joins the rank threads

 private:
  void follower(int rank, const std::function<void(int)>& build);

  // Engines go before the communicators they use, and the threads before both.
  std::vector<std::unique_ptr<parallel::Communicator>> comms_;
  std::vector<std::unique_ptr<Engine>> engines_;
  parallel::Mailbox mailbox_;
  std::vector<std::thread> threads_;
  std::optional<LeaderGroup> lead_;
};

}  // namespace tpdraft::engine
