// A tensor-parallel group of engines driven as one: sessions opened and closed on every rank
// (they get the same ids everywhere) and steps checked once, on rank 0, then applied on every rank,
// so that the step's collectives meet. Two kinds: ranks as threads of this process (the
// library's handle), and ranks led by rank 0 over a command channel (the program's groups, whose
// ranks are MPI processes or threads of `tpdraft draft`, `bench` or `serve`): rank 0 drives a
// LeaderGroup, every other rank follows. How many CPU threads each rank takes is decided here too.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
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

// Ranks as threads of this process: one rank per thread, the in-process communicator between
// them. The threads live as long as the group, so a call costs a hand-off to waiting threads,
// not thread starts. With one rank there are no threads: the caller's thread runs it. When a
// call fails on any rank, the others are released from any collective they wait in and the
// first error is rethrown; the group is then broken, and every later call fails with that reason.
class LocalGroup final : public Group {
 public:
  // Builds `tp` ranks (each on its own thread, rank 0 on the caller's) and their engines.
  LocalGroup(const model::ModelSource& source, const model::RuntimeOptions& options, int tp,
             int64_t max_open_sessions);
  ~LocalGroup() override;
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  Engine& leader() override { return *engines_[0]; }
  int64_t open_session() override;
  void close_session(int64_t id) override;
  std::vector<model::DraftResult> apply(const std::vector<StepEntry>& entries, StepDump* dump = nullptr) override;
  void close() override;  // ends and joins the rank threads

 private:
  // Runs fn(engine of rank r) on every rank at once and returns when all are done.
  void on_all(const std::function<void(Engine&)>& fn);
  void run(const std::function<void(int)>& job);
  void worker(int rank);

  std::vector<std::unique_ptr<parallel::Communicator>> comms_;
  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::string broken_;
};

// Called on every rank of a led group just before its share of a step (the CLI's fault-injection point).
using StepHook = std::function<void()>;

// Rank 0 of a group led over a command channel: each call posts the command, then makes the
// engine call itself; the step's entries, tap rows inline (copied to the host from a device),
// follow on the group's communicator. With one rank there is no channel.
class LeaderGroup final : public Group {
 public:
  LeaderGroup(Engine& engine, parallel::Communicator& comm, parallel::CommandChannel* channel, StepHook hook)
      : engine_(engine), comm_(comm), channel_(channel), hook_(std::move(hook)) {}
  ~LeaderGroup() override { close(); }

  Engine& leader() override { return engine_; }
  int64_t open_session() override;
  void close_session(int64_t id) override;
  std::vector<model::DraftResult> apply(const std::vector<StepEntry>& entries, StepDump* dump = nullptr) override;
  void close() override;

 private:
  Engine& engine_;
  parallel::Communicator& comm_;
  parallel::CommandChannel* channel_;
  StepHook hook_;
  std::vector<uint64_t> payload_;  // 8-byte aligned
  bool closed_ = false;
};

// Every other rank of a led group: follows rank 0's commands until it says stop.
void follow(Engine& engine, parallel::Communicator& comm, parallel::CommandChannel& channel, const StepHook& hook);

}  // namespace tpdraft::engine
